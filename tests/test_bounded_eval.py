"""Evaluation reads the rows its steps look up from the partitions' files (pbgio
CheckpointDir.map_embeddings, pbgtrain FileTable), not whole partitions, with the same metrics as
reading them whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, write_checkpoint
from pbgio.example import TEST_EDGE_PATH, build_example
from pbgio.formats.h5 import InMemoryRows, MappedRows
from pbgtrain.checkpoint_reader import FileTable
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    example = build_example(tmp_path_factory.mktemp("bounded-eval") / "layout", num_edges=3000)
    fit(load_run_config(example, ["num_epochs=1"]), FitOptions(seed=1))
    return example


def _never(*_: object, **__: object) -> None:
    raise AssertionError("a whole partition was read")


@pytest.mark.parametrize("all_entities", [False, True])
def test_eval_maps_partitions_and_its_metrics_equal_reading_them_whole(
        trained: Path, monkeypatch: pytest.MonkeyPatch, all_entities: bool) -> None:
    options = EvalOptions(edge_paths=[trained.parent / TEST_EDGE_PATH], all_entities=all_entities)
    run = load_run_config(trained)
    with monkeypatch.context() as whole:  # the reference: every partition read whole into memory
        whole.setattr(CheckpointDir, "map_embeddings",
                      lambda self, t, p, v: InMemoryRows(self.read_embeddings(t, p, v).embeddings))
        expected = evaluate_checkpoint(run, options).metrics.to_dict()
    taken: list[int] = []
    take = MappedRows.take

    def spy(self: MappedRows, rows: np.ndarray) -> np.ndarray:
        taken.append(len(rows))
        return take(self, rows)

    monkeypatch.setattr(CheckpointDir, "read_embeddings", _never)
    monkeypatch.setattr(MappedRows, "take", spy)
    assert evaluate_checkpoint(run, options).metrics.to_dict() == expected
    assert taken or all_entities  # sampled steps read their rows; every entity's ranking reads the map


def test_mapped_rows_read_the_stored_rows_and_cannot_write_them(trained: Path) -> None:
    ckpt = CheckpointDir(load_run_config(trained).checkpoint_path)
    version = ckpt.read_version()
    mapped = ckpt.map_embeddings("user", 1, version)
    stored = ckpt.read_embeddings("user", 1, version).embeddings
    assert isinstance(mapped, MappedRows) and np.array_equal(mapped.array, stored)
    wanted = np.array([3, 0, 3, len(stored) - 1])
    assert np.array_equal(mapped.take(wanted), stored[wanted])
    with pytest.raises(IndexError, match=f"row {len(stored)} asked for"):
        mapped.take(np.array([len(stored)]))
    with pytest.raises(ValueError, match="read-only"):
        mapped.array[0] += 1
    mapped.release()
    assert np.array_equal(mapped.array, stored)


def test_a_file_table_renorms_the_rows_it_reads_not_the_file(trained: Path) -> None:
    ckpt = CheckpointDir(load_run_config(trained).checkpoint_path)
    version = ckpt.read_version()
    stored = torch.from_numpy(ckpt.read_embeddings("user", 0, version).embeddings.copy())
    table = FileTable(ckpt.map_embeddings("user", 0, version), entity_type="user", partition=0)
    ids = torch.tensor([1, 2, 1])
    small = float(stored[ids].norm(dim=1).min()) / 2
    table.renorm_(ids, small)
    expected = stored.clone()
    torch.embedding_renorm_(expected, ids, small, 2.0)
    assert torch.allclose(table.gather(ids), expected[ids])
    assert np.array_equal(ckpt.read_embeddings("user", 0, version).embeddings, stored.numpy())


def test_mapped_rows_stay_readable_when_a_commit_removes_their_file(tmp_path: Path) -> None:
    """A newer commit may remove the version being evaluated (pbgtrain fit --valid, eval while fit
    commits): the rows asked for afterwards are still those of the file that was opened."""
    stored = np.arange(40, dtype=np.float32).reshape(10, 4)
    ckpt = CheckpointDir(tmp_path)
    write_checkpoint(ckpt, 1, embeddings={("user", 0): EmbeddingsState(stored)}, model=None)
    mapped = ckpt.map_embeddings("user", 0, 1)
    ckpt.embeddings_path("user", 0, 1).unlink()
    assert np.array_equal(mapped.take(np.array([9, 2])), stored[[9, 2]])
