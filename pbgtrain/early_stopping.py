"""Validation-driven training: ``pbgtrain fit --valid PATH`` (pbgtrain's own; the config is untouched).

Every ``every`` epochs (and after the last iteration of the plan) the version just committed is
evaluated on the validation edge path with the filtered protocol (all entities as candidates,
known edges of the filter paths left out: :func:`pbgtrain.evaluate.evaluate_checkpoint`, the
ranking of ``pbgtrain eval --filter``). Featurized entity types have no table to rank against: their
sides are left out and the plain sides of their relations ranked, as ``eval --filter`` does; only
when no relation has a plain side to rank, the sampled protocol (same-batch candidates) instead
(:func:`validation_filters`; a line before training says which: :func:`validation_note`). Then:

* **best version**: a version whose validation MRR beats every earlier one is kept in
  ``checkpoint_path/best/`` (:func:`pbgio.keep.keep_version`), a checkpoint directory of its
  own that later commits never remove: evaluate or export it with ``-p checkpoint_path=…/best``;
* **early stopping** (``patience`` P): the run stops after P evaluations in a row without a
  better MRR (a run stopped by another rule, ``--max-iterations``, has its last version evaluated
  too; past ``--max-minutes``, once a best version is kept, only when its validation is expected to
  take less than ``last_share`` of an epoch: :func:`validate_past_cap`);
* **a sample** (``sample`` N, ``--valid-sample``): N of the validation edges, drawn uniformly
  without repeats by the run's seed, the same at every evaluation, are ranked instead of all;
* **learning-rate decay on a plateau** (``lr_decay`` F, ``lr_patience`` Q): after Q evaluations
  without a better MRR (counted since the best or the last decay) the learning rates (``lr`` and
  ``relation_lr``) are multiplied by F for the rest of the run.

Each evaluation, with what was decided and why, is one line of ``training_stats.json`` under the
``pbgtrain`` key (``{"validation": …}``, which the original ignores). A resumed run reads them
back: the best MRR, the evaluations since, and the learning-rate scale carry on where they were.

The rule is one :class:`pbgtrain.train.StopRule`: the fit loop asks it after every commit, as it
asks ``--max-minutes``.

>>> state, options = ValidationState(), ValidationOptions("valid", patience=3, lr_decay=0.5, lr_patience=2)
>>> for version, mrr in [(1, .30), (2, .35), (3, .34), (4, .35), (5, .33)]:
...     print(version, state.record(version, mrr, options).decision)
1 best
2 best
3 no improvement
4 no improvement; learning rate × 0.5
5 no improvement; stop: 3 evaluation(s) without improvement (patience 3)
>>> state.best_version, state.lr_scale
(2, 0.5)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pbgio import storage
from pbgio.checkpoint import CheckpointDir
from pbgio.keep import keep_version
from pbgio.layout import Layout
from pbgio.spec import naming
from pbgio.spec.stats import EXTRA_KEY
from pbgio.storage import AnyPath
from pbgtrain.checkpointing import iteration_keys
from pbgtrain.evaluate import EvalOptions, EvalResult, evaluate_checkpoint
from pbgtrain.featurized_ranking import not_ranked, same_batch_only, table_sides
from pbgtrain.ranking_watch import edges_ranked
from pbgtrain.training.fit_plan import ValidationOptions, sampled_validation_reason
from pbgtrain.training.records import IterationRecord
from pbgtrain.validation_log import RECORD_KEY, STOP_PREFIX, validation_records


@dataclass
class Decision:
    """What one evaluation decided (``decision``: the same in words)."""

    decision: str
    best: bool = False
    stop: bool = False
    lr_changed: bool = False


@dataclass
class ValidationState:
    """The best validation MRR so far, the version that reached it, evaluations without a better
    one (since the best, and since the best or the last decay), and the learning-rate scale."""

    best_version: int = 0
    best_mrr: float = -math.inf
    since_best: int = 0
    since_change: int = 0
    lr_scale: float = 1.0

    def record(self, version: int, mrr: float, options: ValidationOptions) -> Decision:
        """Account for ``version``'s validation MRR; what to do now."""
        if mrr > self.best_mrr:
            self.best_version, self.best_mrr = version, mrr
            self.since_best = self.since_change = 0
            return Decision("best", best=True)
        self.since_best += 1
        self.since_change += 1
        parts = ["no improvement"]
        decision = Decision("")
        if options.lr_decay is not None and self.since_change >= options.lr_patience:
            self.lr_scale *= options.lr_decay
            self.since_change = 0
            decision.lr_changed = True
            parts.append(f"learning rate × {self.lr_scale:.6g}")
        if options.patience is not None and self.since_best >= options.patience:
            decision.stop = True
            parts.append(f"{STOP_PREFIX} {self.since_best} evaluation(s) without improvement "
                         f"(patience {options.patience})")
        decision.decision = "; ".join(parts)
        return decision

    def to_record(self) -> dict[str, Any]:
        return {"best_version": self.best_version, "best_mrr": self.best_mrr if self.best_version else None,
                "since_best": self.since_best, "since_change": self.since_change, "lr_scale": self.lr_scale}

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> ValidationState:
        """The state after the last of ``records`` (a fresh one without any)."""
        state = cls()
        for rec in records:
            state = cls(int(rec["best_version"]), -math.inf if rec["best_mrr"] is None else float(rec["best_mrr"]),
                        int(rec["since_best"]), int(rec["since_change"]), float(rec["lr_scale"]))
        return state


@dataclass
class ValidationRule:
    """The stop rule of ``--valid``: evaluates when due, keeps the best version, decays the learning
    rate, says stop when patience runs out.

    ``evaluate(version)`` ranks the validation edges; ``scale_lr(scale)`` sets the trainer's learning
    rates to ``scale`` × the config's; ``log`` reports a line. Records go to ``checkpoint``'s
    ``training_stats.json``, the best version to its ``best/``. ``past_time_cap()`` says whether
    ``--max-minutes`` has passed: then the run stops after this version, which is validated only
    when no version has been kept as the best yet, or when its validation is expected to take less
    than ``options.last_share`` of an epoch (:func:`validate_past_cap`: the validations of this
    run, or else those recorded before it, against this run's iterations times ``epoch_iterations``);
    else ``never_validated`` says which version was not and what ``best/`` holds. ``seconds`` adds
    up the time of the evaluations (ranking, keeping the best, recording).
    """

    options: ValidationOptions
    checkpoint: CheckpointDir
    plan_length: int
    num_buckets: int
    evaluate: Callable[[int], EvalResult]
    scale_lr: Callable[[float], None]
    log: Callable[[str], None]
    past_time_cap: Callable[[], bool] = lambda: False
    state: ValidationState = field(default_factory=ValidationState)
    evaluated: int = 0  # the version evaluated last (or skipped past the time cap)
    evaluations: int = 0  # in this run
    seconds: float = 0.0  # of this run's evaluations
    epoch_iterations: int = 1  # iterations of an epoch (edge paths × edge chunks)
    iteration_seconds: list[float] = field(default_factory=list)  # training time of this run's iterations
    validation_seconds: list[float] = field(default_factory=list)  # of this run's validations, each
    recorded_seconds: list[float] = field(default_factory=list)  # of the validations recorded before this run
    never_validated: str | None = None  # the last version, skipped past the time cap, and what best/ holds

    def resume(self) -> None:
        """Carry on from the records of the versions committed so far."""
        committed = self.checkpoint.read_version()
        history = validation_records(self.checkpoint.read_stats(), self.options.edge_path, committed)
        self.state = ValidationState.from_records(history)
        self.recorded_seconds = [float(r["seconds"]) for r in history
                                 if isinstance(r.get("seconds"), int | float) and not isinstance(r["seconds"], bool)]
        if self.state.lr_scale != 1.0:
            self.scale_lr(self.state.lr_scale)
            self.log(f"validation: learning rates × {self.state.lr_scale:.6g}, as decayed before the resume")
        if self.state.best_version:
            self.log(f"validation: best so far version {self.state.best_version} "
                     f"(MRR {self.state.best_mrr:.4f}), kept in {naming.BEST_DIR}/")

    def due(self, record: IterationRecord) -> bool:
        step = record.step
        every_nth = step.ends_epoch and (step.epoch_idx + 1) % self.options.every == 0
        return every_nth or record.version >= self.plan_length

    def should_stop(self, record: IterationRecord) -> str | None:
        self.iteration_seconds.append(record.training_seconds)
        return self._evaluate(record) if self.due(record) else None

    def stopping(self, record: IterationRecord) -> None:
        """Another rule stops the run (``--max-minutes``, ``--max-iterations``): the last version is
        evaluated too (past the time cap, see the class doc)."""
        if self.evaluated != record.version:
            self._evaluate(record)

    def _evaluate(self, record: IterationRecord) -> str | None:
        """Evaluate ``record``'s version, act on it, record it; why to stop (None: go on)."""
        self.evaluated = record.version
        if self.state.best_version and self.past_time_cap():
            measured = self.validation_seconds or self.recorded_seconds
            expected = sum(measured) / len(measured) if measured else None  # this run's, else recorded ones
            epoch = sum(self.iteration_seconds) / max(len(self.iteration_seconds), 1) * self.epoch_iterations
            validate, why = validate_past_cap(expected, epoch, self.options.last_share)
            if not validate:
                kept = f"version {self.state.best_version} (MRR {self.state.best_mrr:.4f})"
                self.log(f"validation after version {record.version} skipped: past the time cap (--max-minutes); "
                         f"best/ keeps {kept}; {why}")
                self.never_validated = f"version {record.version} never validated, best/ holds {kept}"
                return None
            self.log(f"validation after version {record.version}, the last: past the time cap (--max-minutes), "
                     f"validated all the same: {why}")
        started = time.perf_counter()
        result = self.evaluate(record.version)
        metrics = result.metrics
        decision = self.state.record(record.version, metrics.mrr, self.options)
        if decision.best:
            keep_version(self.checkpoint, record.version)
        if decision.lr_changed:
            self.scale_lr(self.state.lr_scale)
        step = record.step
        sample = None if result.sampled_from is None else {"edges": metrics.count, "of": result.sampled_from}
        seconds = time.perf_counter() - started
        self.checkpoint.append_stats([{
            **iteration_keys(step), "index": (step.index + 1) * self.num_buckets - 1,
            EXTRA_KEY: {RECORD_KEY: {"version": record.version, "edge_path": self.options.edge_path,
                                     "protocol": metrics.protocol.describe(), **metrics.to_stats(),
                                     **({} if sample is None else {"sample": sample}),
                                     "seconds": round(seconds, 3),
                                     "decision": decision.decision, **self.state.to_record()}}}])
        self.evaluations += 1
        self.validation_seconds.append(seconds)
        self.seconds += time.perf_counter() - started
        best = "" if decision.best else \
            f" (best: version {self.state.best_version}, MRR {self.state.best_mrr:.4f})"
        self.log(f"validation after version {record.version} (epoch {step.epoch_idx + 1}), "
                 f"{edges_ranked(metrics.count, result.sampled_from)} in {seconds:.2f} s: "
                 f"{metrics.format(hits=(1, 10))}; {decision.decision}{best}")
        if not decision.stop:
            return None
        return (f"patience: {self.state.since_best} evaluation(s) in a row without a better validation MRR, "
                f"--patience {self.options.patience}")

    def summary(self) -> str | None:
        if not self.state.best_version:
            return None
        return (f"best on {self.options.edge_path}: version {self.state.best_version} (MRR {self.state.best_mrr:.4f}), "
                f"kept in {storage.display(self.checkpoint.path / naming.BEST_DIR)}")


def checkpoint_evaluator(layout: Layout, options: ValidationOptions, device: str | None,
                         seed: int) -> Callable[[int], EvalResult]:
    """``evaluate(version)``: the filtered ranking of ``options.edge_path`` (its ``sample``: the
    same edges at every version) by that version, against :func:`validation_filters` (none: the
    sampled ranking among same-batch candidates)."""
    valid = layout.path(options.edge_path)
    eval_options = EvalOptions(edge_paths=[valid], filter_paths=validation_filters(layout, options), device=device,
                               seed=seed, sample=options.sample)

    def evaluate(version: int) -> EvalResult:
        return evaluate_checkpoint(layout, replace(eval_options, version=version))

    return evaluate


def validate_past_cap(expected: float | None, epoch: float, share: float) -> tuple[bool, str]:
    """Whether the last version of a run stopped by its time cap is validated all the same (once a
    best version is kept): when its validation, ``expected`` seconds (None: no validation measured
    yet), is to take less than ``share`` of an ``epoch``'s training seconds; and why, in words.

    >>> validate_past_cap(4.0, 80.0, 0.1)
    (True, 'its validation is expected to take 4.00 s, less than 0.1 × an epoch of training (80.0 s)')
    >>> validate_past_cap(40.0, 80.0, 0.1)[0], validate_past_cap(None, 80.0, 0.1)
    (False, (False, 'no validation measured to expect its time from'))
    """
    if expected is None:
        return False, "no validation measured to expect its time from"
    relation = "less than" if expected < share * epoch else "not less than"
    return expected < share * epoch, (f"its validation is expected to take {expected:.2f} s, {relation} {share:g} × "
                                      f"an epoch of training ({epoch:.1f} s)")


def validation_filters(layout: Layout, options: ValidationOptions) -> list[AnyPath]:
    """The filter paths ``--valid`` ranks with, those of ``pbgtrain eval --filter``: ``--filter``'s,
    by default the config's ``edge_paths`` and the validation path; none when featurized types leave
    no side to rank against all entities (:func:`pbgtrain.featurized_ranking.same_batch_only`: the
    sampled protocol of ``eval`` without ``--filter``, which ``fit`` refuses ``--filter`` with)."""
    if same_batch_only(layout.config):
        return []
    return [layout.path(p) for p in options.filter_paths] or [*layout.edge_paths, layout.path(options.edge_path)]


def validation_note(layout: Layout, options: ValidationOptions) -> str | None:
    """The run's line on how ``--valid`` ranks where featurized entity types take a side that takes
    negatives (None where none does: it ranks as without them): the sides ranked against all
    entities and the filter paths, as ``pbgtrain eval --filter`` ranks, and the featurized sides not
    ranked; or same-batch candidates, when no relation has a plain side to rank (each validation
    line states the protocol)."""
    cfg = layout.config
    if same_batch_only(cfg):
        return f"validation: {sampled_validation_reason(cfg.featurized_types())} (each validation line states " \
               "the protocol)"
    left_out = not_ranked(cfg)
    if not left_out:
        return None
    ranked = table_sides(cfg)
    sides = "both sides" if len(ranked) == 2 else f"the {ranked[0]} side"
    filters = "+".join(p.name for p in validation_filters(layout, options))  # (named as eval --filter names them)
    return (f"validation: --valid ranks {sides} against all entities, filtered (against {filters}), as pbgtrain eval "
            f"--filter ranks; not ranked: {', '.join(n.describe() for n in left_out)} (each validation line "
            "states the protocol)")
