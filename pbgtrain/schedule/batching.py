"""Batch preparation (as the original chunks it): the iteration schedule, the held-out edges, the batches.

Training walks epochs → edge paths → edge chunks; each (epoch, path, chunk) is one
*iteration*, and iteration index ``N`` commits checkpoint version ``N + 1``. Within an
iteration every bucket's chunk is prepared the same way:

1. hold out ``eval_fraction`` of its edges, sampled with replacement by a generator seeded
   with a stable hash of ``(edge path, chunk, lhs, rhs)``: the same edges every epoch;
2. shuffle the others (seeded per epoch and bucket) and split them into equal contiguous
   parts, one per worker;
3. cut each part into batches: contiguous ``batch_size`` slices with dynamic relations;
   otherwise batches of one relation each, the relation drawn with probability proportional
   to its edges left, taking its first ``batch_size`` edges left (or fewer).

Everything works on int64 index tensors into the chunk's edge arrays; the caller gathers
``lhs``/``rhs``/``rel``/``weight`` with them.

>>> schedule = IterationSchedule(num_epochs=2, edge_paths=("data/train",), num_edge_chunks=2)
>>> [str(step) for step in schedule.steps(committed_version=1)]
['epoch 1/2, chunk 2/2 of data/train', 'epoch 2/2, chunk 1/2 of data/train', 'epoch 2/2, chunk 2/2 of data/train']
>>> rel = torch.tensor([0, 1, 1, 0, 1, 1, 1])
>>> batches = grouped_batches(torch.arange(7), rel, batch_size=2, generator=torch.Generator().manual_seed(0))
>>> sorted(sorted(set(rel[b].tolist())) for b in batches), sorted(batches.edge_idx.tolist())
([[0], [1], [1], [1]], [0, 1, 2, 3, 4, 5, 6])
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from pbgio.checkpoint import IterationInfo

if TYPE_CHECKING:
    from pbgio.config import ConfigSchema

MAX_EDGES_PER_CHUNK = 1_000_000_000


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``repr(parts)``: the same in every process and run (``hash`` is not)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- iteration schedule


@dataclass(frozen=True)
class IterationStep:
    """One iteration: an edge chunk of an edge path in an epoch; ``index`` N writes version N+1."""

    index: int
    epoch_idx: int
    num_epochs: int
    edge_path_idx: int
    edge_path: str
    num_edge_paths: int
    edge_chunk_idx: int
    num_edge_chunks: int

    @property
    def version(self) -> int:
        """The checkpoint version this iteration commits."""
        return self.index + 1

    @property
    def ends_epoch(self) -> bool:
        """Whether this is the epoch's last iteration (its last chunk of its last edge path)."""
        return self.edge_path_idx == self.num_edge_paths - 1 and self.edge_chunk_idx == self.num_edge_chunks - 1

    def info(self) -> IterationInfo:
        """The ``iteration/*`` attributes of the files this iteration writes."""
        return IterationInfo(num_epochs=self.num_epochs, epoch_idx=self.epoch_idx,
                             num_edge_paths=self.num_edge_paths, edge_path_idx=self.edge_path_idx,
                             edge_path=self.edge_path, num_edge_chunks=self.num_edge_chunks,
                             edge_chunk_idx=self.edge_chunk_idx)

    def __str__(self) -> str:
        path = f" of {self.edge_path}" if self.num_edge_paths == 1 else (
            f" of edge path {self.edge_path_idx + 1}/{self.num_edge_paths} ({self.edge_path})")
        chunk = f"chunk {self.edge_chunk_idx + 1}/{self.num_edge_chunks}"
        return f"epoch {self.epoch_idx + 1}/{self.num_epochs}, {chunk}{path}"


def resolve_num_edge_chunks(num_edge_chunks: int | None, first_bucket_sizes: Iterable[int],
                            max_edges_per_chunk: int = MAX_EDGES_PER_CHUNK) -> int:
    """``num_edge_chunks``, or when None ``ceil(max |bucket (0, 0)| over edge paths / max_edges_per_chunk)``.

    At least 1 (an empty graph still has one chunk).

    >>> resolve_num_edge_chunks(None, [2_500, 900], max_edges_per_chunk=1_000)
    3
    """
    if num_edge_chunks is not None:
        if num_edge_chunks < 1:
            raise ValueError(f"expected num_edge_chunks > 0, found {num_edge_chunks}")
        return num_edge_chunks
    if max_edges_per_chunk < 1:
        raise ValueError(f"expected max_edges_per_chunk > 0, found {max_edges_per_chunk}")
    largest = max(first_bucket_sizes, default=0)
    return max(1, -(-largest // max_edges_per_chunk))


@dataclass(frozen=True)
class IterationSchedule:
    """Epochs → edge paths → edge chunks, chunk varying fastest (the original's order)."""

    num_epochs: int
    edge_paths: tuple[str, ...]
    num_edge_chunks: int

    def __post_init__(self) -> None:
        if self.num_epochs < 0 or not self.edge_paths or self.num_edge_chunks < 1:
            raise ValueError(f"expected num_epochs >= 0, edge paths and num_edge_chunks >= 1, found "
                             f"{self.num_epochs}, {list(self.edge_paths)}, {self.num_edge_chunks}")

    @classmethod
    def from_config(cls, config: ConfigSchema, first_bucket_sizes: Iterable[int] = ()) -> IterationSchedule:
        """The schedule of ``config``; ``first_bucket_sizes`` (|edges_0_0| per edge path) are needed
        only when ``num_edge_chunks`` is null."""
        chunks = resolve_num_edge_chunks(config.num_edge_chunks, first_bucket_sizes, config.max_edges_per_chunk)
        return cls(config.num_epochs, tuple(config.edge_paths), chunks)

    def __len__(self) -> int:
        return self.num_epochs * len(self.edge_paths) * self.num_edge_chunks

    def step(self, index: int) -> IterationStep:
        if not 0 <= index < len(self):
            raise IndexError(f"iteration {index} is outside the schedule of {len(self)} iterations")
        rest, chunk = divmod(index, self.num_edge_chunks)
        epoch, path_idx = divmod(rest, len(self.edge_paths))
        return IterationStep(index=index, epoch_idx=epoch, num_epochs=self.num_epochs, edge_path_idx=path_idx,
                             edge_path=self.edge_paths[path_idx], num_edge_paths=len(self.edge_paths),
                             edge_chunk_idx=chunk, num_edge_chunks=self.num_edge_chunks)

    def steps(self, committed_version: int = 0) -> Iterator[IterationStep]:
        """The iterations still to run after ``committed_version`` of them are committed.

        A version at or past the end yields nothing (the run is complete).
        """
        if committed_version < 0:
            raise ValueError(f"expected a committed version >= 0, found {committed_version}")
        for index in range(committed_version, len(self)):
            yield self.step(index)

    def __iter__(self) -> Iterator[IterationStep]:
        return self.steps(0)

    def starts_epoch(self, index: int) -> bool:
        """Whether iteration ``index`` is the first of its epoch."""
        return index % (len(self.edge_paths) * self.num_edge_chunks) == 0


# --------------------------------------------------------------------------- hold-out and shuffle


@dataclass(frozen=True)
class ChunkKey:
    """Identifies the chunk of a bucket; seeds the hold-out (the same subset in every epoch).

    The edge path is its index in the config's ``edge_paths``, not its name: how a path is
    written (relative, absolute, a ``file://`` or ``s3://`` URL) says where the data is, not what
    it is, so the same config and seed train the same embeddings wherever the layout lives.

    >>> key = ChunkKey(edge_path_idx=0, edge_chunk_idx=1, lhs=0, rhs=1)
    >>> key.holdout_seed() == ChunkKey(0, 1, 0, 1).holdout_seed() != ChunkKey(1, 1, 0, 1).holdout_seed()
    True
    """

    edge_path_idx: int
    edge_chunk_idx: int
    lhs: int
    rhs: int

    def holdout_seed(self) -> int:
        return stable_seed("holdout", self.edge_path_idx, self.edge_chunk_idx, self.lhs, self.rhs)

    def shuffle_seed(self, run_seed: int, epoch_idx: int) -> int:
        """Seed of the training shuffle: new every epoch, reproducible on resume."""
        return stable_seed("shuffle", run_seed, epoch_idx, self.edge_path_idx, self.edge_chunk_idx, self.lhs,
                           self.rhs)


@dataclass(frozen=True)
class HeldOut:
    """``eval_idx``: held-out edges (with replacement, so possibly repeated), ``train_idx``: the rest,
    ascending."""

    eval_idx: Tensor
    train_idx: Tensor


def hold_out(num_edges: int, eval_fraction: float, key: ChunkKey) -> HeldOut:
    """Sample ``floor(num_edges * eval_fraction)`` edges with replacement; the others train.

    The sample depends only on ``num_edges``, ``eval_fraction`` and ``key``.
    """
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"expected eval_fraction in [0, 1], found {eval_fraction}")
    num_eval = int(num_edges * eval_fraction)
    if num_eval == 0:
        return HeldOut(torch.zeros(0, dtype=torch.int64), torch.arange(num_edges, dtype=torch.int64))
    eval_idx = torch.randint(num_edges, (num_eval,), generator=_generator(key.holdout_seed()), dtype=torch.int64)
    keep = torch.ones(num_edges, dtype=torch.bool)
    keep[eval_idx] = False
    return HeldOut(eval_idx, keep.nonzero().squeeze(1))


def shuffle(idx: Tensor, generator: torch.Generator) -> Tensor:
    """``idx`` in uniformly random order."""
    return idx[torch.randperm(len(idx), generator=generator)]


def split_equally(idx: Tensor, parts: int) -> list[Tensor]:
    """``parts`` contiguous views of ``idx`` whose lengths differ by at most one."""
    if parts < 1:
        raise ValueError(f"expected at least one part, found {parts}")
    base, extra = divmod(len(idx), parts)
    sizes = [base + (1 if i < extra else 0) for i in range(parts)]
    return list(torch.split(idx, sizes))


# --------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class Batches:
    """Batches as one index tensor in batch order plus offsets: batch ``k`` is
    ``edge_idx[offsets[k]:offsets[k+1]]``. ``relations[k]`` is batch ``k``'s relation
    (static relations) or None (mixed batches)."""

    edge_idx: Tensor
    offsets: Tensor
    relations: Tensor | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, k: int) -> Tensor:
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} of {len(self)}")
        k %= len(self)
        return self.edge_idx[int(self.offsets[k]):int(self.offsets[k + 1])]

    def __iter__(self) -> Iterator[Tensor]:
        bounds = self.offsets.tolist()
        for start, end in itertools.pairwise(bounds):
            yield self.edge_idx[start:end]

    def to(self, device: torch.device) -> Batches:
        """The same batches with ``edge_idx`` on ``device`` (offsets and relations stay on the host)."""
        return Batches(self.edge_idx.to(device), self.offsets, self.relations)

    def relation(self, k: int) -> int | None:
        return None if self.relations is None else int(self.relations[k])

    def sizes(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def num_edges(self) -> int:
        return len(self.edge_idx)


def mixed_batches(idx: Tensor, batch_size: int) -> Batches:
    """Contiguous batches of ``batch_size`` (the last may be shorter), relations mixed."""
    _check_batch_size(batch_size)
    n = len(idx)
    offsets = torch.arange(0, n + batch_size, batch_size, dtype=torch.int64).clamp_(max=n)
    if n % batch_size == 0:
        offsets = offsets[: n // batch_size + 1]
    return Batches(idx, offsets)


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"expected batch_size > 0, found {batch_size}")


def grouped_batches(idx: Tensor, rel: Tensor | np.ndarray, batch_size: int, generator: torch.Generator) -> Batches:
    """Single-relation batches: repeatedly draw a relation with probability proportional to its
    edges left, take its first ``batch_size`` edges left (in ``idx`` order), remove them.

    ``rel`` holds the relation of every edge of the chunk (``rel[idx]`` those of ``idx``).
    Instead of drawing one relation at a time this simulates the same random process all at
    once: relation ``r``'s ``k``-th draw happens at time ``Σ_{j<=k} E_j / w_{r,j}``, where
    ``w_{r,j}`` is the number of its edges left before its ``j``-th batch and ``E_j ~ Exp(1)``;
    independent exponential clocks with those rates fire in exactly the order of the
    proportional draw, so sorting the times gives the sequence of batches.
    """
    _check_batch_size(batch_size)
    idx = torch.as_tensor(idx, dtype=torch.int64)
    n = len(idx)
    if n == 0:
        return Batches(idx, torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    # Per-edge sort and gathers in torch (parallel); the per-batch bookkeeping in numpy, whose
    # repeat runs on the calling thread (torch's wakes the thread pool even for tiny inputs).
    edge_rel = torch.as_tensor(rel, dtype=torch.int64)[idx]
    order = torch.sort(edge_rel, stable=True).indices
    grouped = idx[order]
    sorted_rel = edge_rel[order].numpy()
    group_start = np.flatnonzero(np.r_[True, sorted_rel[1:] != sorted_rel[:-1]])
    counts = np.diff(np.r_[group_start, n])
    num_batches = -(-counts // batch_size)
    batch_group = np.repeat(np.arange(len(counts)), num_batches)
    first_batch = np.cumsum(num_batches) - num_batches
    k = np.arange(len(batch_group)) - first_batch[batch_group]
    starts = group_start[batch_group] + k * batch_size
    ends = np.minimum(starts + batch_size, (group_start + counts)[batch_group])
    left = (counts[batch_group] - k * batch_size).astype(np.float64)
    draws = torch.empty(len(batch_group), dtype=torch.float64).exponential_(generator=generator).numpy()
    steps = draws / left
    times = np.cumsum(steps)
    times -= np.repeat(times[first_batch] - steps[first_batch], num_batches)
    batch_order = np.argsort(times, kind="stable")
    sizes = (ends - starts)[batch_order]
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    position = np.arange(n, dtype=np.int64) + np.repeat(starts[batch_order] - offsets[:-1], sizes)
    return Batches(grouped[torch.from_numpy(position)], torch.from_numpy(offsets),
                   torch.from_numpy(sorted_rel[group_start][batch_group[batch_order]]))


def make_batches(idx: Tensor, rel: Tensor | np.ndarray, batch_size: int, *, dynamic: bool,
                 generator: torch.Generator) -> Batches:
    """Mixed batches with dynamic relations, single-relation batches otherwise."""
    return mixed_batches(idx, batch_size) if dynamic else grouped_batches(idx, rel, batch_size, generator)


@dataclass(frozen=True)
class PreparedChunk:
    """A bucket chunk ready to train: the held-out edges and each worker's batches."""

    held_out: HeldOut
    worker_batches: list[Batches]

    @property
    def num_train_edges(self) -> int:
        return sum(b.num_edges for b in self.worker_batches)


def prepare_chunk(rel: Tensor | np.ndarray, *, key: ChunkKey, eval_fraction: float, batch_size: int,
                  dynamic: bool, num_workers: int = 1, shuffle_seed: int) -> PreparedChunk:
    """Hold out, shuffle, split among workers and batch the edges of one bucket chunk.

    ``rel`` is the chunk's relation array (its length is the number of edges);
    ``shuffle_seed`` is usually ``key.shuffle_seed(run_seed, epoch_idx)``.
    """
    held = hold_out(len(rel), eval_fraction, key)
    train = shuffle(held.train_idx, _generator(shuffle_seed))
    parts = split_equally(train, num_workers)
    batches = [make_batches(part, rel, batch_size, dynamic=dynamic,
                            generator=_generator(stable_seed("batches", shuffle_seed, i)))
               for i, part in enumerate(parts)]
    return PreparedChunk(held, batches)

