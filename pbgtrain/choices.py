"""The choices of pbgtrain's options, declared once and light (no torch): the command lines offer
them (Typer refuses any other value itself), :func:`pbgtrain.training.fit_plan.resolve_fit`
checks a Python caller's value against the same declaration.

>>> PRECISIONS, PRECISION_CHOICES, [init.value for init in OperatorInit], [kind.value for kind in StepKind]
(('fp32', 'tf32', 'bf16'), ('fp32', 'tf32', 'bf16', 'auto'), ['identity', 'random'], ['auto', 'scores', 'attention'])
"""

from __future__ import annotations

import enum
from typing import Literal

Precision = Literal["fp32", "tf32", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16")
"""Arithmetic precision of the score matrix products (:mod:`pbgtrain.model.precision`)."""

PRECISION_CHOICES: tuple[str, ...] = (*PRECISIONS, "auto")
"""What ``--precision`` takes: a precision, or ``auto`` (bf16 where the device computes it
natively, else fp32: :func:`pbgtrain.training.device.resolve_precision`)."""

PrecisionChoice = enum.Enum("PrecisionChoice", {p: p for p in PRECISION_CHOICES}, type=str)  # type: ignore[misc]
"""``--precision`` on the command line: :data:`PRECISION_CHOICES` as an enum."""


class OperatorInit(str, enum.Enum):
    """How a fresh run's relation operators start (``--operator-init``): drawn from
    ``init_scale · N(0, 1)`` like the entities (``random``, the default of ``pbgtrain fit``), or as
    the identity (the original's behaviour). Operators read from a checkpoint or ``init_path``
    replace them either way."""

    identity = "identity"
    random = "random"


class UnknownFeatures(str, enum.Enum):
    """What ``pbgtrain predict`` does with the features of a bag that its featurized type's
    dictionary lacks (``--unknown``): fail, naming them (``error``, the default), or skip them and
    list them in the answer (``ignore``), as ``pbgio embed --unknown`` does."""

    error = "error"
    ignore = "ignore"


class StepKind(str, enum.Enum):
    """The training step (``--step``): the softmax over negatives as attention where it applies
    on a GPU and the score matrices elsewhere (``auto``: on a CPU they are the faster), or either
    one (:mod:`pbgtrain.model.step_choice`)."""

    auto = "auto"
    scores = "scores"
    attention = "attention"
