"""Read-only access to one checkpoint version: its model and its partitions, as it was trained.

:class:`CheckpointReader` serves ``pbgtrain eval``, ``fit --valid`` and ``pbgtrain predict``. It
takes a version opened by :meth:`pbgio.layout.Layout.open_checkpoint`, so the model it builds
has the settings the checkpoint was trained with (its ``config.json``), whatever the config
passed says of them; partitions are read once and kept until :meth:`CheckpointReader.keep_only`
lets them go. On a CPU a partition is read row by row where its file allows
(:meth:`pbgio.checkpoint.CheckpointDir.map_embeddings`, :class:`FileTable`): a step reads the rows
it looks up, so sampled evaluation holds a batch's rows, not two partitions; what reads a whole table
(ranking against every entity) reads it through a memory map whose pages
:meth:`CheckpointReader.keep_only` lets go at every bucket.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from pbgio.checkpoint import TableRows
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.errors import MissingArtifactError
from pbgio.layout import CheckpointVersion
from pbgio.training_memory import check_parameters
from pbgtrain.checkpointing import load_model_params
from pbgtrain.model import EmbeddingModel, EntityTable
from pbgtrain.schedule.buckets import PartitionKey


class FileTable(EntityTable):
    """A partition read in place, never written (evaluation, predictions): ``weights`` is the
    file's read-only map (shape, dtype; read whole only by what needs every row), and a step's
    lookups (:meth:`gather`) read exactly their rows from the file."""

    def __init__(self, rows: TableRows, *, entity_type: str, partition: int) -> None:
        with warnings.catch_warnings():  # a map is read-only, and nothing writes to this table
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            weights = torch.from_numpy(rows.array)
        super().__init__(weights, entity_type=entity_type, partition=partition)
        self.rows = rows
        self._max_norm: float | None = None

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.from_numpy(self.rows.take(ids.numpy()))
        if self._max_norm is not None:  # what renorm_ would have done to the table, done to the copy
            torch.embedding_renorm_(rows, torch.arange(len(rows)), self._max_norm, 2.0)
        return rows

    def renorm_(self, ids: torch.Tensor, max_norm: float) -> None:
        """The file is never written: the rows read are renormed instead (:meth:`gather`), the
        same rows a renormed table would give."""
        self._max_norm = max_norm


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
        check_parameters(cfg, num_dynamic, opened.layout.source)  # too large for memory: refused, not allocated
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
            self._tables[key] = self._read(entity_type, part)
        return self._tables[key]

    def _read(self, entity_type: str, part: int) -> EntityTable:
        """On a CPU, the partition read row by row (:class:`FileTable`); on another device, copied there."""
        rows = self.dir.map_embeddings(entity_type, part, self.version)
        if self.device.type == "cpu":
            return FileTable(rows, entity_type=entity_type, partition=part)
        table = torch.from_numpy(np.array(rows.array, dtype=np.float32)).to(self.device)
        return EntityTable(table, entity_type=entity_type, partition=part)

    def keep_only(self, keys: set[PartitionKey]) -> None:
        """Drop the tables not in ``keys``; of the others, let go the pages read whole so far."""
        for key in list(self._tables):
            if key not in keys:
                del self._tables[key]
        for table in self._tables.values():
            if isinstance(table, FileTable):
                table.rows.release()
