"""The picture of a run, as data: four panels of series, marks and vertical lines, with fixed
geometry and colours (:data:`PANEL_RECTS`, :data:`SERIES_COLOURS`, :data:`MARK_COLOURS`), so that
``tests/test_report.py`` can find each of them in the PNG by its colour.

Top to bottom: loss, held-out metrics after each bucket, validation (``fit --valid``: MRR and
Hits@10 by version, the best version starred, learning-rate changes and the early stop as
vertical lines; its y axis from the data, :func:`data_limits`), training edges/s. The x axis of
every panel is the iteration counted from 1, which is the checkpoint version it committed. A
run without held-out edges (``eval_fraction`` 0) has no held-out panel: the picture is one
panel shorter (:func:`figure_layout`), and a note under its title says why (:func:`drawn`).

>>> from pbgtrain.report.collect import ValidationPoint
>>> evaluations = [ValidationPoint(v, "valid", None, 10, {"mrr": m, "r10": 2 * m}, d, b, s) for v, m, d, b, s in [
...     (2, .2, "best", 2, 1.0), (4, .1, "no improvement; learning rate × 0.5", 2, .5),
...     (6, .1, "no improvement; stop: 2 evaluation(s) without improvement (patience 2)", 2, .5)]]
>>> valid = validation_panel(evaluations)
>>> [s.key for s in valid.series], [(m.key, m.x, m.y) for m in valid.markers], [(e.key, e.x) for e in valid.events]
(['valid_mrr', 'valid_r10'], [('best', 2, 0.2)], [('lr_change', 4), ('stop', 6)])
>>> valid.ylim
(0.07, 0.43)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pbgtrain.report.collect import IterationPoint, ValidationPoint, best_evaluation

# The picture: FIGURE_INCHES at DPI; one axes per panel at PANEL_RECTS (left, bottom, width,
# height, fractions of the figure; the first is the top panel); legends right of the axes.
FIGURE_INCHES = (11.0, 13.0)
DPI = 100
PANEL_RECTS: tuple[tuple[float, float, float, float], ...] = (
    (0.08, 0.76, 0.70, 0.18), (0.08, 0.525, 0.70, 0.18), (0.08, 0.29, 0.70, 0.18), (0.08, 0.055, 0.70, 0.18))
METRIC_LIMITS = (0.0, 1.0)  # y range of the held-out metrics panel (the validation panel's: from its data)
DATA_MARGIN = 0.1  # of the data's range, left free above and below it (validation panel)
NOTE_INCHES = 0.3  # the height of a line of note under the picture's title (a panel left out says why there)
LINE_WIDTH = 2.0
# Fixed colours, one per series (matplotlib's tab10, which has no grey in it but #7f7f7f; the
# validation series and the marks from ColorBrewer's Dark2).
SERIES_COLOURS: dict[str, str] = {
    "loss": "#1f77b4", "held_out_loss": "#ff7f0e", "mrr": "#2ca02c", "r1": "#d62728", "r3": "#9467bd",
    "r10": "#8c564b", "r50": "#e377c2", "auc": "#17becf", "edges_per_second": "#bcbd22",
    "valid_mrr": "#1b9e77", "valid_r10": "#d95f02",
}
# The best version's star, the vertical lines of learning-rate changes and of the early stop,
# and the line of the version a kept checkpoint (best/, epoch_k/) or --version holds.
MARK_COLOURS: dict[str, str] = {"best": "#e7298a", "lr_change": "#7570b3", "stop": "#a6761d", "shown": "#e6ab02"}
# Colours of other metrics a stats file may hold, in the order met.
OTHER_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
METRIC_ORDER = ("mrr", "r1", "r3", "r10", "r50", "auc")
NOT_IN_METRICS_PANEL = {"loss", "pos_rank"}  # the held-out loss is drawn with the training loss
METRIC_LABELS = {"mrr": "MRR", "r1": "Hits@1", "r3": "Hits@3", "r10": "Hits@10", "r50": "Hits@50", "auc": "AUC",
                 "pos_rank": "MR"}
VALIDATION_SERIES = ("mrr", "r10")  # drawn of each evaluation; the HTML page's table has them all


@dataclass(frozen=True)
class Series:
    """One line of the picture: ``y`` at iteration numbers ``x`` (counted from 1)."""

    key: str
    label: str
    colour: str
    x: tuple[int, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class Marker:
    """One point drawn large over a series: the best version's validation MRR."""

    key: str
    label: str
    colour: str
    x: int
    y: float


@dataclass(frozen=True)
class Event:
    """A vertical line at a version: a learning-rate change, the early stop, the version shown."""

    key: str
    label: str
    colour: str
    x: int
    style: str  # matplotlib's line style: "-", "--", ":"


@dataclass(frozen=True)
class Panel:
    """One axes of the picture."""

    title: str
    ylabel: str
    series: tuple[Series, ...]
    empty_note: str  # drawn instead when there is no series
    ylim: tuple[float, float] | None = None  # None: from the data (edges/s from 0)
    markers: tuple[Marker, ...] = ()
    events: tuple[Event, ...] = ()
    left_out_when_empty: bool = False  # without a series, not drawn at all: its empty_note goes in the title


def drawn(shown: Sequence[Panel]) -> tuple[tuple[Panel, ...], tuple[str, ...]]:
    """The panels of the picture, top to bottom, and the notes of those left out (an empty panel
    that is :attr:`Panel.left_out_when_empty`: the held-out metrics of a run without held-out edges),
    which the picture shows under its title."""
    left_out = [p for p in shown if p.left_out_when_empty and not p.series]
    return tuple(p for p in shown if p not in left_out), tuple(f"no panel of {p.title}: {p.empty_note}"
                                                               for p in left_out)


def figure_layout(count: int, notes: int = 0) -> tuple[tuple[float, float],
                                                      tuple[tuple[float, float, float, float], ...]]:
    """The size of a picture of ``count`` panels (inches) and their axes (:data:`PANEL_RECTS`'
    fractions of it, top to bottom): each panel as tall, as far from the next and from the edges as in
    the picture of four (:data:`FIGURE_INCHES`, :data:`PANEL_RECTS`), and :data:`NOTE_INCHES` more
    at the top for each of ``notes`` lines under the title; the height in whole pixels.

    >>> figure_layout(4) == (FIGURE_INCHES, PANEL_RECTS)
    True
    >>> size, rects = figure_layout(3, notes=1)
    >>> size, [round(r[1] * size[1], 3) for r in rects], {round(r[3] * size[1], 3) for r in rects}
    ((11.0, 10.24), [6.825, 3.77, 0.715], {2.34})
    """
    if (count, notes) == (len(PANEL_RECTS), 0):
        return FIGURE_INCHES, PANEL_RECTS
    width, height = FIGURE_INCHES
    pitch = (PANEL_RECTS[0][1] - PANEL_RECTS[1][1]) * height  # from one panel's bottom to the next one's
    tall = round((height - (len(PANEL_RECTS) - count) * pitch + notes * NOTE_INCHES) * DPI) / DPI
    below = PANEL_RECTS[-1][1] * height  # under the last panel
    rects = tuple((left, (below + (count - 1 - index) * pitch) / tall, w, h * height / tall)
                  for index, (left, _, w, h) in enumerate(PANEL_RECTS[:count]))
    return (width, tall), rects


def data_limits(values: Iterable[float]) -> tuple[float, float]:
    """A metric axis (within 0 … 1) from the data: its range and :data:`DATA_MARGIN` of it (of the
    value, when there is one value) above and below, so that an MRR of 0.044 is not on the floor.

    >>> data_limits([0.0444, 0.1]), data_limits([0.0444]), data_limits([0.2, 0.95]), data_limits([])
    ((0.03884, 0.10556), (0.03996, 0.04884), (0.125, 1.0), (0.0, 1.0))
    """
    found = [v for v in values if math.isfinite(v)]
    if not found:
        return METRIC_LIMITS
    low, high = min(found), max(found)
    margin = DATA_MARGIN * ((high - low) or abs(high) or 1.0)
    return round(max(METRIC_LIMITS[0], low - margin), 10), round(min(METRIC_LIMITS[1], high + margin), 10)


def _series(key: str, label: str, colour: str, points: Sequence[IterationPoint],
            value: Callable[[IterationPoint], float | None]) -> Series | None:
    pairs = [(p.number, v) for p in points if (v := value(p)) is not None]
    if not pairs:
        return None
    return Series(key, label, colour, tuple(x for x, _ in pairs), tuple(float(y) for _, y in pairs))


def _held_out(name: str) -> Callable[[IterationPoint], float | None]:
    return lambda point: point.held_out.get(name)


def _is_fraction(values: Iterable[float]) -> bool:
    return all(math.isnan(v) or 0.0 <= v <= 1.0 for v in values)


def validation_panel(evaluations: Sequence[ValidationPoint]) -> Panel:
    """The validation panel: MRR and Hits@10 by version, the best starred, learning-rate changes
    (dashed) and the early stop (solid) as vertical lines."""
    empty = "no validation (pbgtrain fit --valid PATH ranks the versions on validation edges)"
    if not evaluations:
        return Panel("validation", "metric", (), empty, METRIC_LIMITS)
    series = []
    for name in VALIDATION_SERIES:
        pairs = [(e.version, e.metrics[name]) for e in evaluations if name in e.metrics]
        if pairs:
            series.append(Series(f"valid_{name}", f"validation {METRIC_LABELS[name]}", SERIES_COLOURS[f"valid_{name}"],
                                 tuple(x for x, _ in pairs), tuple(y for _, y in pairs)))
    best = best_evaluation(evaluations)
    markers = () if best is None else (Marker(
        "best", f"best: version {best.version} ({best.metrics['mrr']:.4f})", MARK_COLOURS["best"],
        best.version, best.metrics["mrr"]),)
    events: list[Event] = []
    scale = 1.0
    for e in evaluations:
        if e.lr_scale != scale:
            events.append(Event("lr_change", f"learning rate × {e.lr_scale:.3g}",
                                MARK_COLOURS["lr_change"], e.version, "--"))
            scale = e.lr_scale
        if e.stopped:
            events.append(Event("stop", "early stop", MARK_COLOURS["stop"], e.version, "-"))
    title = f"validation on {posixpath.basename(evaluations[-1].edge_path.rstrip('/'))}, filtered, by version"
    return Panel(title, "metric", tuple(series), empty, data_limits(y for s in series for y in s.y), markers,
                 tuple(events))


def panels(points: Sequence[IterationPoint], protocol: str | None = None,
           evaluations: Sequence[ValidationPoint] = (), shown: Event | None = None,
           ) -> tuple[Panel, Panel, Panel, Panel]:
    """The four panels of the picture, with their series (only those with data); ``shown``, the
    line of the version a kept checkpoint holds, is drawn in each."""
    loss = [s for s in (
        _series("loss", "training loss", SERIES_COLOURS["loss"], points, lambda p: p.loss),
        _series("held_out_loss", "held-out loss", SERIES_COLOURS["held_out_loss"], points,
                _held_out("loss"))) if s is not None]
    names = list(dict.fromkeys(name for p in points for name in p.held_out))
    ordered = [n for n in METRIC_ORDER if n in names] + [n for n in names if n not in METRIC_ORDER]
    metrics: list[Series] = []
    others = itertools.cycle(OTHER_COLOURS)
    for name in ordered:
        if name in NOT_IN_METRICS_PANEL or not _is_fraction(p.held_out[name] for p in points if name in p.held_out):
            continue  # ranks and other figures off the 0 … 1 scale are in the HTML page's table
        colour = SERIES_COLOURS.get(name) or next(others)
        found = _series(name, METRIC_LABELS.get(name, name), colour, points, _held_out(name))
        if found is not None:
            metrics.append(found)
    speed = _series("edges_per_second", "edges/s", SERIES_COLOURS["edges_per_second"], points,
                    lambda p: p.edges_per_second)
    drawn = (
        Panel("loss per edge" + (" (held-out: after training on each bucket)" if len(loss) > 1 else ""), "loss",
              tuple(loss), "no loss recorded"),
        Panel("held-out metrics after each bucket" + (f" ({protocol})" if protocol else ""), "metric",
              tuple(metrics), "no held-out edges (eval_fraction is 0)", METRIC_LIMITS, left_out_when_empty=True),
        validation_panel(evaluations),
        Panel("training edges/s (edges over the wall-clock time of the iteration's buckets)", "edges/s",
              () if speed is None else (speed,), "no training times recorded (stats not written by pbgtrain)"),
    )
    loss_panel, held_out_panel, validation, speed_panel = (
        panel if shown is None else dataclasses.replace(panel, events=(*panel.events, shown)) for panel in drawn)
    return loss_panel, held_out_panel, validation, speed_panel
