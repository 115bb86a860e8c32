"""``recipes/``: every recipe's config loads, has its row in recipes/README.md, and its documented
commands (import, ``fit`` with the row's options, ``eval`` of ``model/best``) run as written on a
small graph, with only the size shrunk (``-p dimension=8 -p num_epochs=2``). The figures
themselves come from ``tools/bench_quality.py`` on the real datasets.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from pbgio.importers import import_edge_lists
from pbgtrain.cli import app
from pbgtrain.config import load_run_config

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.json"))
SPLITS = ("train", "valid", "test")


def _bench_quality() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_quality", REPO / "tools" / "bench_quality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small_graph(dest: Path, seed: int = 0) -> None:
    """Train/valid/test TSVs of a random 60-entity, 3-relation graph (valid and test edges only
    between entities and relations that train has)."""
    rng = random.Random(seed)
    triples = sorted({(f"e{rng.randrange(60)}", f"r{rng.randrange(3)}", f"e{rng.randrange(60)}") for _ in range(900)})
    rng.shuffle(triples)
    train, valid, test = triples[:700], triples[700:760], triples[760:820]
    seen = {part for h, r, t in train for part in (h, r, t)}
    for name, rows in zip(SPLITS, (train, valid, test), strict=True):
        kept = rows if name == "train" else [row for row in rows if set(row) <= seen]
        (dest / f"{name}.tsv").write_text("".join("\t".join(row) + "\n" for row in kept), encoding="utf-8")


def test_every_recipe_has_a_config_and_a_row() -> None:
    assert {"fb15k-237", "wn18rr", "kinship", "umls", "nations"} <= set(RECIPES)
    bench = _bench_quality()
    for name in RECIPES:
        run = load_run_config(REPO / "recipes" / f"{name}.json")
        assert run.config.dynamic_relations and run.config.relations[0].all_negs, name
        options, minutes = bench.recipe_options(name)
        assert "--precision" in options and minutes < float("inf"), name


@pytest.mark.parametrize("name", RECIPES)
def test_the_documented_commands_run(name: str, tmp_path: Path) -> None:
    work = tmp_path / name
    work.mkdir()
    shutil.copy(REPO / "recipes" / f"{name}.json", work / "config.json")
    _small_graph(work)
    import_edge_lists(work / "config.json", [work / f"{s}.tsv" for s in SPLITS], overwrite=True)
    options, _ = _bench_quality().recipe_options(name)
    data = [str(work / "data" / s) for s in SPLITS]
    small = ["-p", "dimension=8", "-p", "num_epochs=2", "-p", "workers=1"]
    runner = CliRunner()
    done = runner.invoke(app, ["fit", str(work / "config.json"), "-p", "edge_paths=data/train", *small,
                               "--valid", data[1], *(a for d in data for a in ("--filter", d)), *options,
                               "--no-progress"])
    assert done.exit_code == 0, done.output
    assert "kept in" in done.output
    done = runner.invoke(app, ["eval", str(work / "config.json"), "-p", "checkpoint_path=model/best", *small,
                               "--edges", data[2], *(a for d in data for a in ("--filter", d)), "--no-progress"])
    assert done.exit_code == 0, done.output
    assert "MRR" in done.output
    stats = [json.loads(line) for line in (work / "model" / "training_stats.json").read_text().splitlines()]
    assert any("validation" in line.get("pbgtrain", {}) for line in stats)
