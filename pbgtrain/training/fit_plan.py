"""``pbgtrain fit``'s options, parsed once: :func:`resolve_fit` turns a layout and the options
as given (:class:`FitOptions`: strings, numbers, names) into a :class:`FitPlan` (those options,
checked, its validation paths absolute, and what they decide: a ``torch.device``, a precision,
the operator initialisation, the step) or raises one
:class:`~pbgio.errors.UsageError` naming the option. The command line and :func:`pbgtrain.train.fit`
both go through it, so a bad option gives the same line either way (the command line exits 2);
the trainer and the fit loop take the plan and check nothing again.

>>> from pbgio.example import example_config
>>> from pbgio.layout import Layout
>>> plan = resolve_fit(Layout.load(example_config()), FitOptions(frozen_types=frozenset({"item"})))
>>> plan.device, plan.precision, sorted(plan.options.frozen_types), plan.operator_init.value
(device(type='cpu'), 'fp32', ['item'], 'random')
>>> resolve_fit(Layout.load(example_config()), FitOptions(frozen_types=frozenset({"items"})))
Traceback (most recent call last):
...
pbgio.errors.UsageError: --freeze: unknown entity type 'items'; the config's entity types are 'item', 'user'
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, replace
from typing import Any

import torch

from pbgio.deprecation import warn_renamed
from pbgio.errors import MissingArtifactError, UsageError
from pbgio.layout import Layout
from pbgtrain.choices import PRECISION_CHOICES, OperatorInit, Precision, StepKind
from pbgtrain.featurized_ranking import same_batch_only
from pbgtrain.model.model import relation_prediction_problem
from pbgtrain.model.step_choice import (
    CPU_ATTENTION_KEYS,
    SAMPLED_VIOLATORS,
    StepChoice,
    StepConfig,
    attention_problem,
    capture_problem,
    keys_per_edge,
)
from pbgtrain.model.step_choice import (
    Capture as StepCapture,
)
from pbgtrain.model.step_choice import (
    Head as StepHead,
)
from pbgtrain.training.device import resolve_device, resolve_precision

LAST_VALIDATION_SHARE = 0.1
"""``--last-validation-share``'s default: past the time cap, a last validation expected to take less
than a tenth of an epoch of training still runs."""


@dataclass(frozen=True)
class ValidationOptions:
    """What ``--valid`` and its companions ask for (:mod:`pbgtrain.early_stopping`).

    ``edge_path`` and ``filter_paths`` are as written on the command line (relative to the config's
    folder, ``./`` for the current directory); ``filter_paths`` empty means the config's
    ``edge_paths`` and the validation path. In a :class:`FitPlan` they are absolute. ``sample``
    (``--valid-sample``): rank a fixed sample of this many validation edges, drawn once by the
    run's seed (None: all of them). ``last_share`` (``--last-validation-share``): past
    ``--max-minutes``, the last version is validated all the same when its validation is expected
    to take less than this share of an epoch of training (:func:`pbgtrain.early_stopping.validate_past_cap`).
    """

    edge_path: str
    filter_paths: tuple[str, ...] = ()
    every: int = 1
    patience: int | None = None
    lr_decay: float | None = None
    lr_patience: int = 1
    sample: int | None = None
    last_share: float = LAST_VALIDATION_SHARE


@dataclass(frozen=True)
class FitOptions:
    """How to run ``fit``, as given (everything else comes from the config); :func:`resolve_fit`
    checks it."""

    device: str | None = None
    seed: int = 0
    check_layout: bool = True  # validate the layout (pbgio.validate) before training; --no-validate: not
    interactive: bool = False
    max_seconds: float | None = None  # --max-minutes × 60 (a fresh run takes edge chunks to suit: edge_chunk_plan)
    max_iterations: int | None = None
    rank: int | None = None  # --rank: this trainer's rank in a run of num_machines trainers
    peer_timeout: float | None = None  # seconds without a peer's heartbeat before a distributed run stops
    precision: str | None = None  # fp32, tf32, bf16 or auto (default: bf16 with half_precision on a GPU, else fp32)
    partition_memory: float | None = None  # GiB of swapped-out partitions kept in memory (None: automatic)
    read_ahead_partitions: bool | None = None  # read the next bucket's partitions in the background (None: on a GPU)
    compile: bool = False  # fuse the score-matrix passes with torch.compile (pbgtrain.model.score_kernels)
    static_shapes: bool = False  # pad every batch to batch_size (EdgeBatch.pad): one shape per run
    step: str = StepKind.auto.value  # --step: auto, scores or attention (StepKind; pbgtrain.model.step_choice)
    capture: bool | None = None  # --capture/--no-capture: replay the step (None: on a GPU with the attention step)
    remote_cache: float = 8.0  # GiB of local copies of remote edge buckets (re-read every epoch)
    frozen_types: frozenset[str] = frozenset()  # --freeze: entity types whose embeddings stay as loaded
    validation: ValidationOptions | None = None  # --valid: evaluate, keep the best, stop early (early_stopping)
    operator_init: str = OperatorInit.random.value  # --operator-init (OperatorInit; identity: the original's)
    relation_prediction: float = 0.0  # --relation-prediction: weight of the relation loss (0: off)
    validate: InitVar[bool | None] = None  # check_layout's name before a release, kept for one, with a warning

    def __post_init__(self, validate: bool | None) -> None:
        if validate is not None:
            warn_renamed("FitOptions(validate=...)", "FitOptions(check_layout=...)", callers_to_skip=2)
            object.__setattr__(self, "check_layout", validate)


@dataclass(frozen=True)
class FitPlan:
    """The checked options of a run and its layout (:func:`resolve_fit`): every option is read
    from ``options``; the plan's other fields are what :func:`resolve_fit` decides from them."""

    layout: Layout
    options: FitOptions  # as given, checked; validation's paths absolute, frozen_types a frozenset
    device: torch.device  # options.device; a bare ``cuda`` is indexed by the run's placement
    precision: Precision  # options.precision for this device and config
    precision_note: str  # the precision and why, the run's first line (a warning when it will be slow)
    operator_init: OperatorInit  # options.operator_init
    step: StepChoice  # options.step, capture and compile: head, passes, replay; its note a line of the run
    edge_chunks_note: str | None = None  # why layout.config's num_edge_chunks is not the config's as given
    # (pbgtrain.training.edge_chunk_plan: a resume keeps the checkpoint's; --max-minutes shortens iterations)


def resolve_fit(layout: Layout, options: FitOptions) -> FitPlan:
    """``options`` checked against ``layout`` (see the module doc); the first bad option is a
    :class:`~pbgio.errors.UsageError` whose message starts with it."""
    device = resolve_device(options.device, layout)
    asked = None if options.precision is None else _plain(options.precision)
    precision, precision_note = resolve_precision(_choice("--precision", asked, PRECISION_CHOICES), layout.config,
                                                  device)
    problem = frozen_types_problem(layout.config, options.frozen_types)
    if problem is not None:
        raise UsageError(f"--freeze: {problem}")
    operator_init = _plain(options.operator_init)
    problem = operator_init_problem(operator_init)
    if problem is not None:
        raise UsageError(problem)
    _check_numbers(options, layout.config.num_machines)
    cfg = layout.config
    problem = relation_prediction_problem(options.relation_prediction, cfg.dynamic_relations,
                                          cfg.relations[0].operator if cfg.relations else "none")
    if problem is not None:
        raise UsageError(f"--relation-prediction: {problem}")
    step = resolve_step(_plain(options.step), options.capture, options.compile, cfg, device,
                        lambda: _largest_partition(layout))
    validation = None if options.validation is None else _checked_validation(layout, options.validation)
    checked = replace(options, frozen_types=frozenset(options.frozen_types), validation=validation)
    return FitPlan(layout, checked, device, precision, precision_note, OperatorInit(operator_init), step)


def _largest_partition(layout: Layout) -> int:
    """The most entities of a partition of ``layout`` (0 where a count cannot be read: the run
    reports that itself, before it trains)."""
    from pbgio.entities import read_entity_count
    from pbgio.errors import PbgioError

    try:
        return max((read_entity_count(layout.entity_path, name, part) for name, entity in layout.config.entities.items()
                    for part in range(entity.num_partitions)), default=0)
    except (PbgioError, OSError):
        return 0


def resolve_step(requested: str, capture: bool | None, compile_step: bool, cfg: StepConfig,
                 device: torch.device, largest_partition: Callable[[], int] = lambda: 0) -> StepChoice:
    """The step of ``--step``, ``--capture`` and ``--compile`` for ``cfg`` on ``device``, and its
    line; an option that cannot apply is a :class:`~pbgio.errors.UsageError` naming it. ``auto``
    takes the attention form on a GPU wherever it applies, and on a CPU where it is the faster
    there (:data:`~pbgtrain.model.step_choice.CPU_ATTENTION_KEYS`; ``largest_partition`` is asked
    only for every-entity negatives).

    >>> from pbgio.example import example_config
    >>> resolve_step("auto", None, False, example_config(), torch.device("cpu")).note
    'step: score matrices'
    >>> print(resolve_step("attention", True, False, example_config(), torch.device("cpu")).note)
    ... # doctest: +NORMALIZE_WHITESPACE
    step: softmax over negatives as attention, through the replay driver (on a CPU it calls the step's body)
    (violators counted on the first 64 edges of each batch)
    """
    _choice("--step", requested, [kind.value for kind in StepKind])
    why_not_attention = attention_problem(cfg)
    if requested == "attention" and why_not_attention is not None:
        raise UsageError(f"--step attention: {why_not_attention}")
    if requested == "attention" and compile_step:
        raise UsageError("--compile: it compiles the score-matrix step's elementwise passes, which the attention "
                         "step (--step attention) does not have")
    gpu = device.type == "cuda"
    head: StepHead = "scores"
    faster_here = gpu or keys_per_edge(cfg, largest_partition() if any(r.all_negs for r in cfg.relations)
                                       else 0) >= CPU_ATTENTION_KEYS
    if requested == "attention" or (requested == "auto" and why_not_attention is None and not compile_step
                                    and faster_here):
        head = "attention"
    why_not_replayed = capture_problem(cfg)
    if capture and why_not_replayed is not None:
        raise UsageError(f"--capture: the step cannot be replayed: {why_not_replayed}")
    replay: StepCapture = "none"
    if capture or (capture is None and gpu and head == "attention" and why_not_replayed is None):
        replay = "cuda-graph" if gpu else "stand-in"
    choice = StepChoice(head, compile_step, replay)
    notes = []
    if head == "attention":
        notes.append(SAMPLED_VIOLATORS)
    if requested == "auto" and gpu and why_not_attention is not None:
        notes.append(f"the attention step, the GPU's default, does not apply: {why_not_attention}")
    if requested == "auto" and not gpu and head == "attention":
        notes.append(f"on a CPU the faster for {CPU_ATTENTION_KEYS:,} or more candidates an edge")
    if capture is None and gpu and head == "attention" and why_not_replayed is not None:
        notes.append(f"not replayed as a CUDA graph: {why_not_replayed}")
    note = f"step: {choice.describe()}" + (f" ({'; '.join(notes)})" if notes else "")
    return replace(choice, note=note)


def _plain(value: str | enum.Enum) -> str:
    """A choice as its value (a Python caller may pass ``OperatorInit.random`` or ``"random"``)."""
    return str(value.value) if isinstance(value, enum.Enum) else value


def choice_error(option: str, value: object, choices: Sequence[str]) -> str:
    """The line the command line prints for a value not among an option's ``choices``.

    >>> choice_error("--precision", "fp8", ["fp32", "bf16"])
    "Invalid value for '--precision': 'fp8' is not one of 'fp32', 'bf16'."
    """
    return f"Invalid value for {option!r}: {value!r} is not one of {', '.join(repr(c) for c in choices)}."


def _choice(option: str, value: str | None, choices: Sequence[str]) -> str | None:
    if value is not None and value not in choices:
        raise UsageError(choice_error(option, value, choices))
    return value


def operator_init_problem(name: str) -> str | None:
    """Why ``--operator-init name`` cannot run (None when it can).

    >>> operator_init_problem("random") is None
    True
    """
    choices = [init.value for init in OperatorInit]
    return None if name in choices else choice_error("--operator-init", name, choices)


def frozen_types_problem(cfg: Any, frozen: frozenset[str] | set[str]) -> str | None:
    """Why ``--freeze`` of ``frozen`` cannot run with ``cfg`` (None when it can): a name that is
    not an entity type, or nothing left to train (every type the relations use is frozen, and
    no relation operator has parameters; the global embeddings of frozen types are frozen too).

    >>> from pbgio.example import example_config
    >>> cfg = example_config()
    >>> frozen_types_problem(cfg, {"item"}) is None and frozen_types_problem(cfg, {"user", "item"}) is None
    True
    """
    unknown = sorted(set(frozen) - set(cfg.entities))
    if unknown:
        known = ", ".join(repr(t) for t in sorted(cfg.entities))
        names = ", ".join(repr(t) for t in unknown)
        return f"unknown entity type{'s' if len(unknown) > 1 else ''} {names}; the config's entity types are {known}"
    used = {t for r in cfg.relations for t in (r.lhs, r.rhs)}
    if not frozen or not used <= set(frozen):
        return None
    from pbgtrain.model.operators import make_dynamic_operator, make_operator

    def has_parameters(operator: str) -> bool:  # whatever the dimension (2: the smallest any operator takes)
        made = make_dynamic_operator(operator, 2, 1) if cfg.dynamic_relations else make_operator(operator, 2)
        return any(True for _ in made.parameters())

    if any(has_parameters(r.operator) for r in cfg.relations):
        return None
    return (f"every entity type of the relations is frozen ({', '.join(sorted(used))}) and no relation operator has "
            f"parameters (operator {', '.join(sorted({repr(r.operator) for r in cfg.relations}))}; global "
            "embeddings are frozen with their types): nothing would train; freeze fewer types")


def _check_numbers(options: FitOptions, num_machines: int) -> None:
    """The numeric options: each in its range, or a :class:`~pbgio.errors.UsageError` naming it."""
    if options.max_seconds is not None and options.max_seconds < 0:
        raise UsageError(f"--max-minutes: expected minutes ≥ 0, found {options.max_seconds / 60:g}")
    if options.max_iterations is not None and options.max_iterations < 1:
        raise UsageError(f"--max-iterations: expected a number of iterations ≥ 1, found {options.max_iterations}")
    if options.partition_memory is not None and options.partition_memory < 0:
        raise UsageError(f"--partition-memory: expected GiB ≥ 0, found {options.partition_memory:g}")
    if options.peer_timeout is not None and options.peer_timeout <= 0:
        raise UsageError(f"--peer-timeout: expected seconds > 0, found {options.peer_timeout:g}")
    if options.rank is not None and not 0 <= options.rank < num_machines:
        raise UsageError(f"--rank {options.rank}: expected a rank in [0, {num_machines}) (num_machines="
                         f"{num_machines} in the config)")
    if options.remote_cache < 0:
        raise UsageError(f"remote_cache: expected GiB ≥ 0, found {options.remote_cache:g}")


def _checked_validation(layout: Layout, validation: ValidationOptions) -> ValidationOptions:
    """``--valid`` and its companions in range, their edge paths existing directories (absolute)."""
    checks: list[tuple[bool, str]] = [
        (validation.every < 1, f"--eval-every: expected a number of epochs ≥ 1, found {validation.every}"),
        (validation.patience is not None and validation.patience < 1,
         f"--patience: expected a number of evaluations ≥ 1, found {validation.patience}"),
        (validation.lr_decay is not None and not 0 < validation.lr_decay < 1,
         f"--lr-decay: expected a factor between 0 and 1 (exclusive), found {validation.lr_decay}"),
        (validation.lr_patience < 1,
         f"--lr-patience: expected a number of evaluations ≥ 1, found {validation.lr_patience}"),
        (validation.sample is not None and validation.sample < 1,
         f"--valid-sample: expected a number of edges ≥ 1, found {validation.sample}"),
        (not validation.last_share >= 0,
         f"--last-validation-share: expected a share of an epoch ≥ 0, found {validation.last_share:g}"),
    ]
    for bad, message in checks:
        if bad:
            raise UsageError(message)
    if validation.filter_paths and same_batch_only(layout.config):
        raise UsageError(f"--filter: {sampled_validation_reason(layout.config.featurized_types())}; no known edge is "
                         "left out of same-batch candidates: drop --filter")
    try:
        edge_path = str(layout.existing_dir(validation.edge_path, "--valid"))
        filters = tuple(str(layout.existing_dir(p, "--filter")) for p in validation.filter_paths)
    except MissingArtifactError as exc:
        raise UsageError(str(exc)) from None
    return replace(validation, edge_path=edge_path, filter_paths=filters)


def sampled_validation_reason(featurized: Sequence[str]) -> str:
    """Why ``--valid`` ranks same-batch candidates rather than all entities (the config's
    ``featurized`` entity types take every side that takes negatives:
    :func:`pbgtrain.featurized_ranking.same_batch_only`): a featurized entity has no table to rank
    against (docs/guides/featurized.md), and no relation has a plain side to rank instead.

    >>> sampled_validation_reason(["doc"])
    "--valid ranks same-batch candidates (the config's eval negatives), not all entities: every side that \
takes negatives is featurized (entity type 'doc': bags of features, with no table to rank against)"
    """
    names = ", ".join(repr(t) for t in featurized)
    types = f"entity types {names}" if len(featurized) > 1 else f"entity type {names}"
    return ("--valid ranks same-batch candidates (the config's eval negatives), not all entities: every side that "
            f"takes negatives is featurized ({types}: bags of features, with no table to rank against)")
