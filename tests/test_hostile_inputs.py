"""Hostile inputs: names of every Unicode class and megabyte length, names files of
millions of names, paths with spaces and non-ASCII characters, symbolic link loops inside a
layout, config values at every schema bound.

Bad input gets a precise pbgio error (file, line or row, rule), never a raw traceback, never a
silent acceptance, never lost or corrupted data. See docs/guides/hostile-inputs.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import textwrap
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import ConfigSchema, load_config, parse_config
from pbgio.entities import (
    iter_entity_names,
    read_entity_count,
    read_entity_names,
    read_relation_names,
    write_entity_count,
    write_entity_names,
    write_name_list,
)
from pbgio.errors import ConfigError, FormatError, InputError, MissingArtifactError, PbgioError
from pbgio.exporters import ExportError, export_embeddings
from pbgio.importers import import_edge_lists
from pbgio.importers.plan import ImportSetupError
from pbgio.info import summarize
from pbgio.spec import naming
from pbgio.validate import validate_path
from tests.deadline import deadline as _deadline
from tests.profiles import examples

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "anchor"  # every edge's other end; the first line of a text input, so no name starts the file


def _config(root: Path, name: str = "config.json", *, entity_type: str = "node", partitions: int = 1,
            entity_path: str = "data", edge_paths: tuple[str, ...] = ("data/edges",),
            checkpoint_path: str = "model", **extra: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    path.write_text(json.dumps({
        "entities": {entity_type: {"num_partitions": partitions}},
        "relations": [{"name": "r", "lhs": entity_type, "rhs": entity_type}],
        "dimension": 2, "entity_path": entity_path, "edge_paths": list(edge_paths),
        "checkpoint_path": checkpoint_path, **extra}, ensure_ascii=False), encoding="utf-8")
    return path


def _all_names(entity_path: Path, entity_type: str = "node", partitions: int = 1) -> list[str]:
    return [n for p in range(partitions) for n in read_entity_names(entity_path, entity_type, p)]


def _fake_checkpoint(config: Path) -> None:
    """Embeddings for every entity of the imported layout, as a trained run would leave them."""
    cfg = load_config(config)
    entity_path = config.parent / cfg.entity_path
    rng = np.random.default_rng(0)
    embeddings = {(t, p): EmbeddingsState(rng.standard_normal((read_entity_count(entity_path, t, p), 2)))
                  for t, e in cfg.entities.items() for p in range(e.num_partitions)}
    write_checkpoint(CheckpointDir(config.parent / cfg.checkpoint_path), 1, embeddings=embeddings,
                     model=ModelState({}), config=cfg)


def _import_tsv(root: Path, names: list[str]) -> Path:
    config = _config(root)
    lines = [f"{ANCHOR}\tr\t{ANCHOR}", *(f"{name}\tr\t{ANCHOR}" for name in names)]
    (root / "in.tsv").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    import_edge_lists(config, [root / "in.tsv"])
    return config


def _import_parquet(root: Path, names: list[str]) -> Path:
    config = _config(root)
    pl.DataFrame({"lhs": [ANCHOR, *names], "rel": "r", "rhs": ANCHOR}).write_parquet(root / "in.parquet")
    import_edge_lists(config, [root / "in.parquet"])
    return config


def _exported_tsv_names(path: Path) -> list[str]:
    """First fields of an exported TSV, split on b"\\n" only (str.splitlines would also split
    names on \\x85, \\u2028 …)."""
    return [line.split(b"\t", 1)[0].decode("utf-8") for line in path.read_bytes().split(b"\n") if line]


def _assert_round_trip(config: Path, names: list[str], *, tsv: bool) -> None:
    """Names file, Parquet, npy (and TSV) exports hold exactly the input names, byte for byte."""
    root = config.parent
    want = sorted({ANCHOR, *names})
    stored = _all_names(root / "data")
    assert sorted(stored) == want
    assert len(stored) == len(want)  # no name merged with another (NFC/NFD variants stay apart)
    report = validate_path(config)
    assert report.ok, report.issues
    _fake_checkpoint(config)
    export_embeddings(config, root / "e.parquet", fmt="parquet", add_global=False)
    got = pl.read_parquet(root / "e.parquet").get_column("name").to_list()
    assert [n.encode("utf-8") for n in got] == [n.encode("utf-8") for n in stored]
    export_embeddings(config, root / "e.npy", fmt="npy", add_global=False)
    assert json.loads((root / "e.names.json").read_text(encoding="utf-8")) == stored
    if tsv:
        export_embeddings(config, root / "e.tsv", add_global=False)
        assert _exported_tsv_names(root / "e.tsv") == stored


# --------------------------------------------------------------------------- 1. Unicode names


def _category_samples() -> dict[str, list[str]]:
    """Three code points (first, middle, last) of every Unicode general category."""
    found: dict[str, list[str]] = {}
    for cp in range(0x110000):
        found.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    return {cat: [chars[0], chars[len(chars) // 2], chars[-1]] for cat, chars in found.items()}


SPECIAL_NAMES = [
    "👩\u200d👩\u200d👧\u200d👦",  # a ZWJ emoji sequence
    "🏳️\u200d🌈", "🇫🇷", "👍🏽",  # ZWJ with a variation selector, a flag, a skin tone
    "שלום עולם", "مرحبا", "\u202eevil\u202c", "\u200f\u200e",  # RTL, bidi controls
    "\u200b", "\u200c\u200d", "\u2060", "a\ufeffb",  # zero-width characters, a BOM inside a name
    "é", "e\u0301", "Å", "A\u030a", "\u212b",  # NFC and NFD spellings: distinct names
    " ", "\u3000", "\xa0", " padded ",  # blank names
    "nul\x00inside", "\x00", "\x7f", "\x1c\x1d\x1e\x1f", "\x0b\x0c", "\x85", "\u2028\u2029",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0010fffd", "\ue000", "\U000e0001",  # astral, private use, tags
    'quote"d', "back\\slash", "\\u0041", "[\"json\", 1]", "{}",  # JSON look-alikes
    "中文名字", "日本語", "한국어", "ελληνικά", "кириллица", "ქართული", "தமிழ்", "ไทย",
]
LINE_BREAKING = {"\t", "\n", "\r"}  # what a TSV row cannot hold inside a name


def _category_names(*, text: bool) -> list[str]:
    names = []
    for cat, chars in sorted(_category_samples().items()):
        if cat == "Cs":  # lone surrogates are no Unicode text: no UTF-8 file or Parquet column holds them
            continue
        usable = [c for c in chars if not (text and c in LINE_BREAKING)]
        names += [f"{cat}:{''.join(usable)}", *usable]
    names += SPECIAL_NAMES
    return list(dict.fromkeys(n for n in names if not (text and LINE_BREAKING.intersection(n))))


def test_names_of_every_category_round_trip_through_tsv(tmp_path: Path) -> None:
    names = _category_names(text=True)
    _assert_round_trip(_import_tsv(tmp_path, names), names, tsv=True)


def test_names_of_every_category_round_trip_through_parquet(tmp_path: Path) -> None:
    names = [*_category_names(text=False), "tab\there", "line\nbreak", "cr\rlf\r\n", "\t", "\n"]
    _assert_round_trip(_import_parquet(tmp_path, names), names, tsv=False)
    with pytest.raises(ExportError, match=r"entity_names_node_0\.json: name \d+ .* holds a tab or a line break"):
        export_embeddings(tmp_path / "config.json", tmp_path / "refused.tsv", add_global=False)
    assert not (tmp_path / "refused.tsv").exists()


def _megabyte_name() -> str:
    unit = "aé😀\u0301ש\u200d中"
    name = unit * ((1 << 20) // len(unit.encode("utf-8")) + 1)
    assert len(name.encode("utf-8")) >= 1 << 20
    return name


@pytest.mark.parametrize("fmt", ["tsv", "parquet"])
def test_a_megabyte_name_round_trips(tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import pbgio.entities
    import pbgio.importers.importer
    import pbgio.importers.read

    monkeypatch.setattr(pbgio.importers.importer, "IN_MEMORY_BYTES", 0)  # stream the input in blocks …
    monkeypatch.setattr(pbgio.importers.read, "BLOCK_BYTES", 1 << 16)  # … smaller than the name
    monkeypatch.setattr(pbgio.entities, "_READ_CHARS", 1 << 16)  # the names file too
    big = _megabyte_name()
    names = [big, big[:-1], "small"]
    config = (_import_tsv if fmt == "tsv" else _import_parquet)(tmp_path, names)
    _assert_round_trip(config, names, tsv=fmt == "tsv")


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12),
                      min_size=1, max_size=6, unique=True))
def test_any_text_round_trips_through_parquet(tmp_path_factory: pytest.TempPathFactory, names: list[str]) -> None:
    _assert_round_trip(_import_parquet(tmp_path_factory.mktemp("any"), names), names, tsv=False)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\t\n\r"),
                              min_size=1, max_size=12), min_size=1, max_size=6, unique=True))
def test_any_tab_free_text_round_trips_through_tsv(tmp_path_factory: pytest.TempPathFactory,
                                                   names: list[str]) -> None:
    _assert_round_trip(_import_tsv(tmp_path_factory.mktemp("any"), names), names, tsv=True)


def test_a_tab_or_line_break_inside_a_tsv_name_is_a_located_input_error(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "tab.tsv").write_text("a\tr\tb\nwith\ttab\tr\tb\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        import_edge_lists(config, [tmp_path / "tab.tsv"])
    assert (caught.value.file, caught.value.line) == (str(tmp_path / "tab.tsv"), 2)
    assert "expected 3 fields separated by '\\t', found 4" in caught.value.reason
    (tmp_path / "nl.tsv").write_text("a\tr\tb\nline\nbreak\tr\tb\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        import_edge_lists(config, [tmp_path / "nl.tsv"])
    assert caught.value.line == 2 and "found 1" in caught.value.reason
    (tmp_path / "bad.tsv").write_bytes(b"a\tr\tb\nc\xff\tr\tb\n")
    with pytest.raises(InputError) as caught:
        import_edge_lists(config, [tmp_path / "bad.tsv"])
    assert caught.value.line == 2 and "UTF-8" in caught.value.reason
    assert not (tmp_path / "data").exists()  # nothing written


def test_relation_names_of_any_class_round_trip_and_crlf_is_a_line_end(tmp_path: Path) -> None:
    config = _config(tmp_path, dynamic_relations=True, global_emb=False)
    relations = ["fölgt 👩\u200d👩", "\u202e rtl", '"q"\\', "\x00", "e\u0301", "é"]
    lines = [f"{ANCHOR}\t{rel}\tname {i}" for i, rel in enumerate(relations)]
    (tmp_path / "in.tsv").write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    import_edge_lists(config, [tmp_path / "in.tsv"])
    assert read_relation_names(tmp_path / "data") == sorted(relations)
    assert sorted(_all_names(tmp_path / "data")) == sorted([ANCHOR, *(f"name {i}" for i in range(6))])
    assert validate_path(config).ok


def test_lone_surrogates_in_a_names_file_are_refused_by_export_with_the_row(tmp_path: Path) -> None:
    """JSON can spell a lone surrogate (\\ud800), which no UTF-8 text holds; an escaped pair is one
    astral character."""
    config = _config(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "entity_names_node_0.json").write_text('["ok", "\\ud83d\\ude00", "bad\\ud800"]')
    write_entity_count(tmp_path / "data", "node", 0, 3)
    assert read_entity_names(tmp_path / "data", "node", 0) == ["ok", "😀", "bad\ud800"]
    _fake_checkpoint(config)
    for fmt, output in (("tsv", "e.tsv"), ("parquet", "e.parquet"), ("npy", "e.npy")):
        with pytest.raises(ExportError, match=r"entity_names_node_0\.json: name 2 .*lone surrogate '\\ud800'"):
            export_embeddings(config, tmp_path / output, fmt=fmt, add_global=False)  # type: ignore[arg-type]
        assert not (tmp_path / output).exists()


@pytest.mark.parametrize(("text", "row", "message"), [
    ('["a", 3]', 1, r"line 1: expected a string \(name 1\), found a number"),
    ('[\n  "a",\n  null\n]', 1, r"line 3: expected a string \(name 1\), found null"),
    ('[\n  "a",\n  "b\tc"\n]', 1, r"line 3: expected a JSON string \(name 1\), found invalid text: Invalid control"),
    ('["a", "b",]', 2, r"expected a string \(name 2\), found '\]'"),
    ('["a" "b"]', 0, r"expected ',' or '\]' after name 0"),
    ('["a", "b"', 1, r"expected ',' or '\]' after name 1, found the end of the file"),
    ('{"a": 1}', None, r"expected a JSON list of strings, found an object"),
    ("", None, r"found an empty file"),
    ('["a"] x', None, r"expected the end of the file after the list"),
    ("[" * 100_000, 0, r"expected a string \(name 0\), found a list"),
])
def test_a_bad_names_file_is_a_format_error_naming_line_and_name(tmp_path: Path, text: str, row: int | None,
                                                                  message: str) -> None:
    path = tmp_path / "entity_names_node_0.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FormatError, match=message) as caught:
        read_entity_names(tmp_path, "node", 0)
    assert caught.value.rule == "entity-names-format" and caught.value.file == str(path)
    assert caught.value.issue.rows == (() if row is None else (row,))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.text(), max_size=8), st.sampled_from([None, 0, 1, 4]), st.booleans(),
       st.sampled_from([1, 3, 16, 1 << 20]), st.sampled_from([4, 1 << 23]))
def test_the_streamed_names_reader_reads_what_json_reads(names: list[str], indent: int | None, ascii_only: bool,
                                                         block: int, longest_fast_line: int) -> None:
    """Both parsers (lines by json.loads; token by token, for long lines and errors), any block size."""
    import tempfile

    import pbgio.entities

    text = json.dumps(names, indent=indent, ensure_ascii=ascii_only or any(
        0xD800 <= ord(c) < 0xE000 for n in names for c in n))
    old = pbgio.entities._READ_CHARS, pbgio.entities._MAX_FAST_PIECE
    pbgio.entities._READ_CHARS, pbgio.entities._MAX_FAST_PIECE = block, longest_fast_line
    try:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "entity_names_t_0.json"
            path.write_text(text, encoding="utf-8")
            assert read_entity_names(Path(directory), "t", 0) == names
            for cut in {len(text) // 2, len(text) - 1}:  # truncated: an error, never a shorter list
                path.write_text(text[:cut], encoding="utf-8")
                with pytest.raises(FormatError):
                    read_entity_names(Path(directory), "t", 0)
    finally:
        pbgio.entities._READ_CHARS, pbgio.entities._MAX_FAST_PIECE = old


# --------------------------------------------------------------------------- 2. huge names files

_MEASURE = textwrap.dedent("""
    import json, resource, sys, time, tracemalloc
    from pathlib import Path
    what, directory, count, trace = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[5] == "trace"

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    from pbgio.entities import iter_entity_names
    from pbgio.validate import validate_path
    validate_path(Path(sys.argv[4]))  # warm up: imports, first allocations
    if trace:
        tracemalloc.start()
    before, started = peak(), time.perf_counter()
    if what == "validate":
        report = validate_path(directory)
        assert report.ok, report.issues
        assert report.checked["entity names files"] == 1
    elif what == "stream":
        assert sum(len(chunk) for chunk in iter_entity_names(directory, "node", 0)) == count
    else:  # the whole list in memory, as json.load (the old reader) holds it
        names = json.loads((directory / "entity_names_node_0.json").read_text())
        assert len(names) == count
    seconds = time.perf_counter() - started
    traced = tracemalloc.get_traced_memory()[1] if trace else None
    print(json.dumps({"seconds": seconds, "rss_growth": peak() - before, "traced_peak": traced}))
""")
FIXED_BYTES = 24e6  # what streaming holds whatever the number of names: a block of text and its names


def _names_layout(directory: Path, count: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_name_list(directory / naming.entity_names_file("node", 0), (f"entity-{i:09d}" for i in range(count)))
    write_entity_count(directory, "node", 0, count)
    return directory


def _measure(what: str, directory: Path, count: int, warm: Path, *, trace: bool) -> dict[str, float]:
    """Seconds and peak RSS growth of ``what`` in a fresh process, or (``trace``) the peak of the
    memory Python and numpy allocate while it runs (tracemalloc: exact, but slower)."""
    args = [what, str(directory), str(count), str(warm), "trace" if trace else "rss"]
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _list_bytes(count: int) -> int:
    """Memory of the names as a Python list: a str object and a pointer per name."""
    return count * (sys.getsizeof("entity-000000000") + 8)


def _check_bounded(tmp_path: Path, count: int, *, rss: bool) -> dict[str, dict[str, float]]:
    """Streaming holds a fixed amount; validating, 8 bytes (a hash) a name more; both far below the list."""
    directory = _names_layout(tmp_path / "names", count)
    warm = _names_layout(tmp_path / "warm", 10)
    figures = {}
    for what, bound in (("stream", FIXED_BYTES), ("validate", FIXED_BYTES + 8 * count)):
        figures[what] = _measure(what, directory, count, warm, trace=True)
        assert figures[what]["traced_peak"] < min(bound, _list_bytes(count) / 3), (what, figures[what])
        if rss:
            figures[what].update({k: v for k, v in _measure(what, directory, count, warm, trace=False).items()
                                  if k != "traced_peak"})
            assert figures[what]["rss_growth"] < _list_bytes(count) / 3, (what, figures[what])
    return figures


def test_a_million_names_are_streamed_in_bounded_memory(tmp_path: Path) -> None:
    _check_bounded(tmp_path, 10**6, rss=False)


@pytest.mark.slow
def test_ten_million_names_are_streamed_in_bounded_memory(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Run with ``-m slow``; prints the figures reported in docs/guides/hostile-inputs.md."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("ten million names take about a minute; run with -m slow")
    count = 10**7
    figures = _check_bounded(tmp_path, count, rss=True)
    figures["json.loads (whole list)"] = _measure("list", tmp_path / "names", count, tmp_path / "warm", trace=False)
    size = (tmp_path / "names" / naming.entity_names_file("node", 0)).stat().st_size
    print(f"\n{count:,} names, {size / 1e6:.0f} MB file, list in memory about {_list_bytes(count) / 1e6:.0f} MB:")
    for what, measured in figures.items():
        traced = measured.get("traced_peak")
        print(f"  {what}: {measured['seconds']:.1f} s, peak RSS growth {measured['rss_growth'] / 1e6:.0f} MB"
              + (f", traced peak {traced / 1e6:.0f} MB" if traced else ""))


def test_duplicates_in_a_streamed_names_file_are_found_with_their_rows(tmp_path: Path) -> None:
    names = [f"n{i}" for i in range(200_000)]
    names[150_000] = names[7]
    names[199_999] = "n42"
    write_entity_names(tmp_path, "node", 0, names)
    write_entity_names(tmp_path, "node", 1, ["other", "n3"])
    for part, count in ((0, len(names)), (1, 2)):
        write_entity_count(tmp_path, "node", part, count)
    report = validate_path(tmp_path)
    dupes = [i for i in report.issues if i.rule == "entity-names-duplicate"]
    assert len(dupes) == 2, report.issues
    assert dupes[0].rows == (7, 42, 150_000, 199_999) and dupes[0].count == 2 and "'n7'" in dupes[0].message
    assert "found 'n3' in partitions 0 and 1" in dupes[1].message


# --------------------------------------------------------------------------- 3. odd paths

ODD = "dir with spaces/ünï cødé 数据 ✓"


def test_paths_with_spaces_and_non_ascii_characters_go_through_import_validate_fit_export(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command lines, run in-process from the layout's directory with relative, odd paths."""
    from typer.testing import CliRunner

    from pbgio.cli.commands import app as pbgio_app
    from pbgtrain.cli import app as pbgtrain_app

    root = tmp_path / ODD
    config = _config(root, "cönfig filé.json", entity_type="ùser type", partitions=2,
                     entity_path="entités dir", edge_paths=("edges/tr ain ✓",), checkpoint_path="mödel dir/ckpt ü",
                     num_epochs=1)
    (root / "in put ü.tsv").write_text("ann\tr\tbøb\nbøb\tr\tcy 3\ncy 3\tr\tann\n", encoding="utf-8")
    monkeypatch.chdir(root)
    steps = [(pbgio_app, ["import", config.name, "in put ü.tsv", "--no-progress"]),
             (pbgio_app, ["validate", config.name]),
             (pbgtrain_app, ["fit", config.name, "--no-progress"]),
             (pbgio_app, ["validate", "mödel dir/ckpt ü"]),
             (pbgio_app, ["export", config.name, "-o", "out put é.tsv", "--no-progress"]),
             (pbgio_app, ["info", config.name])]
    for app, args in steps:
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0 and done.exception is None, (args, done.output, done.exception)
    assert sorted(_exported_tsv_names(root / "out put é.tsv")) == ["ann", "bøb", "cy 3"]
    assert (root / "entités dir" / "entity_names_ùser type_1.json").is_file()
    assert CheckpointDir(root / "mödel dir" / "ckpt ü").read_version() == 1


# --------------------------------------------------------------------------- 4. symbolic link loops


def _error_of(call: Callable[[], Any]) -> str | None:
    """The message of the pbgio error ``call`` raises (anything else fails the test), or None."""
    try:
        call()
    except PbgioError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An imported and trained layout (entity dir, one edge path, a checkpoint) to break."""
    root = tmp_path_factory.mktemp("trained")
    config = _config(root, partitions=2, edge_paths=("edges/train",), num_epochs=1)
    (root / "in.tsv").write_text("a\tr\tb\nb\tr\tc\nc\tr\ta\n", encoding="utf-8")
    import_edge_lists(config, [root / "in.tsv"])
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    fit(load_run_config(config), FitOptions(seed=0))
    return root


def _self_link(path: Path) -> None:
    if path.is_dir():
        import shutil

        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.symlink_to(path.name)


def _links_up(root: Path) -> None:
    """Directory links to a parent inside the layout (and a pair of links to each other) beside the layout's
    files. (A link to a folder above the layout leads out of it: ``layout-link-outside``, docs/security.md.)"""
    for link, target in (("edges/train/up", ".."), ("data/here", "."), ("model/root", ".."), ("model/a", "b"),
                         ("model/b", "a")):
        (root / link).symlink_to(target)


LOOPS: dict[str, Callable[[Path], Any]] = {  # what breaks, and where the loop is
    "entity_path is a loop": lambda r: _self_link(r / "data"),
    "edge path is a loop": lambda r: _self_link(r / "edges" / "train"),
    "checkpoint_path is a loop": lambda r: _self_link(r / "model"),
    "parent of the edge path is a loop": lambda r: _self_link(r / "edges"),
    "names file is a loop": lambda r: _self_link(r / "data" / "entity_names_node_0.json"),
    "count file is a loop": lambda r: _self_link(r / "data" / "entity_count_node_1.txt"),
    "bucket is a loop": lambda r: _self_link(r / "edges" / "train" / "edges_0_1.h5"),
    "model file is a loop": lambda r: _self_link(r / "model" / "model.v1.h5"),
    "checkpoint version is a loop": lambda r: _self_link(r / "model" / "checkpoint_version.txt"),
    "links to parents inside the layout": lambda r: _links_up(r),
}
HARMLESS = "links to parents inside the layout"


@pytest.mark.parametrize("case", list(LOOPS))
def test_symlink_loops_are_reported_or_ignored_never_followed(trained: Path, tmp_path: Path, case: str) -> None:
    import shutil

    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    root = tmp_path / "layout"
    shutil.copytree(trained, root, symlinks=True)
    LOOPS[case](root)
    config = root / "config.json"
    with _deadline(120):
        report = validate_path(config)
        assert report.ok == (case == HARMLESS), report.issues
        if case != HARMLESS:
            assert any("symbolic link loop" in i.message or "Too many levels of symbolic links" in i.message
                       for i in report.errors), report.errors
        for target in (root, root / "data", root / "edges" / "train", root / "model"):
            with contextlib.suppress(PbgioError):
                validate_path(target)
        with contextlib.suppress(PbgioError):
            summarize(config)
        imported = _error_of(lambda: import_edge_lists(config, [root / "in.tsv"], overwrite=True))
        assert imported is None or "symbolic link loop" in imported
        trained_again = _error_of(lambda: fit(load_run_config(config, ["num_epochs=2"]), FitOptions(seed=0)))
        assert trained_again is None or any(
            text in trained_again for text in ("symbolic link loop", "does not validate")), trained_again


def test_a_looping_input_file_or_config_names_the_loop(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "in.tsv").symlink_to("in.tsv")
    with pytest.raises(MissingArtifactError, match=r"in\.tsv: expected the input edge list, found a symbolic link"):
        import_edge_lists(config, [tmp_path / "in.tsv"])
    (tmp_path / "loop.json").symlink_to("loop.json")
    with pytest.raises(MissingArtifactError, match="expected the path to validate, found a symbolic link loop"):
        validate_path(tmp_path / "loop.json")
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(tmp_path / "loop.json")
    (tmp_path / "out").symlink_to("out")
    with pytest.raises(ImportSetupError, match="found a symbolic link loop"):
        import_edge_lists(_config(tmp_path, "c2.json", entity_path="out/data"), [tmp_path / "in.tsv"])


# --------------------------------------------------------------------------- 5. config bounds

BASE: dict[str, Any] = {
    "entities": {"u": {"num_partitions": 1}}, "relations": [{"name": "r", "lhs": "u", "rhs": "u"}],
    "dimension": 4, "entity_path": "d", "edge_paths": ["e"], "checkpoint_path": "m"}
INT64_MAX = (1 << 63) - 1


def _schema_bounds() -> list[tuple[str, dict[str, Any]]]:
    """Every bounded field of the published JSON Schema, by its path in a config."""
    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text())
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
            "maxItems")
    where = {"EntitySchema": "entities.u", "RelationSchema": "relations[0]"}
    found = []

    def visit(props: dict[str, Any], prefix: str) -> None:
        for name, spec in props.items():
            for option in [spec, *spec.get("anyOf", [])]:
                bounds = {k: option[k] for k in keys if k in option}
                if bounds:
                    found.append((f"{prefix}{name}", {**bounds, "type": option.get("type")}))
                if "minLength" in option.get("items", {}):
                    found.append((f"{prefix}{name}[0]", {"minLength": option["items"]["minLength"], "type": "string"}))

    visit(schema["properties"], "")
    for definition, prefix in where.items():
        visit(schema["$defs"][definition]["properties"], prefix + ".")
    return found


BOUNDS = _schema_bounds()


def _with(path: str, value: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(json.dumps(BASE))
    if path.startswith("entities.u."):
        config["entities"]["u"][path.split(".")[-1]] = value
    elif path.startswith("relations[0]."):
        config["relations"][0][path.split(".")[-1]] = value
    elif path.endswith("[0]"):
        config[path[:-3]] = [value]
    else:
        config[path] = value
    return config


def _schema_issues(path: str, value: Any) -> list[str]:
    """The config-schema messages about ``path`` when it holds ``value`` (semantic rules aside)."""
    try:
        parse_config(_with(path, value))
    except ConfigError as exc:
        return [i.message for i in exc.issues if i.rule == "config-schema" and i.dataset == path]
    return []


def _edge_values(bounds: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Values at the bounds (accepted) and just past them (refused)."""
    kind = bounds["type"]
    ok: list[Any] = []
    bad: list[Any] = []
    if kind == "integer":
        if "minimum" in bounds:
            ok.append(bounds["minimum"])
            bad.append(bounds["minimum"] - 1)
        if "exclusiveMinimum" in bounds:
            ok.append(bounds["exclusiveMinimum"] + 1)
            bad.append(bounds["exclusiveMinimum"])
        ok.append(INT64_MAX)
        bad += [INT64_MAX + 1, 10**400]
    elif kind == "number":
        if "minimum" in bounds:
            ok.append(float(bounds["minimum"]))
            bad.append(math.nextafter(float(bounds["minimum"]), -math.inf))
        if "exclusiveMinimum" in bounds:
            ok.append(math.nextafter(float(bounds["exclusiveMinimum"]), math.inf))
            bad.append(float(bounds["exclusiveMinimum"]))
        if "maximum" in bounds:
            ok.append(float(bounds["maximum"]))
            bad.append(math.nextafter(float(bounds["maximum"]), math.inf))
        else:
            ok.append(sys.float_info.max)
            bad += [math.inf, 10**400]
        bad.append(math.nan)
    elif kind == "string":
        ok.append("x" * bounds.get("minLength", 1))
        if "minLength" in bounds:
            bad.append("x" * (bounds["minLength"] - 1))
    elif kind == "array":
        bad.append([])
    return ok, bad


def test_the_schema_has_the_bounds_this_test_knows() -> None:
    paths = {path for path, _ in BOUNDS}
    assert {"dimension", "entities.u.num_partitions", "relations[0].weight", "eval_fraction", "edge_paths",
            "edge_paths[0]", "lr", "num_epochs"} <= paths
    assert all(b["type"] in ("integer", "number", "string", "array") for _, b in BOUNDS)


@pytest.mark.parametrize(("path", "bounds"), BOUNDS, ids=[p for p, _ in BOUNDS])
def test_config_values_at_every_schema_bound(path: str, bounds: dict[str, Any]) -> None:
    ok, bad = _edge_values(bounds)
    for value in ok:
        assert _schema_issues(path, value) == [], (path, value)
    for value in bad:
        messages = _schema_issues(path, value)
        assert messages, f"{path}={value!r} was accepted"
        assert all(m for m in messages)


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from([(p, b) for p, b in BOUNDS if b["type"] in ("integer", "number")]), st.data())
def test_numbers_are_accepted_exactly_within_their_bounds(field: tuple[str, dict[str, Any]],
                                                          data: st.DataObject) -> None:
    path, bounds = field
    if bounds["type"] == "integer":
        value: Any = data.draw(st.one_of(st.integers(-3, 3), st.integers(-(1 << 70), 1 << 70)))
        inside = -(1 << 63) <= value <= INT64_MAX
    else:
        value = data.draw(st.one_of(st.floats(), st.integers(-3, 3)))
        inside = isinstance(value, int) or math.isfinite(value)
    if "minimum" in bounds:
        inside = inside and value >= bounds["minimum"]
    if "exclusiveMinimum" in bounds:
        inside = inside and value > bounds["exclusiveMinimum"]
    if "maximum" in bounds:
        inside = inside and value <= bounds["maximum"]
    assert (_schema_issues(path, value) == []) == inside, (path, value)


def test_refusals_name_the_key_and_the_bound() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "lr": math.inf, "init_scale": math.nan, "num_epochs": 1 << 63,
                      "eval_fraction": 1.0000000000000002, "relations": [{**BASE["relations"][0], "weight": 0}]})
    found = {i.dataset: i.message for i in caught.value.issues}
    assert found["lr"] == "expected a finite number, found inf"
    assert found["init_scale"] == "expected a finite number, found nan"
    assert found["num_epochs"].startswith("expected an integer within int64")
    assert found["eval_fraction"] == "must be at most 1.0, found 1.0000000000000002"
    assert found["relations[0].weight"] == "must be greater than 0.0, found 0"
    # JSON's NaN and Infinity, as Python's json module reads them, from a config file
    assert "lr" in str(caught.value)


def test_a_config_file_with_infinity_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "lr": 1.0}).replace('"lr": 1.0', '"lr": Infinity'))
    with pytest.raises(ConfigError, match=r"lr: expected a finite number, found inf"):
        load_config(path)


def test_entity_type_names_at_the_file_name_bound(tmp_path: Path) -> None:
    """embeddings_{type}_{part}.v999999.h5 fits in 255 bytes for the type's last partition."""
    def problems(name: str, partitions: int) -> list[str]:
        config = {**BASE, "entities": {name: {"num_partitions": partitions}},
                  "relations": [{"name": "r", "lhs": name, "rhs": name}]}
        try:
            parse_config(config)
        except ConfigError as exc:
            return [i.rule for i in exc.issues]
        return []

    longest = 255 - len(naming.embeddings_file("", 0, 999_999))
    assert problems("é" * (longest // 2) + "t" * (longest % 2), 1) == []  # bytes, not characters
    assert problems("t" * (longest + 1), 1) == ["entity-type-name-unsafe"]
    assert problems("t" * longest, 10) == []
    assert problems("t" * longest, 11) == ["entity-type-name-unsafe"]  # partition 10 is one byte longer
    odd = "ty pe✓ 数据"
    config = _config(tmp_path, entity_type=odd)
    (tmp_path / "in.tsv").write_text("a\tr\tb\n", encoding="utf-8")
    import_edge_lists(config, [tmp_path / "in.tsv"])
    assert sorted(read_entity_names(tmp_path / "data", odd, 0)) == ["a", "b"]
    assert validate_path(config).ok
    assert isinstance(load_config(config), ConfigSchema)


def test_iter_entity_names_streams_chunks(tmp_path: Path) -> None:
    write_entity_names(tmp_path, "t", 0, (f"n{i}" for i in range(100_000)))
    chunks = list(iter_entity_names(tmp_path, "t", 0))
    assert len(chunks) > 1 and sum(map(len, chunks)) == 100_000
    assert chunks[0][0] == "n0" and chunks[-1][-1] == "n99999"
    with pytest.raises(MissingArtifactError):
        list(iter_entity_names(tmp_path, "t", 1))
