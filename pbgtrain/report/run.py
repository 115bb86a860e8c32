"""The report of one run: its points, its validation and its config, read through pbgio.

``checkpoint_path`` may be a run's checkpoint directory, or a version kept inside one (``best/``
of ``fit --valid``, ``epoch_k/`` of ``checkpoint_preservation_interval``): a kept version has no
stats of its own, so the run's are read from the directory above, and the kept version is marked.
``version`` (``report --version N``) draws the run as it stood after version N.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pbgio.errors import PbgioError, UsageError
from pbgtrain.report.collect import (
    IterationPoint,
    ValidationPoint,
    best_evaluation,
    eval_protocol,
    iteration_points,
    validation_points,
)
from pbgtrain.report.panels import MARK_COLOURS, Event, Panel, drawn, panels
from pbgtrain.run_log import COMPLETED, RunTimes, run_records

if TYPE_CHECKING:
    from pbgio.checkpoint import CheckpointDir
    from pbgio.layout import Layout


class NoStatsError(PbgioError):
    """The checkpoint has no training stats to draw yet."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        super().__init__(f"{path}: no training stats yet (no iteration has been trained); "
                         f"run pbgtrain fit {source} first")


@dataclass(frozen=True)
class TrainingReport:
    """What a report shows: the run's points, its validation, its config, and the version marked."""

    checkpoint: str  # the run's checkpoint directory, as messages show it
    points: tuple[IterationPoint, ...]
    protocol: str | None
    config_json: str
    config_source: str  # the file the config was read from
    evaluations: tuple[ValidationPoint, ...] = ()  # fit --valid's, by version
    shown: Event | None = None  # the version a kept checkpoint holds, or --version's
    runs: tuple[Mapping[str, Any], ...] = ()  # how each fit ended and its times (pbgtrain.run_log), in order

    @property
    def panels(self) -> tuple[Panel, Panel, Panel, Panel]:
        return panels(self.points, self.protocol, self.evaluations, self.shown)

    @property
    def drawn(self) -> tuple[tuple[Panel, ...], tuple[str, ...]]:
        """The panels drawn, top to bottom, and the notes of those left out (:func:`~pbgtrain.report.panels.drawn`)."""
        return drawn(self.panels)

    @property
    def title(self) -> str:
        edges = sum(p.edges for p in self.points)
        marked = "" if self.shown is None else f"; {self.shown.label}"
        return f"{self.checkpoint}: {len(self.points)} iteration(s), {edges:,} training edges{marked}"

    def summary(self) -> str:
        """One line: first → last loss and MRR, the median edges/s, the first validation against the
        best (:func:`validation_summary`), the time of the runs (training, validation,
        checkpointing) and why the last one stopped early."""
        parts = [f"{len(self.points)} iteration(s) of {self.checkpoint}"]
        if self.shown is not None:
            parts.append(self.shown.label)
        first, last = self.points[0], self.points[-1]
        if first.loss is not None and last.loss is not None:
            parts.append(f"loss {first.loss:.4g} → {last.loss:.4g}")
        if "mrr" in first.held_out and "mrr" in last.held_out:
            parts.append(f"held-out MRR {first.held_out['mrr']:.4f} → {last.held_out['mrr']:.4f}")
        speeds = [s for s in (p.edges_per_second for p in self.points) if s is not None]
        if speeds:
            parts.append(f"median {statistics.median(speeds):,.0f} edges/s")
        valid = [e for e in self.evaluations if "mrr" in e.metrics]
        if valid:
            parts.append(validation_summary(valid, best_evaluation(self.evaluations)))
        if self.runs:
            parts.append(sum((RunTimes.from_record(r) for r in self.runs), RunTimes()).line())
            last_run = self.runs[-1]
            if last_run.get("end") != COMPLETED:
                parts.append(f"stopped early after version {last_run['version']} ({last_run.get('reason')})")
        elif self.evaluations and self.evaluations[-1].stopped:
            parts.append(f"stopped early after version {self.evaluations[-1].version}")
        return ", ".join(parts)


def validation_summary(valid: Sequence[ValidationPoint], best: ValidationPoint | None) -> str:
    """The validation MRR of the summary line: the first evaluation against the best one (the
    first being the best, or the only one, said as such; the best's MRR not recorded: against the last).

    >>> def at(version, mrr):
    ...     return ValidationPoint(version, "valid", None, 10, {"mrr": mrr}, "", 0, 1.0)
    >>> validation_summary([at(1, .2), at(2, .3), at(3, .25)], at(2, .3))
    'validation MRR 0.2000 (version 1) → best 0.3000 (version 2) of 3 evaluations'
    >>> validation_summary([at(1, .3), at(2, .2)], at(1, .3))
    'validation MRR 0.3000 (version 1), the best of 2 evaluations'
    >>> validation_summary([at(5, .0444)], at(5, .0444))
    'validation MRR 0.0444 (version 5), the only evaluation'
    """
    first = valid[0]
    said = f"validation MRR {first.metrics['mrr']:.4f} (version {first.version})"
    if len(valid) == 1:
        return f"{said}, the only evaluation"
    if best is not None and best.version == first.version:
        return f"{said}, the best of {len(valid)} evaluations"
    other, which = (valid[-1], "last") if best is None else (best, "best")
    return f"{said} → {which} {other.metrics['mrr']:.4f} (version {other.version}) of {len(valid)} evaluations"


def _run_of(ckpt: CheckpointDir) -> CheckpointDir:
    """The checkpoint directory whose stats tell ``ckpt``'s story: ``ckpt`` itself, or the run
    above a kept version (``best/``, ``epoch_k/``), which has no stats of its own."""
    from pbgio.checkpoint import CheckpointDir
    from pbgio.spec import naming

    if (ckpt.path / naming.TRAINING_STATS).is_file() or not naming.is_snapshot_dir(ckpt.path.name):
        return ckpt
    above = CheckpointDir(ckpt.path.parent)
    return above if (above.path / naming.TRAINING_STATS).is_file() else ckpt


def load_report(layout: Layout, version: int | None = None) -> TrainingReport:
    """The report of ``layout``'s checkpoint: its stats, its validation and the config it was
    trained with (the config given when the checkpoint has none yet); ``version``: the run as it
    stood after that version, marked. Raises :class:`NoStatsError` when no iteration has been
    trained, :class:`UsageError` for a version the run has not committed."""
    from pbgio import storage
    from pbgio.checkpoint import CheckpointDir
    from pbgio.layout import stored_config
    from pbgio.spec import naming

    given = CheckpointDir(layout.checkpoint_path)
    run = _run_of(given)
    records = run.read_stats()
    stored = stored_config(run)  # stats are appended before the first commit writes config.json
    config, source = (layout.config, layout.source) if stored is None else \
        (stored, storage.display(run.path / naming.CONFIG_JSON))
    lhs, rhs = config.bucket_grid()
    points = iteration_points(records, lhs * rhs)
    if not points:
        raise NoStatsError(storage.display(run.path / naming.TRAINING_STATS), layout.source)
    committed = run.read_version()
    evaluations = validation_points(records, committed)
    runs = run_records(records, committed)
    shown = None
    if version is not None:
        if not 1 <= version <= committed:
            held = f"versions 1 … {committed}" if committed else "no version yet"
            raise UsageError(f"--version {version}: {storage.display(run.path)} has committed {held}")
        points = [p for p in points if p.number <= version]
        if not points:
            raise NoStatsError(storage.display(run.path / naming.TRAINING_STATS), layout.source)
        evaluations = [e for e in evaluations if e.version <= version]
        runs = [r for r in runs if r["version"] <= version]
        shown = Event("shown", f"up to version {version}", MARK_COLOURS["shown"], version, ":")
    elif run is not given:
        kept = given.read_version()
        shown = Event("shown", f"version {kept} kept in {given.path.name}/", MARK_COLOURS["shown"], kept, ":")
    return TrainingReport(storage.display(run.path), tuple(points), eval_protocol(records), config.to_json(),
                          source, tuple(evaluations), shown, tuple(runs))
