"""How many operations a step dispatches that compute: the kernels it would launch on a GPU, counted on any device.

A step replayed as a CUDA graph launches one kernel per computing operation of its body, and at a
batch of 10,000 the launches, not the arithmetic, bound its rate. :func:`count_ops` runs a function
under ``torch.profiler`` (CPU activity: what the host dispatches, the same operations on every
device) and counts its ``aten::`` operations by one rule, read from the profiler's tree of calls
and torch's operator registry only (so a count is the same from run to run and from machine to
machine for the same code):

- an operation **computes** unless it is a *view* (every overload of it that takes and returns
  tensors returns an alias of an input, not written: ``view``, ``select``, ``transpose``,
  ``detach``, ``to`` and ``contiguous`` when they copy nothing…), an *allocation without a fill*
  (:data:`ALLOCATIONS`) or *metadata* (it returns no tensor: ``result_type``; a read of the device,
  ``_local_scalar_dense``, computes);
- a computing operation with a **kernel of its own** (an overload registered for the CPU dispatch
  key: ``mul``, ``sum``, ``index_add_``, ``bmm``, the attention kernels…) counts one, and what it
  dispatches inside is its kernel's business, not counted (a CPU reduction's ``fill_`` of its
  output, the conversion of a Python number, ``index_add_``'s ``scatter_add_``);
- any other operation is a **composite**, written in other operations (``to`` → ``_to_copy`` →
  ``copy_``, ``new_zeros`` → ``zero_``, ``matmul`` → ``bmm``, ``stack`` → ``cat``): it counts
  through the operations it dispatches, or one when none of them counts.

On a GPU most counted operations are one kernel each; a few differ (a CUDA kernel that launches a
helper of its own, or a CPU kernel's dispatched housekeeping that a CUDA kernel does inline), so
the count is the CPU's view of the launches, within a few of a GPU's. :func:`count_replayed_step`
counts the body a replayed step runs (:func:`~pbgtrain.model.step.step_body` with what
:class:`~pbgtrain.model.runner.ReplayRunner` gives it).

>>> import torch
>>> x = torch.ones(4, 3)
>>> counted = count_ops(lambda: (x.t().reshape(-1) * 2).to(torch.float64).sum())
>>> counted.computing, sorted(counted.by_name.items())  # reshape's copy, mul, to's copy, sum
(4, [('aten::copy_', 2), ('aten::mul', 1), ('aten::sum', 1)])
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.inputs import EdgeBatch
from pbgtrain.model.model import EmbeddingModel
from pbgtrain.model.negative_scores import Head
from pbgtrain.model.relation_adagrad import RelationAdagrad
from pbgtrain.model.step import StepTotals, step_body
from pbgtrain.model.tables import EntityTable

ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_",
                         "scalar_tensor", "_unsafe_view"})
"""Operations that allocate (or re-view) memory without writing it: no kernel. ``scalar_tensor``
makes a host number (a wrapped scalar); ``_unsafe_view`` is a view its schema does not say is one."""
READS = frozenset({"_local_scalar_dense"})
"""Operations that return no tensor but copy from the device (``item``): counted."""


@functools.cache
def computes(name: str) -> bool:
    """Whether the ``aten::`` operation ``name`` (no overload) computes (see the module doc).

    >>> computes("aten::add_"), computes("aten::transpose"), computes("aten::empty"), computes("aten::to")
    (True, False, False, False)
    """
    op = name.removeprefix("aten::")
    if op in ALLOCATIONS:
        return False
    if op in READS:
        return True
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:  # not an aten operator (a profiler's label): count it, to be seen
        return True
    overloads = [getattr(packet, overload) for overload in packet.overloads()]
    on_tensors = [o for o in overloads if _takes_and_returns_tensors(o._schema)]
    if not on_tensors:
        return False  # metadata: no overload returns a tensor
    return not all(o.is_view for o in on_tensors)


@functools.cache
def has_kernel(name: str) -> bool:
    """Whether some overload of the ``aten::`` operation ``name`` has a kernel of its own (one
    registered for the CPU dispatch key), rather than being written in other operations.

    >>> has_kernel("aten::index_add_"), has_kernel("aten::matmul"), has_kernel("aten::new_zeros")
    (True, False, False)
    """
    op = name.removeprefix("aten::")
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return False
    for overload in packet.overloads():
        qualified = f"aten::{op}" if overload == "default" else f"aten::{op}.{overload}"
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"):
                return True
        except RuntimeError:  # an overload the dispatcher does not hold (a TorchScript one)
            continue
    return False


def _takes_and_returns_tensors(schema: Any) -> bool:
    return any(str(a.type).startswith("Tensor") for a in schema.arguments) and \
        any(str(r.type).startswith("Tensor") for r in schema.returns)


@dataclass(frozen=True)
class OpCount:
    """The operations of one call: every ``aten::`` one the profiler saw, those counted as
    computing (the rule of the module doc), the counted ones by name, and by the module of the
    package that dispatched them (``by_module``: the innermost Python frame in a file under the
    ``within`` folder given to :func:`count_ops`, by the file's stem; ``""`` for none)."""

    aten: int
    computing: int
    by_name: Counter[str]
    by_module: Counter[str]


def counted_events(events: Iterable[Any]) -> list[Any]:
    """The counted operations among profiler ``events`` (with their ``cpu_parent`` links, as
    ``profile.events()`` gives them), each in the order dispatched."""
    aten = [e for e in events if e.name.startswith("aten::")]
    children: dict[int, list[Any]] = {}
    roots = []
    for event in aten:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            roots.append(event)
        else:
            children.setdefault(id(parent), []).append(event)
    counted: list[Any] = []

    def visit(event: Any) -> None:
        if computes(event.name) and has_kernel(event.name):
            counted.append(event)
            return
        before = len(counted)
        for child in children.get(id(event), ()):
            visit(child)
        if len(counted) == before and computes(event.name):
            counted.append(event)

    for root in roots:
        visit(root)
    return counted


def _module_of(event: Any, within: str) -> str:
    """The stem of the innermost Python frame above ``event`` whose file is under ``within``: from
    the profiler's Python function events above it (torch 2.13 puts them in the tree of calls),
    else from the stack recorded on the event (``event.stack``, innermost frame first: torch 2.5,
    the declared floor, with the profiler's ``verbose`` setting). Frames read
    ``path/file.py(line): function`` in both."""
    parent = event.cpu_parent
    frames: list[str] = []
    while parent is not None:
        frames.append(parent.name)
        parent = parent.cpu_parent
    recorded: list[str] = getattr(event, "stack", None) or []
    for frame in [*frames, *recorded]:
        if within in frame and ".py(" in frame:
            return frame.split(".py(")[0].rsplit("/", 1)[-1]
    return ""


def count_ops(fn: Callable[[], object], calls: int = 1, *, within: str | None = None) -> OpCount:
    """Run ``fn`` ``calls`` times under the profiler and count what one call dispatches (the
    totals divided by ``calls``, rounded down: give a function that dispatches the same every
    call). ``within`` (a folder, e.g. ``"pbgtrain/model/"``): also record the Python stack and
    count by the module that dispatched each operation."""
    from torch.profiler import ProfilerActivity, profile

    stacks: dict[str, Any] = {} if within is None else {  # verbose: torch 2.5 records the stacks only so
        "with_stack": True, "experimental_config": torch._C._profiler._ExperimentalConfig(verbose=True)}
    with profile(activities=[ProfilerActivity.CPU], **stacks) as prof:
        for _ in range(calls):
            fn()
    events = list(prof.events())
    counted = counted_events(events)
    aten = sum(e.name.startswith("aten::") for e in events)
    by_name = Counter(e.name for e in counted)
    by_module = Counter(_module_of(e, within) for e in counted) if within is not None else Counter[str]()
    return OpCount(aten // calls, len(counted) // calls, _per_call(by_name, calls), _per_call(by_module, calls))


def _per_call(counts: Counter[str], calls: int) -> Counter[str]:
    return +Counter({name: n // calls for name, n in counts.items()})


MODEL_FOLDER = "pbgtrain/model/"
"""Where :func:`count_replayed_step` attributes operations (``OpCount.by_module``)."""


def count_replayed_step(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch,
                        head: Head, optimizer: RelationAdagrad | None, *, warmup: int = 2) -> OpCount:
    """The operations of one replayed step's body on ``batch``: as the replay driver runs it, the
    batch's count of real edges and its weights on the device (a batch without them is given
    them: the driver's buffers always hold both), the learning rates in device tensors, the uniform negatives from a
    :class:`~pbgtrain.model.counter_rng.CounterGenerator`; counted after ``warmup`` calls (what a
    step makes once and keeps is made there), by module of :data:`MODEL_FOLDER`. It trains
    ``lhs_table``, ``rhs_table`` and the model."""
    device = lhs_table.device
    padded = batch if batch.num_real is not None else dataclasses.replace(  # the driver's static batch: a count
        batch, weight=torch.ones(len(batch), device=device) if batch.weight is None else batch.weight,
        num_real=torch.tensor(len(batch), device=device))
    generator = CounterGenerator(device)
    generator.manual_seed(0)
    row_lr = torch.tensor(model.spec.lr, device=device)
    relation_lr: Tensor = torch.tensor(model.spec.relation_lr, device=device)
    totals = StepTotals()

    def body() -> None:
        step_body(totals, model, lhs_table, rhs_table, padded, optimizer, generator=generator,
                  negatives=model.spec.train_negatives, head=head, row_lr=row_lr, relation_lr=relation_lr)

    for _ in range(warmup):
        body()
    return count_ops(body, within=MODEL_FOLDER)
