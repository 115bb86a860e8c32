"""Embed new bags of features with a trained checkpoint: how unseen documents get an embedding.

A featurized entity is the mean of its features' embeddings (seed 002), so any bag of known
features, seen in training or not, has one: :func:`embed_bags` averages the feature rows
exactly as :func:`~pbgio.exporters.export_embeddings` writes them, that is with the type's
global embedding added when the model has one (the vector the model scores with, before the
relation operator). Features are names from the type's ``entity_names_{type}_{part}.json``,
or integer row offsets within the partition (for layouts without names files). Repeated
features count as often as they appear, as in ``embedding_bag(mode="mean")``.

The work is vectorized: one pass over the bags flattens them; names are looked up in the
names file by one polars ``replace_strict`` (a hash join); offsets are checked, rows gathered
and bag sums taken (``np.add.reduceat``, float64 accumulation, rounded once to float32) by
numpy, a block of rows at a time. No torch: ``pbgio embed`` starts fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.errors import MissingArtifactError
from pbgio.exporters.common import ExportError, ExportSource, open_export_source
from pbgio.exporters.embeddings import add_global_embedding, global_embeddings, partition_names
from pbgio.spec import naming

Unknown = Literal["error", "ignore"]
Feature = str | int
Ints = NDArray[np.int64]
Floats = NDArray[np.float32]
_BLOCK = 1 << 16  # feature rows gathered (and widened to float64) at once
_NAME, _OFFSET, _OTHER = 0, 1, 2
_KINDS: dict[type, int] = {str: _NAME, np.str_: _NAME, int: _OFFSET,
                           **{np.dtype(code).type: _OFFSET for code in np.typecodes["AllInteger"]}}
_SHOWN = 5  # unknown names quoted in an error


class BagError(ExportError):
    """A bag that cannot be embedded; ``bag`` is its 0-based index, ``reason`` the rest."""

    def __init__(self, bag: int, reason: str) -> None:
        super().__init__(f"bag {bag}: {reason}")
        self.bag = bag
        self.reason = reason


def embed_bags(
    config: ConfigSchema | str | Path,
    entity_type: str,
    bags: Sequence[Sequence[Feature]],
    *,
    version: int | None = None,
    partition: int = 0,
    add_global: bool = True,
    unknown: Unknown = "error",
    checkpoint: Path | None = None,
    base: Path | None = None,
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
    source = open_export_source(config, base=base, checkpoint=checkpoint, version=version)
    cfg = source.config
    if entity_type not in cfg.entities:
        raise ExportError(f"expected an entity type of the config {sorted(cfg.entities)}, found {entity_type!r}")
    if not cfg.entities[entity_type].featurized:
        raise ExportError(f"{entity_type!r} is not featurized: its rows are entities, not features; export them "
                          "with export_embeddings (pbgio export)")
    if not 0 <= partition < cfg.num_partitions(entity_type):
        raise ExportError(f"expected a partition of {entity_type!r} in [0, {cfg.num_partitions(entity_type)}), "
                          f"found {partition}")
    rows = source.checkpoint.read_embeddings(entity_type, partition, source.version).embeddings
    ids, counts = _bag_ids(source, entity_type, partition, bags, rows.shape[0], unknown)
    shift = global_embeddings(source, [entity_type])[entity_type] if add_global and cfg.global_emb else None
    return _means(rows, ids, counts, shift, entity_type)


def _means(rows: Floats, ids: Ints, counts: Ints, shift: Floats | None, entity_type: str) -> Floats:
    """Mean of each bag's rows as exported (global embedding added), summed in float64 a block at a time."""
    means = np.empty((len(counts), rows.shape[1]), dtype=np.float32)
    ends = np.cumsum(counts)
    starts = ends - counts
    first = 0
    while first < len(counts):  # bags [first, stop) hold about _BLOCK features (at least one bag)
        stop = max(first + 1, int(np.searchsorted(ends, starts[first] + _BLOCK, side="right")))
        lo, hi = starts[first], ends[stop - 1]
        block = add_global_embedding(rows[ids[lo:hi]], shift, entity_type).astype(np.float64)
        means[first:stop] = np.add.reduceat(block, starts[first:stop] - lo, axis=0) / counts[first:stop, None]
        first = stop
    return means


def _bag_ids(source: ExportSource, entity_type: str, partition: int, bags: Sequence[Sequence[Feature]],
             num_features: int, unknown: Unknown) -> tuple[Ints, Ints]:
    """Row offsets of every bag's features, flattened, and each bag's feature count.

    When several bags are wrong, the error names the first of them.
    """
    where = f"{entity_type!r} partition {partition}"
    flat: list[Any] = []
    counts = np.zeros(len(bags), dtype=np.int64)
    for b, bag in enumerate(bags):
        if isinstance(bag, str | bytes):
            raise BagError(b, f"expected a sequence of features, found the string {bag!r} (write [{bag!r}] for "
                              "a bag of one feature)")
        try:
            counts[b] = len(bag)
        except TypeError:
            raise BagError(b, f"expected a sequence of features, found {type(bag).__name__}") from None
        flat.extend(bag)
    owner = np.repeat(np.arange(len(bags), dtype=np.int64), counts)  # the bag of each entry of flat
    kind = np.fromiter(map(_KINDS.get, map(type, flat), repeat(_OTHER)), dtype=np.int8, count=len(flat))
    problems: list[tuple[int, str]] = []  # (bag, reason): the first bag's is raised
    for i in np.flatnonzero(kind == _OTHER):  # rare: subclasses of str or int, bools, anything else
        if isinstance(flat[i], str) or _is_offset(flat[i]):
            kind[i] = _NAME if isinstance(flat[i], str) else _OFFSET
        else:
            problems.append((int(owner[i]), f"expected feature names (str) or offsets (int), found {flat[i]!r}"))
            break
    ids = np.zeros(len(flat), dtype=np.int64)

    at = np.flatnonzero(kind == _OFFSET)
    if len(at):
        given = _integers(_pick(flat, at))
        if given is not None and not ((given < 0) | (given >= num_features)).any():
            ids[at] = given
        else:  # rare: beyond int64, or out of range; name the first
            outside = next((i for i in at if not 0 <= flat[i] < num_features), None)
            if outside is None:
                ids[at] = [int(flat[i]) for i in at]
            else:
                problems.append((int(owner[outside]), f"expected feature offsets in [0, {num_features}) for "
                                                      f"{where}, found {flat[outside]}"))

    if (counts == 0).any():
        problems.append((int(np.argmax(counts == 0)), "expected at least one feature, found none"))

    missing = np.zeros(len(flat), dtype=bool)
    at = np.flatnonzero(kind == _NAME)
    if len(at):
        try:
            ids[at] = _look_up(source, entity_type, partition, num_features, _pick(flat, at), int(owner[at[0]]))
        except BagError as exc:
            raise BagError(*min([*problems, (exc.bag, exc.reason)], key=lambda problem: problem[0])) from None
        missing[at] = ids[at] < 0
        if missing.any() and unknown == "error":
            first = int(owner[np.argmax(missing)])
            names = [flat[i] for i in np.flatnonzero(missing & (owner == first))]
            problems.append((first, f"features {names[:_SHOWN]} are not in the dictionary of {where}"
                                  f"{' (and more)' if len(names) > _SHOWN else ''}; pass unknown='ignore' "
                                  "(--unknown ignore) to drop unknown features"))

    ignored = unknown == "ignore" and bool(missing.any())
    kept = counts - np.bincount(owner[missing], minlength=len(bags)) if ignored else counts
    emptied = (kept == 0) & (counts > 0)
    if emptied.any():
        first = int(np.argmax(emptied))
        dropped = [flat[i] for i in np.flatnonzero(missing & (owner == first))]
        problems.append((first, f"expected at least one feature, found none after dropping unknown features "
                              f"{dropped[:_SHOWN]}{' (and more)' if len(dropped) > _SHOWN else ''}"))
    if problems:
        raise BagError(*min(problems, key=lambda problem: problem[0]))  # the first bag; ties: first found
    return (ids[~missing], kept) if ignored else (ids, counts)


def _pick(flat: list[Any], at: NDArray[np.intp]) -> list[Any]:
    return flat if len(at) == len(flat) else [flat[i] for i in at]


def _is_offset(feature: object) -> bool:
    return isinstance(feature, int | np.integer) and not isinstance(feature, bool | np.bool_)


def _integers(features: list[Any]) -> NDArray[np.integer[Any]] | None:
    """``features`` (integers) as a 1-D integer array when numpy reads them as one, else None."""
    try:
        array = np.asarray(features)
    except (ValueError, TypeError, OverflowError):
        return None
    return array if array.ndim == 1 and array.dtype.kind in "iu" else None


def _look_up(source: ExportSource, entity_type: str, partition: int, num_features: int, features: list[str],
             bag: int) -> Ints:
    """Row offset of each feature name in the partition's names file (-1 when absent); ``bag``
    holds the first of them."""
    import polars as pl

    try:
        names = pl.Series(partition_names(source, entity_type, partition, num_features), dtype=pl.String)
    except MissingArtifactError as exc:
        raise BagError(bag, f"feature {features[0]!r} is a name, but {entity_type!r} partition {partition} has no "
                            f"names file ({exc.path}); give features as row offsets (ints; --offsets on the "
                            "command line)") from None
    try:
        found = pl.Series(features, dtype=pl.String).replace_strict(
            names, pl.int_range(len(names), eager=True), default=-1, return_dtype=pl.Int64)
    except pl.exceptions.InvalidOperationError:
        twice = names.filter(names.is_duplicated()).unique(maintain_order=True).head(_SHOWN).to_list()
        path = source.entity_path / naming.entity_names_file(entity_type, partition)
        raise ExportError(f"{path}: expected unique feature names to look bags up by name, found {twice} more "
                          "than once [entity-names-duplicate]") from None
    return found.to_numpy()


def write_bag_tsv(out: IO[bytes], vectors: NDArray[np.float32]) -> None:
    """``number<TAB>v0<TAB>v1…`` per bag (numbered from 1), values as the TSV exporter writes them."""
    import polars as pl

    from pbgio.exporters.embeddings import write_tsv

    numbers = pl.Series("name", np.arange(1, len(vectors) + 1, dtype=np.int64)).cast(pl.String)
    write_tsv(out, numbers, vectors)
