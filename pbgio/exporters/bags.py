"""Embed new bags of features with a trained checkpoint: how unseen documents get an embedding.

A featurized entity is the mean of its features' embeddings (seed 002), so any bag of known
features, seen in training or not, has one: :func:`embed_bags` averages the checkpoint's
feature rows, with the type's global embedding added when the model has one, exactly as
:func:`~pbgio.exporters.export_embeddings` adds it to every row (the vector the model scores
with, before the relation operator). Features are names from the type's
``entity_names_{type}_{part}.json``, or integer row offsets. Repeated features count as often
as they appear. Numpy only: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO, Literal

import numpy as np
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.entities import read_entity_names
from pbgio.exporters.common import ExportError, open_export_source
from pbgio.exporters.embeddings import global_embeddings

Unknown = Literal["error", "ignore"]
Feature = str | int


class BagError(ExportError):
    """A bag that cannot be embedded; ``bag`` is its 0-based index."""

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
    """Embeddings [len(bags), dimension] (float32) of ``bags`` of features of a featurized type.

    ``unknown="ignore"`` drops features the dictionary lacks (a bag left empty is still an
    error); names need the type's names file, integer offsets do not.
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
    ids, offsets = _bag_ids(source.entity_path, entity_type, partition, bags, rows.shape[0], unknown)
    values = np.add.reduceat(rows[ids], offsets[:-1], axis=0) if len(bags) else np.zeros((0, rows.shape[1]))
    means = (values / np.diff(offsets)[:, None]).astype(np.float32)
    if add_global and cfg.global_emb:
        means += global_embeddings(source, [entity_type])[entity_type]
    return means


def _bag_ids(entity_path: Path, entity_type: str, partition: int, bags: Sequence[Sequence[Feature]],
             num_features: int, unknown: Unknown) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Row offsets of every bag's features, flattened, and the bags' offsets into them."""
    index: dict[str, int] | None = None
    ids: list[int] = []
    offsets = [0]
    for b, bag in enumerate(bags):
        if isinstance(bag, str):
            raise BagError(b, f"expected a sequence of features, found the string {bag!r} (write [{bag!r}] "
                              "for a bag of one feature)")
        missing = []
        for feature in bag:
            if isinstance(feature, str):
                if index is None:
                    names = read_entity_names(entity_path, entity_type, partition)
                    index = {name: i for i, name in enumerate(names)}
                row = index.get(feature)
                if row is None:
                    missing.append(feature)
                    continue
            elif isinstance(feature, int | np.integer) and not isinstance(feature, bool):
                row = int(feature)
                if not 0 <= row < num_features:
                    raise BagError(b, f"expected feature offsets in [0, {num_features}) for "
                                      f"{entity_type!r} partition {partition}, found {row}")
            else:
                raise BagError(b, f"expected feature names (str) or offsets (int), found {feature!r}")
            ids.append(row)
        if missing and unknown == "error":
            raise BagError(b, f"features {missing[:5]} are not in the dictionary of {entity_type!r} "
                              f"partition {partition}{' (and more)' if len(missing) > 5 else ''}; pass "
                              "unknown='ignore' (--unknown ignore) to drop unknown features")
        if len(ids) == offsets[-1]:
            dropped = f" after dropping unknown features {missing[:5]}" if missing else ""
            raise BagError(b, f"expected at least one feature, found none{dropped}")
        offsets.append(len(ids))
    return np.asarray(ids, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


def write_bag_tsv(out: IO[bytes], vectors: NDArray[np.float32]) -> None:
    """``number<TAB>v0<TAB>v1…`` per bag (numbered from 1), values in shortest round-trip form."""
    import polars as pl

    columns = {f"dim_{i}": vectors[:, i] for i in range(vectors.shape[1])}
    frame = pl.DataFrame({"bag": np.arange(1, len(vectors) + 1), **columns})
    frame.write_csv(out, separator="\t", include_header=False, quote_style="never", line_terminator="\n")
