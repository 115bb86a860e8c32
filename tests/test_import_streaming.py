"""The streaming path: files read in blocks (as large inputs are), and the name index behind the dictionaries.

Small inputs are normally parsed whole and kept in memory for the second pass; here
``IN_MEMORY_BYTES = 0`` and tiny blocks force every file through the block reader, so
that line numbers, long lines, missing final line breaks and Parquet slices are checked
the way a 50M-edge import meets them.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbgio.errors import InputError
from pbgio.importers import InputOptions, import_edge_lists, importer, read
from pbgio.importers.nameindex import NameIndex
from pbgio.progress import Progress
from pbgio.testing.edgelists import layout_edges
from pbgio.validate import validate_path
from tests.profiles import examples

NAMES = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\t\n\r\ufeff"),
                min_size=1, max_size=8)


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(read, "BLOCK_BYTES", 16)
    monkeypatch.setattr(read, "PARQUET_ROWS", 3)


def write_config(root: Path, partitions: int = 2, **overrides: object) -> Path:
    config = {"entities": {"n": {"num_partitions": partitions}},
              "relations": [{"name": "r", "lhs": "n", "rhs": "n"}, {"name": "s", "lhs": "n", "rhs": "n"}],
              "dimension": 4, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
              **overrides}
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_blocks_cover_every_line_once(tmp_path: Path, tiny_blocks: None) -> None:
    path = tmp_path / "t.txt"
    long_line = "x" * 100 + "\n"  # longer than a block
    path.write_bytes(("a\nbb\r\n\n" + long_line + "ccc\n" * 7 + "last").encode())
    blocks = list(read._line_blocks(path))
    assert b"".join(block for block, _, _ in blocks) == path.read_bytes()
    assert all(block.endswith(b"\n") for block, _, _ in blocks[:-1])
    starts = [1 + sum(b.count(b"\n") for b, _, _ in blocks[:i]) for i in range(len(blocks))]
    assert [first for _, first, _ in blocks] == starts
    ends = [sum(len(b) for b, _, _ in blocks[: i + 1]) for i in range(len(blocks))]
    assert [end for _, _, end in blocks] == ends
    (tmp_path / "empty.txt").write_bytes(b"")
    assert list(read._line_blocks(tmp_path / "empty.txt")) == [(b"", 1, 0)]


def test_line_numbers_across_blocks(tmp_path: Path, tiny_blocks: None) -> None:
    config = write_config(tmp_path)
    good = [f"a{i}\tr\tb{i}" for i in range(40)]
    lines = ["\ufeff" + good[0], *good[1:10], "", "bad\tr", *good[10:25], "x" * 50, "", *good[25:], "z\tq\tw"]
    path = tmp_path / "t.tsv"
    path.write_text("\r\n".join(lines), encoding="utf-8")  # CRLF, BOM, no final line break
    with pytest.raises(InputError) as info:
        import_edge_lists(config, [path])
    assert (info.value.line, info.value.count) == (12, 3)
    report = import_edge_lists(config, [path], on_error="skip")
    assert [p.line for p in report.files[0].problems] == [12, 28, 45]
    assert "found 'q'" in report.files[0].problems[2].message
    assert (report.read, report.kept, report.skipped) == (43, 40, 3)
    got = Counter(e[:3] for e in layout_edges(config)["data/train"])
    assert got == Counter((f"a{i}", "r", f"b{i}") for i in range(40))
    assert validate_path(config).ok


def test_invalid_utf8_in_a_later_block(tmp_path: Path, tiny_blocks: None) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "t.tsv"
    path.write_bytes(b"".join(b"a%d\tr\tb\n" % i for i in range(20)) + b"c\tr\t\xffd\n")
    with pytest.raises(InputError, match=r"t.tsv:21: expected UTF-8 text"):
        import_edge_lists(config, [path], on_error="skip")
    assert not (tmp_path / "data").exists()


def test_header_and_weights_in_blocks(tmp_path: Path, tiny_blocks: None) -> None:
    config = write_config(tmp_path)
    rows = [(f"u{i}", "s" if i % 2 else "r", f"v{i % 7}", f"{i / 8}") for i in range(30)]
    path = tmp_path / "t.csv"
    path.write_text("dst,w,rel,src\n" + "".join(f"{c},{w},{r},{a}\n" for a, r, c, w in rows), encoding="utf-8")
    options = InputOptions(delimiter=",", header=True, lhs_col="src", rel_col="rel", rhs_col="dst", weight_col="w")
    report = import_edge_lists(config, [path], options=options)
    assert report.kept == 30 and report.files[0].rows == 30
    got = sorted(layout_edges(config)["data/train"])
    assert got == sorted((a, r, c, float(np.float32(w))) for a, r, c, w in rows)


def test_parquet_in_slices(tmp_path: Path, tiny_blocks: None) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "t.parquet"
    frame = pl.DataFrame({"s": [f"a{i}" for i in range(10)], "r": ["r", "s"] * 5,
                          "d": [f"b{i % 3}" for i in range(10)]})
    frame = frame.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(None).otherwise(pl.col("s")).alias("s"))
    frame.write_parquet(path)
    report = import_edge_lists(config, [path], on_error="skip")
    assert [p.line for p in report.files[0].problems] == [8]
    assert report.kept == 9
    assert sorted(e[:3] for e in layout_edges(config)["data/train"]) == sorted(
        (s, r, d) for s, r, d in frame.rows() if s is not None)


@settings(max_examples=examples(20), deadline=None)
@given(st.lists(st.tuples(NAMES, st.sampled_from(["r", "s"]), NAMES), min_size=1, max_size=80),
       st.integers(1, 3), st.integers(8, 64))
def test_streamed_import_equals_in_memory_import(rows: list[tuple[str, str, str]], partitions: int,
                                                 block: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        path = root / "t.tsv"
        path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
        layouts = []
        for in_memory, block_bytes in ((importer.IN_MEMORY_BYTES, read.BLOCK_BYTES), (0, block)):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(importer, "IN_MEMORY_BYTES", in_memory)
                mp.setattr(read, "BLOCK_BYTES", block_bytes)
                (root / f"m{in_memory}").mkdir()
                config = write_config(root / f"m{in_memory}", partitions)
                import_edge_lists(config, [path], seed=3)
                assert validate_path(config).ok
                data = root / f"m{in_memory}" / "data"
                layouts.append({p.name: p.read_bytes() for p in sorted(data.iterdir()) if p.is_file()})
                layouts[-1]["edges"] = layout_edges(config)["data/train"]  # type: ignore[assignment]
        assert layouts[0] == layouts[1]  # same dictionaries, partitions and edges in the same order
        assert Counter(e[:3] for e in layouts[1]["edges"]) == Counter(rows)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- name index


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.lists(NAMES, max_size=300), min_size=1, max_size=6), st.lists(NAMES, max_size=50))
def test_name_index_counts_and_finds_every_name(batches: list[list[str]], probes: list[str]) -> None:
    index = NameIndex()
    for batch in batches:
        index.add(pl.Series(batch, dtype=pl.String))
    expected = Counter(name for batch in batches for name in batch)
    names = index.names().to_list()
    assert len(index) == len(names) == len(expected) == len(set(names))
    assert {name: int(index.counts[i]) for i, name in enumerate(names)} == expected
    ids = index.lookup(pl.Series(probes + names, dtype=pl.String)).tolist()
    assert [names[i] if i >= 0 else None for i in ids] == [p if p in expected else None for p in probes] + names
    index.compact()
    index.drop_names()
    assert index.lookup(pl.Series(names, dtype=pl.String)).tolist() == list(range(len(names)))


def test_name_index_grows_past_many_resizes() -> None:
    index = NameIndex()
    rng = np.random.default_rng(0)
    for _ in range(5):
        index.add(pl.Series(rng.integers(0, 60_000, 40_000)).cast(pl.String))
    names = index.names()
    assert len(names) == names.n_unique() and int(index.counts.sum()) == 200_000
    assert (index.lookup(names) == np.arange(len(names))).all()
    assert (index.lookup(pl.Series(["-1", "nope", "60000"])) == -1).all()


class RecordingProgress(Progress):
    def __init__(self) -> None:
        self.stages: list[list[float]] = []  # [total, advanced]

    def start(self, description: str, total: float | None = None) -> None:
        self.stages.append([total or 0.0, 0.0])

    def advance(self, amount: float = 1) -> None:
        self.stages[-1][1] += amount


def test_progress_stages_reach_their_totals(tmp_path: Path, tiny_blocks: None) -> None:
    config = write_config(tmp_path, partitions=2)
    path = tmp_path / "t.tsv"
    path.write_text("".join(f"a{i}\tr\tb{i % 5}\n" for i in range(50)), encoding="utf-8")
    progress = RecordingProgress()
    import_edge_lists(config, [path], progress=progress)
    assert len(progress.stages) == 5  # counting, dictionaries, entity names, edges, buckets
    for total, advanced in progress.stages:
        assert advanced == pytest.approx(total)
