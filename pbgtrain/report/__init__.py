"""``pbgtrain report``: a run's learning curve as pictures (a PNG, and an HTML page).

The figures come from the checkpoint's ``training_stats.json``, read through
:meth:`pbgio.checkpoint.CheckpointDir.read_stats` (:mod:`~pbgtrain.report.collect`): one point per
iteration (loss, held-out metrics, edges/s) and one per evaluation of ``fit --valid`` (the
validation MRR and Hits@10 by version, the best version, learning-rate changes, the early stop).
:mod:`~pbgtrain.report.panels` lays them out in four panels of fixed geometry and colours (three
without held-out edges),
:mod:`~pbgtrain.report.run` reads a run (also a kept version, ``best/`` or ``epoch_k/``, or the run
as it stood after ``--version N``), and :mod:`~pbgtrain.report.draw` draws the PNG (matplotlib,
imported when drawing: ``pip install 'pbg[report]'``) and the HTML page.

Collecting needs only the standard library (the command starts without torch).

>>> line = {"index": 0, "lhs_partition": 0, "rhs_partition": 0, "stats": {"count": 10, "metrics": {"loss": 2.0}},
...         "pbgtrain": {"trained_from": 100.0, "trained_until": 102.0}}
>>> [(p.number, p.edges, p.loss, p.edges_per_second) for p in iteration_points([line], 1)]
[(1, 10, 2.0, 5.0)]
"""

from pbgtrain.report.collect import (
    IterationPoint,
    ValidationPoint,
    eval_protocol,
    iteration_points,
    validation_points,
)
from pbgtrain.report.draw import (
    INSTALL_HINT,
    MissingMatplotlibError,
    render_html,
    render_png,
    require_matplotlib,
    write_report,
)
from pbgtrain.report.panels import (
    DPI,
    FIGURE_INCHES,
    MARK_COLOURS,
    METRIC_LIMITS,
    PANEL_RECTS,
    SERIES_COLOURS,
    Event,
    Marker,
    Panel,
    Series,
    data_limits,
    drawn,
    figure_layout,
    panels,
    validation_panel,
)
from pbgtrain.report.run import NoStatsError, TrainingReport, load_report

__all__ = [
    "DPI", "FIGURE_INCHES", "INSTALL_HINT", "MARK_COLOURS", "METRIC_LIMITS", "PANEL_RECTS", "SERIES_COLOURS",
    "Event", "IterationPoint", "Marker", "MissingMatplotlibError", "NoStatsError", "Panel", "Series",
    "TrainingReport", "ValidationPoint", "data_limits", "drawn", "eval_protocol", "figure_layout", "iteration_points",
    "load_report", "panels", "render_html", "render_png", "require_matplotlib", "validation_panel",
    "validation_points", "write_report",
]
