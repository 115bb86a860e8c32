"""Issue 46, a new user's third hour, points 1, 2 and 8, each met through the real ``pbgtrain fit`` on
a small WordNet-like graph (tests/wordnet_like.py): what a validation costs, on all the validation
edges or a sample, and where a run's time went; a time cap that starts no validation past it, and
every early end with its reason; a Ctrl-C before the first commit, and a resumed run, said as they
are."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.spec.stats import EXTRA_KEY
from tests.cli import pbgio, pbgtrain
from tests.wordnet_like import write_wordnet_like

VALID_EDGES = 30  # the graph's validation split (wordnet_like's 5 %)
TRAIN = ("-p", "edge_paths=data/train", "--no-progress")
VALID = ("--valid", "data/valid")
TIME_LINE = re.compile(r"^time: training [\d.]+ s, validation [\d.]+ s \((\d+) evaluations?\), "
                       r"checkpointing [\d.]+ s; [\d.]+ s in all$", re.MULTILINE)


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    """The graph imported as a new user imports it; returns its config (3 epochs, dimension 8)."""
    config = write_wordnet_like(tmp_path / "wn", dimension=8, num_epochs=3)
    splits = [str(config.parent / f"{split}.csv") for split in ("train", "valid", "test")]
    done = pbgio("import", str(config), *splits, "-d", "comma", "--header")
    assert done.returncode == 0, done.stderr
    return config


def _fit(config: Path, *args: str) -> Any:
    done = pbgtrain("fit", str(config), *TRAIN, *args)
    assert done.returncode == 0, done.stderr
    return done


def _records(config: Path, key: str) -> list[dict[str, Any]]:
    lines = CheckpointDir(config.parent / "model").read_stats()
    return [line[EXTRA_KEY][key] for line in lines if key in line.get(EXTRA_KEY, {})]


def _last_line(done: Any) -> str:
    return done.stdout.strip().splitlines()[-1]


# --------------------------------------------------------------------------- 1. what a validation costs


def test_every_validation_line_says_how_long_it_took_and_on_which_edges(graph: Path) -> None:
    done = _fit(graph, *VALID, "-p", "num_epochs=2")
    assert "resuming" not in done.stderr  # a first fit
    lines = re.findall(r"^validation after version (\d) \(epoch \d\), (\d+) edges in ([\d.]+) s: MRR ",
                       done.stderr, re.MULTILINE)
    assert [(version, edges) for version, edges, _ in lines] == [("1", str(VALID_EDGES)), ("2", str(VALID_EDGES))]
    records = _records(graph, "validation")
    assert [r["count"] for r in records] == [VALID_EDGES, VALID_EDGES]
    assert all("sample" not in r and r["seconds"] >= 0 for r in records)


def test_a_validation_sample_is_the_same_edges_each_time_and_says_so(graph: Path) -> None:
    """With lr 0 the model never changes: the same sample at each evaluation gives the same figures."""
    done = _fit(graph, *VALID, "--valid-sample", "12", "-p", "lr=0", "-p", "num_epochs=2")
    said = re.findall(r"^validation after version \d \(epoch \d\), a sample of 12 of 30 edges in [\d.]+ s: MRR .*"
                      r"; 12 edges\)", done.stderr, re.MULTILINE)
    assert len(said) == 2, done.stderr
    first, second = _records(graph, "validation")
    assert first["sample"] == second["sample"] == {"edges": 12, "of": VALID_EDGES}
    assert first["count"] == 12 and first["metrics"] == second["metrics"]
    refused = pbgtrain("fit", str(graph), *TRAIN, *VALID, "--valid-sample", "0")
    assert refused.returncode == 2 and "--valid-sample: expected a number of edges ≥ 1, found 0" in refused.stderr


def test_the_summary_and_the_report_split_the_time(graph: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    done = _fit(graph, *VALID, "--valid-sample", "12")
    assert [int(n) for n in TIME_LINE.findall(done.stdout)] == [3], done.stdout
    assert _last_line(done).endswith("over 3 iteration(s); committed checkpoint version 3 of 3")
    (run,) = _records(graph, "run")
    assert run["end"] == "completed" and (run["from_version"], run["version"]) == (0, 3)
    seconds = run["seconds"]
    assert seconds["validations"] == 3 and seconds["training"] > 0 and seconds["checkpointing"] > 0
    assert seconds["training"] + seconds["validation"] + seconds["checkpointing"] <= seconds["total"]
    report = pbgtrain("report", str(graph), "-o", str(tmp_path / "r.png"))
    assert report.returncode == 0, report.stderr
    assert re.search(r", time: training [\d.]+ s, validation [\d.]+ s \(3 evaluations\), checkpointing [\d.]+ s; "
                     r"[\d.]+ s in all$", report.stdout.splitlines()[0]), report.stdout


# --------------------------------------------------------------------------- 2. a time cap, and why a run ended


def test_a_time_cap_starts_no_validation_past_it_once_a_best_is_kept(graph: Path) -> None:
    _fit(graph, *VALID, "--max-iterations", "1")  # version 1 evaluated: the best so far
    done = _fit(graph, *VALID, "--max-minutes", "0", "--last-validation-share", "0")  # no last validation
    assert "validation after version 2 (" not in done.stderr, done.stderr
    assert ("validation after version 2 skipped: past the time cap (--max-minutes); best/ keeps version 1"
            in done.stderr)
    assert re.search(r"stopped early at checkpoint version 2 of 3 \(time cap: --max-minutes 0 passed\); version 2 "
                     r"never validated, best/ holds version 1 \(MRR [\d.]+\)$", _last_line(done)), done.stdout
    assert [r["version"] for r in _records(graph, "validation")] == [1]
    assert [(r["version"], r["end"]) for r in _records(graph, "run")] == [(1, "iteration cap"), (2, "time cap")]


def test_past_the_time_cap_the_first_version_is_still_validated(graph: Path) -> None:
    """Without any validated version there is no best to keep: the last version is evaluated."""
    done = _fit(graph, *VALID, "--max-minutes", "0")
    assert re.search(r"^validation after version 1 \(epoch 1\), 30 edges in", done.stderr, re.MULTILINE)
    assert (graph.parent / "model" / "best").is_dir()
    assert _last_line(done).endswith("(time cap: --max-minutes 0 passed)")


def test_every_early_end_says_why_in_the_last_line_the_records_and_the_report(graph: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    done = _fit(graph, "--max-iterations", "1")
    assert _last_line(done).endswith(
        "stopped early at checkpoint version 1 of 3 (iteration cap: --max-iterations 1 reached)")
    # lr 0: version 2 is the best, version 3 no better, and patience 1 stops the run there
    done = _fit(graph, "-p", "num_epochs=5", "-p", "lr=0", *VALID, "--patience", "1")
    patience = "patience: 1 evaluation(s) in a row without a better validation MRR, --patience 1"
    assert _last_line(done).endswith(f"stopped early at checkpoint version 3 of 5 ({patience})"), done.stdout
    assert [(r["version"], r["end"], r["reason"]) for r in _records(graph, "run")] == [
        (1, "iteration cap", "iteration cap: --max-iterations 1 reached"), (3, "patience", patience)]
    report = pbgtrain("report", str(graph), "-o", str(tmp_path / "r.png"))
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[0].endswith(f", stopped early after version 3 ({patience})"), report.stdout


# --------------------------------------------------------------------------- 8. Ctrl-C, and a resume


def _interrupt_at_bucket(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """Ctrl-C while the ``nth`` bucket (from 1) of the run trains."""
    from pbgtrain.training.trainer import Trainer

    train_bucket = Trainer.train_bucket
    calls = []

    def interrupted(self: Trainer, *args: Any) -> Any:
        calls.append(None)
        if len(calls) == nth:
            raise KeyboardInterrupt
        return train_bucket(self, *args)

    monkeypatch.setattr(Trainer, "train_bucket", interrupted)


def test_an_interrupted_first_fit_says_nothing_was_committed(graph: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_at_bucket(monkeypatch, 1)
    done = pbgtrain("fit", str(graph), *TRAIN)
    assert done.returncode == 130
    said = " ".join(done.stderr.split())
    assert "interrupted before the first commit: nothing was committed (no checkpoint version yet)" in said
    assert "version 0" not in said and not _records(graph, "run")


def test_an_interrupted_run_records_its_end_and_a_resumed_one_says_whence(graph: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_at_bucket(monkeypatch, 2)  # version 1 committed, then Ctrl-C
    done = pbgtrain("fit", str(graph), *TRAIN)
    assert done.returncode == 130
    assert "checkpoint version 1 is committed and intact" in " ".join(done.stderr.split())
    assert [(r["version"], r["end"], r["reason"]) for r in _records(graph, "run")] == [
        (1, "interrupted", "interrupted: Ctrl-C")]
    monkeypatch.undo()
    done = _fit(graph)
    assert "resuming from checkpoint version 1 of 3" in done.stderr.splitlines()
    assert _last_line(done).endswith("over 2 iteration(s); committed checkpoint version 3 of 3")
