"""``tools/kill_harness.py --target distributed``: SIGKILL (or, with ``--stall``, SIGSTOP) one of 3 trainers.

Each trial: a fresh copy of a planted graph (one ``node`` type in 4 partitions, so 4×4 buckets),
3 ``pbgtrain fit --rank R`` processes meeting over loopback, the layout on local disk. One rank,
drawn uniformly (rank 0, which serves the run's store, included), is hit at a random moment: one
in four uniform over an uninterrupted run, one in four as soon as a commit's temporary files show
up in the checkpoint directory, else uniform over what follows the first write (the single-process
harness's :class:`KillPlan`). Then:

* the surviving trainers stop within ``--peer-timeout`` + 10 s, exit 1, with one ``error:`` line
  on stderr naming the lost rank and saying what to run, and no Python traceback;
* the committed version is complete and valid (the ``fit`` target's checks: every file loads,
  ``pbgio validate`` passes);
* the three trainers run again resume, finish with the last version, and it validates.

``--stall``: the rank is SIGSTOPped instead; once the others have given up it is SIGCONTed and must
exit too (without a traceback); the committed version must be unchanged and valid, then the rerun
finishes. Where a hit landed (startup, training, commit, finishing) is judged as for ``fit``.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kill_harness as kh

WORLD = 3
ITERATIONS = kh.FIT_ITERATIONS  # num_epochs × num_edge_chunks of the graph below, as for ``fit``
GRAPH = {"num_partitions": 4, "num_nodes": 400, "num_edges": 9_000, "num_epochs": 3, "num_edge_chunks": 3,
         "batch_size": 200}
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Hit:
    """One trainer killed (or stalled) and what the harness found after it."""

    trial: int
    rank: int
    mode: str  # kill | stall
    delay: float
    phase: str
    state: str  # v<committed> after the survivors stopped
    stopped_after: float | None  # seconds from the hit until the last survivor ended
    problems: list[str] = field(default_factory=list)


@dataclass
class DistSummary:
    kills: int
    stalls: int
    seed: int
    peer_timeout: float
    reference_seconds: float = 0.0
    hits: list[Hit] = field(default_factory=list)
    finished_before_hit: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    workdir: str = ""

    def figures(self) -> dict[str, Any]:
        stops = [h.stopped_after for h in self.hits if h.stopped_after is not None]
        return {
            "target": "distributed", "kills": sum(h.mode == "kill" for h in self.hits),
            "stalls": sum(h.mode == "stall" for h in self.hits),
            "phases": dict(Counter(h.phase for h in self.hits)),
            "per_rank": {f"{mode} rank {r}": n for (mode, r), n in sorted(Counter((h.mode, h.rank)
                                                                                for h in self.hits).items())},
            "states": dict(sorted(Counter(h.state for h in self.hits).items())),
            "finished_before_hit": self.finished_before_hit,
            "slowest_stop_seconds": round(max(stops), 1) if stops else None,
            "peer_timeout": self.peer_timeout, "failures": len(self.failures),
            "reference_seconds": round(self.reference_seconds, 2), "seconds": round(self.seconds, 1),
        }

    def text(self) -> str:
        f = self.figures()
        lines = [
            f"target distributed ({WORLD} trainers, --peer-timeout {self.peer_timeout:g}): {f['kills']} kills, "
            f"{f['stalls']} stalls, {f['seconds']} s (uninterrupted run {f['reference_seconds']} s)",
            f"  where they landed: {f['phases']}; per rank: {f['per_rank']}",
            f"  committed state after the hit: {f['states']}; runs that finished before their hit: "
            f"{f['finished_before_hit']}",
            f"  slowest survivor stopped {f['slowest_stop_seconds']} s after the hit",
            f"  failures: {f['failures']}" + (f" (kept under {self.workdir})" if self.failures else ""),
        ]
        for failure in self.failures[:20]:
            lines.append(f"    - trial {failure['trial']} ({failure['mode']} of rank {failure['rank']} at "
                         f"{failure['delay']} s, kept in {failure['directory']}): "
                         f"{'; '.join(failure['problems'][:5])}")
        return "\n".join(lines)


def setup(template: Path) -> Path:
    from pbgio.testing.planted import planted_graph

    return planted_graph(template, **GRAPH)  # type: ignore[arg-type]


def start(work: Path, peer_timeout: float, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The 3 trainers of ``work``'s config, each one's stdout and stderr in ``logs/rank<R>.log``."""
    sys.path.insert(0, str(kh.ROOT / "tests"))
    from distributed_runs import free_port, trainer_env

    logs.mkdir(parents=True, exist_ok=True)
    env = {**trainer_env(), "PYTHONPATH": str(kh.ROOT)}
    args = ["-p", f"num_machines={WORLD}", "-p", f"distributed_init_method=tcp://127.0.0.1:{free_port()}",
            "-p", "workers=1", "--no-progress", "--peer-timeout", str(peer_timeout), "--seed", "5"]
    procs = []
    for rank in range(WORLD):
        with (logs / f"rank{rank}.log").open("wb") as out:
            procs.append(subprocess.Popen([*kh.PBGTRAIN, "fit", str(work / "config.json"), "--rank", str(rank),
                                           *args], stdout=out, stderr=out, env=env, cwd=work))
    return procs


def wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> dict[int, float]:
    """When each process ended (``time.monotonic()``), killing those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = time.monotonic()
        time.sleep(0.02)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return ended


def commit_in_progress(checkpoint: Path) -> bool:
    """A commit's temporary files (the model or version file being written) are in the checkpoint."""
    try:
        return any(p.name.startswith(".") and p.name.endswith(".tmp") for p in checkpoint.iterdir())
    except OSError:
        return False


class DistHarness:
    def __init__(self, kills: int, stalls: int, seed: int, peer_timeout: float, workdir: Path) -> None:
        self.summary = DistSummary(kills, stalls, seed, peer_timeout)
        self.workdir, self.template = workdir, workdir / "template"
        self.peer_timeout = peer_timeout
        self.first_write: float | None = None

    def rerun(self, work: Path, logs: Path) -> list[str]:
        """Run the 3 trainers to the end; the problems found."""
        procs = start(work, self.peer_timeout, logs)
        ended = wait(procs, 60 + 20 * self.summary.reference_seconds)
        problems = [f"rank {r} still running after the rerun's time limit" for r in range(WORLD) if r not in ended]
        problems += [f"rank {r} of the rerun exited {p.returncode} (see {logs})" for r, p in enumerate(procs)
                     if r in ended and p.returncode != 0]
        return problems

    def prepare(self) -> None:
        setup(self.template)
        reference = self.workdir / "reference"
        shutil.copytree(self.template, reference, symlinks=True)
        started = time.monotonic()
        procs = start(reference, self.peer_timeout, reference / "logs")
        before = kh.fingerprint(reference / "checkpoint")
        while any(p.poll() is None for p in procs):
            if self.first_write is None and kh._changed(before, kh.fingerprint(reference / "checkpoint")):
                self.first_write = time.monotonic() - started
            time.sleep(0.02)
        self.summary.reference_seconds = time.monotonic() - started
        if any(p.returncode != 0 for p in procs):
            raise SystemExit(f"the uninterrupted distributed run failed; see {reference / 'logs'}")
        shutil.rmtree(reference, ignore_errors=True)

    def plan(self, rng: random.Random) -> tuple[str, float]:
        """``("commit", 0)``, ``("start", s)`` or ``("write", s)``: when to hit."""
        draw = rng.random()
        if draw < 0.25 or self.first_write is None:
            return "start", rng.uniform(0.0, self.summary.reference_seconds)
        if draw < 0.5:
            return "commit", 0.0
        return "write", rng.uniform(0.0, self.summary.reference_seconds - self.first_write)

    def trial(self, index: int, mode: str) -> None:
        rng = random.Random(f"{self.summary.seed}-{index}")  # a string seed is hashed: ranks vary by trial
        work = self.workdir / f"trial{index:04d}"
        shutil.copytree(self.template, work, symlinks=True)
        checkpoint = work / "checkpoint"
        victim = rng.randrange(WORLD)
        aim, delay = self.plan(rng)
        before = kh.fingerprint(checkpoint)
        procs = start(work, self.peer_timeout, work / "logs")
        started = time.monotonic()
        deadline = started + delay if aim == "start" else None
        limit = started + 60 + 20 * self.summary.reference_seconds
        while procs[victim].poll() is None and time.monotonic() < limit:
            now = time.monotonic()
            if deadline is None and aim == "write" and kh._changed(before, kh.fingerprint(checkpoint)):
                deadline = now + delay
            if (deadline is not None and now >= deadline) or (aim == "commit" and commit_in_progress(checkpoint)):
                break
            time.sleep(0.002 if aim == "commit" else 0.01)
        if procs[victim].poll() is not None:  # the run ended first: it counts as a rerun, not a hit
            wait(procs, 60)
            self.summary.finished_before_hit += 1
            shutil.rmtree(work, ignore_errors=True)
            return
        hit_at = time.monotonic()
        procs[victim].send_signal(signal.SIGSTOP if mode == "stall" else signal.SIGKILL)
        phase = kh.FitTarget().phase(work, before) if kh._changed(before, kh.fingerprint(checkpoint)) else "startup"
        others = [p for r, p in enumerate(procs) if r != victim]
        # Before the trainers have all met, the others cannot tell a dead rank from a late one: they
        # wait for the rendezvous (--peer-timeout, at least 30 s), which they may reach only after their
        # imports (as long as an uninterrupted run takes to its first write). After it, the watchdog's bound holds;
        # a stalled rank 0 (which serves the store) is seen as a store that stops answering (same bound).
        bound = self.peer_timeout + 10 if phase != "startup" else \
            max(self.peer_timeout, 30.0) + 10 + (self.first_write or 0.0)
        ended = wait(others, max(self.peer_timeout, 30.0) + 30)
        problems: list[str] = []
        survivors = [r for r in range(WORLD) if r != victim]
        stopped = [ended[i] - hit_at for i in range(len(others)) if i in ended]
        if len(stopped) < len(others):
            problems.append(f"survivor(s) hung: still running {max(self.peer_timeout, 30.0) + 30:g} s after "
                            f"the {mode}")
        elif max(stopped) > bound:
            problems.append(f"a survivor stopped {max(stopped):.1f} s after the {mode} (limit {bound:g} s)")
        for rank, proc in zip(survivors, others, strict=True):
            problems += self.judge_survivor(work, rank, proc.returncode, victim)
        state, found, _ = kh.FitTarget().check(work, work)
        problems += [f"after the {mode}: {p}" for p in found]
        if mode == "stall":
            procs[victim].send_signal(signal.SIGCONT)
            if not wait([procs[victim]], self.peer_timeout + 40):
                problems.append("the stalled trainer did not stop after SIGCONT")
            log = (work / "logs" / f"rank{victim}.log").read_text(encoding="utf-8", errors="replace")
            if TRACEBACK in log:
                problems.append(f"the stalled rank {victim} printed a traceback after SIGCONT")
            after, found, _ = kh.FitTarget().check(work, work)
            problems += [f"after the stalled trainer went on: {p}" for p in found]
            if after != state:
                problems.append(f"the stalled trainer changed the committed version: {state} -> {after}")
        else:
            procs[victim].wait()
        if not problems:
            problems += self.rerun(work, work / "logs-rerun")
        if not problems:
            final, found, _ = kh.FitTarget().check(work, work)
            problems += [f"after the rerun: {p}" for p in found]
            if final != f"v{ITERATIONS}":
                problems.append(f"the rerun ended at {final}, expected v{ITERATIONS}")
        hit = Hit(index, victim, mode, round(hit_at - started, 3), phase, state,
                  round(max(stopped), 2) if stopped else None, problems)
        self.summary.hits.append(hit)
        print(f"trial {index}: {mode} of rank {victim} at {hit.delay} s ({phase}, {state}), survivors stopped "
              f"after {hit.stopped_after} s, {'FAILED: ' + '; '.join(problems) if problems else 'ok'}", flush=True)
        if problems:
            self.summary.failures.append({"trial": index, "mode": mode, "rank": victim, "delay": hit.delay,
                                          "directory": str(work), "problems": problems})
        else:
            shutil.rmtree(work, ignore_errors=True)

    def judge_survivor(self, work: Path, rank: int, returncode: int | None, victim: int) -> list[str]:
        log = (work / "logs" / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace")
        if returncode == 0 and "error:" not in log:
            return []  # the hit came after the run's last barrier: nothing was left to wait for
        problems = []
        if returncode != 1:
            problems.append(f"survivor rank {rank} exited {returncode}, expected 1")
        if TRACEBACK in log:
            problems.append(f"survivor rank {rank} printed a traceback")
        errors = [line for line in log.splitlines() if "error:" in line]
        if len(errors) != 1:
            problems.append(f"survivor rank {rank} printed {len(errors)} error lines, expected 1: {errors[:3]}")
        elif f"rank {victim}" not in errors[0] or "run the same command" not in errors[0]:
            problems.append(f"survivor rank {rank}'s error does not name rank {victim} and what to run: "
                            f"{errors[0]}")
        return problems

    def run(self) -> DistSummary:
        started = time.monotonic()
        self.prepare()
        modes = ["kill"] * self.summary.kills + ["stall"] * self.summary.stalls
        index = 0
        for mode in modes:
            done = len(self.summary.hits)
            while len(self.summary.hits) == done:  # a run that finished before its hit is tried again
                index += 1
                self.trial(index, mode)
        self.summary.seconds = time.monotonic() - started
        self.summary.workdir = str(self.workdir)
        return self.summary


def run_distributed(kills: int, stalls: int, *, seed: int = 0, peer_timeout: float = 5.0,
                    workdir: Path | None = None) -> DistSummary:
    """The campaign in ``workdir`` (default: a temporary directory, removed unless a trial failed)."""
    work = workdir or Path(tempfile.mkdtemp(prefix="pbg-kill-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    summary = DistHarness(kills, stalls, seed, peer_timeout, work).run()
    if workdir is None and not summary.failures:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def write_json(summary: DistSummary, path: Path) -> None:
    from dataclasses import asdict

    path.write_text(json.dumps({"figures": summary.figures(), "hits": [asdict(h) for h in summary.hits],
                                "failures": summary.failures}, indent=1), encoding="utf-8")
