"""Bad input: every malformed case is reported with file and line; a failed import writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from pbgio.cli.exporting import export
from pbgio.cli.importing import import_edges
from pbgio.errors import InputError, MissingArtifactError
from pbgio.importers import ImportSetupError, InputOptions, LayoutExistsError, import_edge_lists
from pbgio.testing.edgelists import layout_edges
from pbgio.validate import validate_path


def write_config(root: Path, **overrides: Any) -> Path:
    config = {
        "entities": {"user": {"num_partitions": 2}},
        "relations": [{"name": "follows", "lhs": "user", "rhs": "user"},
                      {"name": "likes", "lhs": "user", "rhs": "user"}],
        "dimension": 8, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
        **overrides,
    }
    if any(e.get("featurized") for e in config["entities"].values()):  # same-batch negatives only (featurized)
        config.setdefault("num_uniform_negs", 0)
        config.setdefault("eval_num_uniform_negs", 0)
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


GOOD = "a\tfollows\tb\nb\tlikes\tc\n"
# (name, file content, options, expected line, message fragment)
CASES: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("too few fields", GOOD + "c\tfollows\n", {}, 3, "expected 3 fields separated by '\\t', found 2"),
    ("first line malformed", "c\tfollows\n" + GOOD, {}, 1, "expected 3 fields separated by '\\t', found 2"),
    ("too many fields", GOOD + "\nc\tfollows\ta\tx\n", {}, 4,
     "expected 3 fields separated by '\\t', found 4"),
    ("empty lhs", GOOD + "\tfollows\ta\n", {}, 3,
     "expected an entity name in column 0 (lhs), found an empty"),
    ("empty rhs", "a\tfollows\t\n" + GOOD, {}, 1, "expected an entity name in column 2 (rhs)"),
    ("empty relation", GOOD + "a\t\tb\n", {}, 3, "expected a relation name in column 1 (rel)"),
    ("unknown relation", GOOD + "a\tblocks\tb\n", {}, 3,
     "expected a relation of the config ('follows', 'likes'), found 'blocks'"),
    ("weight not a number", "a\tfollows\tb\t1.5\nb\tfollows\tc\tabc\n", {"weight_col": 3}, 2,
     "expected a number in column 3 (weight), found 'abc'"),
    ("negative weight", "a\tfollows\tb\t-1\n", {"weight_col": 3}, 1,
     "expected a finite non-negative weight, found -1"),
    ("infinite weight", "a\tfollows\tb\t1\na\tfollows\tb\tinf\n", {"weight_col": 3}, 2,
     "expected a finite non-negative weight, found inf"),
    ("wrong count with header", "x,y,z\na,follows,b\na,follows\n", {"delimiter": ",", "header": True}, 3,
     "expected 3 fields separated by ','"),
]


@pytest.mark.parametrize(("content", "options", "line", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_rows_fail_with_file_and_line(tmp_path: Path, content: str, options: dict[str, Any],
                                                line: int, fragment: str) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        import_edge_lists(config, [path], options=InputOptions(**options))
    assert info.value.file == str(path)
    assert info.value.line == line
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert not (tmp_path / "data").exists()  # nothing written, not even directories


@pytest.mark.parametrize(("content", "options", "line", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_rows_are_skipped_and_counted(tmp_path: Path, content: str, options: dict[str, Any],
                                               line: int, fragment: str) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.tsv"
    path.write_text(content, encoding="utf-8")
    report = import_edge_lists(config, [path], options=InputOptions(**options), on_error="skip")
    assert report.skipped == 1
    assert report.kept == report.read - 1
    [problem] = report.files[0].problems
    assert (problem.file, problem.line) == (str(path), line) and fragment in problem.message
    assert validate_path(config).ok


def test_skip_reports_the_first_problems_and_all_counts(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.tsv"
    lines = [f"a{i}\tfollows\tb{i}" if i % 3 else f"a{i}\tfollows" for i in range(1, 301)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = import_edge_lists(config, [path], on_error="skip")
    assert report.skipped == 100 and report.kept == 200 and report.read == 300
    assert [p.line for p in report.files[0].problems] == [3 * k for k in range(1, 21)]
    with pytest.raises(InputError, match=r"train.tsv:3: .*\(100 problems in this file\)"):
        import_edge_lists(config, [path], overwrite=True)


def test_featurized_row_without_features(tmp_path: Path) -> None:
    config = write_config(tmp_path, entities={"u": {"num_partitions": 1}, "doc": {"num_partitions": 1,
                                                                                  "featurized": True}},
                          relations=[{"name": "reads", "lhs": "u", "rhs": "doc"}], num_uniform_negs=0)
    path = tmp_path / "t.tsv"
    path.write_text("a\treads\tx y\nb\treads\t   \n", encoding="utf-8")
    with pytest.raises(InputError, match=r"t.tsv:2: expected at least one feature in column 2"):
        import_edge_lists(config, [path])


@pytest.mark.parametrize("content", ["", "\n\n", "\r\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="expected edges, found none") as info:
        import_edge_lists(config, [path])
    assert info.value.file == str(path) and info.value.line is not None
    report = import_edge_lists(config, [path], on_error="skip")
    assert report.read == 0 and "expected edges, found none" in report.warnings[0]
    assert validate_path(config).ok  # an empty layout is still a complete one


def test_header_only_file(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.csv"
    path.write_text("src,rel,dst\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"train.csv:2: expected edges, found none"):
        import_edge_lists(config, [path], options=InputOptions(delimiter=",", header=True))


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "train.tsv"
    path.write_bytes(GOOD.encode() + b"b\tfollows\tc\xff\n")
    with pytest.raises(InputError, match=r"train.tsv:3: expected UTF-8 text"):
        import_edge_lists(config, [path], on_error="skip")
    path.write_bytes(b"\xffa\tfollows\tb\n")
    with pytest.raises(InputError, match=r"train.tsv:1: expected UTF-8 text"):
        import_edge_lists(config, [path])


def test_parquet_problems_name_the_row(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "e.parquet"
    pl.DataFrame({"s": ["a", None, "c"], "r": ["follows"] * 3, "d": ["b", "c", "a"]}).write_parquet(path)
    with pytest.raises(InputError) as info:
        import_edge_lists(config, [path])
    assert str(info.value) == f"{path}: row 2: expected a value in column 's' (lhs), found null"
    pl.DataFrame({"s": [1.5], "r": ["follows"], "d": ["b"]}).write_parquet(path)
    with pytest.raises(InputError, match=r"expected strings or integers in column 's' \(lhs\)"):
        import_edge_lists(config, [path])


def test_column_problems(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "t.tsv"
    path.write_text(GOOD, encoding="utf-8")
    with pytest.raises(InputError, match="expected at least 6 fields for column 5"):
        import_edge_lists(config, [path], options=InputOptions(weight_col=5))
    with pytest.raises(InputError, match="the file has no header"):
        import_edge_lists(config, [path], options=InputOptions(lhs_col="src"))
    with pytest.raises(ValueError, match="must differ"):
        InputOptions(lhs_col=0, rhs_col=0)


@pytest.mark.parametrize(("text", "delimiter", "hint"), [
    ('a,follows,b\nc,follows,"d, e"\n', "\t", "split on tab; the lines split into 3 or more fields on comma: "
                                                "try -d comma"),
    ("a follows  b\nc follows\td\n", ",", "split on comma; the lines split into 3 or more fields on whitespace: "
                                             "try -d whitespace"),
    ("a;follows;b\n", "\t", "try -d semicolon"),
    ("a\n", "\t", None),  # no delimiter fits: no hint
])
def test_too_few_fields_names_the_delimiter_and_the_one_that_fits(tmp_path: Path, text: str, delimiter: str,
                                                                  hint: str | None) -> None:
    """A forgotten ``-d``: the error says which delimiter split the lines and, when another splits
    every sampled line into enough fields alike, suggests it."""
    config = write_config(tmp_path)
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        import_edge_lists(config, [path], options=InputOptions(delimiter=delimiter))
    assert "expected at least 3 fields for column 2 (rhs)" in str(info.value)
    message = str(info.value)
    assert message.endswith("split on tab") and "try -d" not in message if hint is None else hint in message, message


def test_setup_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text(GOOD, encoding="utf-8")
    with pytest.raises(ImportSetupError, match="expected a relation column for a config with 2 relations"):
        import_edge_lists(write_config(tmp_path), [path], options=InputOptions(rel_col=None, rhs_col=1))
    dynamic = write_config(tmp_path, relations=[{"name": "r", "lhs": "user", "rhs": "user"}],
                           dynamic_relations=True, global_emb=False)
    with pytest.raises(ImportSetupError, match="dynamic_relations"):
        import_edge_lists(dynamic, [path], options=InputOptions(rel_col=None, rhs_col=1))
    featurized = write_config(tmp_path, entities={"user": {"num_partitions": 2, "featurized": True}},
                              num_uniform_negs=0)
    with pytest.raises(ImportSetupError, match="featurized entity type 'user' to have 1 partition"):
        import_edge_lists(featurized, [path])
    with pytest.raises(MissingArtifactError):
        import_edge_lists(write_config(tmp_path), [tmp_path / "missing.tsv"])


def test_existing_layout_needs_overwrite_and_survives_a_failed_reimport(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "t.tsv"
    path.write_text(GOOD, encoding="utf-8")
    import_edge_lists(config, [path])
    before = layout_edges(config)
    with pytest.raises(LayoutExistsError, match="pass --overwrite"):
        import_edge_lists(config, [path])
    bad = tmp_path / "bad.tsv"
    bad.write_text("x\tfollows\ty\nx\tnope\ty\n", encoding="utf-8")
    with pytest.raises(InputError):
        import_edge_lists(config, [bad], overwrite=True)
    assert layout_edges(config) == before and validate_path(config).ok
    assert not [p for p in tmp_path.rglob(".pbgio-import-*")]  # staging directories are gone


def test_failure_while_writing_leaves_nothing_that_validates(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "t.tsv"
    path.write_text(GOOD * 50, encoding="utf-8")
    from pbgio.importers import write

    calls = {"n": 0}
    original = write.BucketSink.append

    def failing(self: write.BucketSink, batch: Any) -> None:
        calls["n"] += 1
        raise OSError("disk full")

    monkeypatch.setattr(write.BucketSink, "append", failing)
    with pytest.raises(OSError, match="disk full"):
        import_edge_lists(config, [path])
    assert calls["n"] == 1
    assert not (tmp_path / "data").exists()
    monkeypatch.setattr(write.BucketSink, "append", original)
    import_edge_lists(config, [path])
    assert validate_path(config).ok


def test_crash_during_commit_leaves_no_valid_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted after the buckets moved in but before the entity counts: no layout is left (the
    files already moved in are removed again; a kill -9 here is tests/test_crash_recovery.py's)."""
    import os

    from pbgio.importers import write

    config = write_config(tmp_path)
    path = tmp_path / "t.tsv"
    path.write_text(GOOD, encoding="utf-8")
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        moving_in = (Path(src).parent.name.startswith(".pbgio-import")
                     and not Path(dst).parent.name.startswith(".pbgio-import"))
        if moving_in and Path(dst).name.startswith("entity_count"):
            raise KeyboardInterrupt  # as if killed
        real_replace(src, dst)

    monkeypatch.setattr(write.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        import_edge_lists(config, [path])
    monkeypatch.setattr(write.os, "replace", real_replace)
    report = validate_path(config)
    assert not report.ok and report.rule_ids() == {"path-missing"}
    assert not list((tmp_path / "data").rglob("*.h5"))


# --------------------------------------------------------------------------- command line


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("import")(import_edges)
    app.command("export")(export)
    return app


def test_cli_exit_codes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    good, bad = tmp_path / "good.tsv", tmp_path / "bad.tsv"
    good.write_text(GOOD, encoding="utf-8")
    bad.write_text(GOOD + "x\tfollows\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(cli(), ["import", str(config), str(bad), "--no-progress"])
    assert result.exit_code == 1
    assert f"{bad}:3: expected 3 fields" in result.output and "nothing was written" in result.output
    result = runner.invoke(cli(), ["import", str(config), str(bad), "--on-error", "skip", "--json"])
    assert result.exit_code == 0, result.output
    assert "skipped 1 malformed" in result.output
    assert runner.invoke(cli(), ["import", str(config), str(good)]).exit_code == 2  # exists
    assert runner.invoke(cli(), ["import", str(config), str(good), "--overwrite"]).exit_code == 0
    assert runner.invoke(cli(), ["import", str(config), str(tmp_path / "nope.tsv")]).exit_code == 2
    assert runner.invoke(cli(), ["import", str(config), str(good), "-d", "ab"]).exit_code == 2
    assert runner.invoke(cli(), ["import", str(config), str(good), "--on-error", "ignore"]).exit_code == 2


def test_command_modules_do_not_import_polars() -> None:
    """``pbgio.cli.commands`` registers these commands; ``pbgio validate`` must stay free of polars."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import pbgio.cli.commands, pbgio.cli.importing, pbgio.cli.exporting, pbgio.importers, pbgio.exporters\n"
            "heavy = [m for m in ('polars', 'torch', 'h5py') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_header_that_was_not_declared_is_refused(tmp_path: Path) -> None:
    """A forgotten ``--header``: the first line's names occur nowhere else and one is a usual column
    name, so the import refuses the file (naming it, line 1, the names and both ways out) and writes
    nothing; with ``--header``, with ``--no-header`` (header=False: line 1 is an edge), or without such
    a line, it imports."""
    config = write_config(tmp_path, dynamic_relations=True, global_emb=False,
                          relations=[{"name": "all", "lhs": "user", "rhs": "user"}])
    path = tmp_path / "edges.tsv"
    path.write_text("source\trelation\ttarget\n" + GOOD, encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:1: expected an edge or a declared header, "
                                         r"found a line that looks like a header \('source', 'relation', 'target': "
                                         r"usual column names among them, none in the next \d+ lines\)\. "
                                         r"Pass --header if it names the columns, or --no-header to "
                                         r"import it as an edge$"):
        import_edge_lists(config, [path])
    assert not (tmp_path / "data").exists()
    declared = import_edge_lists(config, [path], options=InputOptions(header=True, lhs_col="source", rel_col=
                                 "relation", rhs_col="target"))
    assert declared.warnings == []
    as_edge = import_edge_lists(config, [path], options=InputOptions(header=False), overwrite=True)
    assert as_edge.files[0].rows == declared.files[0].rows + 1
    path.write_text("a\tfollows\tb\n" + GOOD, encoding="utf-8")  # names that recur: an edge, not a header
    assert import_edge_lists(config, [path], overwrite=True).warnings == []
