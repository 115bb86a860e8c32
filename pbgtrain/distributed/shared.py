"""Shared parameters of a distributed run: periodic all-reduce of their changes, bounded staleness.

Every trainer updates its own copy of the *shared state*: the relation operators and global
embeddings (the model's parameters) with their Adagrad state, and the unpartitioned entity
types with their row-wise Adagrad sums (every bucket uses them, so no lock can give them to
one trainer). A background thread on each rank runs rounds in lockstep with the others (one
``all_reduce`` of a flat float32 buffer per round, on a gloo group of its own):

- it takes ``delta = current − base`` (what this rank changed since the last round),
- sums the deltas of all ranks, sets ``base += Σ delta`` (bitwise the same on every rank),
- and adds the *other* ranks' part, ``Σ delta − delta``, to its copy, in place, so that the
  updates this rank made during the round are kept and sent in the next one.

The sum of the changes is what one trainer would have applied in sequence (the original's
parameter server adds the updates too). A round starts every ``period`` seconds: at least
a quarter second, and ten times the time the buffer takes to reduce at 100 MB/s, so the all-reduce
costs about a tenth of the time at most; that period (the same on every rank, from the size of
the shared state) is the staleness bound. When a rank has trained its last bucket of the
iteration it says so in the buffer; the round in which all ranks have said so sets every copy
to ``base``: one agreed copy, the one the checkpoint holds.

The training step and the round's read and write hold one lock, so neither sees the other half done.

What ``--freeze`` keeps fixed (the ``fixed`` tensors: frozen types' unpartitioned tables and
global embeddings, with their optimizer state) is made rank 0's at the start with the rest and
then left out of the rounds: no bytes reduced for it, and not a bit of it changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor

from pbgtrain.distributed.cluster import Cluster, DistributedError

MIN_PERIOD = 0.25
ASSUMED_BYTES_PER_SECOND = 100e6
MAX_SHARE = 0.1  # of wall time spent in the all-reduce


def round_period(num_values: int) -> float:
    """Seconds between rounds for a shared state of ``num_values`` floats.

    >>> round_period(1000), round_period(500_000_000)
    (0.25, 200.0)
    """
    return max(MIN_PERIOD, num_values * 4 / ASSUMED_BYTES_PER_SECOND / MAX_SHARE)


def flatten(tensors: list[Tensor]) -> Tensor:
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors])


def pieces(tensors: list[Tensor], flat: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """Each tensor with its piece of ``flat`` (as :func:`flatten` laid them out), shaped like it."""
    offset = 0
    for t in tensors:
        n = t.numel()
        yield t, flat[offset:offset + n].view(t.shape).to(t.device, t.dtype)
        offset += n


class SharedStateSync:
    """Keeps ``tensors()`` the same on every rank (see the module).

    ``tensors`` is called at the start of each iteration (optimizer states may have been
    replaced). Use :meth:`agree` once at the start of the run, then :meth:`start` and
    :meth:`finish` around each iteration's training, holding :attr:`lock` (``lock``, else a new
    one) during every update of the shared state.
    """

    def __init__(self, cluster: Cluster, tensors: Callable[[], list[Tensor]],
                 fixed: Callable[[], list[Tensor]] | None = None, *,
                 lock: AbstractContextManager[Any] | None = None) -> None:
        import torch.distributed as dist

        self.cluster = cluster
        self.tensors = tensors
        self.fixed = fixed or list
        self.lock: AbstractContextManager[Any] = lock or threading.Lock()
        self.period = round_period(sum(t.numel() for t in tensors()))
        timeout = max(cluster.peer_timeout, 30.0) + 2 * self.period  # a round waits for the others' period
        # The rounds' own group: nothing else runs on it.
        with cluster.holding_the_store(timeout):  # gloo waits for every member's address through the store
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        self.rounds = 0
        self.bytes_reduced = 0
        self.seconds_reducing = 0.0
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None

    def agree(self) -> None:
        """Make every copy rank 0's (once, before training: fresh random state may differ), the
        ``fixed`` tensors included."""
        import torch.distributed as dist

        current = [*self.tensors(), *self.fixed()]
        flat = flatten(current)
        dist.broadcast(flat, src=0, group=self.group)
        for tensor, piece in pieces(current, flat):
            tensor.copy_(piece)

    def start(self) -> None:
        """Start the rounds of an iteration."""
        if self._thread is not None:
            raise RuntimeError("the shared-state rounds of the previous iteration are still running")
        current = self.tensors()
        self._done.clear()
        self._error = None
        self._thread = threading.Thread(target=self._rounds, args=(current, flatten(current)),
                                        name="pbgtrain-shared-state", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Say this rank is done updating, and wait for the round that agrees on one copy."""
        self._done.set()
        thread = self._thread
        assert thread is not None
        while thread.is_alive():
            thread.join(timeout=0.2)
            self.cluster.check()
        self._thread = None
        if self._error is not None:
            # A peer is gone: give the watchdog its timeout to name it, then report what gloo said.
            deadline = time.monotonic() + self.cluster.peer_timeout + 5
            while time.monotonic() < deadline:
                self.cluster.check()
                time.sleep(0.2)
            raise DistributedError(f"the all-reduce of the shared parameters failed: {self._error}"
                                   .splitlines()[0])

    def _rounds(self, tensors: list[Tensor], base: Tensor) -> None:
        import torch.distributed as dist

        try:
            while True:
                self._done.wait(self.period)
                done = self._done.is_set()
                with self.lock:
                    delta = flatten(tensors).sub_(base)
                started = time.perf_counter()
                buffer = torch.cat([delta, torch.tensor([1.0 if done else 0.0])])
                dist.all_reduce(buffer, group=self.group)
                elapsed = time.perf_counter() - started
                self.rounds += 1
                self.bytes_reduced += buffer.numel() * 4
                self.seconds_reducing += elapsed
                total, all_done = buffer[:-1], int(buffer[-1].item()) == self.cluster.world_size
                base.add_(total)
                with self.lock:
                    for tensor, piece in pieces(tensors, base if all_done else total.sub_(delta)):
                        if all_done:
                            tensor.copy_(piece)
                        else:
                            tensor.add_(piece)
                if all_done:
                    return
        except BaseException as exc:  # a peer is gone; the main thread reports it
            self._error = exc
