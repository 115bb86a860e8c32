"""The trainer's view of a checkpoint directory, with the original's version semantics.

Version N holds the state after N completed iterations (one iteration = one edge chunk
of one edge path in one epoch). While iteration N runs, partitions that are swapped out
are written straight into version N+1 files; at the end, the partitions still resident
and the model are written too, then :func:`pbgio.checkpoint.plan_checkpoint` commits
N+1 (the version file last) and removes version N. A crash at any point leaves version N
intact and the run resumes from it. All file access goes through :mod:`pbgio`.

Where a partition comes from, in order: this iteration's already-written N+1 file, the
committed version N, the ``init_path`` directory (its committed version, v0 by default),
a v0 file in the checkpoint directory itself, else a seeded ``init_scale · N(0, 1)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np
import torch

from pbgio.checkpoint import (
    CheckpointDir,
    EmbeddingsState,
    FileMetadata,
    IterationInfo,
    ModelState,
    plan_checkpoint,
)
from pbgio.config import ConfigSchema
from pbgio.errors import ConfigError, FormatError, Issue
from pbgio.optimizer_state import decode_adagrad, decode_row_adagrad, encode_row_adagrad, encode_state_dict
from pbgio.spec.checkpoint import MODEL_DEFINING_KEYS, public_to_private
from pbgio.spec.rules import rule
from pbgio.storage import AnyPath
from pbgtrain.batching import stable_seed
from pbgtrain.model.tables import EntityTable

PartitionKey = tuple[str, int]


class WrittenPartitions(Protocol):
    """The partitions written into the version being built: a set, or the store of a distributed run."""

    def add(self, key: PartitionKey) -> None: ...

    def __contains__(self, key: object) -> bool: ...

    def clear(self) -> None: ...


class TrainingCheckpoint:
    """Reads and writes the partitions and the model of one training run."""

    def __init__(self, path: AnyPath, config: ConfigSchema, *, init_path: AnyPath | None = None, seed: int = 0,
                 device: torch.device | str = "cpu") -> None:
        self.dir = CheckpointDir(path)
        self.init = CheckpointDir(init_path) if init_path is not None else None
        self.config = config
        self.seed = seed
        self.device = torch.device(device)
        self.committed = self.dir.read_version()
        # Partitions already in version committed + 1 (in a distributed run: by any trainer).
        self.written: WrittenPartitions = set()
        if self.committed > 0:
            check_same_model(self.dir, config)

    # ---- partitions
    def load(self, entity_type: str, part: int, count: int, device: torch.device | str | None = None) -> EntityTable:
        """The partition's table (from the version being built, the committed one, init_path, or
        freshly initialized) on ``device`` (default: the training device)."""
        dim = self.config.entity_dimension(entity_type)
        source = self._source(entity_type, part)
        if source is None:
            gen = torch.Generator().manual_seed(stable_seed("init", self.seed, entity_type, part))
            weights = torch.randn(count, dim, generator=gen).mul_(self.config.init_scale)
            sums = torch.zeros(count)
        else:
            directory, version = source
            state = directory.read_embeddings(entity_type, part, version)
            path = str(directory.embeddings_path(entity_type, part, version))
            if state.embeddings.shape != (count, dim):
                raise ConfigError(path, [rule("embeddings-shape").issue(
                    path, "embeddings", f"expected shape ({count}, {dim}) from the entity count and the "
                    f"config's dimension, found {state.embeddings.shape}")])
            weights = torch.from_numpy(state.embeddings)
            sums = torch.from_numpy(decode_row_adagrad(state.optimizer_state, path, count=count)) \
                if state.optimizer_state else torch.zeros(count)
        target = self.device if device is None else torch.device(device)
        return EntityTable(weights.to(target).contiguous(), sums.to(target).contiguous(),
                           entity_type=entity_type, partition=part)

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
    def load_model(self) -> ModelState | None:
        """The model of the committed version, else of init_path, else None (fresh)."""
        if self.committed > 0:
            return self.dir.read_model(self.committed)
        for directory in (self.init, self.dir):
            if directory is not None:
                version = directory.read_version()
                if directory.model_path(version).is_file():
                    return directory.read_model(version)
        return None

    @staticmethod
    def restore_optimizer(optimizer: torch.optim.Optimizer, state: ModelState, source: str, lr: float) -> None:
        """Load a model file's Adagrad state into ``optimizer`` (its parameters in the original's
        order); the learning rate stays the config's ``lr`` (the stored one is the old run's)."""
        if not state.optimizer_state:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        decoded = decode_adagrad(state.optimizer_state, source, [tuple(p.shape) for p in params])
        if decoded is None:
            return
        decoded["state"] = {index: {key: torch.as_tensor(value) if isinstance(value, np.ndarray) else value
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
                    embeddings[key] = source[0].read_embeddings(key[0], key[1], source[1])
        model = ModelState(params, encode_state_dict(optimizer_state) if optimizer_state else None)
        for step in plan_checkpoint(self.dir, version, embeddings=embeddings, model=model,
                                    metadata=self._metadata(iteration), config=self.config,
                                    snapshot_epoch=snapshot_epoch):
            step.run()
        self.advance(version)
        return version

    def advance(self, version: int) -> None:
        """``version`` is committed (by this trainer, or by rank 0 of a distributed run)."""
        self.committed = version
        self.written.clear()


def check_same_model(directory: CheckpointDir, config: ConfigSchema) -> None:
    """Refuse to resume a checkpoint written for a different model."""
    try:
        saved = directory.read_config().to_dict()
    except Exception:  # an unreadable config.json is reported by the validator, not here
        return
    current = config.to_dict()
    differ = [k for k in MODEL_DEFINING_KEYS if saved.get(k) != current.get(k)]
    if differ:
        path = str(directory.path / "config.json")
        raise ConfigError(path, [rule("checkpoint-config-mismatch").issue(
            path, key, f"expected {key} as in the checkpoint being resumed ({saved.get(key)!r}), found "
            f"{current.get(key)!r}; use a new checkpoint_path or the same model settings") for key in differ])


def load_model_params(model: torch.nn.Module, params: dict[str, np.ndarray], source: str) -> None:
    """Load checkpoint parameters (public names, as in ``model.vN.h5``) into ``model``, on its device;
    a parameter missing or left over is a ``model-param-name`` error naming ``source``."""
    own = model.state_dict()
    loaded = {public_to_private(name) or name: torch.from_numpy(value) for name, value in params.items()}
    missing = sorted(set(own) - set(loaded))
    unexpected = sorted(set(loaded) - set(own))
    if missing or unexpected:
        raise FormatError(Issue("model-param-name", "error", source, "model",
                                f"expected the parameters {sorted(own)}, found {sorted(loaded)} "
                                f"(missing {missing}, unexpected {unexpected})"))
    model.load_state_dict({k: v.to(own[k].device) for k, v in loaded.items()})
