"""Read-only access to one checkpoint version: its model and its partitions, as it was trained.

:class:`CheckpointReader` serves ``pbgtrain eval``, ``fit --valid`` and ``pbgtrain predict``. It
takes a version opened by :meth:`pbgio.layout.Layout.open_checkpoint`, so the model it builds
has the settings the checkpoint was trained with (its ``config.json``), whatever the config
passed says of them; partitions are read once and kept until :meth:`CheckpointReader.keep_only`
lets them go.
"""

from __future__ import annotations

import torch

from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.errors import MissingArtifactError
from pbgio.layout import CheckpointVersion
from pbgtrain.checkpointing import load_model_params
from pbgtrain.model import EmbeddingModel, EntityTable
from pbgtrain.plan.buckets import PartitionKey


class CheckpointReader:
    """One version's model (on ``device``, in eval mode) and its partitions, read on demand."""

    def __init__(self, opened: CheckpointVersion, device: torch.device) -> None:
        self.layout = opened.layout
        self.dir = opened.checkpoint
        self.version = opened.version
        if self.version == 0 and not self.dir.model_path(0).is_file():
            raise MissingArtifactError(str(self.dir.path), "committed checkpoint (train first with pbgtrain fit)")
        self.device = device
        cfg = opened.config
        num_dynamic = read_dynamic_rel_count(opened.entity_path) if cfg.dynamic_relations else None
        self.model = EmbeddingModel.from_config(cfg, num_dynamic).to(device)
        state = self.dir.read_model(self.version)
        load_model_params(self.model, state.params, str(self.dir.model_path(self.version)))
        self.model.eval()
        self.counts = {(etype, part): read_entity_count(opened.entity_path, etype, part)
                       for etype, entity in cfg.entities.items() for part in range(entity.num_partitions)}
        self._tables: dict[PartitionKey, EntityTable] = {}

    def table(self, entity_type: str, part: int) -> EntityTable:
        key = (entity_type, part)
        if key not in self._tables:
            state = self.dir.read_embeddings(entity_type, part, self.version)
            self._tables[key] = EntityTable(torch.from_numpy(state.embeddings).to(self.device),
                                            entity_type=entity_type, partition=part)
        return self._tables[key]

    def keep_only(self, keys: set[PartitionKey]) -> None:
        for key in list(self._tables):
            if key not in keys:
                del self._tables[key]
