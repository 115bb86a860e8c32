"""Issue 46, what a new user met around the commands themselves, through the real CLIs on a small
WordNet-like graph of the tests' own (tests/wordnet_like.py): a forgotten ``--header`` refused
rather than imported as an edge, help that keeps its width in a pipe, both CLIs in docs/cli.md, and
a ready config of sampled negatives for a graph of one's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pbgio.entities import read_entity_names
from tests.cli import pbgio, pbgtrain
from tests.wordnet_like import write_wordnet_like

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train.csv", "valid.csv", "test.csv")


def _inputs(root: Path) -> list[str]:
    return [str(root / split) for split in SPLITS]


def test_a_forgotten_header_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    config = write_wordnet_like(tmp_path)
    done = pbgio("import", str(config), *_inputs(tmp_path), "-d", "comma")
    assert done.returncode == 1
    assert (f"{tmp_path / 'train.csv'}:1: expected an edge or a declared header, found a line that looks like a header "
            "('source', 'relation', 'target': usual column names among them") in done.stderr
    assert "Pass --header if it names the columns, or --no-header to import it as an edge" in done.stderr
    assert not (tmp_path / "data").exists()

    assert pbgio("import", str(config), *_inputs(tmp_path), "-d", "comma", "--header").returncode == 0
    names = read_entity_names(tmp_path / "data", "synset", 0)
    assert "source" not in names and "dog.n.02000000" in names

    said = pbgio("import", str(config), *_inputs(tmp_path), "-d", "comma", "--no-header", "--overwrite")
    assert said.returncode == 0, said.stderr  # the user said line 1 is an edge: it is one
    assert "source" in read_entity_names(tmp_path / "data", "synset", 0)


@pytest.mark.parametrize("command", [["pbgtrain", "fit", "--help"], ["pbgio", "import", "--help"]])
def test_help_in_a_pipe_is_not_squeezed_into_80_columns(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    code = f"import sys; sys.argv = {command!r}; from {command[0]}.__main__ import main; main()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    widths = {len(line) for line in done.stdout.splitlines() if line.startswith("╭")}
    assert widths == {120}, widths
    narrow = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                            env={**env, "COLUMNS": "90"})
    assert {len(line) for line in narrow.stdout.splitlines() if line.startswith("╭")} == {90}  # a width said is kept


def test_docs_cli_covers_both_command_lines() -> None:
    from pbgio.cli import app as pbgio_app
    from pbgtrain.cli import app as pbgtrain_app

    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    for tool, app in (("pbgio", pbgio_app), ("pbgtrain", pbgtrain_app)):
        assert f"\n## {tool}\n" in text
        for info in app.registered_commands:
            name = info.name or (info.callback.__name__ if info.callback else "")
            assert f"### `{tool} {name}`" in text, (tool, name)


def test_the_sampled_recipe_for_a_graph_of_ones_own_runs_as_written(tmp_path: Path) -> None:
    """recipes/own/sampled.json as recipes/README.md says to use it: copied beside the user's CSVs,
    imported, trained (only the size shrunk) and evaluated."""
    recipe = REPO / "recipes" / "own" / "sampled.json"
    cfg = json.loads(recipe.read_text())
    assert not cfg["relations"][0]["all_negs"] and cfg["num_batch_negs"] and cfg["num_uniform_negs"]
    assert "own/sampled.json" in (REPO / "recipes" / "README.md").read_text(encoding="utf-8")
    write_wordnet_like(tmp_path)
    config = tmp_path / "config.json"
    shutil.copy(recipe, config)
    assert pbgio("import", str(config), *_inputs(tmp_path), "-d", "comma", "--header").returncode == 0
    fit = pbgtrain("fit", str(config), "-p", "edge_paths=data/train", "-p", "dimension=8", "-p", "num_epochs=2",
                   "-p", "batch_size=100", "--valid", "data/valid", "--valid-sample", "20", "--no-progress")
    assert fit.returncode == 0, fit.stdout + fit.stderr
    done = pbgtrain("eval", str(config), "-p", "checkpoint_path=model/best", "--edges", "data/test",
                    "--filter", "data/train", "--filter", "data/valid", "--filter", "data/test")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MRR" in done.stdout


def test_index_build_takes_the_only_type_by_default_as_neighbors_does(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    config = write_wordnet_like(tmp_path, dimension=4, num_epochs=1)
    assert pbgio("import", str(config), *_inputs(tmp_path), "-d", "comma", "--header").returncode == 0
    assert pbgtrain("fit", str(config), "-p", "edge_paths=data/train", "--no-progress").returncode == 0
    built = pbgio("index", "build", str(config), "--no-progress")
    assert built.returncode == 0, built.stderr
    assert "faiss flat index of 166 'synset' rows" in built.stderr
    found = pbgio("neighbors", str(config), "dog.n.02000000", "--index", "-k", "3")
    assert found.returncode == 0, found.stderr
    assert "faiss flat, exact" in found.stderr
