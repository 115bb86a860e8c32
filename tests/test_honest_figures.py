"""Figures a user can read correctly: ``pbgtrain fit`` warns when it trains on an edge path named
like a held-out split, and ``pbgtrain eval`` warns when the edges it evaluates are ones the model
trained on (the default, the config's edge_paths; what it trained on is the checkpoint's
config.json, ``-p`` overrides of the run included)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.entities import read_entity_count
from pbgio.example import build_example
from tests.cli import pbgtrain

HELD_OUT_WARNING = "named like a held-out split"
TRAINED_ON_WARNING = "the model trained on these edges"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled example (edges/train trained on, edges/test held out), trained one epoch."""
    root = tmp_path_factory.mktemp("example") / "example"
    build_example(root, num_edges=3000)
    fitted = pbgtrain("fit", str(root / "config.json"), "-p", "num_epochs=1")
    assert fitted.returncode == 0, fitted.stderr
    assert HELD_OUT_WARNING not in fitted.stderr
    return root


def test_fit_warns_when_it_trains_on_a_split_named_test(example: Path, tmp_path: Path) -> None:
    fitted = pbgtrain("fit", str(example / "config.json"), "-p", "num_epochs=1", "-p",
                      "edge_paths=edges/train,edges/test", "-p", f"checkpoint_path={tmp_path / 'model'}")
    assert fitted.returncode == 0, fitted.stderr
    warnings = [line for line in fitted.stderr.splitlines() if HELD_OUT_WARNING in line]
    assert len(warnings) == 1 and "'edges/test'" in warnings[0], fitted.stderr
    # eval knows what this checkpoint trained on (its config.json), whatever the config file says
    evaluated = pbgtrain("eval", str(example / "config.json"), "-p", f"checkpoint_path={tmp_path / 'model'}",
                         "--edges", str(example / "edges" / "test"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert TRAINED_ON_WARNING in evaluated.stderr and str(example / "edges" / "test") in evaluated.stderr


def test_eval_warns_on_the_edges_it_trained_on_and_not_on_held_out_ones(example: Path) -> None:
    default = pbgtrain("eval", str(example / "config.json"))
    assert default.returncode == 0, default.stderr
    assert TRAINED_ON_WARNING in default.stderr and str(example / "edges" / "train") in default.stderr
    held_out = pbgtrain("eval", str(example / "config.json"), "--edges", str(example / "edges" / "test"))
    assert held_out.returncode == 0, held_out.stderr
    assert TRAINED_ON_WARNING not in held_out.stderr
    assert held_out.stdout.startswith("checkpoint version 1")


def test_a_graph_smaller_than_its_eval_negatives_ranks_against_every_entity(tmp_path: Path) -> None:
    """The UMLS case: 2,000 negatives drawn with repeats from a few dozen entities gave a mean rank
    above the number of entities. Held-out edges during fit and the default eval now rank against
    every entity of the partition (the exact figure), and say so."""
    root = tmp_path / "small"
    build_example(root, num_edges=3000)
    config = json.loads((root / "config.json").read_text())
    largest = max(read_entity_count(root / config["entity_path"], etype, part)
                  for etype, entity in config["entities"].items() for part in range(entity.get("num_partitions", 1)))
    assert largest < 1000 + 50  # fewer entities than eval negatives (the defaults, batch capped at 1000)
    fitted = pbgtrain("fit", str(root / "config.json"), "-p", "num_epochs=2", "-p", "eval_fraction=0.2",
                      "-p", "eval_num_uniform_negs=1000", "-p", "eval_num_batch_negs=1000")
    assert fitted.returncode == 0, fitted.stderr
    stats = CheckpointDir(root / config["checkpoint_path"]).read_stats()
    lines = [line for line in stats if "eval_stats_before" in line]
    assert lines
    for line in lines:
        assert line["eval_stats_before"]["metrics"]["pos_rank"] <= largest, line
        assert "all entities of the partition" in line["pbgtrain"]["eval_protocol"], line
    evaluated = pbgtrain("eval", str(root / "config.json"), "--edges", str(root / "edges" / "test"), "--json",
                         "-p", "eval_num_uniform_negs=1000")
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout)
    assert result["metrics"]["pos_rank"] <= largest and "entities" in result["protocol"], result


def test_every_eval_command_in_the_docs_names_the_edges_it_measures() -> None:
    """A reader copies commands: none evaluates the config's edge_paths (the training edges) by default."""
    repo = Path(__file__).resolve().parents[1]
    found = []
    for doc in [repo / "README.md", repo / "recipes" / "README.md", *sorted((repo / "docs").rglob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", doc.read_text(encoding="utf-8"))  # join continued command lines
        for command in re.findall(r"pbgtrain eval \S+\.(?:json|py)\b[^\n`]*", text):
            found.append(command)
            assert "--edges" in command, f"{doc.relative_to(repo)}: {command}"
    assert len(found) >= 8, found
