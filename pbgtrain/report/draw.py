"""Drawing a report: the PNG (matplotlib's Agg canvas only: no pyplot, no global backend) and a
self-contained HTML page, written through :mod:`pbgio.storage`. matplotlib is imported when
drawing (``pip install 'pbg[report]'``)."""

from __future__ import annotations

import base64
import html
import math
from typing import IO, TYPE_CHECKING, cast

from pbgio.errors import PbgioError
from pbgtrain.report.panels import (
    DPI,
    FIGURE_INCHES,
    LINE_WIDTH,
    METRIC_LABELS,
    METRIC_ORDER,
    NOTE_INCHES,
    Panel,
    figure_layout,
)
from pbgtrain.report.run import TrainingReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from pbgio.storage import AnyPath

INSTALL_HINT = "pip install 'pbg[report]'"
TITLE_Y = 0.975  # the top of the picture's title, a fraction of the height of the picture of four panels


class MissingMatplotlibError(PbgioError):
    """Drawing needs matplotlib, which is not installed."""

    def __init__(self) -> None:
        super().__init__(f"pbgtrain report draws with matplotlib, which is not installed: {INSTALL_HINT}")


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
    for marker in panel.markers:
        ax.plot([marker.x], [marker.y], color=marker.colour, marker="*", markersize=18, linestyle="none",
                label=marker.label, zorder=5)
    for event in panel.events:
        ax.axvline(event.x, color=event.colour, linestyle=event.style, linewidth=LINE_WIDTH, label=event.label,
                   zorder=1.8)  # over the grid (1.5), under the series (2)
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
    """The picture of ``report`` as PNG bytes: four panels (loss, held-out metrics, validation,
    edges/s; three without held-out edges) over the iterations, at :data:`DPI`, the size and the
    axes of :func:`~pbgtrain.report.panels.figure_layout`."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown, notes = report.drawn
    size, rects = figure_layout(len(shown), len(notes))
    figure = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(figure)
    numbers = [p.number for p in report.points]
    xlim = (min(numbers) - 0.5, max(numbers) + 0.5)
    for index, (rect, panel) in enumerate(zip(rects, shown, strict=True)):
        _draw_panel(figure.add_axes(rect), panel, xlim, last=index == len(shown) - 1)
    title_from_top = (1 - TITLE_Y) * FIGURE_INCHES[1]  # inches: the same in a picture of fewer panels
    figure.suptitle(report.title, x=0.08, y=1 - title_from_top / size[1], ha="left", fontsize=11)
    for line, note in enumerate(notes, start=1):  # why a panel is not drawn, under the title
        figure.text(0.08, 1 - (title_from_top + line * NOTE_INCHES) / size[1], note, ha="left", va="top",
                    fontsize=9, color="#555555")
    sink = _Sink()
    figure.savefig(cast("IO[bytes]", sink), format="png", dpi=DPI, metadata={"Software": None})
    return sink.value()


def _cell(value: float | int | None, digits: str) -> str:
    return "" if value is None else format(value, digits)


def _ordered(found: list[str], first: tuple[str, ...]) -> list[str]:
    ordered = [n for n in first if n in found]
    return ordered + [n for n in found if n not in ordered]


def _row(css: str, cells: list[str]) -> str:
    attribute = f' class="{css}"' if css else ""
    return f"<tr{attribute}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _table(table_id: str, head: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """An HTML table; each row is (its class, or "", its cells)."""
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "\n".join(_row(css, cells) for css, cells in rows)
    return f'<table id="{table_id}">\n<thead><tr>{header}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def _iterations_table(report: TrainingReport) -> str:
    names = _ordered(list(dict.fromkeys(name for p in report.points for name in p.held_out)), ("loss", *METRIC_ORDER))
    head = ["iteration", "epoch", "edges", "loss", *("held-out " + METRIC_LABELS.get(n, n) for n in names), "edges/s"]
    rows = [("", [str(p.number), "" if p.epoch_idx is None else str(p.epoch_idx + 1), f"{p.edges:,}",
                  _cell(p.loss, ".4g"),
                  *(_cell(p.held_out.get(n), ".4f" if n in METRIC_ORDER else ".4g") for n in names),
                  _cell(p.edges_per_second, ",.0f")]) for p in report.points]
    return _table("iterations", head, rows)


def _validation_section(report: TrainingReport) -> str:
    evaluations = report.evaluations
    if not evaluations:
        return ""
    last = evaluations[-1]
    names = _ordered(list(dict.fromkeys(name for e in evaluations for name in e.metrics)), METRIC_ORDER)
    head = ["version", *(METRIC_LABELS.get(n, n) for n in names), "decision", "learning-rate scale"]
    rows = [("best" if e.version == last.best_version else "",
             [f"{e.version} ★" if e.version == last.best_version else str(e.version),
              *(_cell(e.metrics.get(n), ".4f" if n in METRIC_ORDER else ".4g") for n in names),
              e.decision, f"{e.lr_scale:.6g}"]) for e in evaluations]
    ranked = f"Ranked: {last.protocol}; " if last.protocol else ""
    return (f"<h2>Validation</h2>\n<p>{html.escape(ranked)}{last.count:,} edges of "
            f"<code>{html.escape(last.edge_path)}</code>; ★ the best version (kept in best/).</p>\n"
            f"{_table('validation', head, rows)}\n")


def render_html(report: TrainingReport, png: bytes) -> str:
    """A self-contained HTML page: the picture ``png`` (embedded), a table of the figures per
    iteration, the validation's evaluations (when the run had them), and the run config (pretty JSON)."""
    protocol = f"<p>Held-out edges ranked: {html.escape(report.protocol)}.</p>\n" if report.protocol else ""
    protocol += "".join(f'<p class="note">{html.escape(note[:1].upper() + note[1:])}.</p>\n'
                        for note in report.drawn[1])
    image = base64.b64encode(png).decode("ascii")
    width, height = (round(inches * DPI) for inches in figure_layout(*map(len, report.drawn))[0])
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
tr.best {{ font-weight: bold; }}
pre {{ background: #f6f8fa; padding: 1em; overflow: auto; }}
</style>
</head>
<body>
<h1>Training report</h1>
<p>{html.escape(report.summary())}.</p>
{protocol}<img id="curves" alt="loss, held-out metrics, validation and edges/s per iteration" width="{width}" \
height="{height}" src="data:image/png;base64,{image}">
<h2>Per iteration</h2>
{_iterations_table(report)}
{_validation_section(report)}<h2>Run config</h2>
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
