"""The fuzzing campaign: worker processes that run inputs under memory and time bounds.

Each worker (a ``spawn`` process) loads the seed corpus, runs every target's seeds once (so
that modules are imported and thread pools started), then lowers its address-space limit
(``RLIMIT_AS``) to its current size plus ``memory_mb``: an allocation driven by a size a file
claims raises :class:`MemoryError` there, which counts as a failure. Every input runs under a
``setitimer`` alarm that raises :class:`~pbgio.testing.fuzz.Hang`; a worker that does not
answer within twice the bound plus a grace period (stuck in C code) is killed, and its input
is a ``hang``. A worker that dies (abort, segfault) is replaced; its input is a ``crash``.
An input after which the pickle marker file exists is a ``pickle-executed`` failure.

Inputs are generated inside the workers (:func:`pbgio.testing.fuzz_mutators.generate`), so only the
failing inputs' bytes travel back; :func:`campaign` writes each to ``crashes/<target>/`` with
its traceback.

>>> stats = TargetStats("demo")
>>> stats.record(Result("demo", 0, "error", "FormatError", "", "", None, 0.01, ""))
>>> stats.outcomes
Counter({'FormatError': 1})
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import resource
import shutil
import signal
import tempfile
import time
import traceback
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from pbgio.testing import fuzz, fuzz_mutators, fuzz_seeds

GRACE_S = 20.0
WORKER_START_S = 300.0
MAX_SAVED_PER_SIGNATURE = 5


@dataclass
class Result:
    """The outcome of one input, as a worker reports it."""

    target: str
    index: int | str
    outcome: str  # clean | error | failure
    detail: str  # the pbgio error class, or the failure kind
    signature: str  # failures: kind, exception type and the raising line
    traceback: str
    data: bytes | None  # failures only
    seconds: float
    message: str
    retire: bool = False  # the worker exits after this result (its address space grew): start another


@dataclass
class TargetStats:
    """Figures of one target's run."""

    name: str
    inputs: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)
    saved: list[str] = field(default_factory=list)
    slowest: float = 0.0

    def record(self, result: Result) -> None:
        self.inputs += 1
        self.slowest = max(self.slowest, result.seconds)
        if result.outcome == "failure":
            self.failures[result.detail] += 1
            self.signatures[result.signature] += 1
        else:
            self.outcomes["clean" if result.outcome == "clean" else result.detail] += 1

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items(), key=lambda kv: -kv[1]))
        failures = ", ".join(f"{k} {v}" for k, v in sorted(self.failures.items())) or "none"
        return (f"{self.name}: {self.inputs} inputs in {self.seconds:.1f} s ({self.rate:.0f}/s, slowest "
                f"{self.slowest:.2f} s); {outcomes or 'no outcomes'}; failures: {failures}")

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "seconds": round(self.seconds, 3), "inputs_per_second": round(self.rate, 1),
                "slowest_input_seconds": round(self.slowest, 3), "outcomes": dict(self.outcomes),
                "failures": dict(self.failures), "failure_signatures": dict(self.signatures),
                "saved": self.saved}


# --------------------------------------------------------------------------- the worker


def _vm_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _on_alarm(signum: int, frame: Any) -> None:
    raise fuzz.Hang("the input ran past the time bound")


def _signature(kind: str, exc: BaseException | None) -> str:
    if exc is None:
        return kind
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{kind}:{type(exc).__name__}@{where}"


def _worker(conn: Connection, corpus_dir: str, names: list[str], seed: int, timeout: float,
            memory_mb: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("ignore")  # mutated inputs make numpy and torch warn; outcomes are what count
    scratch = Path(tempfile.mkdtemp(prefix="pbgio-fuzz-"))
    marker = scratch / "PICKLE-PAYLOAD-RAN"
    os.environ[fuzz.MARKER_ENV] = str(marker)
    corpora = {name: fuzz_seeds.load_corpus(Path(corpus_dir) / name) for name in names}
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in names:  # warm up: imports, thread pools, caches (not the deliberately broken readers)
        for data in corpora[name][:2] if name in fuzz.TARGETS else []:
            signal.setitimer(signal.ITIMER_REAL, max(timeout, 30.0))
            try:
                with contextlib.suppress(BaseException):  # a warm-up only
                    fuzz.run_input(fuzz.get_target(name), data, scratch)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    # Past this size the worker retires (what readers leave behind, such as HDF5's free lists and
    # caches, adds up over 10^5 inputs): the bound stays on each input, not on the worker's history.
    retire_at = _vm_bytes() + memory_mb * (1 << 19) if memory_mb > 0 else 0
    if memory_mb > 0:
        limit = _vm_bytes() + memory_mb * (1 << 20)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    signal.signal(signal.SIGALRM, _on_alarm)
    conn.send(("ready", os.getpid()))
    try:
        while True:
            task = conn.recv()
            if task is None:
                break
            result = _run_task(task, corpora, seed, timeout, scratch, marker)
            result.retire = bool(retire_at) and _vm_bytes() > retire_at
            conn.send(result)
            if result.retire:
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_bounded(target: Any, data: bytes, scratch: Path, timeout: float) -> tuple[BaseException | None, str]:
    """Run one input under the time bound (the caller installed :func:`_on_alarm` for SIGALRM);
    return what it raised, if anything, and its traceback."""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            fuzz.run_input(target, data, scratch)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as error:
        return error, traceback.format_exc()
    return None, ""


def _run_task(task: tuple[str, str, Any, bytes | None], corpora: dict[str, list[bytes]], seed: int,
              timeout: float, scratch: Path, marker: Path) -> Result:
    how, name, index, payload = task
    target = fuzz.get_target(name)
    try:
        data = payload if how == "data" and payload is not None else fuzz_mutators.generate(
            target, corpora[name], seed, int(index), scratch, marker)
    except BaseException as error:
        return Result(name, index, "failure", "generator", _signature("generator", error),
                      traceback.format_exc(), b"", 0.0, str(error)[:300])
    started = time.perf_counter()
    exc, tb = run_bounded(target, data, scratch, timeout)
    seconds = time.perf_counter() - started
    outcome, detail = fuzz.classify(exc)
    if marker.exists():
        marker.unlink()
        outcome, detail = "failure", "pickle-executed"
    if outcome != "failure":
        return Result(name, index, outcome, detail, "", "", None, seconds, "")
    message = f"{type(exc).__name__}: {exc}"[:500] if exc is not None else detail
    return Result(name, index, outcome, detail, _signature(detail, exc), tb, data, seconds, message)


# --------------------------------------------------------------------------- the parent


@dataclass
class _Slot:
    process: Any
    conn: Connection
    ready: bool = False
    task: tuple[str, str, Any, bytes | None] | None = None
    since: float = 0.0
    started: float = field(default_factory=time.monotonic)


class Campaign:
    """Workers for a set of targets; :meth:`run` feeds them tasks and collects results."""

    def __init__(self, names: list[str], corpus_dir: Path, *, seed: int = 0, jobs: int = 2,
                 timeout: float = 5.0, memory_mb: int = 1024, crashes: Path | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.names = names
        self.corpus_dir = corpus_dir
        self.seed = seed
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.crashes = crashes
        self.log = log
        self._mp = multiprocessing.get_context("spawn")
        self._slots: list[_Slot] = []
        self.retired = 0  # workers replaced because their address space grew

    def __enter__(self) -> Campaign:
        env = {"POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "HDF5_USE_FILE_LOCKING": "FALSE"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self._slots = [self._start() for _ in range(self.jobs)]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        while not all(s.ready for s in self._slots):
            ready = wait([s.conn for s in self._slots if not s.ready], timeout=1.0)
            for slot in self._slots:
                if slot.conn in ready:
                    try:
                        message = slot.conn.recv()
                    except (EOFError, OSError):
                        raise RuntimeError("a fuzz worker died while starting (exit code "
                                           f"{slot.process.exitcode})") from None
                    slot.ready = message[0] == "ready"
                elif not slot.ready and time.monotonic() - slot.started > WORKER_START_S:
                    raise RuntimeError(f"a fuzz worker did not start within {WORKER_START_S:.0f} s")

    def __exit__(self, *exc: object) -> None:
        for slot in self._slots:
            with contextlib.suppress(OSError, BrokenPipeError):
                slot.conn.send(None)
        for slot in self._slots:
            slot.process.join(timeout=10)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()

    def _start(self) -> _Slot:
        parent, child = self._mp.Pipe()
        process = self._mp.Process(target=_worker, args=(child, str(self.corpus_dir), self.names, self.seed,
                                                         self.timeout, self.memory_mb), daemon=True)
        process.start()
        child.close()
        return _Slot(process, parent)

    def _replace(self, slot: _Slot) -> _Slot:
        slot.process.kill()
        slot.process.join()
        slot.conn.close()
        env_saved = os.environ.get("POLARS_MAX_THREADS")
        os.environ["POLARS_MAX_THREADS"] = "1"
        try:
            new = self._start()
        finally:
            if env_saved is None:
                os.environ.pop("POLARS_MAX_THREADS", None)
        self._slots[self._slots.index(slot)] = new
        return new

    def run(self, name: str, tasks: Iterable[tuple[str, str, Any, bytes | None]],
            *, deadline: float | None = None) -> TargetStats:
        """Run the tasks of one target on every worker; stop early at ``deadline`` (monotonic)."""
        stats = TargetStats(name)
        queue = deque(tasks)
        started = time.monotonic()
        while queue or any(s.task is not None for s in self._slots):
            if deadline is not None and time.monotonic() > deadline:
                queue.clear()
            for slot in self._slots:
                if slot.ready and slot.task is None and queue:
                    slot.task, slot.since = queue.popleft(), time.monotonic()
                    slot.conn.send(slot.task)
            ready = wait([s.conn for s in self._slots], timeout=1.0)
            for slot in list(self._slots):
                if slot.conn in ready:
                    try:
                        message = slot.conn.recv()
                    except (EOFError, OSError):
                        self._lost(slot, stats, "crash")
                        continue
                    if isinstance(message, tuple) and message and message[0] == "ready":
                        slot.ready = True
                        continue
                    slot.task = None
                    self._record(stats, message)
                    if message.retire:
                        self.retired += 1
                        self._replace(slot)
                elif slot.task is not None and time.monotonic() - slot.since > 2 * self.timeout + GRACE_S:
                    self._lost(slot, stats, "hang")
                elif not slot.ready and time.monotonic() - slot.started > WORKER_START_S:
                    raise RuntimeError("a fuzz worker did not start within "
                                       f"{WORKER_START_S:.0f} s (exit code {slot.process.exitcode})")
                elif not slot.process.is_alive() and not slot.ready:
                    raise RuntimeError(f"a fuzz worker died while starting (exit code {slot.process.exitcode})")
        stats.seconds = time.monotonic() - started
        return stats

    def _lost(self, slot: _Slot, stats: TargetStats, kind: str) -> None:
        task = slot.task
        code = slot.process.exitcode
        self._replace(slot)
        if task is None:
            if not slot.ready:
                raise RuntimeError(f"a fuzz worker died while starting (exit code {code})")
            return
        _how, name, index, payload = task
        detail = f"worker {'killed after the time bound' if kind == 'hang' else f'died, exit code {code}'}"
        self._record(stats, Result(name, index, "failure", kind, f"{kind}:exit{code}", detail,
                                   payload if payload is not None else None, 2 * self.timeout, detail))

    def _record(self, stats: TargetStats, result: Result) -> None:
        first = result.outcome == "failure" and stats.signatures[result.signature] == 0
        stats.record(result)
        if result.outcome != "failure":
            return
        if first:
            self.log(f"  FAILURE {result.target} input {result.index}: {result.signature}: {result.message}")
        if self.crashes is not None and stats.signatures[result.signature] <= MAX_SAVED_PER_SIGNATURE:
            stats.saved.append(str(self._save(result)))

    def _save(self, result: Result) -> Path:
        folder = self.crashes / result.target  # type: ignore[operator]
        folder.mkdir(parents=True, exist_ok=True)
        data = result.data or b""
        digest = hashlib.sha256(data).hexdigest()[:10]
        index = Path(result.index).stem if isinstance(result.index, str) else result.index  # a replayed file
        stem = f"{result.detail}-{index}-{digest}"
        (folder / f"{stem}.bin").write_bytes(data)
        replay = (f"replay: tools/fuzz.py --target {result.target} --replay {folder / (stem + '.bin')}"
                  if result.data is not None else "input not recoverable (the worker died before reporting); "
                  f"regenerate it: tools/fuzz.py --target {result.target} --seed {self.seed} --only {result.index}")
        (folder / f"{stem}.txt").write_text(
            f"target: {result.target}\ninput: {result.index}\nseed: {self.seed}\nkind: {result.detail}\n"
            f"signature: {result.signature}\n{replay}\n\n{result.traceback}", encoding="utf-8")
        return folder / f"{stem}.bin"


def generated(name: str, inputs: int, start: int = 0) -> Iterable[tuple[str, str, Any, bytes | None]]:
    return (("gen", name, i, None) for i in range(start, start + inputs))


def replayed(name: str, files: Iterable[Path]) -> list[tuple[str, str, Any, bytes | None]]:
    return [("data", name, str(path), path.read_bytes()) for path in files]
