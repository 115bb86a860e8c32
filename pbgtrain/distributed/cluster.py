"""The trainers of a distributed run: who they are, how they meet, and how they fail together.

A run of ``W`` trainers is one ``torch.distributed`` process group (gloo) plus its c10d store.
Rank and world size come from torchrun's environment (``RANK``, ``WORLD_SIZE``, rendezvous at
``MASTER_ADDR:MASTER_PORT``) or, as in the original, from ``--rank`` with ``num_machines`` and
``distributed_init_method`` of the config (:func:`resolve_launch`).

Everything the trainers coordinate goes through the store: the bucket locks
(:mod:`pbgtrain.distributed.lock_server`), barriers, per-iteration stats, and the *watchdog*:
each rank bumps its heartbeat counter every second, and a background thread on every rank
watches the others. A rank whose counter stops for ``peer_timeout`` seconds (killed, stopped,
its machine gone) or that posts an abort (it failed, or was interrupted) makes every other rank
stop: the watchdog interrupts the main thread, which raises :class:`PeerFailure` naming the rank
(a main thread held in C code, gloo meeting a peer that died, is ended by the watchdog after a
grace of a few seconds, with the same one-line message). A gloo call that fails waits for the
watchdog to name the peer it lost; around a call that holds the store client in C code (making a
gloo group), the sentry waits for the store's own timeout before blaming rank 0. Rank 0, when it
serves the store, keeps it up after an abort until every live rank has read it (a few seconds at
most), so that each survivor reports which rank failed rather than a lost store. Waits are
polling loops, so they are always interruptible; no rank waits forever.

>>> resolve_launch(num_machines=1, init_method=None, rank=None, env={}) is None
True
>>> resolve_launch(num_machines=2, init_method="tcp://10.0.0.1:30050", rank=1, env={})
Launch(rank=1, world_size=2, init_method='tcp://10.0.0.1:30050', source='--rank')
>>> resolve_launch(num_machines=1, init_method=None, rank=None,
...                env={"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
Launch(rank=3, world_size=4, init_method='env://', source='torchrun')
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pbgio.errors import PbgioError

PEER_TIMEOUT_DEFAULT = 60.0
HEARTBEAT_SECONDS = 1.0
POLL_SECONDS = 0.02
ABORT_LINGER_SECONDS = 3 * HEARTBEAT_SECONDS  # how long rank 0 keeps the store up for an abort
STORE_PREFIX = "pbgtrain"
STORE_EXIT_GRACE_SECONDS = 3.0  # after a store that stopped answering: time for the main thread to stop cleanly
RERUN_HINT = ("the last committed checkpoint version is intact: run the same command on every trainer again "
              "(all {world} of them) to resume from it")


class DistributedError(PbgioError):
    """A distributed run cannot start or go on (a launch mistake, or a lost peer)."""


class PeerFailure(DistributedError):
    """Another rank died, hung, failed or was interrupted; this rank stops too."""

    def __init__(self, rank: int | None, reason: str) -> None:
        self.rank = rank
        super().__init__(reason)


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a distributed run."""

    rank: int
    world_size: int
    init_method: str
    source: str  # "torchrun" or "--rank"


def resolve_launch(*, num_machines: int, init_method: str | None, rank: int | None,
                   env: Mapping[str, str]) -> Launch | None:
    """The launch of this process, or None for a single-process run.

    ``--rank`` (``rank``) takes ``num_machines`` trainers meeting at ``distributed_init_method``,
    as the original. Without it, torchrun's ``RANK``/``WORLD_SIZE`` give the rank and the number
    of trainers and the rendezvous is torchrun's (``env://``); the config's ``num_machines``
    must then be 1 or that number.
    """
    if rank is not None:
        if not 0 <= rank < num_machines:
            raise DistributedError(f"--rank {rank}: expected a rank in [0, {num_machines}) "
                                   f"(num_machines={num_machines} in the config)")
        if num_machines == 1:
            return None
        if not init_method:
            raise DistributedError(f"num_machines={num_machines} with --rank needs distributed_init_method "
                                   "in the config (e.g. tcp://HOST:PORT of rank 0, or file:///shared/path); "
                                   "or launch with torchrun")
        return Launch(rank, num_machines, init_method, "--rank")
    world = env.get("WORLD_SIZE")
    if world is not None and "RANK" in env:
        world_size, env_rank = int(world), int(env["RANK"])
        if num_machines not in (1, world_size):
            raise DistributedError(f"torchrun started {world_size} trainer(s) but the config says "
                                   f"num_machines={num_machines}; make them agree (or set num_machines=1 "
                                   "to let torchrun decide)")
        if world_size == 1:
            return None
        return Launch(env_rank, world_size, "env://", "torchrun")
    if num_machines > 1:
        raise DistributedError(f"num_machines={num_machines}: start each trainer with --rank R "
                               f"(0 … {num_machines - 1}), or launch with torchrun")
    return None


class Cluster:
    """This rank's handle on the run: the store, barriers, heartbeats and the watchdog.

    Use as a context manager: it joins the process group on enter and leaves it on exit,
    posting an abort for the others when it leaves because of an error.
    """

    def __init__(self, launch: Launch, *, peer_timeout: float = PEER_TIMEOUT_DEFAULT) -> None:
        self.launch = launch
        self.rank = launch.rank
        self.world_size = launch.world_size
        self.peer_timeout = peer_timeout
        self.store: Any = None
        self._store_timeout = max(peer_timeout, 30.0)  # how long one store call may wait (the rendezvous too)
        self._held_until = 0.0  # the main thread may hold the store client in C code until then (monotonic)
        self._explaining = False  # the main thread is asking the watchdog which peer a failed call lost
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.failure: PeerFailure | None = None
        self._barriers: dict[str, int] = {}
        self._leaving = False
        self._abort_acknowledged = False
        self._answer_by = float("inf")  # the store must have answered the watchdog by then (monotonic)
        self._answer_within = peer_timeout  # the bound _answer_by was set with (seconds), for the message
        self.local_world_size = 1  # trainers on this machine (known once joined)

    # ---- lifecycle
    def __enter__(self) -> Cluster:
        from torch.distributed import DistError

        timeout = timedelta(seconds=self._store_timeout)
        self._expect_answer_within(timeout.total_seconds() + 5)
        threading.Thread(target=self._sentry, name="pbgtrain-store-sentry", daemon=True).start()
        try:  # the sentry's interrupt may reach the main thread inside the handler below: caught here too
            try:
                self._join(timeout)
            except DistError as exc:
                raise DistributedError(
                    f"the {self.world_size} trainers did not all meet at {self.launch.init_method} within "
                    f"{timeout.total_seconds():.0f} s (rank {self.rank}; rank 0 serves the rendezvous): "
                    f"{str(exc).splitlines()[0]}; "
                    f"run the same command on every trainer again (all {self.world_size} of them)") from None
        except (KeyboardInterrupt, DistributedError):
            if self.failure is not None:  # the sentry: the store stopped answering
                raise self.failure from None
            raise
        # The store answered the meeting just now: from here the sentry's deadline is the watchdog's
        # (a rank 0 stopped before the watchdog's first round was otherwise noticed at the meeting's bound).
        self._expect_answer_within(self.peer_timeout + HEARTBEAT_SECONDS)
        self._watchdog = threading.Thread(target=self._watch, name="pbgtrain-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _join(self, timeout: timedelta) -> None:
        """Rendezvous, join the process group, and learn how many trainers share this machine."""
        import socket

        import torch.distributed as dist
        from torch.distributed.rendezvous import rendezvous

        if self.launch.init_method.startswith("tcp://"):
            store = self._meet_over_tcp(timeout)
        else:
            store, rank, world_size = next(rendezvous(self.launch.init_method, self.rank, self.world_size,
                                                      timeout=timeout))
            if (rank, world_size) != (self.rank, self.world_size):
                raise DistributedError(f"the rendezvous gave rank {rank} of {world_size}, expected "
                                       f"{self.rank} of {self.world_size}")
        store.set_timeout(timeout)
        self.store = dist.PrefixStore(STORE_PREFIX, store)  # type: ignore[attr-defined]
        group_store = dist.PrefixStore(f"{STORE_PREFIX}/pg", store)  # type: ignore[attr-defined]
        # The store answered the meeting: the group's making may wait on it (in C code) for its timeout.
        self._expect_answer_within(timeout.total_seconds() + 5)
        try:
            dist.init_process_group("gloo", store=group_store, rank=self.rank,
                                    world_size=self.world_size, timeout=timeout)
        except RuntimeError as exc:  # DistError naming a store key, or gloo's own: who is gone is named
            raise self._roll_call(exc) from None
        self._heartbeat()
        self.store.set(f"host/{self.rank}", socket.gethostname())
        hosts = [bytes(self.store.get(f"host/{r}")).decode() for r in range(self.world_size)]
        self.local_world_size = hosts.count(hosts[self.rank])

    def _meet_over_tcp(self, timeout: timedelta) -> Any:
        """The ``tcp://HOST:PORT`` rendezvous (rank 0 serves the store), each rank marking that it
        joined: when one never comes, the others name it (torch's own says only "2/3 clients")."""
        from urllib.parse import urlparse

        import torch.distributed as dist

        url = urlparse(self.launch.init_method)
        if url.hostname is None or url.port is None:
            raise DistributedError(f"distributed_init_method {self.launch.init_method}: expected tcp://HOST:PORT")
        store = dist.TCPStore(url.hostname, url.port, self.world_size, self.rank == 0,  # type: ignore[attr-defined]
                              timeout=timeout, wait_for_workers=False, multi_tenant=True)
        store.set(f"{STORE_PREFIX}/joined/{self.rank}", "1")
        from torch.distributed import DistError

        deadline = time.monotonic() + timeout.total_seconds()
        missing: list[int] = []
        while True:
            try:
                missing = [r for r in range(self.world_size) if not store.check([f"{STORE_PREFIX}/joined/{r}"])]
            except DistError:
                if not missing or time.monotonic() < deadline - 5:  # rank 0 itself is gone
                    raise
                deadline = 0.0  # rank 0 gave up waiting for them at its deadline (and took the store with it)
            if not missing:
                return store
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not join the run "
                    f"at {self.launch.init_method} within {timeout.total_seconds():.0f} s (rank {self.rank}): "
                    f"nothing was trained; run the same command on every trainer again (all {self.world_size} "
                    "of them)")
            time.sleep(POLL_SECONDS * 5)

    def _roll_call(self, exc: BaseException) -> DistributedError:
        """Making the process group failed (a trainer that met the others died before it gave gloo
        its address; they all wait for it the group's whole timeout, then fail about together): the
        trainers still here mark themselves and wait ``peer_timeout`` for each other; those that
        never do are named. A rank 0 gone takes the store with it (named too); a rank 0 stopped holds
        this call, and the sentry names it."""
        from torch.distributed import DistError

        def absent(mark: str, ranks: range | list[int]) -> list[int]:
            self._expect_answer_within(self.peer_timeout + HEARTBEAT_SECONDS)
            return [r for r in ranks if not self.store.check([f"{mark}/{r}"])]

        def wait_for(mark: str, ranks: range | list[int]) -> list[int]:
            deadline = time.monotonic() + self.peer_timeout
            while (missing := absent(mark, ranks)) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS * 5)
            return missing

        try:
            self.store.set(f"roll-call/{self.rank}", "1")
            missing = wait_for("roll-call", range(self.world_size))
            self.store.set(f"roll-call-read/{self.rank}", "1")
            if self.rank == 0:  # it serves the store: stay until the others have read the roll call
                wait_for("roll-call-read", [r for r in range(self.world_size) if r not in missing])
        except DistError as lost:
            return PeerFailure(0, self._store_lost(lost))
        if not missing:
            return DistributedError(
                f"the {self.world_size} trainers met at {self.launch.init_method} but could not make their "
                f"process group (rank {self.rank}): {str(exc).splitlines()[0]}; run the same command on every "
                f"trainer again (all {self.world_size} of them)")
        ranks = ", ".join(map(str, missing))
        return PeerFailure(missing[0] if len(missing) == 1 else None,
                           f"rank{'s' if len(missing) > 1 else ''} {ranks} stopped after the trainers met, before "
                           "they made their process group (killed, hung, or its machine is gone)")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self._leaving = True
        if exc is not None and not isinstance(exc, PeerFailure):
            reason = ("was interrupted" if isinstance(exc, KeyboardInterrupt)
                      else f"failed: {type(exc).__name__}: {exc}".splitlines()[0])
            self.post_abort(f"rank {self.rank} {reason}")
        self._stop.set()
        if exc is not None:
            self._linger_for_abort()
        self._leaving = True
        if exc is None:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    def leave(self) -> None:
        """Meet the others one last time, then stop watching them: from here on, rank 0 (which may
        serve the store) can exit without the others taking it for a failure."""
        self.barrier("leaving")
        self._leaving = True
        self._stop.set()

    # ---- failure handling
    def post_abort(self, reason: str) -> None:
        """Tell every rank to stop (best effort: the store may be gone with rank 0)."""
        with contextlib.suppress(Exception):
            self.store.compare_set("abort", "", reason)
            self._acknowledge_abort()

    def _acknowledge_abort(self) -> None:
        if not self._abort_acknowledged:
            self._abort_acknowledged = True
            self.store.add("abort/seen", 1)

    def _linger_for_abort(self) -> None:
        """If this rank serves the store (rank 0 launched with ``--rank``), keep it up until every
        live peer has read the abort, at most :data:`ABORT_LINGER_SECONDS`: otherwise a peer polling
        a moment later would see only a lost store, not which rank failed."""
        if self.rank != 0 or self.launch.source != "--rank" or self.store is None:
            return
        def settled() -> bool:
            lost = sum(bool(self.store.check([f"lost/{peer}"])) for peer in range(self.world_size))
            return int(self.store.add("abort/seen", 0)) + lost >= self.world_size

        deadline = time.monotonic() + ABORT_LINGER_SECONDS
        with contextlib.suppress(Exception):
            while not settled() and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)

    def _sentry(self) -> None:
        """Exit when the store stops answering: a stopped (SIGSTOP) or hung rank 0 keeps its connections
        open, and torch's store calls then wait forever whatever their timeout, so neither the watchdog
        nor the main thread would ever see it. The watchdog pushes :attr:`_answer_by` on after every
        round; past it, this rank stops like the watchdog would, and exits if that does not end it."""
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if time.monotonic() <= max(self._answer_by, self._held_until) or self._leaving:
                continue
            reason = (f"the run's store, served by rank 0, did not answer within {self._answer_within:.0f} s "
                      "(rank 0 stopped, hung, or its machine is gone)")
            self._fail(0, reason)
            self._exit_unless_stopped()
            return

    @contextlib.contextmanager
    def holding_the_store(self, seconds: float) -> Iterator[None]:
        """Around a call that may wait on the store in C code for up to ``seconds`` (making a gloo
        group: it waits for every member's address): a store client runs one call at a time, so the
        watchdog's calls queue behind it and cannot show that the store answers; the sentry then
        waits that long, after which the call fails and :meth:`translating_interrupts` names the
        lost peer."""
        self._held_until = time.monotonic() + seconds + self.peer_timeout + HEARTBEAT_SECONDS
        try:
            yield
        finally:
            self._held_until = 0.0
            if self._answer_by < time.monotonic() + self.peer_timeout + HEARTBEAT_SECONDS:
                self._expect_answer_within(self.peer_timeout + HEARTBEAT_SECONDS)

    def _expect_answer_within(self, seconds: float) -> None:
        """The store must answer again within ``seconds`` from now, else the sentry stops this rank."""
        self._answer_within = seconds
        self._answer_by = time.monotonic() + seconds

    def _heartbeat(self) -> None:
        self.store.add(f"heartbeat/{self.rank}", 1)

    def _watch(self) -> None:
        """Heartbeat, and stop the main thread when a peer aborted or went silent."""
        last_seen: dict[int, tuple[int, float]] = {}
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._heartbeat()
                aborted = self.store.check(["abort"]) and self.store.get("abort").decode()
                self._expect_answer_within(self.peer_timeout + HEARTBEAT_SECONDS)
                if aborted:
                    self._acknowledge_abort()
                    self._fail(None, f"stopping: {aborted}")
                    break
                now = time.monotonic()
                for peer in range(self.world_size):
                    if peer == self.rank:
                        continue
                    beats = int(self.store.add(f"heartbeat/{peer}", 0))
                    seen = last_seen.get(peer)
                    if seen is None or seen[0] != beats:
                        last_seen[peer] = (beats, now)
                    elif now - seen[1] > self.peer_timeout:
                        self.store.set(f"lost/{peer}", "1")
                        self.post_abort(f"rank {peer} stopped responding")
                        self._fail(peer, f"rank {peer} stopped responding: no heartbeat for "
                                         f"{self.peer_timeout:.0f} s (killed, hung, or its machine is gone)")
                        break
                if self.failure is not None:
                    break
            except Exception as exc:  # the store is gone: rank 0 (which serves it) died
                if self._stop.is_set():
                    return
                self._fail(0, self._store_lost(exc))
                break
        self._exit_unless_stopped()

    def _exit_unless_stopped(self) -> None:
        """After a failure: the main thread, interrupted, leaves the cluster within moments, unless it
        waits in C code (a gloo call meeting a dead peer holds it for the store's timeout, 30 s or
        more; a store call to a stopped rank 0, for ever), where an interrupt cannot reach it; then
        this thread says why and ends the process, as a kill would (commits are atomic: nothing
        committed is lost)."""
        if self.failure is None or self._stop.wait(STORE_EXIT_GRACE_SECONDS) or self._leaving:
            return
        sys.stderr.write(f"error: {self.failure}; {RERUN_HINT.format(world=self.world_size)}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    def _fail(self, rank: int | None, reason: str) -> None:
        if self._leaving or self.failure is not None:
            return
        self.failure = PeerFailure(rank, reason)
        if not self._explaining:  # else the main thread is polling for it (see _explain)
            _thread.interrupt_main()

    def check(self) -> None:
        """Raise the failure the watchdog saw, if any."""
        if self.failure is not None:
            raise self.failure

    @contextlib.contextmanager
    def translating_interrupts(self) -> Iterator[None]:
        """Turn the watchdog's interrupt of the main thread into its :class:`PeerFailure`, and a
        lost store into one naming its server."""
        from torch.distributed import DistError

        try:
            yield
        except KeyboardInterrupt:
            if self.failure is not None:
                raise self.failure from None
            raise
        except RuntimeError as exc:  # DistError, or gloo's plain RuntimeError for a peer gone mid-call
            if not isinstance(exc, DistError) and "gloo" not in str(exc).lower():
                raise
            raise self._explain(exc) from None

    def _explain(self, exc: BaseException) -> PeerFailure:
        """A call between the trainers failed: the peer it lost is named by an abort that peer posted,
        or by the watchdog once the peer's heartbeat has stopped for ``peer_timeout`` (waited for)."""
        deadline = time.monotonic() + self.peer_timeout + 2 * HEARTBEAT_SECONDS
        self._explaining = True
        try:
            while self.failure is None and time.monotonic() < deadline and not self._stop.is_set():
                aborted = self.store.check(["abort"]) and bytes(self.store.get("abort")).decode()
                if aborted:
                    self._acknowledge_abort()
                    return PeerFailure(None, f"stopping: {aborted}")
                time.sleep(POLL_SECONDS * 5)
        except KeyboardInterrupt:
            pass  # the watchdog found the peer
        except Exception:
            if self.failure is None:
                return PeerFailure(0, self._store_lost(exc))
        finally:
            self._explaining = False
        return self.failure or PeerFailure(None, f"lost contact with another trainer: {str(exc).splitlines()[0]}")

    def _store_lost(self, exc: BaseException) -> str:
        server = "torchrun's agent" if self.launch.source == "torchrun" else "rank 0"
        return (f"lost the run's store, served by {server} (killed, or its machine is gone): "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")

    # ---- waiting
    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready`` until it holds (interruptible; the watchdog bounds how long)."""
        delay = POLL_SECONDS
        while not ready():
            self.check()
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def barrier(self, name: str) -> None:
        """Wait until every rank reached the barrier ``name`` (reusable: each use is a new round)."""
        round_ = self._barriers.get(name, 0)
        self._barriers[name] = round_ + 1
        key = f"barrier/{name}/{round_}"
        self.store.add(key, 1)
        self.wait_until(lambda: int(self.store.add(key, 0)) >= self.world_size, f"barrier {name}")

    # ---- small shared values
    def publish(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def fetch(self, key: str) -> str:
        """The value of ``key``, waiting until some rank publishes it."""
        self.wait_until(lambda: bool(self.store.check([key])), key)
        return bytes(self.store.get(key)).decode()

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(key, amount))
