"""Issue 46, points 4 and 9: what a new user's held-out figures do not say, through the real CLI on
the WordNet-like graph of tests/wordnet_like.py (inverse pairs, symmetric relations, two relations
without a twin, 6 test edges naming 'hermit' synsets that appear nowhere else)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import pbgio, pbgtrain
from tests.wordnet_like import INVERSES, ONE_WAY, SYMMETRIC, wordnet_like, write_wordnet_like


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("wordnet")
    cfg = write_wordnet_like(root)
    files = [str(root / f"{split}.csv") for split in ("train", "valid", "test")]
    result = pbgio("import", str(cfg), *files, "-d", "comma", "--header", "--no-progress")
    assert result.returncode == 0, result.stderr
    return cfg, result.stderr + result.stdout


def expected_leakage(split: str) -> dict[str, tuple[int, int, int]]:
    """(edges, inverse, symmetric) per relation of ``split``, counted on the edges themselves."""
    graph = wordnet_like()
    train = set(graph["train"])
    pairs = {(h, t): {r for h2, r, t2 in graph["train"] if (h2, t2) == (h, t)} for h, _, t in train}
    out: dict[str, tuple[int, int, int]] = {}
    for h, r, t in graph[split]:
        reverse = pairs.get((t, h), set())
        n, inv, sym = out.get(r, (0, 0, 0))
        out[r] = (n + 1, inv + bool(reverse - {r}), sym + (r in reverse))
    return out


def test_import_reports_inverse_and_symmetric_leakage_per_relation(imported: tuple[Path, str]) -> None:
    _, output = imported
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if "data/test:" in line and "reverse in" in line)
    assert "inverse or symmetric leakage" in lines[at]
    for relation, (edges, inverse, symmetric) in expected_leakage("test").items():
        line = next(line for line in lines[at + 1:] if line.strip().startswith(f"{relation}:"))
        assert f"{relation}: {edges:,} edges" in line
        assert f"inverse {inverse / edges:.1%}, symmetric {symmetric / edges:.1%}" in line


def test_import_json_holds_the_leakage_of_each_held_out_path(tmp_path: Path) -> None:
    cfg = write_wordnet_like(tmp_path)
    files = [str(tmp_path / f"{split}.csv") for split in ("train", "valid", "test")]
    result = pbgio("import", str(cfg), *files, "-d", "comma", "--header", "--no-progress", "--json")
    assert result.returncode == 0, result.stderr
    leakage = json.loads(result.stdout)["leakage"]
    test = next(rows for path, rows in leakage.items() if path.endswith("test"))
    by_name = {row["relation"]: row for row in test}
    for relation, (edges, inverse, symmetric) in expected_leakage("test").items():
        assert (by_name[relation]["edges"], by_name[relation]["inverse"], by_name[relation]["symmetric"]) == \
            (edges, inverse, symmetric)
    assert all(by_name[r]["inverse_or_symmetric"] == 0 for r in ONE_WAY if r in by_name)
    assert all(by_name[r]["symmetric"] == by_name[r]["edges"] for r in SYMMETRIC if r in by_name)
    assert any(by_name[r]["inverse"] for r in INVERSES)


def test_eval_reports_the_edges_whose_entities_were_never_trained(imported: tuple[Path, str]) -> None:
    cfg, _ = imported
    fit = pbgtrain("fit", str(cfg), "-p", "edge_paths=data/train", "--no-progress")
    assert fit.returncode == 0, fit.stderr
    graph = wordnet_like()
    named = {e for h, _, t in graph["train"] for e in (h, t)}
    untrained = sum(1 for h, _, t in graph["test"] if h not in named or t not in named)
    assert untrained >= 6  # the hermits, at least
    filters = ["--filter", "data/train", "--filter", "data/valid", "--filter", "data/test"]
    text = pbgtrain("eval", str(cfg), "--edges", "data/test", *filters, "--no-progress")
    assert text.returncode == 0, text.stderr
    share = untrained / len(graph["test"])
    assert f"{untrained:,} of the evaluated edges ({share:.1%}) name an entity that no training edge names" \
        in text.stdout
    assert "training paths: " in text.stdout and text.stdout.rstrip().endswith("data/train)")
    as_json = pbgtrain("eval", str(cfg), "--edges", "data/test", *filters, "--json", "--no-progress")
    figures = json.loads(as_json.stdout)["untrained_edges"]
    assert figures["count"] == untrained and figures["share"] == pytest.approx(share)
    assert [Path(p).name for p in figures["training_paths"]] == ["train"]
