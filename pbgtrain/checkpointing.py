"""The trainer's view of a checkpoint directory, with the original's version semantics.

Version N holds the state after N completed iterations (one iteration = one edge chunk
of one edge path in one epoch). While iteration N runs, partitions that are swapped out
are written straight into version N+1 files; at the end, the partitions still resident
and the model are written too, then :func:`pbgio.checkpoint.commit_steps` commits
N+1 (the version file last) and removes version N. A crash at any point leaves version N
intact and the run resumes from it. All file access goes through :mod:`pbgio`. Every run, a single
process or rank 0 of a distributed one, commits an iteration with :func:`commit_iteration`: its
stats lines and their held-out average (:func:`chunk_average`), then the version.

Where a partition comes from, in order: this iteration's already-written N+1 file, the
committed version N, the ``init_path`` directory (its committed version, v0 by default),
a v0 file in the checkpoint directory itself, else a seeded ``init_scale · N(0, 1)``.
The model (relation operators, global embeddings) and its Adagrad state come from the
committed version, else from ``init_path``, else from a v0 model file, else are fresh.

**Warm start after growth.** After ``pbgio import --append`` the layout may count more
entities (and, with dynamic relations, more relations) than an ``init_path`` checkpoint holds.
A table read from ``init_path`` with fewer rows than the entity count keeps its rows and
their row-wise Adagrad sums; the rows after them are those a fresh table of the full count
would have (the seeded ``init_scale · N(0, 1)`` above, rows ``stored…count-1``) with sums 0.
Dynamic relation operators with fewer relations keep theirs (and their Adagrad sums); the
new relations' parameters start as a fresh model's (identity operators, or random ones with
``--operator-init random``) with sums 0.
More rows or relations than the layout counts stay an error, and so does a smaller table in
the run's own ``checkpoint_path`` (continuing a checkpoint in place after an append is
refused: warm start a new ``checkpoint_path`` from it with ``init_path``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from pbgio.checkpoint import (
    CheckpointDir,
    EmbeddingsState,
    FileMetadata,
    IterationInfo,
    ModelState,
    commit_steps,
)
from pbgio.checks import raise_first
from pbgio.checks.checkpoint import embeddings_shape, param_names, param_shape
from pbgio.config import ConfigSchema
from pbgio.errors import ConfigError
from pbgio.optimizer_state import decode_adagrad, decode_row_adagrad, encode_row_adagrad, encode_state_dict
from pbgio.spec.checkpoint import private_to_public, public_to_private
from pbgio.storage import AnyPath
from pbgtrain.model.relation_adagrad import RelationAdagrad
from pbgtrain.model.tables import EntityTable
from pbgtrain.schedule.batching import IterationStep, stable_seed
from pbgtrain.schedule.buckets import PartitionKey, WrittenPartitions


def nothing_written(version: int) -> WrittenPartitions:
    """The partitions written into a version a single process starts building: none yet."""
    return set()


class TrainingCheckpoint:
    """Reads and writes the partitions and the model of one training run."""

    def __init__(self, path: AnyPath | str, config: ConfigSchema, *, init_path: AnyPath | str | None = None,
                 seed: int = 0, device: torch.device | str = "cpu", counts: Mapping[PartitionKey, int] | None = None,
                 written: Callable[[int], WrittenPartitions] = nothing_written) -> None:
        self.dir = CheckpointDir(path)
        self.init = CheckpointDir(init_path) if init_path is not None else None
        self.config = config
        self.seed = seed
        self.device = torch.device(device)
        self.counts = dict(counts) if counts is not None else None  # entity counts, to grow carried-over tables
        self.committed = self.dir.read_version()
        # Partitions already in version committed + 1 (in a distributed run: by any trainer); a new
        # tracker for each version, from ``written`` (the run's scheduler says which kind).
        self._written_in = written
        self.written = written(self.committed + 1)

    # ---- partitions
    def load(self, entity_type: str, part: int, count: int, device: torch.device | str | None = None) -> EntityTable:
        """The partition's table (from the version being built, the committed one, init_path, or
        freshly initialized) on ``device`` (default: the training device)."""
        dim = self.config.entity_dimension(entity_type)
        source = self._source(entity_type, part)
        if source is None:
            weights = self.fresh(entity_type, part, count)
            sums = torch.zeros(count)
        else:
            directory, version = source
            state = directory.read_embeddings(entity_type, part, version)
            path = str(directory.embeddings_path(entity_type, part, version))
            stored = state.embeddings.shape[0]
            grow = directory is self.init and stored < count and state.embeddings.shape[1:] == (dim,)
            problem = None if grow else embeddings_shape(
                path, entity_type, state.embeddings.shape, (count, dim),
                grown=not (stored > count or directory is self.init),
                source="the entity count and the config's dimension")
            if problem is not None:
                raise ConfigError(path, [problem])
            weights = torch.from_numpy(state.embeddings)
            sums = torch.from_numpy(decode_row_adagrad(state.optimizer_state, path, count=stored)) \
                if state.optimizer_state else torch.zeros(stored)
            if grow:  # the layout grew since init_path was written: new rows as a fresh table has them
                fresh = self.fresh(entity_type, part, count)
                fresh[:stored] = weights
                weights = fresh
                sums = torch.cat([sums, torch.zeros(count - stored)])
        target = self.device if device is None else torch.device(device)
        return EntityTable(weights.to(target).contiguous(), sums.to(target).contiguous(),
                           entity_type=entity_type, partition=part)

    def fresh(self, entity_type: str, part: int, count: int) -> torch.Tensor:
        """A freshly initialised table of ``count`` rows: ``init_scale · N(0, 1)``, seeded by the run's
        seed, the type and the partition."""
        gen = torch.Generator().manual_seed(stable_seed("init", self.seed, entity_type, part))
        dim = self.config.entity_dimension(entity_type)
        return torch.randn(count, dim, generator=gen).mul_(self.config.init_scale)

    def _source(self, entity_type: str, part: int) -> tuple[CheckpointDir, int] | None:
        if (entity_type, part) in self.written:
            return self.dir, self.committed + 1
        if self.committed > 0:
            return self.dir, self.committed
        if self.init is not None:
            version = self.init.read_version()
            if self.init.embeddings_path(entity_type, part, version).is_file():
                return self.init, version
        if self.dir.embeddings_path(entity_type, part, 0).is_file():
            return self.dir, 0
        return None

    def save(self, entity_type: str, part: int, partition: EntityTable, iteration: IterationInfo) -> None:
        """Write a swapped-out partition into the version being built."""
        self.dir.write_embeddings(entity_type, part, self.committed + 1, self._embeddings_state(partition),
                                  self._metadata(iteration))
        self.written.add((entity_type, part))

    def _embeddings_state(self, table: EntityTable) -> EmbeddingsState:
        return EmbeddingsState(table.weights.detach().cpu().numpy(),
                               encode_row_adagrad(table.adagrad_sum.detach().cpu().numpy(), lr=self.config.lr))

    def _metadata(self, iteration: IterationInfo | None) -> FileMetadata:
        return FileMetadata(config_json=self.config.to_json(), iteration=iteration)

    # ---- model
    def model_source(self) -> tuple[CheckpointDir, int] | None:
        """Where the model comes from: the committed version, else init_path's, else a v0 model
        file in the checkpoint directory, else None (fresh)."""
        if self.committed > 0:
            return self.dir, self.committed
        for directory in (self.init, self.dir):
            if directory is not None:
                version = directory.read_version()
                if directory.model_path(version).is_file():
                    return directory, version
        return None

    def may_grow(self, directory: CheckpointDir) -> bool:
        """Whether a model read from ``directory`` may hold fewer dynamic relations than the layout
        (it is init_path's: relations may have been appended since)."""
        return directory is self.init and self.config.dynamic_relations

    def restore_model(self, model: torch.nn.Module, optimizer: RelationAdagrad | None,
                      relation_lr: float) -> None:
        """The model and its Adagrad state from :meth:`model_source` (nothing: a fresh model);
        dynamic operators of fewer relations, from init_path, grow."""
        source = self.model_source()
        if source is None:
            return
        directory, version = source
        state = directory.read_model(version)
        path = str(directory.model_path(version))
        grow = self.may_grow(directory)
        load_model_params(model, state.params, path, grow=grow)
        if optimizer is not None:
            shapes = stored_param_shapes(model, optimizer, state.params) if grow else None
            self.restore_optimizer(optimizer, state, path, relation_lr, shapes)

    @staticmethod
    def restore_optimizer(optimizer: RelationAdagrad, state: ModelState, source: str, lr: float,
                          stored_shapes: list[tuple[int, ...]] | None = None) -> None:
        """Load a model file's Adagrad state into ``optimizer`` (its parameters in the original's
        order); the learning rate stays the config's ``lr`` (the stored one is the old run's).
        ``stored_shapes``: the stored parameters' shapes when they may hold fewer leading rows than
        the optimizer's (a warm start after relations were added); their sums are padded with 0."""
        if not state.optimizer_state:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        live = [tuple(p.shape) for p in params]
        decoded = decode_adagrad(state.optimizer_state, source, stored_shapes or live)
        if decoded is None:
            return
        decoded["state"] = {index: {key: torch.as_tensor(_padded(value, live[index]) if key == "sum" else value)
                                    if isinstance(value, np.ndarray) else value
                                    for key, value in entry.items()}
                            for index, entry in decoded["state"].items()}
        optimizer.load_state_dict(decoded)
        for group in optimizer.param_groups:
            group["lr"] = lr

    # ---- commit
    def commit(self, resident: Iterable[tuple[PartitionKey, EntityTable]], untouched: Iterable[PartitionKey],
               params: dict[str, np.ndarray], optimizer_state: dict[str, object] | None,
               iteration: IterationInfo, snapshot_epoch: int | None = None) -> int:
        """Write the rest of version committed+1 and commit it; returns the new version."""
        version = self.committed + 1
        embeddings = {key: self._embeddings_state(p) for key, p in resident if key not in self.written}
        for key in untouched:  # partitions no bucket of this iteration touched: carried over unchanged
            if key not in self.written and key not in embeddings:
                source = self._source(*key)
                if source is not None:
                    state = source[0].read_embeddings(key[0], key[1], source[1])
                    count = None if self.counts is None else self.counts.get(key)
                    if source[0] is self.init and count is not None and state.embeddings.shape[0] < count:
                        state = self._embeddings_state(self.load(key[0], key[1], count, device="cpu"))
                    embeddings[key] = state
        model = ModelState(params, encode_state_dict(optimizer_state) if optimizer_state else None)
        for step in commit_steps(self.dir, version, embeddings=embeddings, model=model,
                                    metadata=self._metadata(iteration), config=self.config,
                                    snapshot_epoch=snapshot_epoch):
            step.run()
        self.advance(version)
        return version

    def advance(self, version: int) -> None:
        """``version`` is committed (by this trainer, or by rank 0 of a distributed run)."""
        self.committed = version
        self.written = self._written_in(version + 1)


StatsLine = dict[str, Any]
"""One line of ``training_stats.json`` (:mod:`pbgio.spec.stats`)."""


def commit_iteration(ckpt: TrainingCheckpoint, step: IterationStep, lines: list[StatsLine],
                     tables: Iterable[tuple[PartitionKey, EntityTable]], untouched: Iterable[PartitionKey],
                     params: dict[str, np.ndarray], optimizer_state: dict[str, object] | None) -> int:
    """Commit iteration ``step``, the one way every run does (a single process, and rank 0 of a
    distributed run with every rank's lines); returns the new version.

    ``lines`` (every bucket's stats line of the iteration) are appended to ``training_stats.json``
    in bucket order, followed by the iteration's ``eval_stats_chunk_avg`` line when edges were held
    out (:func:`chunk_average`); then the rest of the version is written (``tables``: the partitions
    in memory; ``untouched``: every partition, those no bucket wrote being carried over) and
    committed, with an ``epoch_{k}`` snapshot where ``checkpoint_preservation_interval`` asks for
    one. Stats first, then the commit, as the original orders them: a crash in between repeats the
    iteration's lines when it is trained again, but never loses those of a committed version.
    """
    lines = sorted(lines, key=lambda line: int(line["index"]))
    average = chunk_average(lines)
    if average is not None:  # the original's per-iteration average of the held-out edges
        num_buckets = _num_buckets(ckpt.config)
        lines.append({**iteration_keys(step), "index": (step.index + 1) * num_buckets - 1,
                      "eval_stats_chunk_avg": average})
    ckpt.dir.append_stats(lines)
    return ckpt.commit(tables, untouched, params, optimizer_state, step.info(),
                       snapshot_epoch=snapshot_epoch(ckpt.config, step))


def _num_buckets(config: ConfigSchema) -> int:
    lhs, rhs = config.bucket_grid()
    return lhs * rhs


def snapshot_epoch(config: ConfigSchema, step: IterationStep) -> int | None:
    """``k`` when committing ``step`` also keeps an ``epoch_{k}/`` snapshot (the state after ``k``
    epochs, as in the original: the last iteration of every ``checkpoint_preservation_interval``-th
    epoch), else None."""
    interval = config.checkpoint_preservation_interval
    if interval and step.ends_epoch and (step.epoch_idx + 1) % interval == 0:
        return step.epoch_idx + 1
    return None


def iteration_keys(step: IterationStep) -> dict[str, int]:
    """The keys naming ``step``'s iteration on its stats lines."""
    return {"epoch_idx": step.epoch_idx, "edge_path_idx": step.edge_path_idx, "edge_chunk_idx": step.edge_chunk_idx}


def chunk_average(lines: list[StatsLine]) -> dict[str, Any] | None:
    """The iteration's held-out figure: the count-weighted average of its buckets'
    ``eval_stats_before`` (the original's ``Stats.average_list``), or None without held-out edges.

    >>> chunk_average([{"eval_stats_before": {"count": 1, "metrics": {"mrr": 1.0}}},
    ...                {"eval_stats_before": {"count": 3, "metrics": {"mrr": 0.5}}}, {"stats": {}}])
    {'count': 4, 'metrics': {'mrr': 0.625}}
    """
    befores = [line["eval_stats_before"] for line in lines if "eval_stats_before" in line]
    count = sum(b["count"] for b in befores)
    if not count:
        return None
    keys = dict.fromkeys(k for b in befores for k in b["metrics"])  # in the buckets' order
    metrics = {k: sum(b["metrics"][k] * b["count"] for b in befores if k in b["metrics"]) /
               max(sum(b["count"] for b in befores if k in b["metrics"]), 1) for k in keys}
    return {"count": count, "metrics": metrics}


def load_model_params(model: torch.nn.Module, params: dict[str, np.ndarray], source: str, *,
                      grow: bool = False) -> None:
    """Load checkpoint parameters (public names, as in ``model.vN.h5``) into ``model``, on its device;
    a parameter missing or left over is a ``model-param-name`` error naming ``source``, one of
    another shape a ``model-param-shape`` error. With ``grow`` a parameter may hold fewer leading
    rows than the model's (dynamic operators, relations added since): the model's own values fill
    the rows after them."""
    own = model.state_dict()
    loaded = {public_to_private(name) or name: torch.from_numpy(value) for name, value in params.items()}
    raise_first([param_names(source, "model", list(loaded), list(own))])
    for key, value in loaded.items():
        want = tuple(own[key].shape)
        if tuple(value.shape) == want:
            continue
        if grow and value.ndim == len(want) >= 1 and value.shape[1:] == want[1:] and value.shape[0] < want[0]:
            filled = own[key].detach().cpu().clone()
            filled[: value.shape[0]] = value
            loaded[key] = filled
            continue
        raise_first([param_shape(source, private_to_public(key) or key, tuple(value.shape), want,
                                 source="the config and the layout")])
    model.load_state_dict({k: v.to(own[k].device) for k, v in loaded.items()})


def model_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters under their public checkpoint names (as in ``model.vN.h5``)."""
    params = {}
    for key, value in model.state_dict().items():
        public = private_to_public(key)
        if public is None:
            raise RuntimeError(f"model state key {key!r} has no public checkpoint name")
        params[public] = value.detach().cpu().numpy()
    return params


def stored_param_shapes(model: torch.nn.Module, optimizer: RelationAdagrad,
                        params: Mapping[str, np.ndarray]) -> list[tuple[int, ...]]:
    """Shapes of the stored ``params`` (public names) in the optimizer's parameter order."""
    names = {id(p): name for name, p in model.named_parameters()}
    shapes = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            public = private_to_public(names[id(p)])
            value = params.get(public) if public is not None else None
            shapes.append(tuple(p.shape) if value is None else tuple(value.shape))
    return shapes


def _padded(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` with zeros after its leading rows, up to ``shape`` (unchanged when it has that shape)."""
    if value.shape == shape or value.ndim != len(shape) or value.ndim == 0:
        return value
    out = np.zeros(shape, dtype=value.dtype)
    out[: value.shape[0]] = value
    return out
