"""What a new user tripped over, each reproduced as they met it and shown fixed: CSV as
people write it, every problem of a file at once, one rule for command-line layout paths, names
that forgive typos, --type by default, delimited triples with a header, output that keeps its
lines off a terminal."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pbgio.cli import app as pbgio_app
from pbgio.errors import InputError, UnknownNameError
from pbgio.importers.read import InputOptions, open_source
from pbgio.names import close_names, locate_entities
from pbgio.spec import naming
from pbgtrain.cli import app as pbgtrain_app
from tests.profiles import examples
from tests.test_predict import model_layout

CONFIG = {"entities": {"all": {"num_partitions": 1}},
          "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
          "dynamic_relations": True, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
          "dimension": 8, "num_epochs": 1, "global_emb": False}
QUOTED = ('source,relation,target\r\n'
          '"alga, red",causes,virus\r\n'
          '"say ""hi""",causes,"alga, red"\r\n'
          'virus,"part of",bacterium\r\n')
PLAIN = ('alga, red\tcauses\tvirus\n'
         'say "hi"\tcauses\talga, red\n'
         'virus\tpart of\tbacterium\n')


def _import(root: Path, text: str, *args: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "edges.txt").write_bytes(text.encode())
    done = CliRunner().invoke(pbgio_app, ["import", str(root / "config.json"), str(root / "edges.txt"), *args])
    assert done.exit_code == 0, done.output
    return root


def _layout(root: Path) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
    names = json.loads((root / "data" / naming.entity_names_file("all", 0)).read_text())
    relations = json.loads((root / "data" / naming.DYNAMIC_REL_NAMES).read_text())
    with h5py.File(root / "data" / "train" / naming.bucket_file(0, 0)) as f:
        arrays = {key: f[key][()] for key in ("lhs", "rel", "rhs")}
    return names, relations, arrays


# --------------------------------------------------------------------------- 1. CSV as people write it


def test_a_quoted_crlf_csv_imports_as_the_unquoted_file(tmp_path: Path) -> None:
    quoted = _import(tmp_path / "csv", QUOTED, "--delimiter", "comma", "--header", "--lhs-col", "source",
                     "--rel-col", "relation", "--rhs-col", "target")
    plain = _import(tmp_path / "tsv", PLAIN)
    q_names, q_rels, q_edges = _layout(quoted)
    p_names, p_rels, p_edges = _layout(plain)
    assert sorted(q_names) == ["alga, red", "bacterium", 'say "hi"', "virus"]
    assert (q_names, q_rels) == (p_names, p_rels) and q_rels == ["causes", "part of"]
    assert all(np.array_equal(q_edges[k], p_edges[k]) for k in q_edges)


def test_what_quoting_does_not_accept_is_said_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text('a,r,b\n"open,r,b\nc,r,"d"x\n')
    rows = open_source(path, InputOptions(delimiter=",")).collect()
    assert rows["problem"].to_list() == [None, 1, 1]  # the quoting check (after the field count's)
    from pbgio.importers import import_edge_lists

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(InputError) as caught:
        import_edge_lists(tmp_path / "config.json", [path], options=InputOptions(delimiter=","))
    message = str(caught.value)
    assert "bad.csv:2: expected each quoted field to end with \" followed by ',' or the end of the line" in message
    assert "not a line break" in message and "bad.csv:3:" in message
    # quote=None: every delimiter splits (the quote is an ordinary character)
    rows = open_source(path, InputOptions(delimiter=",", quote=None)).collect()
    assert rows["lhs"].to_list() == ["a", '"open', "c"] and rows["problem"].to_list() == [None, None, None]


# --------------------------------------------------------------------------- 2. every problem at once


def test_a_malformed_file_lists_each_problem_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "e.tsv").write_text("a\tr\tb\nc\tr\n\nd\tr\te\tf\ng\t\th\ni\tr\tj\n")
    done = CliRunner().invoke(pbgio_app, ["import", str(tmp_path / "config.json"), str(tmp_path / "e.tsv")])
    assert done.exit_code == 1
    lines = [line.strip() for line in done.stderr.splitlines()]
    assert lines[0].endswith("e.tsv:2: expected 3 fields separated by '\\t', found 2 (3 problems in this file)")
    assert any(line.endswith("e.tsv:4: expected 3 fields separated by '\\t', found 4") for line in lines)
    assert any(re.search(r"e\.tsv:5: expected a relation name .* found an empty field", line) for line in lines)


# --------------------------------------------------------------------------- 3. one rule for layout paths


def test_layout_paths_on_the_command_line_are_relative_to_the_config(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = model_layout(tmp_path / "project", operators=("diagonal", "diagonal"), comparator="dot")
    edges = next(p for p in json.loads(config.read_text())["edge_paths"])
    runner = CliRunner()
    results = []
    for where in (tmp_path, config.parent, tmp_path / "project" / "checkpoint"):
        monkeypatch.chdir(where)
        done = runner.invoke(pbgtrain_app, ["eval", str(config), "--edges", edges, "--json", "--no-progress"])
        assert done.exit_code == 0, (where, done.output)
        results.append(json.loads(done.stdout[done.stdout.index("{"):])["metrics"])
    assert results[0] == results[1] == results[2]  # the same files, from any directory
    monkeypatch.chdir(tmp_path)
    missing = runner.invoke(pbgtrain_app, ["eval", str(config), "--edges", "project/" + edges])
    assert missing.exit_code == 2
    said = " ".join(missing.stderr.split())
    assert str(config.parent / "project" / edges) in said  # the absolute path, in full
    assert "relative to the config's folder" in said and f"write ./project/{edges} to name that one" in said
    here = runner.invoke(pbgtrain_app, ["eval", str(config), "--edges", f"./project/{edges}", "--json",
                                        "--no-progress"])
    assert here.exit_code == 0, here.output


# --------------------------------------------------------------------------- 4. names that forgive typos


def test_a_mistyped_entity_name_suggests_the_right_one(tmp_path: Path) -> None:
    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="dot")
    data = config.parent / json.loads(config.read_text())["entity_path"]
    for typo in ("user-0-22", "USER-0-2", "usr-0-2"):
        with pytest.raises(UnknownNameError, match=r"did you mean 'user-0-2'"):
            locate_entities(data, "user", 2, [typo])
    done = CliRunner().invoke(pbgtrain_app, ["predict", str(config), "--lhs", "User-1-0", "--rel", "follows"])
    assert done.exit_code == 1 and "did you mean 'user-1-0'?" in done.stderr
    with pytest.raises(UnknownNameError) as caught:
        locate_entities(data, "user", 2, ["qqqqqqqq"])
    assert "did you mean" not in str(caught.value)  # nothing close: no suggestion


def test_suggestions_stream_the_names_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory holds one chunk of names, whatever the type's size: the names are offered to the
    matcher a chunk at a time, never as one list."""
    from pbgio import entities
    from pbgio.entities import write_entity_names

    write_entity_names(tmp_path, "t", 0, [f"name-{i:06d}" for i in range(50_000)])
    monkeypatch.setattr(entities, "NAMES_PER_CHUNK", 1000)
    seen: list[int] = []
    from rapidfuzz import process

    real = process.extract

    def spy(query: str, choices: list[str], **kwargs: object) -> object:
        seen.append(len(choices))
        return real(query, choices, **kwargs)

    monkeypatch.setattr(process, "extract", spy)
    assert close_names(tmp_path, "t", 1, "name-012345x")[0] == "name-012345"
    assert len(seen) == 50 and max(seen) == 1000


# --------------------------------------------------------------------------- 5. --type by default


def test_neighbors_takes_the_only_entity_type_by_default(tmp_path: Path) -> None:
    single = model_layout(tmp_path, comparator="dot")
    cfg = json.loads(single.read_text())
    two_types = CliRunner().invoke(pbgio_app, ["neighbors", str(single), "user-0-1"])
    assert two_types.exit_code == 2 and "give the entity type (--type)" in two_types.stderr
    assert "item, user" in two_types.stderr
    cfg["entities"] = {"user": cfg["entities"]["user"]}
    cfg["relations"] = [r for r in cfg["relations"] if r["lhs"] == r["rhs"] == "user"]
    single.write_text(json.dumps(cfg))
    done = CliRunner().invoke(pbgio_app, ["neighbors", str(single), "user-0-1", "-k", "2"])
    assert done.exit_code == 0, done.output
    assert "2 nearest 'user' entities" in done.stderr


# --------------------------------------------------------------------------- 6. triples as the import reads them


def test_predict_triples_take_the_import_delimiters_and_print_a_header(tmp_path: Path) -> None:
    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="dot")
    runner = CliRunner()
    (tmp_path / "t.tsv").write_text("user-0-1\tfollows\tuser-1-3\n")
    (tmp_path / "t.csv").write_text('"user-0-1",follows,user-1-3\r\n')
    tab = runner.invoke(pbgtrain_app, ["predict", str(config), "--triples", str(tmp_path / "t.tsv")])
    comma = runner.invoke(pbgtrain_app, ["predict", str(config), "--triples", str(tmp_path / "t.csv"),
                                         "--delimiter", "comma"])
    assert tab.exit_code == comma.exit_code == 0, (tab.output, comma.output)
    assert tab.stdout == comma.stdout
    assert tab.stdout.splitlines()[0] == "lhs\trel\trhs\tscore"
    assert "score: the model's score of the triple" in tab.stderr
    (tmp_path / "u.csv").write_text("user-0-1,follows,user-1-3\n")
    bad = runner.invoke(pbgtrain_app, ["predict", str(config), "--triples", str(tmp_path / "u.csv")])
    assert bad.exit_code == 1 and "u.csv:1: expected 3 non-empty fields lhs, rel, rhs separated by '\\t'" in bad.stderr


def test_dynamic_triples_name_both_score_columns(tmp_path: Path) -> None:
    config = model_layout(tmp_path, dynamic=True, comparator="dot", operators=("diagonal", "diagonal"))
    cfg = json.loads(config.read_text())
    data = config.parent / cfg["entity_path"]
    rel = json.loads((data / naming.DYNAMIC_REL_NAMES).read_text())[0]
    (tmp_path / "t.tsv").write_text(f"user-0-1\t{rel}\titem-0-1\n")
    done = CliRunner().invoke(pbgtrain_app, ["predict", str(config), "--triples", str(tmp_path / "t.tsv")])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[0] == "lhs\trel\trhs\tscore\tlhs_side_score"
    assert "lhs_side_score: ranks lhs candidates" in done.stderr


# --------------------------------------------------------------------------- 7. whole lines off a terminal


def test_output_off_a_terminal_keeps_its_lines(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / "layout"
    config = model_layout(deep, operators=("diagonal", "diagonal"), comparator="dot")
    runner = CliRunner()
    info = runner.invoke(pbgio_app, ["info", str(config)])
    assert info.exit_code == 0, info.output
    edges = json.loads(config.read_text())["edge_paths"][0]
    assert any(line.strip().startswith(str(deep / edges)) and line.strip().endswith("edges")
               for line in info.stdout.splitlines()), info.stdout
    done = runner.invoke(pbgio_app, ["validate", str(config)])
    summary = [line for line in done.stderr.splitlines() if "error(s)" in line]
    assert summary and str(config) in summary[0] and summary[0].rstrip().endswith("model files")  # one line


@given(rows=st.lists(st.tuples(*[st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                                         min_size=1, max_size=8)] * 3), min_size=1, max_size=30),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]), crlf=st.booleans())
@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whatever_a_csv_writer_writes_reads_back(tmp_path_factory: pytest.TempPathFactory,
                                                 rows: list[tuple[str, str, str]], quoting: int, crlf: bool) -> None:
    """Any names (quotes, commas, the unit separator, spaces, any script) written by Python's
    csv.writer, minimally or fully quoted, LF or CRLF: every row reads back exactly."""
    path = tmp_path_factory.mktemp("csv") / "edges.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, quoting=quoting, lineterminator="\r\n" if crlf else "\n").writerows(rows)
    got = open_source(path, InputOptions(delimiter=",")).collect()
    assert got["problem"].to_list() == [None] * len(rows)
    assert list(zip(got["lhs"], got["rel"], got["rhs"], strict=True)) == rows
