"""pbgtrain report: the series collected from training_stats.json, the PNG read back pixel by
pixel (each series found by its colour, where the data puts it), the HTML page, the command
line (also without matplotlib), and the guide (docs/guides/training-report.md) run as written.

The stats are written through pbgio (CheckpointDir.append_stats) with known figures: a 2 × 2
bucket grid, six iterations whose loss falls, held-out metrics rise and edges/s peak in the middle.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.config import parse_config
from pbgio.spec.stats import EXTRA_KEY
from pbgtrain import report
from pbgtrain.config import load_run_config

REPO = Path(__file__).resolve().parents[1]
VALIDATION_PANEL, SPEED_PANEL = 2, 3  # the panels from the top: loss, held-out metrics, validation, edges/s
GUIDE = REPO / "docs" / "guides" / "training-report.md"

BUCKETS = [(0, 0), (0, 1), (1, 0), (1, 1)]
COUNTS = [100, 200, 300, 400]  # training edges of each bucket: 1,000 per iteration
OFFSETS = [2.0, -1.0, 0.0, 0.0]  # bucket loss = the iteration's + offset; count-weighted they cancel
HELD_OUT_COUNTS = [10, 20, 30, 40]
HELD_OUT_OFFSETS = [0.04, -0.02, 0.0, 0.0]  # cancel likewise
LOSS = [9.0, 7.0, 5.5, 4.5, 4.0, 3.8]
HELD_OUT_LOSS = [loss + 1.0 for loss in LOSS]
MRR = [0.10, 0.20, 0.30, 0.40, 0.50, 0.55]
R1 = [m - 0.08 for m in MRR]
R10 = [m + 0.25 for m in MRR]
SPEED = [1000.0, 2000.0, 4000.0, 4000.0, 2000.0, 1000.0]
RAW_CONFIG = {"entities": {"e": {"num_partitions": 2}}, "relations": [{"name": "r", "lhs": "e", "rhs": "e"}],
              "dimension": 8, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
              "eval_fraction": 0.1}


def iteration_lines(it: int, *, loss_shift: float = 0.0, order: tuple[int, ...] = (0, 1, 2, 3),
                    timed: bool = True, held_out: bool = True) -> list[dict[str, Any]]:
    """The lines pbgtrain writes for iteration ``it`` (0-based): one per bucket, then the average."""
    lines = []
    seconds = sum(COUNTS) / SPEED[it]
    clock = 1_000_000.0 + 1000.0 * it
    for position, b in enumerate(order):
        lhs, rhs = BUCKETS[b]
        duration = seconds * COUNTS[b] / sum(COUNTS)
        line: dict[str, Any] = {
            "lhs_partition": lhs, "rhs_partition": rhs, "index": it * len(BUCKETS) + position,
            "stats": {"count": COUNTS[b], "metrics": {"loss": LOSS[it] + OFFSETS[b] + loss_shift, "reg": 0.0}},
            "epoch_idx": it // 2, "edge_path_idx": 0, "edge_chunk_idx": it % 2}
        if held_out:
            metrics = {"loss": HELD_OUT_LOSS[it] + OFFSETS[b], "pos_rank": 5.0 + it,
                       "mrr": MRR[it] + HELD_OUT_OFFSETS[b], "r1": R1[it] + HELD_OUT_OFFSETS[b],
                       "r10": R10[it] + HELD_OUT_OFFSETS[b]}
            line["eval_stats_before"] = {"count": HELD_OUT_COUNTS[b], "metrics": {**metrics, "mrr": 0.0}}
            line["eval_stats_after"] = {"count": HELD_OUT_COUNTS[b], "metrics": metrics}
            line[EXTRA_KEY] = {"eval_protocol": "raw, 5 batch + 5 uniform negatives, both sides averaged"}
        if timed:
            line[EXTRA_KEY] = {**line.get(EXTRA_KEY, {}), "rank": 0, "trained_from": clock,
                               "trained_until": clock + duration}
        clock += duration
        lines.append(line)
    if held_out:
        lines.append({"epoch_idx": it // 2, "edge_path_idx": 0, "edge_chunk_idx": it % 2,
                      "index": (it + 1) * len(BUCKETS) - 1,
                      "eval_stats_chunk_avg": {"count": 100, "metrics": {"mrr": 0.0}}})
    return lines


def all_lines(**options: Any) -> list[dict[str, Any]]:
    return [line for it in range(len(LOSS)) for line in iteration_lines(it, **options)]


def write_run(root: Path, records: list[dict[str, Any]], *, checkpoint_config: bool = True) -> Path:
    """A config at ``root/config.json`` whose checkpoint holds ``records`` as its stats."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.json"
    config.write_text(json.dumps(RAW_CONFIG), encoding="utf-8")
    ckpt = CheckpointDir(root / "model")
    if records:
        ckpt.append_stats(records)
    if checkpoint_config:
        ckpt.write_config(parse_config({**RAW_CONFIG, "num_epochs": 3}, "test"))
    return config


# --------------------------------------------------------------------------- collecting


def test_points_are_count_weighted_averages_of_the_buckets() -> None:
    points = report.iteration_points(all_lines(), len(BUCKETS))
    assert [p.number for p in points] == [1, 2, 3, 4, 5, 6]
    assert [p.edges for p in points] == [1000] * 6
    assert [(p.epoch_idx, p.edge_chunk_idx) for p in points] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [p.loss for p in points] == pytest.approx(LOSS)
    assert [p.held_out["loss"] for p in points] == pytest.approx(HELD_OUT_LOSS)
    assert [p.held_out["mrr"] for p in points] == pytest.approx(MRR)  # after, not before (0.0)
    assert [p.held_out["r10"] for p in points] == pytest.approx(R10)
    assert [p.held_out_edges for p in points] == [100] * 6
    assert [p.edges_per_second for p in points] == pytest.approx(SPEED)
    assert report.eval_protocol(all_lines()) == "raw, 5 batch + 5 uniform negatives, both sides averaged"


def test_an_iteration_trained_again_counts_its_last_attempt() -> None:
    """A crash between an iteration's stats and its commit repeats its lines (maybe in another
    bucket order) when it is trained again: the later lines replace the earlier ones."""
    lines = all_lines()
    at = next(i for i, line in enumerate(lines) if line["index"] == 2 * len(BUCKETS))
    records = lines[:at] + iteration_lines(2, loss_shift=50.0, order=(3, 1, 0, 2)) + lines[at:]
    points = report.iteration_points(records, len(BUCKETS))
    assert [p.number for p in points] == [1, 2, 3, 4, 5, 6]
    assert [p.loss for p in points] == pytest.approx(LOSS)
    assert [p.edges for p in points] == [1000] * 6


def test_lines_without_times_or_held_out_edges_leave_those_panels_empty() -> None:
    """Lines the original wrote have no pbgtrain extras; a run with eval_fraction 0 no eval stats."""
    points = report.iteration_points(all_lines(timed=False, held_out=False), len(BUCKETS))
    assert [p.loss for p in points] == pytest.approx(LOSS)
    assert all(p.seconds is None and p.edges_per_second is None and not p.held_out for p in points)
    loss, metrics, validation, speed = report.panels(points)
    assert [s.key for s in loss.series] == ["loss"]
    assert metrics.series == () and "eval_fraction" in metrics.empty_note
    assert validation.series == () and "--valid" in validation.empty_note
    assert speed.series == () and "no training times" in speed.empty_note


def test_panels_hold_the_series_with_fixed_colours() -> None:
    points = report.iteration_points(all_lines(), len(BUCKETS))
    loss, metrics, _, speed = report.panels(points, "raw")
    assert [s.key for s in loss.series] == ["loss", "held_out_loss"]
    assert [s.key for s in metrics.series] == ["mrr", "r1", "r10"]  # the mean rank is off the 0 … 1 scale
    assert [s.key for s in speed.series] == ["edges_per_second"]
    for panel in (loss, metrics, speed):
        for series in panel.series:
            assert series.colour == report.SERIES_COLOURS[series.key]
            assert series.x == (1, 2, 3, 4, 5, 6)
    assert metrics.series[0].y == pytest.approx(MRR)
    assert metrics.ylim == report.METRIC_LIMITS
    assert "(raw)" in metrics.title


def test_the_config_shown_is_the_checkpoints_else_the_given_one(tmp_path: Path) -> None:
    trained = report.load_report(load_run_config(write_run(tmp_path / "a", all_lines())))
    assert trained.config_source.endswith("model/config.json")
    assert json.loads(trained.config_json)["num_epochs"] == 3  # what fit trained with (its -p included)
    config = write_run(tmp_path / "b", all_lines(), checkpoint_config=False)  # stats before the first commit
    early = report.load_report(load_run_config(config))
    assert early.config_source == str(config)
    assert json.loads(early.config_json)["num_epochs"] == 1  # the schema's default: the given config
    assert len(early.points) == 6


def test_no_stats_is_a_clear_error(tmp_path: Path) -> None:
    run = load_run_config(write_run(tmp_path, [], checkpoint_config=False))
    with pytest.raises(report.NoStatsError, match=r"model/training_stats.json: no training stats yet.*pbgtrain fit"):
        report.load_report(run)


# --------------------------------------------------------------------------- the picture


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])


def _panel_box(panel: int, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` pixel bounds of a panel's axes, from the fixed geometry of a
    picture of four panels, or of three (no held-out panel: a note says why), told apart by the
    picture's height."""
    height, width = shape[:2]
    layouts = {tuple(round(inches * report.DPI) for inches in size): rects
               for size, rects in (report.figure_layout(4), report.figure_layout(3, notes=1))}
    assert (width, height) in layouts, (width, height)
    left, bottom, w, h = layouts[(width, height)][panel]
    return (round((1 - bottom - h) * height), round((1 - bottom) * height),
            round(left * width), round((left + w) * width))


def _rows_at_points(image: np.ndarray, panel: int, colour: str, xs: list[int],
                    span: list[int] | None = None) -> list[float]:
    """For each iteration in ``xs``, the mean row of ``colour``'s pixels in its column, inside the
    panel's axes (a few pixels in from the frame); asserts the colour is there. The x axis spans
    the iterations ``span`` (default: ``xs``)."""
    top, bottom, left, right = _panel_box(panel, image.shape)
    inside = image[top + 3:bottom - 3, left + 3:right - 3, :3]
    mask = np.abs(inside - _rgb(colour)).max(axis=2) < 0.02
    assert mask.sum() > 200, f"{colour}: {mask.sum()} pixels in panel {panel}"
    xlim = (min(span or xs) - 0.5, max(span or xs) + 0.5)
    rows = []
    for x in xs:
        column = left + (x - xlim[0]) / (xlim[1] - xlim[0]) * (right - left) - (left + 3)
        found = np.nonzero(mask[:, round(column) - 1:round(column) + 2].any(axis=1))[0]
        assert found.size, f"{colour}: nothing at iteration {x}"
        rows.append(top + 3 + float(found.mean()))
    return rows


def _follows(rows: list[float], values: list[float]) -> float:
    """The largest distance (pixels) of ``rows`` from the best line row = a + b·value; b < 0:
    larger values are drawn higher up."""
    slope, intercept = np.polyfit(values, rows, 1)
    assert slope < 0
    return float(np.abs(np.polyval([slope, intercept], values) - rows).max())


def bottom_of(image: np.ndarray, panel: int) -> float:
    """The row of y = 0 in a panel whose y axis starts at 0 (its frame's bottom)."""
    return float(_panel_box(panel, image.shape)[1])


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> tuple[report.TrainingReport, bytes]:
    pytest.importorskip("matplotlib")
    run = load_run_config(write_run(tmp_path_factory.mktemp("run"), all_lines()))
    training = report.load_report(run)
    return training, report.render_png(training)


def _read_png(data: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(data), format="png")


def test_the_png_shows_each_series_where_the_data_puts_it(picture: tuple[report.TrainingReport, bytes]) -> None:
    image = _read_png(picture[1])
    xs = [1, 2, 3, 4, 5, 6]
    # loss panel (y from the data): the falling training loss, the held-out loss above it
    loss_rows = _rows_at_points(image, 0, report.SERIES_COLOURS["loss"], xs)
    held_rows = _rows_at_points(image, 0, report.SERIES_COLOURS["held_out_loss"], xs)
    assert loss_rows == sorted(loss_rows) and loss_rows[0] < loss_rows[-1] - 100  # falls: drawn lower and lower
    assert _follows(loss_rows + held_rows, LOSS + HELD_OUT_LOSS) < 3
    assert all(h < r for h, r in zip(held_rows, loss_rows, strict=True))
    # metrics panel (y from 0 to 1): each metric at its value
    top, bottom, _, _ = _panel_box(1, image.shape)
    low, high = report.METRIC_LIMITS
    for key, values in (("mrr", MRR), ("r1", R1), ("r10", R10)):
        rows = _rows_at_points(image, 1, report.SERIES_COLOURS[key], xs)
        expected = [top + (high - v) / (high - low) * (bottom - top) for v in values]
        assert np.abs(np.array(rows) - expected).max() < 3, (key, rows, expected)
    # edges/s panel: up, flat, down, from 0
    speed_rows = _rows_at_points(image, SPEED_PANEL, report.SERIES_COLOURS["edges_per_second"], xs)
    assert speed_rows[2] < speed_rows[1] < speed_rows[0] and speed_rows[3] < speed_rows[4] < speed_rows[5]
    assert _follows([*speed_rows, bottom_of(image, SPEED_PANEL)], [*SPEED, 0.0]) < 3
    # colours of series that are not there are not drawn (e.g. Hits@50, AUC)
    for key in ("r50", "auc"):
        top, bottom, left, right = _panel_box(1, image.shape)
        inside = image[top:bottom, left:right, :3]
        assert (np.abs(inside - _rgb(report.SERIES_COLOURS[key])).max(axis=2) < 0.02).sum() == 0


def test_empty_panels_say_why(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = load_run_config(write_run(tmp_path, all_lines(timed=False, held_out=False)))
    image = _read_png(report.render_png(report.load_report(run)))
    _rows_at_points(image, 0, report.SERIES_COLOURS["loss"], [1, 2, 3, 4, 5, 6])
    assert image.shape[0] == round(report.figure_layout(3, notes=1)[0][1] * report.DPI)  # no held-out panel
    for panel in (1, 2):  # validation and edges/s: a grey note, no series colour
        top, bottom, left, right = _panel_box(panel, image.shape)
        inside = image[top + 3:bottom - 3, left + 3:right - 3, :3]
        colours = [_rgb(c) for c in report.SERIES_COLOURS.values()]
        assert not any((np.abs(inside - c).max(axis=2) < 0.02).any() for c in colours)
        assert (inside.max(axis=2) < 0.5).sum() > 100  # the text of the note


def test_html_embeds_the_picture_and_the_config(tmp_path: Path, picture: tuple[report.TrainingReport, bytes]) -> None:
    training, _ = picture
    png_path, html_path = tmp_path / "r.png", tmp_path / "r.html"
    report.write_report(training, png_path, html_path)
    page = html_path.read_text(encoding="utf-8")
    embedded = re.search(r'<img id="curves"[^>]* src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded is not None
    assert base64.b64decode(embedded.group(1)) == png_path.read_bytes()
    _rows_at_points(_read_png(png_path.read_bytes()), 0, report.SERIES_COLOURS["loss"], [1, 2, 3, 4, 5, 6])
    config = re.search(r'<pre id="config">(.*?)</pre>', page, flags=re.DOTALL)
    assert config is not None
    shown = json.loads(html.unescape(config.group(1)))
    assert shown == json.loads(Path(training.config_source).read_text(encoding="utf-8"))
    assert shown["num_epochs"] == 3  # the checkpoint's config (what the run trained with), not config.json's
    assert "model/config.json" in page
    assert page.count("<tr><td>") == 6 and "<td>0.5500</td>" in page  # the last MRR, in the table
    header = re.findall(r"<th>(.*?)</th>", page)
    assert header.count("held-out loss") == 1 and len(header) == len(set(header)), header  # each column once


# --------------------------------------------------------------------------- the command line

RUN_CLI = """import sys
if sys.argv.pop(1) == "block":
    sys.modules["matplotlib"] = None  # import matplotlib now raises ImportError, as when not installed
sys.argv[0] = "pbgtrain"
from pbgtrain.cli import main
main()
"""


def pbgtrain(*args: str, block_matplotlib: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    return subprocess.run([sys.executable, "-c", RUN_CLI, "block" if block_matplotlib else "allow", *args],
                          capture_output=True, text=True, check=False, cwd=cwd, env=env, timeout=120)


def test_cli_writes_the_png_and_the_page_and_says_where(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    config = write_run(tmp_path / "run", all_lines())
    done = pbgtrain("report", str(config), "--html", "page.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"6 iteration(s) of {tmp_path / 'run' / 'model'}, loss 9 → 3.8, held-out MRR 0.1000 → 0.5500, "
        "median 2,000 edges/s", "wrote training-report.png", "wrote page.html"]
    _rows_at_points(_read_png((tmp_path / "training-report.png").read_bytes()), SPEED_PANEL,
                    report.SERIES_COLOURS["edges_per_second"], [1, 2, 3, 4, 5, 6])
    assert (tmp_path / "page.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    out = tmp_path / "elsewhere.png"
    assert pbgtrain("report", str(config), "-o", str(out)).returncode == 0
    assert out.read_bytes() == (tmp_path / "training-report.png").read_bytes()


def test_cli_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    config = write_run(tmp_path / "run", all_lines())
    done = pbgtrain("report", str(config), "-o", "out.png", block_matplotlib=True, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: pbgtrain report draws with matplotlib, which is not installed: pip install 'pbg[report]'"]
    assert not (tmp_path / "out.png").exists()


def test_cli_without_stats_is_a_clear_error(tmp_path: Path) -> None:
    config = write_run(tmp_path / "run", [], checkpoint_config=False)
    done = pbgtrain("report", str(config), cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "training_stats.json: no training stats yet" in done.stderr
    assert f"run pbgtrain fit {config} first" in done.stderr.replace("\n", "")
    assert not (tmp_path / "training-report.png").exists()


# --------------------------------------------------------------------------- the guide

BLOCK = re.compile(r"^```(console|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.slow  # runs the guide's commands, which train: about 8 s
def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    """Each ``$ command`` of the guide's console blocks runs in one directory and prints what the
    guide shows (``...`` elides); its Python block runs there after them. The picture the
    commands write holds the run's loss curve."""
    pytest.importorskip("matplotlib")
    import doctest

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               CI="1", COLUMNS="200", NO_COLOR="1")
    checker = doctest.OutputChecker()
    ran = 0
    for kind, body in BLOCK.findall(GUIDE.read_text(encoding="utf-8")):
        if kind == "python":
            done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines()[-1].startswith("5 ")  # the last iteration's number, loss, …
            ran += 1
            continue
        for chunk in re.split(r"^\$ ", body, flags=re.MULTILINE)[1:]:
            command, _, want = chunk.partition("\n")
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=300)
            assert done.returncode == 0, f"$ {command}\n{done.stdout}"
            assert checker.check_output(want, done.stdout, doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE), \
                f"$ {command}\nwanted:\n{want}\ngot:\n{done.stdout}"
            ran += 1
    assert ran >= 4
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "data:image/png;base64," in (tmp_path / "curves.html").read_text(encoding="utf-8")
    image = _read_png((tmp_path / "demo" / "report.png").read_bytes())
    rows = _rows_at_points(image, 0, report.SERIES_COLOURS["loss"], [1, 2, 3, 4, 5])
    assert rows[0] < rows[-1]  # the loss of the example falls
    assert "<pre id=\"config\">" in (tmp_path / "demo" / "report.html").read_text(encoding="utf-8")
