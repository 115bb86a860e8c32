"""``pbgtrain report``: a run's learning curve as pictures (a PNG, and an HTML page).

The figures come from the checkpoint's ``training_stats.json``, read through
:meth:`pbgio.checkpoint.CheckpointDir.read_stats`; each becomes one point per *iteration* (an
edge chunk of an edge path of an epoch, which commits one checkpoint version, so iteration N
counted from 1 is checkpoint version N). A bucket line belongs to iteration ``index //
buckets_per_iteration`` (:mod:`pbgio.spec.stats`).

* **loss**: the buckets' training loss per edge, averaged weighted by their edge counts, and the
  held-out loss the same way;
* **held-out metrics** (MRR, Hits@k, AUC): the buckets' ``eval_stats_after``, averaged weighted
  by their held-out edge counts: the figures ``pbgtrain fit`` prints after each iteration;
* **edges/s**: the iteration's training edges over its wall-clock window, from its first
  bucket's ``trained_from`` to its last bucket's ``trained_until`` (pbgtrain's extras; lines the
  original wrote have no times, and the panel says so).

When an iteration was trained again (a crash between its stats and its commit repeats its
lines), the lines of the last attempt replace the earlier ones.

Collecting needs only the standard library; drawing needs matplotlib (``pip install
'pbg[report]'``), imported when drawing and used through its Agg canvas only (no pyplot, no
global backend). The picture's geometry and colours are fixed (:data:`PANEL_RECTS`,
:data:`SERIES_COLOURS`), so that it can be read back: ``tests/test_report.py`` finds each
series in the PNG by its colour.

>>> line = {"index": 0, "lhs_partition": 0, "rhs_partition": 0, "stats": {"count": 10, "metrics": {"loss": 2.0}},
...         "pbgtrain": {"trained_from": 100.0, "trained_until": 102.0}}
>>> [(p.iteration, p.edges, p.loss, p.edges_per_second) for p in iteration_points([line], 1)]
[(0, 10, 2.0, 5.0)]
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast

from pbgio.errors import PbgioError
from pbgio.spec.stats import EXTRA_KEY

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from pbgio.layout import Layout
    from pbgio.storage import AnyPath

INSTALL_HINT = "pip install 'pbg[report]'"

# The picture: FIGURE_INCHES at DPI; one axes per panel at PANEL_RECTS (left, bottom, width,
# height, fractions of the figure; the first is the top panel); legends right of the axes.
FIGURE_INCHES = (11.0, 10.0)
DPI = 100
PANEL_RECTS: tuple[tuple[float, float, float, float], ...] = (
    (0.08, 0.68, 0.70, 0.24), (0.08, 0.38, 0.70, 0.24), (0.08, 0.07, 0.70, 0.24))
METRIC_LIMITS = (0.0, 1.0)  # y range of the held-out metrics panel
LINE_WIDTH = 2.0
# Fixed colours, one per series (matplotlib's tab10, which has no grey in it but #7f7f7f).
SERIES_COLOURS: dict[str, str] = {
    "loss": "#1f77b4", "held_out_loss": "#ff7f0e", "mrr": "#2ca02c", "r1": "#d62728", "r3": "#9467bd",
    "r10": "#8c564b", "r50": "#e377c2", "auc": "#17becf", "edges_per_second": "#bcbd22",
}
# Colours of other metrics a stats file may hold, in the order met.
OTHER_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
METRIC_ORDER = ("mrr", "r1", "r3", "r10", "r50", "auc")
NOT_IN_METRICS_PANEL = {"loss", "pos_rank"}  # the held-out loss is drawn with the training loss
METRIC_LABELS = {"mrr": "MRR", "r1": "Hits@1", "r3": "Hits@3", "r10": "Hits@10", "r50": "Hits@50", "auc": "AUC",
                 "pos_rank": "MR"}


class MissingMatplotlibError(PbgioError):
    """Drawing needs matplotlib, which is not installed."""

    def __init__(self) -> None:
        super().__init__(f"pbgtrain report draws with matplotlib, which is not installed: {INSTALL_HINT}")


class NoStatsError(PbgioError):
    """The checkpoint has no training stats to draw yet."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        super().__init__(f"{path}: no training stats yet (no iteration has been trained); "
                         f"run pbgtrain fit {source} first")


# --------------------------------------------------------------------------- collecting


@dataclass(frozen=True)
class IterationPoint:
    """What the stats say about one iteration."""

    iteration: int  # 0-based position in the training plan; checkpoint version iteration + 1
    epoch_idx: int | None
    edge_path_idx: int | None
    edge_chunk_idx: int | None
    edges: int  # training edges of its buckets
    loss: float | None  # training loss per edge
    held_out: Mapping[str, float]  # held-out metrics after each bucket, loss included
    held_out_edges: int
    seconds: float | None  # wall-clock window of its buckets (None: not recorded)

    @property
    def number(self) -> int:
        """The iteration counted from 1: the checkpoint version it commits."""
        return self.iteration + 1

    @property
    def edges_per_second(self) -> float | None:
        """Training edges over the wall-clock window of the buckets (None: no times recorded)."""
        if self.seconds is None or self.seconds <= 0 or self.edges == 0:
            return None
        return self.edges / self.seconds


def _bucket_key(line: Mapping[str, Any]) -> object:
    lhs, rhs = line.get("lhs_partition"), line.get("rhs_partition")
    return (lhs, rhs) if lhs is not None and rhs is not None else ("index", line["index"])


def _weighted(pairs: Iterable[tuple[int, float]]) -> float | None:
    pairs = [(count, value) for count, value in pairs if count > 0]
    total = sum(count for count, _ in pairs)
    return sum(count * value for count, value in pairs) / total if total else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _point(iteration: int, lines: Sequence[Mapping[str, Any]]) -> IterationPoint:
    trained = [(line["stats"]["count"], line["stats"]["metrics"]) for line in lines]
    held_out = [(line["eval_stats_after"]["count"], line["eval_stats_after"]["metrics"])
                for line in lines if "eval_stats_after" in line]
    names = list(dict.fromkeys(name for _, metrics in held_out for name in metrics))
    averaged = {name: _weighted((count, metrics[name]) for count, metrics in held_out if name in metrics)
                for name in names}
    extras = [line[EXTRA_KEY] for line in lines if isinstance(line.get(EXTRA_KEY), dict)]
    starts = [t for t in (_number(extra.get("trained_from")) for extra in extras) if t is not None]
    ends = [t for t in (_number(extra.get("trained_until")) for extra in extras) if t is not None]
    first = lines[0]
    return IterationPoint(
        iteration=iteration, epoch_idx=first.get("epoch_idx"), edge_path_idx=first.get("edge_path_idx"),
        edge_chunk_idx=first.get("edge_chunk_idx"), edges=sum(count for count, _ in trained),
        loss=_weighted((count, metrics["loss"]) for count, metrics in trained if "loss" in metrics),
        held_out={name: value for name, value in averaged.items() if value is not None},
        held_out_edges=sum(count for count, _ in held_out),
        seconds=max(ends) - min(starts) if len(starts) == len(ends) == len(lines) else None)


def iteration_points(records: Iterable[Mapping[str, Any]], buckets_per_iteration: int) -> list[IterationPoint]:
    """One point per iteration with a bucket line (a line holding ``stats``), in training order.

    ``records`` are the lines of ``training_stats.json``; ``buckets_per_iteration`` is the
    config's lhs × rhs partitions. Lines without ``stats`` (the original's per-iteration
    ``eval_stats_chunk_avg`` line) add nothing: the held-out figures come from the buckets.
    """
    if buckets_per_iteration < 1:
        raise ValueError(f"expected buckets_per_iteration >= 1, found {buckets_per_iteration}")
    attempts: dict[int, dict[object, Mapping[str, Any]]] = {}  # iteration -> its last attempt's lines by bucket
    for line in records:
        if "stats" not in line:
            continue
        iteration = line["index"] // buckets_per_iteration
        attempt = attempts.setdefault(iteration, {})
        key = _bucket_key(line)
        if key in attempt:  # the iteration was trained again: its last attempt counts
            attempt = attempts[iteration] = {}
        attempt[key] = line
    return [_point(iteration, list(attempts[iteration].values())) for iteration in sorted(attempts)]


def eval_protocol(records: Iterable[Mapping[str, Any]]) -> str | None:
    """How the held-out edges were ranked, as pbgtrain recorded it (the last line saying so)."""
    found = None
    for line in records:
        extra = line.get(EXTRA_KEY)
        if isinstance(extra, dict) and isinstance(extra.get("eval_protocol"), str):
            found = extra["eval_protocol"]
    return found


@dataclass(frozen=True)
class Series:
    """One line of the picture: ``y`` at iteration numbers ``x`` (counted from 1)."""

    key: str
    label: str
    colour: str
    x: tuple[int, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class Panel:
    """One axes of the picture, top to bottom: loss, held-out metrics, edges/s."""

    title: str
    ylabel: str
    series: tuple[Series, ...]
    empty_note: str  # drawn instead when there is no series
    ylim: tuple[float, float] | None = None  # None: from the data (edges/s from 0)


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


def panels(points: Sequence[IterationPoint], protocol: str | None = None) -> tuple[Panel, Panel, Panel]:
    """The three panels of the picture, with their series (only those with data)."""
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
    return (
        Panel("loss per edge" + (" (held-out: after training on each bucket)" if len(loss) > 1 else ""), "loss",
              tuple(loss), "no loss recorded"),
        Panel("held-out metrics after each bucket" + (f" ({protocol})" if protocol else ""), "metric",
              tuple(metrics), "no held-out edges (eval_fraction is 0)", METRIC_LIMITS),
        Panel("training edges/s (edges over the wall-clock time of the iteration's buckets)", "edges/s",
              () if speed is None else (speed,), "no training times recorded (stats not written by pbgtrain)"),
    )


# --------------------------------------------------------------------------- the report of a run


@dataclass(frozen=True)
class TrainingReport:
    """What a report shows: the run's points and its config."""

    checkpoint: str  # where the stats were read, as messages show it
    points: tuple[IterationPoint, ...]
    protocol: str | None
    config_json: str
    config_source: str  # the file the config was read from

    @property
    def panels(self) -> tuple[Panel, Panel, Panel]:
        return panels(self.points, self.protocol)

    @property
    def title(self) -> str:
        edges = sum(p.edges for p in self.points)
        return f"{self.checkpoint}: {len(self.points)} iteration(s), {edges:,} training edges"

    def summary(self) -> str:
        """One line: first → last loss and MRR, the median edges/s."""
        parts = [f"{len(self.points)} iteration(s) of {self.checkpoint}"]
        first, last = self.points[0], self.points[-1]
        if first.loss is not None and last.loss is not None:
            parts.append(f"loss {first.loss:.4g} → {last.loss:.4g}")
        if "mrr" in first.held_out and "mrr" in last.held_out:
            parts.append(f"held-out MRR {first.held_out['mrr']:.4f} → {last.held_out['mrr']:.4f}")
        speeds = [s for s in (p.edges_per_second for p in self.points) if s is not None]
        if speeds:
            parts.append(f"median {statistics.median(speeds):,.0f} edges/s")
        return ", ".join(parts)


def load_report(layout: Layout) -> TrainingReport:
    """The report of ``layout``'s checkpoint: its stats and the config it was trained with (the
    config given when the checkpoint has none yet). Raises :class:`NoStatsError` when no iteration
    has been trained."""
    from pbgio import storage
    from pbgio.checkpoint import CheckpointDir
    from pbgio.layout import stored_config
    from pbgio.spec import naming

    ckpt = CheckpointDir(layout.checkpoint_path)
    records = ckpt.read_stats()
    stored = stored_config(ckpt)  # stats are appended before the first commit writes config.json
    config, source = (layout.config, layout.source) if stored is None else \
        (stored, storage.display(ckpt.path / naming.CONFIG_JSON))
    lhs, rhs = config.bucket_grid()
    points = iteration_points(records, lhs * rhs)
    if not points:
        raise NoStatsError(storage.display(ckpt.path / naming.TRAINING_STATS), layout.source)
    return TrainingReport(storage.display(ckpt.path), tuple(points), eval_protocol(records), config.to_json(),
                          source)


# --------------------------------------------------------------------------- drawing


def require_matplotlib() -> None:
    """Raise :class:`MissingMatplotlibError` (with how to install it) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingMatplotlibError from None


class _Sink:
    """Where matplotlib writes the PNG: in memory (pbgio writes it to disk). matplotlib (and pillow)
    call only ``write`` on a file object they did not open."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def value(self) -> bytes:
        return b"".join(self.chunks)


def _draw_panel(ax: Axes, panel: Panel, xlim: tuple[float, float], last: bool) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_title(panel.title, fontsize=10, loc="left")
    ax.set_ylabel(panel.ylabel)
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, color="#dddddd", linewidth=0.8)
    if last:
        ax.set_xlabel("iteration (= the checkpoint version it committed)")
    for series in panel.series:
        ax.plot(series.x, series.y, color=series.colour, linewidth=LINE_WIDTH, marker="o", markersize=4,
                label=series.label)
    if not panel.series:
        ax.text(0.5, 0.5, panel.empty_note, transform=ax.transAxes, ha="center", va="center", color="#555555")
        ax.set_yticks([])
        return
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    elif panel.series[0].key == "edges_per_second":  # from 0, so that a slowdown looks its size
        top = max((y for y in panel.series[0].y if math.isfinite(y)), default=1.0)
        ax.set_ylim(0, top * 1.1)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9, frameon=False)


def render_png(report: TrainingReport) -> bytes:
    """The picture of ``report`` as PNG bytes: three panels (loss, held-out metrics, edges/s)
    over the iterations, at :data:`FIGURE_INCHES` × :data:`DPI`, axes at :data:`PANEL_RECTS`."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=DPI)
    FigureCanvasAgg(figure)
    numbers = [p.number for p in report.points]
    xlim = (min(numbers) - 0.5, max(numbers) + 0.5)
    shown = report.panels
    for index, (rect, panel) in enumerate(zip(PANEL_RECTS, shown, strict=True)):
        _draw_panel(figure.add_axes(rect), panel, xlim, last=index == len(shown) - 1)
    figure.suptitle(report.title, x=0.08, y=0.975, ha="left", fontsize=11)
    sink = _Sink()
    figure.savefig(cast("IO[bytes]", sink), format="png", dpi=DPI, metadata={"Software": None})
    return sink.value()


def _cell(value: float | int | None, digits: str) -> str:
    return "" if value is None else format(value, digits)


def render_html(report: TrainingReport, png: bytes) -> str:
    """A self-contained HTML page: the picture ``png`` (embedded), a table of the figures per
    iteration, and the run config (pretty JSON)."""
    found = list(dict.fromkeys(name for p in report.points for name in p.held_out))
    ordered = [n for n in ("loss", *METRIC_ORDER) if n in found]
    names = ordered + [n for n in found if n not in ordered]
    head = ["iteration", "epoch", "edges", "loss", *(
        "held-out " + METRIC_LABELS.get(n, n) for n in names), "edges/s"]
    rows = []
    for p in report.points:
        cells = [str(p.number), "" if p.epoch_idx is None else str(p.epoch_idx + 1), f"{p.edges:,}",
                 _cell(p.loss, ".4g"), *(_cell(p.held_out.get(n), ".4f" if n in METRIC_ORDER else ".4g")
                                         for n in names),
                 _cell(p.edges_per_second, ",.0f")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    protocol = f"<p>Held-out edges ranked: {html.escape(report.protocol)}.</p>\n" if report.protocol else ""
    image = base64.b64encode(png).decode("ascii")
    width, height = (round(inches * DPI) for inches in FIGURE_INCHES)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Training report: {html.escape(report.checkpoint)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: {width + 40}px; color: #222; }}
img {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ padding: 0.2em 0.7em; text-align: right; border-bottom: 1px solid #ddd; }}
pre {{ background: #f6f8fa; padding: 1em; overflow: auto; }}
</style>
</head>
<body>
<h1>Training report</h1>
<p>{html.escape(report.summary())}.</p>
{protocol}<img id="curves" alt="loss, held-out metrics and edges/s per iteration" width="{width}" \
height="{height}" src="data:image/png;base64,{image}">
<h2>Per iteration</h2>
<table>
<thead><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in head)}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<h2>Run config</h2>
<p>From <code>{html.escape(report.config_source)}</code>.</p>
<pre id="config">{html.escape(report.config_json, quote=False)}</pre>
</body>
</html>
"""


def write_report(report: TrainingReport, png_path: AnyPath, html_path: AnyPath | None = None) -> None:
    """Write the picture to ``png_path`` and, when given, the HTML page to ``html_path`` (both or
    neither, each replaced atomically through :mod:`pbgio.storage`)."""
    from pbgio.storage import together, write_bytes, write_text

    png = render_png(report)
    page = None if html_path is None else render_html(report, png)
    with together():
        write_bytes(png_path, png)
        if html_path is not None and page is not None:
            write_text(html_path, page)
