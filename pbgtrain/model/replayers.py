"""How a replayed step's body runs (:class:`Replayer`): a CUDA graph on a GPU
(:class:`CudaGraphReplayer`, the thin CUDA-only layer, tested by ``tests/test_gpu_step.py``), or
the body itself on a CPU (:class:`StandInReplayer`), so that every line of the driver
(:mod:`pbgtrain.model.runner`) runs in the default test suite.

:class:`CudaGraphReplayer` captures (:class:`CaptureSettings`) on the run's device and a stream of
it (``cuda:N`` need not be the current device), in ``thread_local`` error mode (the read-ahead
thread pins host memory while a bucket's graphs are captured), without autocast's cache of casts
(bf16), all graphs in one memory pool (replayed one at a time on one stream, they may share it:
what a graph leaves there, its gradients, its next replay writes before it reads); a failed
capture gives back the thread's stream and the allocator's routing, and the next captures take a
fresh pool. A capture that recorded nothing raises :class:`EmptyGraphError`.

>>> ran = []
>>> StandInReplayer().capture(lambda: ran.append(1))()
>>> ran
[1]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch

Body = Callable[[], None]

EMPTY_GRAPH_WARNING = "The CUDA Graph is empty"
"""How torch's ``CUDAGraph.capture_end`` begins its warning when the capture recorded no node."""


class Replayer(Protocol):
    """How :class:`~pbgtrain.model.runner.ReplayRunner` runs a step's body: eagerly (:meth:`eager`), a relation's first
    ``warmup_steps`` steps and whatever is not captured; or captured once (:meth:`capture`, which
    records the body without running it) and its result called for every later step on the
    same tables. A capture that fails raises; one whose body ran outside it instead of being
    recorded raises :class:`EmptyGraphError`."""

    warmup_steps: int

    def eager(self, body: Body) -> None: ...

    def capture(self, body: Body) -> Body: ...


class EmptyGraphError(RuntimeError):
    """A capture that recorded no work: the body's operations went to a queue that was not
    capturing (another device's, another stream's) and ran there, so its step is done; every
    replay of the graph would do nothing."""


class StandInReplayer:
    """A CPU's stand-in: the body itself, in place of its capture."""

    warmup_steps = 1

    def eager(self, body: Body) -> None:
        body()

    def capture(self, body: Body) -> Body:
        return body


@dataclass(frozen=True)
class CaptureSettings:
    """How :class:`CudaGraphReplayer` captures (the arguments it gives ``torch.cuda.graph``).

    ``error_mode``: ``thread_local`` (torch's default is ``global``): only the capturing thread's
    unsafe CUDA calls break its capture. Under ``global`` any thread's would, and the read-ahead
    thread (:mod:`pbgtrain.training.residency`) pins the next bucket's partitions in host memory,
    which queries events, while this one captures the graphs of the current bucket: the capture
    is invalidated or the pinning fails.

    >>> args = CaptureSettings().graph_arguments(pool=(0, 1), stream=None)
    >>> args["capture_error_mode"], args["pool"]
    ('thread_local', (0, 1))
    """

    error_mode: Literal["global", "thread_local", "relaxed"] = "thread_local"

    def graph_arguments(self, pool: object, stream: object) -> dict[str, Any]:
        """The keyword arguments of ``torch.cuda.graph`` for a capture into ``pool`` on ``stream``."""
        return {"pool": pool, "stream": stream, "capture_error_mode": self.error_mode}


class CudaGraphReplayer:
    """CUDA graphs sharing one memory pool, captured on ``device`` and a stream of it (the eager
    steps run on the same side stream, as capture wants); see the module doc. CUDA only: its
    tests are ``tests/test_gpu_step.py``'s (``pytest -m gpu``)."""

    warmup_steps = 3
    settings: ClassVar[CaptureSettings] = CaptureSettings()

    def __init__(self, device: torch.device) -> None:
        self.index = torch.cuda.current_device() if device.index is None else device.index
        self.device = torch.device("cuda", self.index)
        self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.pool = torch.cuda.graph_pool_handle()
        self._failed: list[torch.cuda.CUDAGraph] = []  # kept: torch's allocators may still hold their filters

    def eager(self, body: Body) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            body()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, body: Body) -> Body:
        graph = torch.cuda.CUDAGraph()
        cache = torch.is_autocast_cache_enabled()
        with torch.cuda.device(self.device):  # the device whose stream torch.cuda.graph captures
            previous = torch.cuda.current_stream()
            try:
                # bf16: a cast autocast caches would be made in the capture and freed when the run
                # leaves its autocast region, under the graph (torch's rule: no autocast cache in a capture)
                torch.set_autocast_cache_enabled(False)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with torch.cuda.graph(graph, **self.settings.graph_arguments(self.pool, self.stream)):
                        body()
            except BaseException:
                self._recover(graph)
                raise
            finally:  # torch.cuda.graph leaves its stream current when capture_end raises
                torch.cuda.set_stream(previous)
                torch.set_autocast_cache_enabled(cache)
        empty = False
        for caught_warning in caught:  # give back the warnings caught on the way (another thread's too)
            if str(caught_warning.message).startswith(EMPTY_GRAPH_WARNING):
                empty = True
            else:
                warnings.warn_explicit(caught_warning.message, caught_warning.category, caught_warning.filename,
                                       caught_warning.lineno)
        if empty:
            raise EmptyGraphError(f"the captured graph is empty: the step's operations ran outside the capture on "
                                  f"{self.device} (another device's or stream's queue)")
        return graph.replay

    def _recover(self, graph: torch.cuda.CUDAGraph) -> None:
        """After a failed capture: torch's ``capture_end`` raises before it ends the caching
        allocator's routing of the capture's allocations to the pool (so the next capture into the
        pool would be refused as already recording), and without giving back the capture's hold
        on the pool. End and give back what is still held; keep the graph (the allocators'
        routing filters point at it); capture into a fresh pool from now on."""
        self._failed.append(graph)
        try:
            torch._C._cuda_endAllocateToPool(self.index, self.pool)
        except RuntimeError:  # no routing left: the capture failed after torch ended it
            pass
        else:
            torch._C._cuda_releasePool(self.index, self.pool)
        self.pool = torch.cuda.graph_pool_handle()


def failure_chain(exc: BaseException) -> list[str]:
    """``exc`` and the exceptions it was raised from or while handling (``__cause__``, else
    ``__context__`` unless suppressed), outermost first, each as ``Type: message`` on one line.

    >>> try:
    ...     try:
    ...         raise ValueError("the root\\nits detail")
    ...     finally:
    ...         raise RuntimeError("the outer one")
    ... except RuntimeError as error:
    ...     failure_chain(error)
    ['RuntimeError: the outer one', 'ValueError: the root / its detail']
    """
    links: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = " / ".join(line.strip() for line in str(current).splitlines() if line.strip())
        links.append(f"{type(current).__name__}: {message}" if message else type(current).__name__)
        current = current.__cause__ if current.__cause__ is not None else \
            None if current.__suppress_context__ else current.__context__
    return links
