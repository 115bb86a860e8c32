"""``pbgtrain fit``: the fit driver, from a config to the last committed version.

:func:`fit` joins the run (alone, or as one trainer of a distributed run:
:mod:`pbgtrain.distributed`), takes the checkpoint lock, validates the layout, builds the
:class:`~pbgtrain.training.trainer.Trainer` and then walks the iteration schedule (epoch → edge path → edge
chunk, see :class:`~pbgtrain.schedule.batching.IterationSchedule`): each iteration is trained and committed by
the trainer (:meth:`~pbgtrain.training.trainer.Trainer.run_iteration`), then the *stop rules* are asked
whether to stop there, and the run's :class:`~pbgtrain.training.coordinator.Coordinator` makes every
process agree. Parallelism: in each process, torch's intra-op threads (``workers``, default the
machine's cores split among its trainers) run the batched matrix products of a whole batch at
once, instead of the original's HOGWILD processes; several processes, on one machine or many,
train together as a distributed run.

**Stop rules.** A :class:`StopRule` sees every committed iteration (:class:`IterationRecord`) and
says whether to stop after it, and why: ``--max-minutes`` (:class:`MaxSeconds`), ``--max-iterations``
(:class:`MaxIterations`) and ``--valid`` (:class:`pbgtrain.early_stopping.ValidationRule`: evaluate
every N epochs, keep the best version, decay the learning rate, stop when it no longer improves).
When one rule stops the run, the others are told (:meth:`StopRule.stopping`), so the last version
is evaluated too (past the time cap only when no version is kept as the best yet, or when its
validation is expected to be cheap: :func:`pbgtrain.early_stopping.validate_past_cap`); the coordinator
makes every process stop after the same version. The time cap is asked after each commit: a run
ends within one iteration's time of it, and under ``--max-minutes`` a fresh run takes the edge
chunks that keep an iteration within a tenth of the cap (:mod:`pbgtrain.training.edge_chunk_plan`;
a resume keeps its checkpoint's). The summary's last line says why a run stopped early (and which
version was never validated), and the run's record (:mod:`pbgtrain.run_log`) how it ended and
where its time went (training, validation, checkpointing).

The trainer and the device helpers live in :mod:`pbgtrain.training.trainer` and :mod:`pbgtrain.training.device`;
their public names are importable from here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pbgio import confinement, interrupts, storage, training_memory
from pbgio.checkpoint import CheckpointDir, remove_superseded, remove_uncommitted
from pbgio.config import semantic_issues
from pbgio.edges import bucket_length
from pbgio.errors import FormatError, Issue, UsageError
from pbgio.layout import Layout
from pbgio.spec import naming
from pbgio.spec.stats import EXTRA_KEY
from pbgio.storage import LocalCache
from pbgtrain.checkpointing import iteration_keys
from pbgtrain.config import held_out_named
from pbgtrain.distributed.coordination import joined
from pbgtrain.early_stopping import ValidationRule, checkpoint_evaluator, validation_note
from pbgtrain.model import keep_freed_memory
from pbgtrain.progress import Reporter
from pbgtrain.ranking import add_negative_scores
from pbgtrain.run_log import COMPLETED, ENDS, ITERATION_CAP, RUN_KEY, TIME_CAP, RunTimes
from pbgtrain.schedule.batching import IterationSchedule
from pbgtrain.schedule.buckets import bucket_limits
from pbgtrain.training.coordinator import Coordinator
from pbgtrain.training.device import default_threads, local_device
from pbgtrain.training.edge_chunk_plan import edge_chunk_plan
from pbgtrain.training.fit_plan import FitOptions, FitPlan, ValidationOptions, resolve_fit
from pbgtrain.training.records import IterationRecord, MovementStats, format_metrics
from pbgtrain.training.residency import GIB
from pbgtrain.training.trainer import Trainer

__all__ = [
    "FitOptions",
    "FitPlan",
    "FitResult",
    "IterationRecord",
    "MaxIterations",
    "MaxSeconds",
    "MovementStats",
    "StopRule",
    "Trainer",
    "ValidationOptions",
    "add_negative_scores",
    "bucket_limits",
    "default_threads",
    "fit",
    "resolve_fit",
]


@dataclass
class FitResult:
    start_version: int
    final_version: int
    total_iterations: int
    iterations: list[IterationRecord] = field(default_factory=list)
    stopped_early: bool = False
    movement: list[dict[str, Any]] = field(default_factory=list)  # per rank (rank 0's result; one entry alone)
    best: str | None = None  # --valid: the best version on the validation edges and where it is kept
    stop_reason: str | None = None  # why it stopped early, in words (the stop rule's; see run_log.ENDS)
    never_validated: str | None = None  # --valid: the last version, not validated past the time cap, and best/
    times: RunTimes = field(default_factory=RunTimes)  # where the time went

    def summary(self) -> str:
        """The run's last lines: the held-out figures, the best version, the time, and last the
        version it ended at (with why, when it stopped early, and what best/ holds when that version
        was never validated)."""
        if not self.iterations:
            if self.final_version >= self.total_iterations:
                return f"nothing to do: checkpoint version {self.final_version} completes all " \
                       f"{self.total_iterations} iterations"
            return f"no iteration ran; checkpoint version {self.final_version}"
        lines = []
        last = self.iterations[-1].eval_after
        if last is not None:
            lines.append(f"held-out edges of the last iteration: {last}")
        if self.best is not None:
            lines.append(self.best)
        lines.append(self.times.line())
        edges = sum(r.train.count for r in self.iterations)
        seconds = self.times.training
        state = f"stopped early at checkpoint version {self.final_version} of {self.total_iterations} " \
                f"({self.stop_reason})" if self.stopped_early else \
                f"committed checkpoint version {self.final_version} of {self.total_iterations}"
        if self.never_validated is not None:
            state += f"; {self.never_validated}"
        lines.append(f"trained {edges:,} edges in {seconds:.1f} s ({edges / max(seconds, 1e-9):,.0f} edges/s) over "
                     f"{len(self.iterations)} iteration(s); {state}")
        return "\n".join(lines)


# ---- stop rules


class StopRule(Protocol):
    """Whether to stop after a committed iteration, and why; asked once per iteration, in order."""

    def should_stop(self, record: IterationRecord) -> str | None:
        """Why to stop after ``record`` (a line: :func:`stop_reason` and the fit's summary say it), or None."""

    def stopping(self, record: IterationRecord) -> None:
        """The run stops after ``record`` though this rule did not say so: the last chance to act on it."""


@dataclass
class MaxSeconds:
    """``--max-minutes``: stop once ``seconds`` have passed since ``started`` (``time.perf_counter``).

    >>> MaxSeconds(90.0, started=time.perf_counter() - 100).should_stop(None)
    'time cap: --max-minutes 1.5 passed'
    """

    seconds: float
    started: float

    def passed(self) -> bool:
        return time.perf_counter() - self.started > self.seconds

    def should_stop(self, record: IterationRecord) -> str | None:
        return f"{TIME_CAP}: --max-minutes {self.seconds / 60:g} passed" if self.passed() else None

    def stopping(self, record: IterationRecord) -> None:
        return None


@dataclass
class MaxIterations:
    """``--max-iterations``: stop after ``count`` iterations of this run.

    >>> rule = MaxIterations(2)
    >>> [rule.should_stop(None) for _ in range(2)]
    [None, 'iteration cap: --max-iterations 2 reached']
    """

    count: int
    seen: int = 0

    def should_stop(self, record: IterationRecord) -> str | None:
        self.seen += 1
        return f"{ITERATION_CAP}: --max-iterations {self.count} reached" if self.seen >= self.count else None

    def stopping(self, record: IterationRecord) -> None:
        return None


def stop_rules(plan: FitPlan, started: float, validation: ValidationRule | None = None) -> list[StopRule]:
    """The stop rules ``plan`` asks for (none: train to the end of the plan); ``validation`` is
    the rule of ``--valid`` (:class:`pbgtrain.early_stopping.ValidationRule`), asked first, and told
    when ``--max-minutes`` has passed (it validates the last version then only when none has kept a
    best version yet, or when that validation is expected to be cheap)."""
    rules: list[StopRule] = [] if validation is None else [validation]
    options = plan.options
    if options.max_seconds is not None:
        cap = MaxSeconds(options.max_seconds, started)
        rules.append(cap)
        if validation is not None:
            validation.past_time_cap = cap.passed
    if options.max_iterations is not None:
        rules.append(MaxIterations(options.max_iterations))
    return rules


def stop_reason(rules: Sequence[StopRule], record: IterationRecord) -> str | None:
    """Why to stop after ``record`` (None: go on): the first reason of the rules (every rule is
    asked: some count the iterations); when one says stop, the others are told
    (:meth:`StopRule.stopping`: ``--valid`` evaluates the last version)."""
    answers = [rule.should_stop(record) for rule in rules]  # a list: ask them all
    reasons = [answer for answer in answers if answer is not None]
    if reasons:
        for rule, answer in zip(rules, answers, strict=True):
            if answer is None:
                rule.stopping(record)
    return reasons[0] if reasons else None


# ---- the run


def fit(layout: Layout, options: FitOptions | None = None) -> FitResult:
    """Train ``layout`` from its latest committed checkpoint to the end of the plan (or ``max_seconds``).

    The options are checked first (:func:`pbgtrain.training.fit_plan.resolve_fit`: a bad one is a
    :class:`~pbgio.errors.UsageError` naming it). When this process is one trainer of a distributed
    run (torchrun's environment, or ``--rank`` with ``num_machines`` > 1) it joins the others; see
    :mod:`pbgtrain.distributed`.
    """
    plan = resolve_fit(layout, options or FitOptions())
    training_memory.check_fits(layout, device_type=plan.device.type)  # before anything sized by the layout
    with joined(layout.config, rank=plan.options.rank, peer_timeout=plan.options.peer_timeout) as coordinator:
        return _fit(plan, coordinator)


def _fit(plan: FitPlan, coordinator: Coordinator) -> FitResult:
    """The run, its checkpoint directory locked by the leading process (the single process, or
    rank 0) from before anything is written to the end (:class:`pbgio.storage.CheckpointLock`):
    a second run on it is refused at once."""
    if plan.options.validation is not None and not coordinator.placement.single_process:
        raise UsageError("--valid: validation-driven training runs in a single process; evaluate the checkpoints "
                         "of a distributed run with pbgtrain eval")
    if not coordinator.placement.leads:
        return _fit_locked(plan, coordinator, _no_lock)
    from pbgio.checks.layout import checkpoint_path_occupied
    from pbgio.errors import ConfigError

    layout = plan.layout
    occupied = checkpoint_path_occupied(  # else the lock would fail to create the directory (EEXIST)
        storage.display(layout.checkpoint_path), layout.checkpoint_path_found(), "checkpoint_path")
    if occupied is not None:
        raise ConfigError(layout.source, [occupied])
    if not storage.is_remote(layout.checkpoint_path):  # where it writes, said before anything is written
        confinement.check_write(layout.checkpoint_path, "checkpoint_path directory", directory=True)
    foreign = CheckpointDir(layout.checkpoint_path).foreign_entries()
    if foreign:
        shown = ", ".join(foreign[:5]) + (f", … ({len(foreign)} in all)" if len(foreign) > 5 else "")
        raise UsageError(f"checkpoint_path {storage.display(layout.checkpoint_path)}: a directory of other files "
                         f"({shown}), not a pbg checkpoint; fit writes only into a new or empty directory or a "
                         "checkpoint: choose another checkpoint_path")
    with storage.CheckpointLock(layout.checkpoint_path, command="pbgtrain fit") as lock:
        return _fit_locked(plan, coordinator, lock.check)


def _no_lock() -> None:
    """Another process holds the checkpoint lock and checks it."""


def _fit_locked(plan: FitPlan, coordinator: Coordinator, check_lock: Callable[[], None]) -> FitResult:
    layout, cfg = plan.layout, plan.layout.config
    torch.set_num_threads(default_threads(cfg, coordinator.placement.local_trainers))
    keep_freed_memory()
    layout.check_resumable(CheckpointDir(layout.checkpoint_path))  # the same model and plan, or one message
    bucket_cache = LocalCache(int(plan.options.remote_cache * GIB))  # local copies of remote edge buckets
    try:
        if plan.options.check_layout and coordinator.placement.leads:
            _validate_inputs(layout, bucket_cache)
        plan = edge_chunk_plan(plan, local_device(plan.device, coordinator.placement.device_index),
                               coordinator.placement.single_process)
        layout, cfg = plan.layout, plan.layout.config
        first_bucket_sizes = [bucket_length(layout.path(p) / naming.bucket_file(0, 0)) for p in cfg.edge_paths] \
            if cfg.num_edge_chunks is None else []
        iterations = IterationSchedule.from_config(cfg, first_bucket_sizes)
        coordinator.barrier("validated")
        trainer = Trainer(plan, coordinator, bucket_cache)
    except BaseException:
        bucket_cache.close()
        raise
    try:
        with interrupts.noticed():
            return _train_iterations(trainer, iterations, plan, coordinator, check_lock)
    finally:
        trainer.close()


def _validate_inputs(layout: Layout, bucket_cache: LocalCache) -> None:
    """Refuse a layout that does not validate; remote buckets are read whole into ``bucket_cache``,
    where training then finds them."""
    from pbgio import validate_layout

    report = validate_layout(layout, cache=bucket_cache)
    errors = [i for i in report.issues if i.severity == "error"]
    if errors:
        shown = "\n".join(f"  {i.rule}: {i.file or ''} {i.dataset or ''}: {i.message}" for i in errors[:10])
        more = f"\n  … and {len(errors) - 10} more (run pbgio validate)" if len(errors) > 10 else ""
        raise FormatError(Issue(errors[0].rule, "error", layout.source, None,
                                f"the layout does not validate ({len(errors)} error(s)); fix it before "
                                f"training:\n{shown}{more}"))


def _train_iterations(trainer: Trainer, iterations: IterationSchedule, plan: FitPlan, coordinator: Coordinator,
                check_lock: Callable[[], None]) -> FitResult:
    """The plan loop: every iteration still to run, trained and committed, until a stop rule says so."""
    cfg, ckpt = trainer.cfg, trainer.ckpt
    if coordinator.placement.leads:
        remove_uncommitted(ckpt.dir)
        if ckpt.committed > 0:  # a run killed after its last commit point left the version before
            remove_superseded(ckpt.dir, ckpt.committed)
    coordinator.start(trainer.handle())
    start = ckpt.committed
    result = FitResult(start, start, len(iterations))
    if start >= len(iterations):
        return result
    started = time.perf_counter()
    with coordinator.progress(plan.options.interactive, len(iterations), start, cfg.verbose) as reporter:
        if coordinator.placement.leads:
            _log_run_notes(trainer, reporter)
            if start:
                reporter.log(f"resuming from checkpoint version {start} of {len(iterations)}")
        validation = None if plan.options.validation is None \
            else _validation_rule(trainer, plan, iterations, reporter)
        rules = stop_rules(plan, started, validation)
        try:
            for step in iterations.steps(start):
                check_lock()  # a remote lease lost to another writer stops the run before it commits
                record = trainer.run_iteration(step, reporter)
                result.iterations.append(record)
                result.final_version = record.version
                reporter.committed(
                    f"{step}: {record.train.count:,} edges in {record.seconds:.1f} s "
                    f"({record.edges_per_second:,.0f} edges/s), loss "
                    f"{record.train.loss / max(record.train.count, 1):.4g}"
                    + (f", held-out {format_metrics(record.eval_after.values())}" if record.eval_after else "")
                    + f" → version {record.version}")
                reason = stop_reason(rules, record)  # asked at the plan's end too: --valid evaluates it
                reason = reason if record.version < len(iterations) else None
                if coordinator.agree_to_stop(record.version, reason is not None):  # all stop after one version
                    result.stopped_early = True
                    result.stop_reason = reason or "the leading trainer's stop rule"
                    break
        except KeyboardInterrupt:
            _end_run(result, trainer, validation, started, "interrupted: Ctrl-C")
            raise
    result.movement = coordinator.finish(trainer.movement_report())
    result.best = None if validation is None else validation.summary()
    result.never_validated = None if validation is None else validation.never_validated
    _end_run(result, trainer, validation, started, result.stop_reason)
    return result


def _end_run(result: FitResult, trainer: Trainer, validation: ValidationRule | None, started: float,
             reason: str | None) -> None:
    """The run's times into ``result``; with a version committed by this run, the leading
    process appends its record (:mod:`pbgtrain.run_log`): how it ended (``reason``, None: the
    plan's end) and where the time went."""
    result.times = RunTimes(
        training=sum(r.training_seconds for r in result.iterations),
        validation=0.0 if validation is None else validation.seconds,
        validations=0 if validation is None else validation.evaluations,
        checkpointing=sum(r.commit_seconds for r in result.iterations),
        total=time.perf_counter() - started)
    if not result.iterations or not trainer.coordinator.placement.leads:
        return
    end = COMPLETED if reason is None else next((e for e in ENDS if reason.startswith(e)), reason)
    last = result.iterations[-1].step
    trainer.ckpt.dir.append_stats([{
        **iteration_keys(last), "index": (last.index + 1) * trainer.num_buckets - 1,
        EXTRA_KEY: {RUN_KEY: {"from_version": result.start_version, "version": result.final_version,
                              "end": end, "reason": reason or f"the plan's {result.total_iterations} iterations done",
                              "seconds": result.times.to_record()}}}])


def _validation_rule(trainer: Trainer, plan: FitPlan, iterations: IterationSchedule,
                     reporter: Reporter) -> ValidationRule:
    options = plan.options
    assert options.validation is not None
    rule = ValidationRule(options.validation, trainer.ckpt.dir, len(iterations), trainer.num_buckets,
                          checkpoint_evaluator(plan.layout, options.validation, str(trainer.device), options.seed),
                          trainer.scale_learning_rates, reporter.log,
                          epoch_iterations=len(iterations.edge_paths) * iterations.num_edge_chunks)
    note = validation_note(plan.layout, options.validation)
    if note is not None:
        reporter.log(note)
    rule.resume()
    return rule


def _log_run_notes(trainer: Trainer, reporter: Reporter) -> None:
    """Once per run: the checkpoint directory it writes (links resolved), on a CPU the memory it holds
    (:mod:`pbgio.training_memory`), the device and precision, then what runs differently from what the
    config may suggest."""
    cfg = trainer.cfg
    threads = torch.get_num_threads()
    checkpoint = trainer.plan.layout.checkpoint_path
    version = CheckpointDir(checkpoint).read_version()
    reporter.log(f"checkpoint: {storage.display(storage.absolute(checkpoint))} "
                 f"({f'resuming version {version}' if version else 'new'})")
    if trainer.device.type == "cpu":
        reporter.log(f"memory: {training_memory.summary(trainer.plan.layout)['line']}")
    reporter.log(f"training on {trainer.device} ({threads} thread{'s' if threads != 1 else ''}), "
                 f"{trainer.plan.precision_note}")
    reporter.log(trainer.plan.step.note)
    if trainer.plan.edge_chunks_note is not None:
        reporter.log(trainer.plan.edge_chunks_note)
    if cfg.background_io:
        reporter.log("warning: background_io is deprecated and has no effect (as in the original)")
    if trainer.frozen:
        reporter.log(f"frozen entity types (--freeze): {', '.join(sorted(trainer.frozen))}: their embeddings, "
                     "Adagrad state and global embeddings stay as loaded")
    for issue in semantic_issues(cfg):
        if issue.severity == "warning":
            reporter.log(f"note [{issue.rule}]: {issue.dataset}: {issue.message}")
    for path in held_out_named(cfg.edge_paths):
        reporter.log(f"warning: training on edge path {path!r}, named like a held-out split: figures measured on it "
                     "will be optimistic; train on the training split only (e.g. -p edge_paths=data/train)")
