"""Embed new bags of features with a trained checkpoint: how unseen documents get an embedding.

A featurized entity is the mean of its features' embeddings (docs/guides/featurized.md), so any bag of known
features, seen in training or not, has one: :func:`embed_bags` averages the feature rows
exactly as :func:`~pbgio.exporters.export_embeddings` writes them, that is with the type's
global embedding added when the model has one (the vector the model scores with, before the
relation operator). Features are names from the type's ``entity_names_{type}_{part}.json``,
or integer row offsets within the partition (for layouts without names files). Repeated
features count as often as they appear, as in ``embedding_bag(mode="mean")``.

One pass over the bags checks them and turns names into row offsets (a dictionary built from
the names file at the first name); rows are then read (only the bags' features, never the whole
partition) and bag sums taken by numpy (``np.add.reduceat``, float64 accumulation, rounded once to
float32), a block of rows at a time. No torch: ``pbgio embed`` starts fast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import IO, Literal

import numpy as np
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.errors import MissingArtifactError
from pbgio.exporters.common import ExportError, consistent_version
from pbgio.exporters.embeddings import partition_names
from pbgio.exporters.global_rows import add_global_embedding, global_embeddings
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.spec import naming
from pbgio.storage import AnyPath

Unknown = Literal["error", "ignore"]
Feature = str | int
Ints = NDArray[np.int64]
Floats = NDArray[np.float32]
_BLOCK = 1 << 16  # feature rows gathered (and widened to float64) at once
_SHOWN = 5  # unknown names quoted in an error


class BagError(ExportError):
    """A bag that cannot be embedded; ``bag`` is its 0-based index, ``reason`` the rest."""

    def __init__(self, bag: int, reason: str) -> None:
        super().__init__(f"bag {bag}: {reason}")
        self.bag = bag
        self.reason = reason


@consistent_version
def embed_bags(
    config: Layout | ConfigSchema | str | AnyPath,
    entity_type: str,
    bags: Sequence[Sequence[Feature]],
    *,
    version: int | None = None,
    partition: int = 0,
    add_global: bool = True,
    unknown: Unknown = "error",
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
) -> NDArray[np.float32]:
    """Embeddings ``[len(bags), dimension]`` (float32) of ``bags`` of features of a featurized type.

    Each bag is a sequence of feature names (``str``) or row offsets (``int``) of ``partition``
    of ``version`` (default: the committed one); its embedding is the mean of those features'
    rows as :func:`~pbgio.exporters.export_embeddings` exports them (global embedding added
    when ``add_global`` and the config has ``global_emb``). ``unknown="ignore"`` drops names
    the dictionary lacks (a bag left empty is still an error). Problems raise
    :class:`~pbgio.exporters.ExportError`; those of one bag raise :class:`BagError`, naming it.
    """
    if unknown not in ("error", "ignore"):
        raise ExportError(f"expected unknown='error' or 'ignore', found {unknown!r}")
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    cfg = source.config
    if entity_type not in cfg.entities:
        raise ExportError(f"expected an entity type of the config {sorted(cfg.entities)}, found {entity_type!r}")
    if not cfg.entities[entity_type].featurized:
        raise ExportError(f"{entity_type!r} is not featurized: its rows are entities, not features; export them "
                          "with export_embeddings (pbgio export)")
    if not 0 <= partition < cfg.num_partitions(entity_type):
        raise ExportError(f"expected a partition of {entity_type!r} in [0, {cfg.num_partitions(entity_type)}), "
                          f"found {partition}")
    num_features, dimension = source.checkpoint.embeddings_shape(entity_type, partition, source.version)
    ids, counts = _bag_ids(source, entity_type, partition, bags, num_features, unknown)
    shift = global_embeddings(source, [entity_type])[entity_type] if add_global and cfg.global_emb else None

    def rows(offsets: Ints) -> Floats:
        return source.checkpoint.read_embedding_rows(entity_type, partition, source.version, offsets)

    return _means(rows, dimension, ids, counts, shift, entity_type)


def _means(rows: Callable[[Ints], Floats], dimension: int, ids: Ints, counts: Ints, shift: Floats | None,
           entity_type: str) -> Floats:
    """Mean of each bag's rows as exported (global embedding added), summed in float64 a block at a time;
    ``rows`` reads the rows of given offsets of the partition (a block's worth)."""
    means = np.empty((len(counts), dimension), dtype=np.float32)
    ends = np.cumsum(counts)
    starts = ends - counts
    first = 0
    while first < len(counts):  # bags [first, stop) hold about _BLOCK features (at least one bag)
        stop = max(first + 1, int(np.searchsorted(ends, starts[first] + _BLOCK, side="right")))
        lo, hi = starts[first], ends[stop - 1]
        block = add_global_embedding(rows(ids[lo:hi]), shift, entity_type).astype(np.float64)
        means[first:stop] = np.add.reduceat(block, starts[first:stop] - lo, axis=0) / counts[first:stop, None]
        first = stop
    return means


def _bag_ids(source: CheckpointVersion, entity_type: str, partition: int, bags: Sequence[Sequence[Feature]],
             num_features: int, unknown: Unknown) -> tuple[Ints, Ints]:
    """Row offsets of every bag's features, flattened, and each bag's feature count.

    Bags are checked in order, so an error names the first bad bag.
    """
    where = f"{entity_type!r} partition {partition}"
    index: dict[str, int] | None = None  # name -> row, read at the first name
    ids: list[int] = []
    counts = np.zeros(len(bags), dtype=np.int64)
    for b, bag in enumerate(bags):
        if isinstance(bag, str | bytes):
            raise BagError(b, f"expected a sequence of features, found the string {bag!r} (write [{bag!r}] for "
                              "a bag of one feature)")
        try:
            features = list(bag)
        except TypeError:
            raise BagError(b, f"expected a sequence of features, found {type(bag).__name__}") from None
        start = len(ids)
        missing = []
        for feature in features:
            if isinstance(feature, str):
                if index is None:
                    index = _name_index(source, entity_type, partition, num_features, b, feature)
                row = index.get(feature)
                if row is None:
                    missing.append(feature)
                    continue
            elif isinstance(feature, int | np.integer) and not isinstance(feature, bool | np.bool_):
                row = int(feature)
                if not 0 <= row < num_features:
                    raise BagError(b, f"expected feature offsets in [0, {num_features}) for {where}, found {row}")
            else:
                raise BagError(b, f"expected feature names (str) or offsets (int), found {feature!r}")
            ids.append(row)
        shown = f"{missing[:_SHOWN]}{' (and more)' if len(missing) > _SHOWN else ''}"
        if missing and unknown == "error":
            raise BagError(b, f"features {shown} are not in the dictionary of {where}; pass unknown='ignore' "
                              "(--unknown ignore) to drop unknown features")
        counts[b] = len(ids) - start
        if counts[b] == 0:
            dropped = f" after dropping unknown features {shown}" if missing else ""
            raise BagError(b, f"expected at least one feature, found none{dropped}")
    return np.asarray(ids, dtype=np.int64), counts


def _name_index(source: CheckpointVersion, entity_type: str, partition: int, num_features: int, bag: int,
                feature: str) -> dict[str, int]:
    """Row of each feature name of the partition's names file; ``bag`` and ``feature`` are the
    first to need it (named when there is no names file)."""
    try:
        names = partition_names(source, entity_type, partition, num_features).to_list()
    except MissingArtifactError as exc:
        raise BagError(bag, f"feature {feature!r} is a name, but {entity_type!r} partition {partition} has no "
                            f"names file ({exc.path}); give features as row offsets (ints; --offsets on the "
                            "command line)") from None
    index = {name: row for row, name in enumerate(names)}
    if len(index) != len(names):
        first_row = {name: row for row, name in reversed(list(enumerate(names)))}
        twice = list(dict.fromkeys(n for row, n in enumerate(names) if first_row[n] != row))[:_SHOWN]
        path = source.entity_path / naming.entity_names_file(entity_type, partition)
        raise ExportError(f"{path}: expected unique feature names to look bags up by name, found {twice} more "
                          "than once [entity-names-duplicate]")
    return index


def write_bag_tsv(out: IO[bytes], vectors: NDArray[np.float32]) -> None:
    """``number<TAB>v0<TAB>v1…`` per bag (numbered from 1), values as the TSV exporter writes them."""
    import polars as pl

    from pbgio.exporters.embeddings import write_tsv

    numbers = pl.Series("name", np.arange(1, len(vectors) + 1, dtype=np.int64)).cast(pl.String)
    write_tsv(out, numbers, vectors)
