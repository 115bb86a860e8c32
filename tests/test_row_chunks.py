"""Issue 45: stages read an embeddings table a row chunk at a time (``PBG_ROW_CHUNK_BYTES``), never a
whole partition, and what they write or report does not depend on the chunk size."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import parse_config
from pbgio.entities import write_entity_count, write_entity_names
from pbgio.errors import Issue
from pbgio.exporters import ExportError, embed_bags, export_embeddings
from pbgio.formats.h5 import DEFAULT_ROW_CHUNK_BYTES, ROW_CHUNK_BYTES_ENV, row_chunk_bytes
from pbgio.progress import Progress
from pbgio.spec import naming
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.testing import small_valid_layout, write_layout
from pbgio.validate import validate_path

DIM = 5
ROW_BYTES = DIM * 4
SIZES = [40, 0, 33]  # rows of partitions 0, 1 (empty), 2 of type "node"
CHUNK_BYTES = [ROW_BYTES, 3 * ROW_BYTES, 7 * ROW_BYTES + 1]  # 1, 3 and 7 rows a chunk
EXPORTS: dict[str, dict[str, Any]] = {
    "tsv": {"fmt": "tsv"},
    "parquet-list": {"fmt": "parquet", "parquet_layout": "list"},
    "parquet-columns": {"fmt": "parquet", "parquet_layout": "columns"},
    "npy": {"fmt": "npy"},
}


def _names(part: int, count: int) -> list[str]:
    return [f"n{part}-{i}-{'é' * (i % 3)}✓" for i in range(count)]


def _write_chunk_layout(root: Path) -> Path:
    """One type ``node`` of partitions :data:`SIZES` with names, a global embedding, and version 1."""
    cfg = parse_config({"entities": {"node": {"num_partitions": len(SIZES)}},
                        "relations": [{"name": "r", "lhs": "node", "rhs": "node"}], "dimension": DIM,
                        "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model"})
    (root / "config.json").write_text(cfg.to_json())
    rng = np.random.default_rng(45)
    embeddings = {}
    for part, count in enumerate(SIZES):
        write_entity_names(root / "data", "node", part, _names(part, count))
        write_entity_count(root / "data", "node", part, count)
        embeddings["node", part] = EmbeddingsState(rng.standard_normal((count, DIM)).astype(np.float32))
    model = ModelState({global_embedding_name("node"): rng.standard_normal(DIM).astype(np.float32)})
    write_checkpoint(CheckpointDir(root / "model"), 1, embeddings=embeddings, model=model, config=cfg)
    return root / "config.json"


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_chunk_layout(tmp_path_factory.mktemp("chunks"))


@pytest.fixture
def bounded_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """While in use: a whole-partition read (``read_embeddings``) fails the test, and the bytes of
    every read of an ``embeddings`` dataset are recorded."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a whole partition was read")

    sizes: list[int] = []
    getitem = h5py.Dataset.__getitem__

    def spy(ds: h5py.Dataset, key: Any, *args: Any, **kwargs: Any) -> Any:
        value = getitem(ds, key, *args, **kwargs)
        if ds.name == "/embeddings":
            sizes.append(np.asarray(value).nbytes)
        return value

    monkeypatch.setattr(CheckpointDir, "read_embeddings", refuse)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    return sizes


def _export(config: Path, out: Path, kind: str) -> dict[str, str]:
    """Export ``kind`` to ``out``; every file written, by name, with its digest."""
    target = out / "e.tsv" if kind == "tsv" else out / "e"
    export_embeddings(config, target, **EXPORTS[kind])
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the setting and the reader


@pytest.mark.parametrize("value", ["lots", "1.5", "0", "-8"])
def test_a_bad_chunk_size_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, value)
    with pytest.raises(ValueError, match=rf"^{ROW_CHUNK_BYTES_ENV}: expected (a number of bytes|at least 1 byte), "
                                         rf"found '?{value}'?$"):
        row_chunk_bytes()


def test_the_chunk_size_defaults_to_64_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROW_CHUNK_BYTES_ENV, raising=False)
    assert row_chunk_bytes() == DEFAULT_ROW_CHUNK_BYTES == 64 << 20
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, "")
    assert row_chunk_bytes() == DEFAULT_ROW_CHUNK_BYTES
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, "4096")
    assert row_chunk_bytes() == 4096


@pytest.mark.parametrize("chunk_bytes", [1, *CHUNK_BYTES, 1 << 30])
def test_row_chunks_are_bounded_and_make_the_table(layout: Path, monkeypatch: pytest.MonkeyPatch,
                                                   chunk_bytes: int) -> None:
    ckpt = CheckpointDir(layout.parent / "model")
    whole = ckpt.read_embeddings("node", 0, 1).embeddings
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(chunk_bytes))
    chunks = list(ckpt.iter_embedding_rows("node", 0, 1))
    assert all(rows.nbytes <= max(chunk_bytes, ROW_BYTES) for _, rows in chunks)  # one row at least
    assert all(rows.dtype == np.float32 and rows.flags.c_contiguous for _, rows in chunks)
    assert [start for start, _ in chunks] == list(np.cumsum([0] + [len(rows) for _, rows in chunks[:-1]]))
    assert np.array_equal(np.concatenate([rows for _, rows in chunks]).view(np.uint32), whole.view(np.uint32))
    assert list(ckpt.iter_embedding_rows("node", 1, 1)) == []  # the empty partition


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_export_bytes_do_not_depend_on_the_chunk_size(layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      bounded_reads: list[int], kind: str) -> None:
    """Partitions of 40, 0 and 33 rows, in chunks of 1, 3 or 7 rows (names and rows cut at different
    places) or whole: the same files, byte for byte, and no read beyond a chunk."""
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(1 << 30))
    whole = _export(layout, tmp_path / "whole", kind)
    assert len(whole) == (2 if kind == "npy" else 1)
    for chunk_bytes in CHUNK_BYTES:
        monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(chunk_bytes))
        bounded_reads.clear()
        assert _export(layout, tmp_path / str(chunk_bytes), kind) == whole, chunk_bytes
        assert bounded_reads and max(bounded_reads) <= chunk_bytes


def test_export_rows_are_the_table_plus_the_global_embedding(layout: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = CheckpointDir(layout.parent / "model")
    want = np.concatenate([ckpt.read_embeddings("node", p, 1).embeddings for p in range(len(SIZES))])
    want = want + ckpt.read_model(1).params[global_embedding_name("node")]
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(3 * ROW_BYTES))
    export_embeddings(layout, tmp_path / "node.npy", fmt="npy")
    assert np.array_equal(np.load(tmp_path / "node.npy").view(np.uint32), want.view(np.uint32))
    names = json.loads((tmp_path / "node.names.json").read_text(encoding="utf-8"))
    assert names == [name for part, count in enumerate(SIZES) for name in _names(part, count)]


def test_export_progress_counts_partitions(layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Recorder(Progress):
        def __init__(self) -> None:
            self.total: float | None = None
            self.done = 0.0

        def start(self, description: str, total: float | None = None) -> None:
            self.total = total

        def advance(self, amount: float = 1) -> None:
            self.done += amount

    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(ROW_BYTES))
    progress = Recorder()
    export_embeddings(layout, tmp_path / "e.tsv", progress=progress)
    assert progress.total == progress.done == len(SIZES)


@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("tsv", "tab", r"entity_names_node_2\.json: name 31 \('bad\\tname'\) holds a tab or a line break, which TSV "
                   r"cannot hold \(2 names in all\)"),
    ("npy", "surrogate", r"entity_names_node_2\.json: name 31 \('bad\\ud800'\) holds the lone surrogate"),
    ("parquet-list", "surrogate", r"entity_names_node_2\.json: name 31 \('bad\\ud800'\) holds the lone surrogate"),
    ("tsv", "short", r"embeddings_node_2\.v1\.h5: expected 32 rows \(entity_names_node_2\.json\), found 33"),
    ("npy", "short", r"embeddings_node_2\.v1\.h5: expected 32 rows \(entity_names_node_2\.json\), found 33"),
])
def test_export_refusals_do_not_depend_on_the_chunk_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         bounded_reads: list[int], kind: str, edit: str,
                                                         message: str) -> None:
    """A bad name late in a partition read in chunks of 3 rows is named by its row in the partition,
    as when the partition is one chunk; no output is left."""
    config = _write_chunk_layout(tmp_path)
    names = _names(2, SIZES[2])
    if edit == "tab":
        names[31], names[32] = "bad\tname", "also\nbad"
    elif edit == "surrogate":
        names[31] = "bad\ud800"
    else:
        names = names[:32]
    (tmp_path / "data" / naming.entity_names_file("node", 2)).write_text(json.dumps(names), encoding="utf-8")
    for chunk_bytes in (3 * ROW_BYTES, 1 << 30):
        monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(chunk_bytes))
        out = tmp_path / f"out{chunk_bytes}"
        with pytest.raises(ExportError, match=message):
            export_embeddings(config, out / ("e.tsv" if kind == "tsv" else "e"),
                              **{**EXPORTS[kind], "add_global": False})
        assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


@pytest.mark.parametrize("parquet_layout", ["list", "columns"])
def test_a_parquet_of_many_row_groups_is_cut_as_whole_partitions_were(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      parquet_layout: str) -> None:
    """Partitions of several names chunks and row groups: the file written from small row chunks is,
    byte for byte, the one written from frames of whole partitions (their names read in the names
    file's chunks, as export read them before rows came a chunk at a time)."""
    import polars as pl

    from pbgio.entities import iter_entity_names

    sizes = [150_000, 90_001]
    cfg = parse_config({"entities": {"node": {"num_partitions": len(sizes)}},
                        "relations": [{"name": "r", "lhs": "node", "rhs": "node"}], "dimension": 2,
                        "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model"})
    (tmp_path / "config.json").write_text(cfg.to_json())
    rng = np.random.default_rng(7)
    tables = {}
    for part, count in enumerate(sizes):
        write_entity_names(tmp_path / "data", "node", part, [f"entity-{part}-{i}" for i in range(count)])
        write_entity_count(tmp_path / "data", "node", part, count)
        tables["node", part] = EmbeddingsState(rng.standard_normal((count, 2)).astype(np.float32))
    write_checkpoint(CheckpointDir(tmp_path / "model"), 1, embeddings=tables, model=ModelState({}), config=cfg)

    frames = []
    for part in range(len(sizes)):
        names = pl.concat([pl.Series("name", chunk, dtype=pl.String)
                           for chunk in iter_entity_names(tmp_path / "data", "node", part)])
        values = tables["node", part].embeddings
        assert len(names.chunk_lengths()) > 1
        if parquet_layout == "list":
            frames.append(pl.DataFrame([names, pl.Series("embedding", values, dtype=pl.Array(pl.Float32, 2))]))
        else:
            frames.append(pl.DataFrame({"name": names, "dim_0": values[:, 0], "dim_1": values[:, 1]}))
    whole, cut = tmp_path / "whole.parquet", tmp_path / "cut.parquet"
    _sink(frames, whole)
    _sink([frame.slice(start, 7_000) for frame in frames for start in range(0, len(frame), 7_000)], cut)
    assert cut.read_bytes() != whole.read_bytes()  # row groups follow the frames given

    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(7_000 * 2 * 4))
    out = tmp_path / "node.parquet"
    export_embeddings(tmp_path / "config.json", out, fmt="parquet", parquet_layout=parquet_layout, add_global=False)
    assert out.read_bytes() == whole.read_bytes()


def _sink(frames: list[Any], path: Path) -> None:
    """Write ``frames`` (polars) into one Parquet file as export hands them to polars: a source of frames."""
    from polars.io.plugins import register_io_source

    register_io_source(lambda *_: iter(frames), schema=frames[0].schema).sink_parquet(path)


def test_export_refuses_a_table_of_another_dimension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     bounded_reads: list[int]) -> None:
    write_layout(tmp_path, small_valid_layout(featurized=False))
    path = tmp_path / "checkpoint" / naming.embeddings_file("user", 1, 1)
    with h5py.File(path, "r+") as f:
        table = f["embeddings"][...]
        del f["embeddings"]
        f["embeddings"] = np.concatenate([table, table], axis=1)
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(3 * 4 * 8))
    with pytest.raises(ExportError, match=r"expected 9 rows of dimension 4 for 'user' \(entity counts, config\), "
                                          r"found rows of dimension 8 beyond row 5"):
        export_embeddings(tmp_path / "config.json", tmp_path / "out", fmt="npy", add_global=False)
    with pytest.raises(ExportError, match=r"^expected dimension 4, found 8$"):
        export_embeddings(tmp_path / "config.json", tmp_path / "out", fmt="parquet", add_global=False)


def test_bags_read_only_their_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       bounded_reads: list[int]) -> None:
    """A featurized partition of 9 rows: bags of offsets averaged from the rows they name, none else read."""
    write_layout(tmp_path, small_valid_layout())
    ckpt = CheckpointDir(tmp_path / "checkpoint")
    with h5py.File(ckpt.embeddings_path("doc", 0, 1), "r") as f:
        table = np.asarray(f["embeddings"][...])
    bounded_reads.clear()
    shift = ckpt.read_model(1).params[global_embedding_name("doc")]
    bags = [[0, 8], [3], [8, 8, 1]]
    got = embed_bags(tmp_path / "config.json", "doc", bags)
    want = [np.mean([(table[i] + shift).astype(np.float64) for i in bag], axis=0) for bag in bags]
    np.testing.assert_array_equal(got, np.asarray(want, dtype=np.float32))
    assert bounded_reads == [4 * table.shape[1] * 4]  # rows 0, 1, 3 and 8, once each


# --------------------------------------------------------------------------- validate


def _issues(config: Path) -> list[Issue]:
    return validate_path(config).issues


def test_validate_reports_the_same_rows_whatever_the_chunk_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                bounded_reads: list[int]) -> None:
    """Non-finite values planted in the first and in late rows of later chunks are reported at their
    rows in the file, in chunks of 1 or 3 rows as in one chunk; no read beyond a chunk."""
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    planted: dict[tuple[str, int], list[tuple[int, int, float]]] = {
        ("user", 0): [(0, 1, np.inf), (4, 3, np.nan)],  # 5 rows of dimension 4
        ("item", 0): [(5, 0, -np.inf), (6, 5, np.nan)],  # 7 rows of dimension 6
    }
    for (entity_type, part), cells in planted.items():
        with h5py.File(tmp_path / "checkpoint" / naming.embeddings_file(entity_type, part, 1), "r+") as f:
            for row, column, value in cells:
                f["embeddings"][row, column] = value
    monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(1 << 30))
    whole = _issues(config)
    found = {issue.file: issue for issue in whole if issue.rule == "embeddings-nonfinite"}
    assert found["checkpoint/embeddings_user_0.v1.h5"].rows == (0, 4)
    assert found["checkpoint/embeddings_item_0.v1.h5"].rows == (5, 6)
    assert "expected finite values, found inf" in found["checkpoint/embeddings_user_0.v1.h5"].message
    assert "expected finite values, found -inf" in found["checkpoint/embeddings_item_0.v1.h5"].message
    for chunk_bytes in (1, 3 * 4 * 4):
        monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(chunk_bytes))
        bounded_reads.clear()
        assert _issues(config) == whole, chunk_bytes
        assert bounded_reads and max(bounded_reads) <= max(chunk_bytes, 6 * 4)


def test_validate_names_the_first_nonfinite_row_of_a_late_chunk(layout: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition 0 (40 rows) read 3 rows at a time: a NaN in row 38 (chunk 12, its third row) is row 38."""
    path = CheckpointDir(layout.parent / "model").embeddings_path("node", 0, 1)
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    with h5py.File(copy, "r+") as f:
        f["embeddings"][38, 4] = np.nan
    issues = {}
    for chunk_bytes in (3 * ROW_BYTES, 1 << 30):
        monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(chunk_bytes))
        issues[chunk_bytes] = [i for i in _issues(copy) if i.rule == "embeddings-nonfinite"]
    assert issues[3 * ROW_BYTES] == issues[1 << 30]
    (issue,) = issues[1 << 30]
    assert issue.rows == (38,) and issue.count == 1 and "found nan" in issue.message
