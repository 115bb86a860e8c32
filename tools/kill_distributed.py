"""``tools/kill_harness.py --target distributed``: SIGKILL (or, with ``--stall``, SIGSTOP) one of 3 trainers.

Each trial: a fresh copy of a planted graph (one ``node`` type in 4 partitions, so 4×4 buckets),
3 ``pbgtrain fit --rank R`` processes meeting over loopback, the layout on local disk or, with
``--storage s3``, on ``s3://`` (one moto S3 server for the campaign, in this process: each trial's
config and layout under ``s3://<bucket>/trialNNNN/``). One rank, drawn uniformly (rank 0, which
serves the run's store, included), is hit at a random moment: one in four uniform over an
uninterrupted run, one in four during a commit (rank 0's writes of the next version's model, the
config, the version file, and the removal of the superseded version) of version v, drawn from 1 to
9, or the first later one caught: locally when the checkpoint directory shows one, polled every
millisecond; on s3 from the server, at the n-th such write request, n drawn from 1 to 3, counted
from the commit of v on; else uniform over what follows the first write. Where the hit landed
(startup: nothing written yet; training; commit; finishing: the last version committed) is judged
from the checkpoint directory as it was just before the signal (for the commit aim on s3, by the
request the signal came with). Then:

* the surviving trainers stop within ``--peer-timeout`` + 10 s, exit 1, with one ``error:`` line
  on stderr naming the lost rank and saying what to run, and no Python traceback;
* the committed version is complete and valid (the ``fit`` target's checks: every file loads,
  ``pbgio validate`` passes);
* the three trainers run again resume, finish with the last version, and it validates; its files
  (config, version file, model, embeddings) are kept under ``<workdir>/finals/trialNNNN/``.

At the end of the campaign, with an environment of the original PyTorch-BigGraph
(``--original-venv``), one process of the original loads every kept checkpoint with its own code
(:file:`tools/original_load.py`: ``ConfigSchema.from_dict``, ``CheckpointManager.read`` of every
partition, ``read_model`` into ``make_model(config)``); a checkpoint it cannot load is a failure.

``--stall``: the rank is SIGSTOPped instead; once the others have given up it is SIGCONTed and must
exit too (without a traceback); the committed version must be unchanged and valid, then the rerun
finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
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
    request: str = ""  # why "commit": the request the signal came with (s3, commit aim), or the file seen
    seconds: float = 0.0  # the whole trial: run, hit, checks, rerun


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
    storage: str = "local"
    kept: list[int] = field(default_factory=list)  # trials whose final checkpoint is under finals/
    original_checked: int | None = None  # None: the original was not asked
    original_loaded: int = 0

    def figures(self) -> dict[str, Any]:
        stops = [h.stopped_after for h in self.hits if h.stopped_after is not None]
        return {
            "target": "distributed", "kills": sum(h.mode == "kill" for h in self.hits),
            "stalls": sum(h.mode == "stall" for h in self.hits),
            "storage": self.storage,
            "phases": dict(Counter(h.phase for h in self.hits)),
            "phases_per_rank": {f"{phase} rank {r}": n for (phase, r), n in
                                sorted(Counter((h.phase, h.rank) for h in self.hits).items())},
            "per_rank": {f"{mode} rank {r}": n for (mode, r), n in sorted(Counter((h.mode, h.rank)
                                                                                for h in self.hits).items())},
            "states": dict(sorted(Counter(h.state for h in self.hits).items())),
            "finished_before_hit": self.finished_before_hit,
            "slowest_stop_seconds": round(max(stops), 1) if stops else None,
            "peer_timeout": self.peer_timeout, "failures": len(self.failures),
            "reference_seconds": round(self.reference_seconds, 2), "seconds": round(self.seconds, 1),
            "trial_seconds": round(sum(h.seconds for h in self.hits) / len(self.hits), 1) if self.hits else None,
            "original_loaded": None if self.original_checked is None else
            f"{self.original_loaded} of {self.original_checked}",
        }

    def text(self) -> str:
        f = self.figures()
        lines = [
            f"target distributed ({WORLD} trainers, --peer-timeout {self.peer_timeout:g}, layout on "
            f"{self.storage}): {f['kills']} kills, {f['stalls']} stalls, {f['seconds']} s (uninterrupted run "
            f"{f['reference_seconds']} s, a trial {f['trial_seconds']} s on average)",
            f"  where they landed: {f['phases']}; per rank: {f['per_rank']}",
            f"  where they landed, per rank: {f['phases_per_rank']}",
            f"  committed state after the hit: {f['states']}; runs that finished before their hit: "
            f"{f['finished_before_hit']}",
            f"  slowest survivor stopped {f['slowest_stop_seconds']} s after the hit",
            "  the original loaded " + (f"{self.original_loaded} of {self.original_checked} final checkpoints"
                                        if self.original_checked is not None else "no final checkpoint (not asked: "
                                        "no --original-venv)"),
            f"  failures: {f['failures']}" + (f" (kept under {self.workdir})" if self.failures else ""),
            *([f"  final checkpoints of {len(self.kept)} trials kept under {self.workdir}/finals"]
              if self.kept else []),
        ]
        for failure in self.failures[:20]:
            where = f"final checkpoint in {failure['directory']}" if failure["mode"] == "-" else \
                f"{failure['mode']} of rank {failure['rank']} at {failure['delay']} s, kept in {failure['directory']}"
            lines.append(f"    - trial {failure['trial']} ({where}): {'; '.join(failure['problems'][:5])}")
        return "\n".join(lines)


def setup(template: Path) -> Path:
    from pbgio.testing.planted import planted_graph

    return planted_graph(template, **GRAPH)  # type: ignore[arg-type]


def start(config: str, work: Path, peer_timeout: float, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The 3 trainers of ``config`` (a path or an ``s3://`` URL), run in ``work``, each one's stdout
    and stderr in ``logs/rank<R>.log``."""
    sys.path.insert(0, str(kh.ROOT / "tests"))
    from distributed_runs import free_port, trainer_env

    logs.mkdir(parents=True, exist_ok=True)
    env = {**trainer_env(), "PYTHONPATH": str(kh.ROOT)}
    args = ["-p", f"num_machines={WORLD}", "-p", f"distributed_init_method=tcp://127.0.0.1:{free_port()}",
            "-p", "workers=1", "--no-progress", "--peer-timeout", str(peer_timeout), "--seed", "5"]
    procs = []
    for rank in range(WORLD):
        with (logs / f"rank{rank}.log").open("wb") as out:
            procs.append(subprocess.Popen([*kh.PBGTRAIN, "fit", config, "--rank", str(rank),
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


COMMIT_TEMPS = (".checkpoint_version.txt.tmp", ".config.json.tmp")
"""Temporary files only a commit writes (locally); a partition swapped out in training writes
``.embeddings_*.tmp``, which is not a commit."""


def commit_evidence(names: set[str], committed: int | None) -> str | None:
    """Why a checkpoint directory holding ``names`` (its committed version ``committed``, None when
    unreadable) is in a commit, or None: the model of the next version (written only by a commit)
    or its temporary file, the config's or the version file's temporary file, or a file of a
    version older than the committed one (superseded, not yet removed)."""
    from pbgio.spec import naming

    if committed is None:
        return "the version file unreadable"
    for name in sorted(names):
        if name in COMMIT_TEMPS or (name.startswith(".model.v") and name.endswith(".tmp")):
            return f"{name} at v{committed}"
        parsed = naming.parse_versioned_file(name)
        if parsed is not None and ((parsed[0] == "model" and parsed[3] > committed)
                                   or 0 < parsed[3] < committed):
            return f"{name} at v{committed}"
    return None


def commit_phase(names: set[str], committed: int | None) -> bool:
    return commit_evidence(names, committed) is not None


def committing(names: set[str]) -> int:
    """The newest version with a model file (or its temporary file) in ``names``: during a
    commit, the version being committed."""
    from pbgio.spec import naming

    found = [0]
    for name in names:
        parsed = naming.parse_versioned_file(name.removeprefix(".").removesuffix(".tmp"))
        if parsed is not None and parsed[0] == "model":
            found.append(parsed[3])
    return max(found)


def committing_at_least(names: set[str], committed: int | None, version: int) -> bool:
    """In a commit, of ``version`` or a later one."""
    return commit_phase(names, committed) and committing(names) >= version


def phase_of(names: set[str], committed: int | None) -> str:
    """training, commit or finishing (a directory something was written to)."""
    if commit_phase(names, committed):
        return "commit"
    return "finishing" if committed == ITERATIONS else "training"


class LocalStore:
    """Each trial's layout on local disk, in the trial's directory."""

    name = "local"

    def root(self, work: Path) -> str:
        return str(work)

    def plant(self, template: Path, work: Path, root: str) -> None:
        shutil.copytree(template, work, symlinks=True)

    def listing(self, root: str) -> set[str]:
        try:
            with os.scandir(f"{root}/checkpoint") as entries:
                return {e.name for e in entries}
        except OSError:
            return set()

    def read_version(self, root: str) -> int | None:
        try:
            text = Path(root, "checkpoint", "checkpoint_version.txt").read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return 0
        except OSError:
            return None
        return int(text) if text.isdigit() else 0 if not text else None

    def baseline(self, root: str) -> Any:
        return kh.fingerprint(Path(root) / "checkpoint")

    def wrote(self, root: str, baseline: Any) -> bool:
        return kh._changed(baseline, kh.fingerprint(Path(root) / "checkpoint"))

    def arm(self, root: str, proc: subprocess.Popen[bytes], sig: int, at: int, version: int) -> None:
        raise NotImplementedError  # locally the commit aim polls (DistHarness.trial)

    def fired(self, root: str) -> tuple[float, str] | None:
        return None

    def disarm(self, root: str) -> None:
        return None

    def fetch(self, root: str, names: list[str], dest: Path) -> None:
        for name in names:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(root, name), dest / name)

    def remove(self, root: str) -> None:
        return None  # the trial's directory holds it

    def close(self) -> None:
        return None


@dataclass
class _Armed:
    proc: subprocess.Popen[bytes]
    sig: int
    at: int  # the at-th commit write request from the commit of ``version`` on
    version: int
    current: int = 0  # the version whose model was last written: the commit under way
    count: int = 0


class S3Store(LocalStore):
    """Each trial's config and layout under ``s3://<bucket>/trialNNNN/`` on one moto server (this
    process, a thread), whose request hook notes each trial's first write to its checkpoint and,
    armed, signals a trainer at the k-th write of a commit."""

    name = "s3"

    def __init__(self) -> None:
        from pbgio.testing.s3server import S3Server

        self.server = S3Server(bucket=f"pbg-kill-{uuid.uuid4().hex[:8]}", hook=self._hook)
        self.server.start()  # its env() is now this process's, so the trainers' too
        self._lock = threading.Lock()
        self._first_write: dict[str, float] = {}
        self._armed: dict[str, _Armed] = {}
        self._fired: dict[str, tuple[float, str]] = {}

    def _fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)

    def root(self, work: Path) -> str:
        return self.server.url(work.name)

    def plant(self, template: Path, work: Path, root: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        fs = self._fs()
        for path in sorted(template.rglob("*")):
            if path.is_file():
                fs.put_file(str(path), f"{root}/{path.relative_to(template).as_posix()}".removeprefix("s3://"))

    def _key(self, root: str) -> str:
        return root.removeprefix("s3://").split("/", 1)[1]

    def _hook(self, request: Any) -> None:
        from pbgio.spec import naming

        if request.method not in ("PUT", "POST", "DELETE"):
            return None
        parts = request.path.lstrip("/").split("/")
        if len(parts) < 4 or parts[0] != self.server.bucket or parts[2] != "checkpoint":
            return None
        trial, name = parts[1], "/".join(parts[3:])
        if name == kh.LOCK_FILE or "lock" in name or "lease" in name:
            return None
        with self._lock:
            self._first_write.setdefault(trial, time.monotonic())
            armed = self._armed.get(trial)
            parsed = naming.parse_versioned_file(name)
            commit_write = name in (naming.CONFIG_JSON, naming.CHECKPOINT_VERSION) or name.startswith("epoch_") \
                or (request.method == "PUT" and parsed is not None and parsed[0] == "model") \
                or (request.method == "DELETE" and parsed is not None)
            if armed is not None and request.method == "PUT" and parsed is not None and parsed[0] == "model":
                armed.current = parsed[3]
            if armed is not None and commit_write and armed.current >= armed.version:
                armed.count += 1
                if armed.count == armed.at:
                    armed.proc.send_signal(armed.sig)
                    self._fired[trial] = (time.monotonic(), f"{request.method} {name}")
                    del self._armed[trial]
        return None  # the request goes on to the server: the store may take a write whose writer is gone

    def listing(self, root: str) -> set[str]:
        try:
            return {Path(e["name"]).name for e in self._fs().ls(f"{root}/checkpoint".removeprefix("s3://"),
                                                                   detail=True)}
        except OSError:
            return set()

    def read_version(self, root: str) -> int | None:
        try:
            text = self._fs().cat_file(f"{root}/checkpoint/checkpoint_version.txt".removeprefix("s3://")).decode()
        except FileNotFoundError:
            return 0
        except OSError:
            return None
        text = text.strip()
        return int(text) if text.isdigit() else 0 if not text else None

    def baseline(self, root: str) -> Any:
        with self._lock:
            self._first_write.pop(self._key(root), None)
        return None

    def wrote(self, root: str, baseline: Any) -> bool:
        return self._key(root) in self._first_write

    def first_write_at(self, root: str) -> float | None:
        return self._first_write.get(self._key(root))

    def arm(self, root: str, proc: subprocess.Popen[bytes], sig: int, at: int, version: int) -> None:
        with self._lock:
            self._armed[self._key(root)] = _Armed(proc, sig, at, version)

    def fired(self, root: str) -> tuple[float, str] | None:
        with self._lock:
            return self._fired.get(self._key(root))

    def disarm(self, root: str) -> None:
        with self._lock:
            self._armed.pop(self._key(root), None)
            self._fired.pop(self._key(root), None)

    def fetch(self, root: str, names: list[str], dest: Path) -> None:
        fs = self._fs()
        for name in names:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f"{root}/{name}".removeprefix("s3://"), str(dest / name))

    def remove(self, root: str) -> None:
        with contextlib.suppress(OSError):
            self._fs().rm(root.removeprefix("s3://"), recursive=True)

    def close(self) -> None:
        self.server.stop()


def final_files(root: str, version: int) -> list[str]:
    """The files (relative to ``root``) the original needs to load version ``version``: the config,
    the checkpoint's version file, model and embeddings, and the entity counts to check them by."""
    from pbgio.config import load_config
    from pbgio.spec import naming
    from pbgio.storage import resolve

    cfg = load_config(resolve(f"{root}/config.json"))
    names = ["config.json", f"checkpoint/{naming.CHECKPOINT_VERSION}", f"checkpoint/{naming.model_file(version)}"]
    for etype, entity in cfg.entities.items():
        for part in range(entity.num_partitions):
            names += [f"checkpoint/{naming.embeddings_file(etype, part, version)}",
                      f"entities/{naming.entity_count_file(etype, part)}"]
    return names


def original_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def load_with_original(venv: Path, finals: Path, trials: list[int]) -> dict[int, list[str]]:
    """Each kept final checkpoint loaded by one process of the original: problems per trial."""
    if not trials:
        return {}
    result = finals / "original-load.json"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    dirs = [str(finals / f"trial{t:04d}") for t in trials]
    done = subprocess.run([str(original_python(venv)), str(kh.ROOT / "tools" / "original_load.py"),
                           "--result", str(result), *dirs], capture_output=True, text=True, env=env, cwd="/",
                          timeout=600 + 10 * len(trials), check=False)
    if done.returncode != 0 or not result.is_file():
        why = f"the original's loader exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}"
        return {t: [why] for t in trials}
    loaded = json.loads(result.read_text(encoding="utf-8"))
    return {t: list(loaded.get(d, ["not loaded"])) for t, d in zip(trials, dirs, strict=True)}


def ensure_original_venv(venv: Path | None, workdir: Path) -> Path:
    """``venv`` (or ``$PBG_ORIGINAL_VENV``) if the original imports there; else one created under
    ``workdir`` as the interop suite creates it (``pip install -r tests/interop/original-requirements.txt``)."""
    chosen = venv or (Path(os.environ["PBG_ORIGINAL_VENV"]) if os.environ.get("PBG_ORIGINAL_VENV") else None)
    sys.path.insert(0, str(kh.ROOT))
    sys.path.insert(0, str(kh.ROOT / "tests" / "interop"))
    from interop_harness import create_original_venv, original_importable

    if chosen is not None and original_importable(chosen):
        return chosen
    target = chosen or workdir / "original-venv"
    print(f"creating the original's environment at {target} (pip install; minutes)", flush=True)
    create_original_venv(target)
    return target


def rank_0_finished_its_commit(victim: int, before: str, after: str) -> bool:
    """A rank 0 stopped in the middle of a commit and continued may finish that one commit: every
    trainer had written its partitions of that version and met rank 0 at the "written" barrier
    before rank 0 began it, so the version is complete (``kill_harness.check_state`` then validates it). Any
    other change of the committed version by a continued trainer is a failure.

    >>> rank_0_finished_its_commit(0, "v4", "v5"), rank_0_finished_its_commit(0, "v4", "v6")
    (True, False)
    >>> rank_0_finished_its_commit(1, "v4", "v5")
    False
    """
    return victim == 0 and before.startswith("v") and after == f"v{int(before[1:]) + 1}"


class DistHarness:
    def __init__(self, kills: int, stalls: int, seed: int, peer_timeout: float, workdir: Path,
                 store: LocalStore) -> None:
        self.summary = DistSummary(kills, stalls, seed, peer_timeout, storage=store.name)
        self.workdir, self.template = workdir, workdir / "template"
        self.finals = workdir / "finals"
        self.peer_timeout = peer_timeout
        self.store = store
        self.first_write: float | None = None

    def rerun(self, root: str, work: Path, logs: Path) -> list[str]:
        """Run the 3 trainers to the end; the problems found."""
        procs = start(f"{root}/config.json", work, self.peer_timeout, logs)
        ended = wait(procs, 60 + 20 * self.summary.reference_seconds)
        problems = [f"rank {r} still running after the rerun's time limit" for r in range(WORLD) if r not in ended]
        problems += [f"rank {r} of the rerun exited {p.returncode} (see {logs})" for r, p in enumerate(procs)
                     if r in ended and p.returncode != 0]
        return problems

    def prepare(self) -> None:
        setup(self.template)
        reference = self.workdir / "reference"
        root = self.store.root(reference)
        self.store.plant(self.template, reference, root)
        baseline = self.store.baseline(root)
        started = time.monotonic()
        procs = start(f"{root}/config.json", reference, self.peer_timeout, reference / "logs")
        while any(p.poll() is None for p in procs):
            if self.first_write is None and self.store.wrote(root, baseline):
                self.first_write = time.monotonic() - started
            time.sleep(0.02)
        self.summary.reference_seconds = time.monotonic() - started
        if any(p.returncode != 0 for p in procs):
            raise SystemExit(f"the uninterrupted distributed run failed; see {reference / 'logs'}")
        self.store.remove(root)
        shutil.rmtree(reference, ignore_errors=True)

    def plan(self, rng: random.Random) -> tuple[str, float]:
        """``("commit", v)`` (during the commit of version v or, missed, a later one), ``("start", s)``
        or ``("write", s)``: when to hit."""
        draw = rng.random()
        if draw < 0.25 or self.first_write is None:
            return "start", rng.uniform(0.0, self.summary.reference_seconds)
        if draw < 0.5:
            return "commit", float(rng.randint(1, ITERATIONS))
        return "write", rng.uniform(0.0, self.summary.reference_seconds - self.first_write)

    def _state_now(self, root: str, baseline: Any) -> tuple[str, str]:
        """``(phase, evidence)`` of a hit now: startup (nothing written to the checkpoint yet), else from the
        checkpoint directory's files and committed version."""
        if not self.store.wrote(root, baseline):
            return "startup", ""
        names, committed = self.store.listing(root), self.store.read_version(root)
        return phase_of(names, committed), commit_evidence(names, committed) or ""

    def trial(self, index: int, mode: str) -> None:
        rng = random.Random(f"{self.summary.seed}-{index}")  # a string seed is hashed: ranks vary by trial
        work = self.workdir / f"trial{index:04d}"
        root = self.store.root(work)
        self.store.plant(self.template, work, root)
        victim = rng.randrange(WORLD)
        aim, delay = self.plan(rng)
        nth = rng.randint(1, 3)  # s3, commit aim: the nth of the commit writes (model, config, version, ...)
        sig = signal.SIGSTOP if mode == "stall" else signal.SIGKILL
        baseline = self.store.baseline(root)
        procs = start(f"{root}/config.json", work, self.peer_timeout, work / "logs")
        started = time.monotonic()
        remote_commit = aim == "commit" and isinstance(self.store, S3Store)
        if remote_commit:
            self.store.arm(root, procs[victim], sig, nth, int(delay))
        deadline = started + delay if aim == "start" else None
        limit = started + 60 + 20 * self.summary.reference_seconds
        phase, evidence = "", ""
        fired: tuple[float, str] | None = None
        while procs[victim].poll() is None and time.monotonic() < limit:
            now = time.monotonic()
            if remote_commit:
                fired = self.store.fired(root)
                if fired is not None:
                    break
            elif aim == "commit":
                names, committed = self.store.listing(root), self.store.read_version(root)
                if committing_at_least(names, committed, int(delay)):
                    phase, evidence = "commit", commit_evidence(names, committed) or ""
                    break
            else:
                if deadline is None and aim == "write" and self.store.wrote(root, baseline):
                    deadline = now + delay
                if deadline is not None and now >= deadline:
                    break
            time.sleep(0.001 if aim == "commit" else 0.01)
        if remote_commit:
            fired = fired or self.store.fired(root)  # fired as the loop ended
            self.store.disarm(root)
        if fired is None and procs[victim].poll() is not None:  # the run ended first: a rerun, not a hit
            wait(procs, 60)
            self.summary.finished_before_hit += 1
            self.store.remove(root)
            shutil.rmtree(work, ignore_errors=True)
            return
        if fired is not None:  # signalled by the server as the request of a commit came in
            hit_at, request = fired
            phase = "commit"
        else:
            if not phase:
                phase, evidence = self._state_now(root, baseline)  # the directory just before the signal
            hit_at, request = time.monotonic(), evidence
            procs[victim].send_signal(sig)
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
        state, found = kh.check_state(root)
        problems += [f"after the {mode}: {p}" for p in found]
        if mode == "stall":
            procs[victim].send_signal(signal.SIGCONT)
            if not wait([procs[victim]], self.peer_timeout + 40):
                problems.append("the stalled trainer did not stop after SIGCONT")
            log = (work / "logs" / f"rank{victim}.log").read_text(encoding="utf-8", errors="replace")
            if TRACEBACK in log:
                problems.append(f"the stalled rank {victim} printed a traceback after SIGCONT")
            after, found = kh.check_state(root)
            problems += [f"after the stalled trainer went on: {p}" for p in found]
            if after != state and not (phase == "commit" and rank_0_finished_its_commit(victim, state, after)):
                problems.append(f"the stalled trainer changed the committed version: {state} -> {after}")
            elif after != state:
                request = (request + "; " if request else "") + f"continued, rank 0 finished that commit: {after}"
        else:
            procs[victim].wait()
        if not problems:
            problems += self.rerun(root, work, work / "logs-rerun")
        if not problems:
            final, found = kh.check_state(root)
            problems += [f"after the rerun: {p}" for p in found]
            if final != f"v{ITERATIONS}":
                problems.append(f"the rerun ended at {final}, expected v{ITERATIONS}")
            else:
                try:  # kept for the original to load at the end of the campaign
                    self.store.fetch(root, final_files(root, ITERATIONS), self.finals / work.name)
                    self.summary.kept.append(index)
                except Exception as exc:
                    problems.append(f"copying the final checkpoint out failed: {type(exc).__name__}: {exc}")
        seconds = round(time.monotonic() - started, 1)
        hit = Hit(index, victim, mode, round(hit_at - started, 3), phase, state,
                  round(max(stopped), 2) if stopped else None, problems, request, seconds)
        self.summary.hits.append(hit)
        print(f"trial {index}: {mode} of rank {victim} at {hit.delay} s ({phase}{', ' + request if request else ''}, "
              f"{state}), survivors stopped after {hit.stopped_after} s, {seconds} s in all, "
              f"{'FAILED: ' + '; '.join(problems) if problems else 'ok'}", flush=True)
        if problems:
            self.summary.failures.append({"trial": index, "mode": mode, "rank": victim, "delay": hit.delay,
                                          "directory": str(work), "root": root, "problems": problems})
        else:
            self.store.remove(root)
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

    def load_finals(self, venv: Path) -> None:
        """The original loads every kept final checkpoint (one process); a failure per trial it cannot load."""
        problems = load_with_original(venv, self.finals, self.summary.kept)
        self.summary.original_checked = len(problems)
        self.summary.original_loaded = sum(not p for p in problems.values())
        for trial, found in problems.items():
            if found:
                self.summary.failures.append({"trial": trial, "mode": "-", "rank": "-", "delay": "-",
                                              "directory": str(self.finals / f"trial{trial:04d}"),
                                              "problems": [f"the original cannot load the final checkpoint: {p}"
                                                           for p in found]})

    def run(self, original_venv: Path | None = None) -> DistSummary:
        started = time.monotonic()
        self.prepare()
        modes = ["kill"] * self.summary.kills + ["stall"] * self.summary.stalls
        index = 0
        for mode in modes:
            done = len(self.summary.hits)
            while len(self.summary.hits) == done:  # a run that finished before its hit is tried again
                index += 1
                self.trial(index, mode)
        if original_venv is not None:
            self.load_finals(original_venv)
        self.summary.seconds = time.monotonic() - started
        self.summary.workdir = str(self.workdir)
        return self.summary


def run_distributed(kills: int, stalls: int, *, seed: int = 0, peer_timeout: float = 5.0,
                    workdir: Path | None = None, storage: str = "local",
                    original_venv: Path | None = None) -> DistSummary:
    """The campaign in ``workdir`` (default: a temporary directory, removed unless a trial failed),
    the layouts on local disk or (``storage="s3"``) on a moto S3 server started for it; with
    ``original_venv``, the original loads every final checkpoint at the end."""
    work = workdir or Path(tempfile.mkdtemp(prefix="pbg-kill-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    store = S3Store() if storage == "s3" else LocalStore()
    try:
        summary = DistHarness(kills, stalls, seed, peer_timeout, work, store).run(original_venv)
    finally:
        store.close()
    if workdir is None and not summary.failures:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def write_json(summary: DistSummary, path: Path) -> None:
    from dataclasses import asdict

    path.write_text(json.dumps({"figures": summary.figures(), "hits": [asdict(h) for h in summary.hits],
                                "failures": summary.failures}, indent=1), encoding="utf-8")
