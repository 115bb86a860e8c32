"""pbgtrain report draws ``fit --valid``'s evaluations: the validation MRR and Hits@10 by version,
the best version starred, learning-rate changes and the early stop as vertical lines, in the PNG
(read back pixel by pixel) and the HTML page's table; for the run, for a kept version (``best/``)
and for the run as it stood after ``--version N``. Then a real ``fit --valid`` run, reported.

The run of tests/test_report.py (six iterations) gets one evaluation per version, its decisions
made by pbgtrain's own rule (:class:`pbgtrain.early_stopping.ValidationState`), so that the lines are
what ``fit --valid`` writes: best at version 2, the learning rate halved after version 5 (3
evaluations without a better MRR), stopped after version 6 (patience 4).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.errors import UsageError
from pbgio.example import build_example
from pbgio.spec import naming
from pbgio.spec.stats import EXTRA_KEY
from pbgtrain import report
from pbgtrain.config import load_run_config
from pbgtrain.early_stopping import ValidationOptions, ValidationState
from pbgtrain.validation_log import RECORD_KEY
from tests.test_report import (
    SPEED_PANEL,
    VALIDATION_PANEL,
    _panel_box,
    _read_png,
    _rgb,
    _rows_at_points,
    all_lines,
    pbgtrain,
    write_run,
)

VALID_MRR = [0.20, 0.30, 0.28, 0.27, 0.26, 0.25]
VALID_R10 = [m + 0.3 for m in VALID_MRR]
OPTIONS = ValidationOptions("data/valid", patience=4, lr_decay=0.5, lr_patience=3)
PROTOCOL = "filtered (against train+valid), all 40 entities as candidates, both sides averaged"
BEST, LR_CHANGE, STOP = 2, 5, 6


def validation_line(version: int, mrr: float, state: ValidationState, edge_path: str = "/run/data/valid",
                    options: ValidationOptions = OPTIONS) -> dict[str, Any]:
    """The line ``fit --valid`` appends after evaluating ``version`` (pbgtrain.early_stopping.ValidationRule)."""
    decision = state.record(version, mrr, options)
    return {"epoch_idx": (version - 1) // 2, "edge_path_idx": 0, "edge_chunk_idx": (version - 1) % 2,
            "index": version * 4 - 1, EXTRA_KEY: {RECORD_KEY: {
                "version": version, "edge_path": edge_path, "protocol": PROTOCOL, "count": 50,
                "metrics": {"pos_rank": 3.0, "mrr": mrr, "r1": mrr / 2, "r10": mrr + 0.3},
                "decision": decision.decision, **state.to_record()}}}


def run_lines(*, extra_at_start: bool = True) -> list[dict[str, Any]]:
    """Six iterations, each followed by its evaluation; also an evaluation on another path (an
    earlier run's) and one of version 7, which no commit followed (a crash): neither is drawn."""
    lines = all_lines()
    state = ValidationState()
    other = [validation_line(1, 0.9, ValidationState(), edge_path="/run/data/old")] if extra_at_start else []
    out = [*other]
    for version in range(1, 7):
        out += [line for line in lines if line.get("index", -1) // 4 == version - 1]
        out.append(validation_line(version, VALID_MRR[version - 1], state))
    out.append(validation_line(7, 0.99, state))
    return out


def write_committed_run(root: Path, committed: int = 6) -> Path:
    config = write_run(root, run_lines())
    (root / "model" / naming.CHECKPOINT_VERSION).write_text(str(committed), encoding="utf-8")
    return config


def test_the_evaluations_are_collected_by_version_with_their_decisions() -> None:
    evaluations = report.validation_points(run_lines(), committed=6)
    assert [e.version for e in evaluations] == [1, 2, 3, 4, 5, 6]  # not the old path's, not version 7's
    assert [e.metrics["mrr"] for e in evaluations] == pytest.approx(VALID_MRR)
    assert {e.edge_path for e in evaluations} == {"/run/data/valid"}
    assert [e.best_version for e in evaluations] == [1, 2, 2, 2, 2, 2]
    assert [e.lr_scale for e in evaluations] == [1, 1, 1, 1, 0.5, 0.5]
    assert [e.stopped for e in evaluations] == [False] * 5 + [True]
    panel = report.validation_panel(evaluations)
    versions = (1, 2, 3, 4, 5, 6)
    assert [(s.key, s.x) for s in panel.series] == [("valid_mrr", versions), ("valid_r10", versions)]
    assert [(m.key, m.x, m.y) for m in panel.markers] == [("best", BEST, 0.30)]
    assert [(e.key, e.x) for e in panel.events] == [("lr_change", LR_CHANGE), ("stop", STOP)]
    assert panel.ylim == report.data_limits([*VALID_MRR, *VALID_R10])


def _columns_of(image: np.ndarray, panel: int, colour: str, xs: list[int]) -> tuple[np.ndarray, float]:
    """The iterations (x data units) at whose columns ``colour`` shows in the panel's axes, and the
    largest fraction of the axes' height it covers in one column."""
    top, bottom, left, right = _panel_box(panel, image.shape)
    inside = image[top + 3:bottom - 3, left + 3:right - 3, :3]
    mask = np.abs(inside - _rgb(colour)).max(axis=2) < 0.02
    columns = np.nonzero(mask.any(axis=0))[0]
    xlim = (min(xs) - 0.5, max(xs) + 0.5)
    at = xlim[0] + (columns + 3) / (right - left) * (xlim[1] - xlim[0])
    return at, float(mask.sum(axis=0).max() / mask.shape[0]) if columns.size else 0.0


def validation_rows(page: str) -> list[list[str]]:
    """The cells of the HTML page's validation table, row by row."""
    table = re.search(r'<table id="validation">(.*?)</table>', page, flags=re.DOTALL)
    assert table is not None
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(1)) if "<td>" in row]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_committed_run(tmp_path_factory.mktemp("valid-run"))


def test_the_png_draws_the_validation_where_the_data_puts_it(run: Path) -> None:
    pytest.importorskip("matplotlib")
    training = report.load_report(load_run_config(run))
    image = _read_png(report.render_png(training))
    xs = [1, 2, 3, 4, 5, 6]
    top, bottom, _, _ = _panel_box(VALIDATION_PANEL, image.shape)
    ylim = training.panels[VALIDATION_PANEL].ylim  # from the data
    assert ylim is not None
    low, high = ylim
    unstarred = [x for x in xs if x != BEST]  # the star covers the MRR line at the best version
    for key, values, at in (("valid_mrr", VALID_MRR, unstarred), ("valid_r10", VALID_R10, xs)):
        rows = _rows_at_points(image, VALIDATION_PANEL, report.SERIES_COLOURS[key], at)
        expected = [top + (high - values[x - 1]) / (high - low) * (bottom - top) for x in at]
        assert np.abs(np.array(rows) - expected).max() < 3, (key, rows, expected)
    at, _ = _columns_of(image, VALIDATION_PANEL, report.MARK_COLOURS["best"], xs)
    assert np.abs(at - BEST).max() < 0.25  # one star, at the best version, at its MRR
    star = _rows_at_points(image, VALIDATION_PANEL, report.MARK_COLOURS["best"], [BEST], span=xs)
    assert abs(star[0] - (top + (high - VALID_MRR[BEST - 1]) / (high - low) * (bottom - top))) < 3
    for key, x in (("lr_change", LR_CHANGE), ("stop", STOP)):
        at, height = _columns_of(image, VALIDATION_PANEL, report.MARK_COLOURS[key], xs)
        assert at.size and np.abs(at - x).max() < 0.05, (key, at)
        assert height > 0.4, (key, height)  # a vertical line (dashed for a change), not a dot
    for panel in (0, 1, SPEED_PANEL):  # validation marks only in the validation panel
        for colour in report.MARK_COLOURS.values():
            assert _columns_of(image, panel, colour, xs)[0].size == 0


def test_a_kept_version_is_reported_with_its_run_and_marked(run: Path) -> None:
    pytest.importorskip("matplotlib")
    best = run.parent / "model" / naming.BEST_DIR
    best.mkdir()
    (best / naming.CHECKPOINT_VERSION).write_text(str(BEST), encoding="utf-8")
    training = report.load_report(load_run_config(run, [f"checkpoint_path={best}"]))
    assert training.checkpoint == str(run.parent / "model")  # the run's stats, from the directory above
    assert len(training.points) == 6 and len(training.evaluations) == 6
    assert training.shown is not None and training.shown.label == "version 2 kept in best/"
    image = _read_png(report.render_png(training))
    for panel in (0, 1, VALIDATION_PANEL, SPEED_PANEL):  # the kept version's line in every panel
        at, height = _columns_of(image, panel, report.MARK_COLOURS["shown"], [1, 2, 3, 4, 5, 6])
        assert at.size and np.abs(at - BEST).max() < 0.05 and height > 0.2, (panel, at, height)  # dotted


def test_version_draws_the_run_as_it_stood_then(run: Path) -> None:
    training = report.load_report(load_run_config(run), version=4)
    assert [p.number for p in training.points] == [1, 2, 3, 4]
    assert [e.version for e in training.evaluations] == [1, 2, 3, 4]
    assert training.shown is not None and training.shown.x == 4
    assert "validation MRR 0.2000 (version 1) → best 0.3000 (version 2) of 4 evaluations" in training.summary()
    for wrong in (0, 7):
        with pytest.raises(UsageError, match=rf"--version {wrong}: .*model has committed versions 1 … 6"):
            report.load_report(load_run_config(run), version=wrong)


def test_the_html_page_lists_the_evaluations_and_marks_the_best(run: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    training = report.load_report(load_run_config(run))
    page = report.render_html(training, report.render_png(training))
    table = re.search(r'<table id="validation">(.*?)</table>', page, flags=re.DOTALL)
    assert table is not None
    header = re.findall(r"<th>(.*?)</th>", table.group(1))
    assert header == ["version", "MRR", "Hits@1", "Hits@10", "MR", "decision", "learning-rate scale"]
    rows = validation_rows(page)
    assert [row[0] for row in rows] == ["1", "2 ★", "3", "4", "5", "6"]
    assert [float(row[1]) for row in rows] == pytest.approx(VALID_MRR)
    assert [float(row[3]) for row in rows] == pytest.approx(VALID_R10)
    assert rows[4][5] == "no improvement; learning rate × 0.5" and rows[4][6] == "0.5"
    assert rows[5][5].startswith("no improvement; stop: 4 evaluation(s)")
    assert table.group(1).count('<tr class="best">') == 1
    assert html.escape(PROTOCOL) in page and "/run/data/valid" in page
    assert "stopped early after version 6" in page


def test_cli_reports_a_kept_version_and_says_so(run: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    best = run.parent / "model" / naming.BEST_DIR
    best.mkdir(exist_ok=True)
    (best / naming.CHECKPOINT_VERSION).write_text(str(BEST), encoding="utf-8")
    done = pbgtrain("report", str(run), "-p", "checkpoint_path=model/best", "--html", "page.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"6 iteration(s) of {run.parent / 'model'}, version 2 kept in best/, loss 9 → 3.8, held-out MRR 0.1000 → "
        "0.5500, median 2,000 edges/s, validation MRR 0.2000 (version 1) → best 0.3000 (version 2) of 6 evaluations, "
        "stopped early after version 6")
    assert '<table id="validation">' in (tmp_path / "page.html").read_text(encoding="utf-8")
    done = pbgtrain("report", str(run), "--version", "9", cwd=tmp_path)
    assert done.returncode == 2 and "--version 9:" in done.stderr and "Traceback" not in done.stderr


def test_a_real_fit_with_validation_is_reported(tmp_path: Path) -> None:
    """``fit --valid`` with a learning rate of 0 never improves on its first version: the rate is
    decayed after version 3 (lr_patience 2) and patience 3 stops the run after version 4."""
    pytest.importorskip("matplotlib")
    example = tmp_path / "example"
    build_example(example, num_edges=600)
    done = pbgtrain("fit", str(example / "config.json"), "-p", "num_epochs=6", "-p", "lr=0", "--valid",
                    "edges/test", "--patience", "3", "--lr-decay", "0.5", "--lr-patience", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    done = pbgtrain("report", str(example / "config.json"), "-o", str(tmp_path / "r.png"), "--html",
                    str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    assert "stopped early after version 4" in done.stdout
    records = [line[EXTRA_KEY][RECORD_KEY] for line in CheckpointDir(example / "checkpoint").read_stats()
               if RECORD_KEY in line.get(EXTRA_KEY, {})]
    assert [(r["version"], r["lr_scale"]) for r in records] == [(1, 1.0), (2, 1.0), (3, 0.5), (4, 0.5)]
    image = _read_png((tmp_path / "r.png").read_bytes())
    mrr = [r["metrics"]["mrr"] for r in records]
    training = report.load_report(load_run_config(example / "config.json"))
    valid_panel = VALIDATION_PANEL - 1  # the example holds no edges out: no held-out panel above it
    assert training.drawn[0][valid_panel] == training.panels[VALIDATION_PANEL]
    top, bottom, _, _ = _panel_box(valid_panel, image.shape)
    ylim = training.panels[VALIDATION_PANEL].ylim
    assert ylim is not None  # from the data
    low, high = ylim
    rows = _rows_at_points(image, valid_panel, report.SERIES_COLOURS["valid_mrr"], [2, 3, 4],
                           span=[1, 2, 3, 4])  # 1: starred
    assert np.abs(np.array(rows) - [top + (high - m) / (high - low) * (bottom - top) for m in mrr[1:]]).max() < 3
    for key, versions in (("best", [1]), ("lr_change", [3]), ("stop", [4])):
        at, _ = _columns_of(image, valid_panel, report.MARK_COLOURS[key], [1, 2, 3, 4])
        assert sorted({round(float(x)) for x in at}) == versions, key
    rows_shown = validation_rows((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert [row[0] for row in rows_shown] == ["1 ★", "2", "3", "4"]
    assert [float(row[1]) for row in rows_shown] == pytest.approx(mrr, abs=5e-5)
