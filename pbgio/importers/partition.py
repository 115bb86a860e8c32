"""Partition assignment: the ``i``-th entity of a shuffled dictionary and where it lands.

The original splits ``N`` shuffled entities into ``P`` partitions with partition ``p``
holding positions ``[ceil(p*N/P), ceil((p+1)*N/P))``; an entity's offset is its
position minus its partition's start. The shuffle here is seeded, so the same input
and seed always give the same layout.

>>> partition_bounds(10, 3)
[0, 4, 7, 10]
>>> shuffled_order(5, seed=0, salt="user").tolist()
[3, 0, 1, 4, 2]
"""

from __future__ import annotations

import zlib

import numpy as np
from numpy.typing import NDArray


def partition_bounds(count: int, num_partitions: int) -> list[int]:
    """Start of every partition, and ``count`` at the end (``num_partitions + 1`` entries)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    return [-(-p * count // num_partitions) for p in range(num_partitions + 1)]


def shuffled_order(count: int, *, seed: int, salt: str) -> NDArray[np.int64]:
    """A permutation of ``range(count)`` fixed by ``seed`` and ``salt`` (the entity type)."""
    rng = np.random.default_rng([seed, zlib.crc32(salt.encode("utf-8"))])
    return rng.permutation(count).astype(np.int64, copy=False)
