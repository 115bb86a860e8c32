"""Edge buckets ``edges_{lhs}_{rhs}.h5``: datasets, dtypes and edge chunks.

>>> [d.name for d in EDGE_DATASETS if d.required]
['rel', 'lhs', 'rhs']
>>> chunk_bounds(10, 3, 0), chunk_bounds(10, 3, 2)
((0, 4), (8, 10))
>>> chunk_bounds(2, 3, 2)
(2, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SIDES: tuple[Literal["lhs"], Literal["rhs"]] = ("lhs", "rhs")
Side = Literal["lhs", "rhs"]

# Elements per HDF5 chunk and per write buffer when pbgio writes buckets. The original's
# importer uses 6,553,600-element chunks; HDF5 reserves whole chunks, so small buckets get
# chunks no larger than their data.
WRITE_CHUNK_ELEMENTS = 1 << 20
# Elements per read when streaming a bucket (validator, chunked readers).
READ_BLOCK_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    dtype: str
    required: bool
    length: str
    meaning: str


def offsets_name(side: Side) -> str:
    return f"{side}d_offsets"


def data_name(side: Side) -> str:
    return f"{side}d_data"


EDGE_DATASETS: tuple[DatasetSpec, ...] = (
    DatasetSpec("rel", "int64", True, "N",
                "relation index into `relations` (static) or dynamic relation id"),
    DatasetSpec("lhs", "int64", True, "N",
                "left entity offset within its partition; ignored where the lhs type is featurized"),
    DatasetSpec("rhs", "int64", True, "N",
                "right entity offset within its partition; ignored where the rhs type is featurized"),
    DatasetSpec("weight", "float32", False, "N",
                "per-edge loss weight (the original wrote int64 by mistake; both are read)"),
    *(
        spec
        for side in SIDES
        for spec in (
            DatasetSpec(offsets_name(side), "int64", False, "N + 1",
                        f"cut points into {data_name(side)}: edge i's {side} features are "
                        f"{data_name(side)}[off[i]:off[i+1]]"),
            DatasetSpec(data_name(side), "int64", False, f"{offsets_name(side)}[-1]",
                        f"feature ids of featurized {side} entities, concatenated"),
        )
    ),
)
DATASETS_BY_NAME = {d.name: d for d in EDGE_DATASETS}
INDEX_DATASETS = ("rel", "lhs", "rhs")


def chunk_bounds(num_edges: int, num_chunks: int, chunk_idx: int) -> tuple[int, int]:
    """Half-open edge range of chunk ``chunk_idx`` of ``num_chunks`` (as the original chunks it).

    Chunk size is ``ceil(N / num_chunks)``, so the last chunks may be short or empty.
    """
    if num_chunks <= 0 or not 0 <= chunk_idx < num_chunks:
        raise ValueError(f"chunk {chunk_idx} of {num_chunks} does not exist")
    size = -(-num_edges // num_chunks)
    start = min(chunk_idx * size, num_edges)
    return start, min(start + size, num_edges)
