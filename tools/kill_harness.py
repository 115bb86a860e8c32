#!/usr/bin/env python
"""Kill ``pbgtrain fit``, ``pbgio import`` (also ``--append``) or ``pbgio convert`` with SIGKILL at random moments.

Usage::

    python tools/kill_harness.py --target fit --kills 200 [--seed S] [--jobs 2] [--json OUT]
    python tools/kill_harness.py --target import --kills 50
    python tools/kill_harness.py --target append --kills 50
    python tools/kill_harness.py --target convert --kills 50
    python tools/kill_harness.py --target command --command 'python my_writer.py {dst}' --kills 5
    python tools/kill_harness.py --target distributed --kills 30 --stalls 5 [--peer-timeout 5]
        [--storage s3] [--original-venv VENV]

What it does (see docs/guides/crash-safety.md):

1. Builds a small input once (fit: the bundled example, 2 ``user`` partitions, 3 epochs × 3
   edge chunks = 9 commits; import: edge lists for 4+1 partitions and two edge paths; append:
   new edge lists, half of their entities new, appended to that import's layout; convert: a
   legacy layout of 9 buckets) and runs the command uninterrupted twice, each time on a fresh
   copy: both runs must leave identical files (the reference), and their durations give ``T``.
2. Trials, ``--jobs`` at a time: a fresh copy, then up to ``--chain`` runs of the same command in
   the same directory, each SIGKILLed after a random delay (one in four uniform in ``[0, T]``,
   three in four uniform over what follows the process's first write, so that kills land in
   training and in commits rather than in torch's import). After every kill the state is checked: for fit the
   committed version (``checkpoint_version.txt``) has all its files, they load, and
   ``pbgio validate`` passes; for import and convert the output is either not visible as complete
   (``pbgio validate`` rejects it, or DST does not exist) or it is complete, valid and identical
   to the reference; for append the layout is the old one byte for byte, or does not validate,
   or is valid and identical to the reference. Then the command is run once more to the end, and every file under the
   output is compared with the reference: byte for byte, except ``training_stats.json`` (wall
   clock times and each fit's closing line, how it ended, are left out, and an interrupted
   iteration's lines repeated when it is trained again: compared as its last line per record),
   HDF5 files are compared by bytes and, where bytes differ, by
   content (datasets and attributes; counted separately). Leftover files (temp files, staging
   directories) are differences too.
3. Prints a summary: kills, where they landed (startup: nothing written yet; training; commit:
   the kill found a commit in progress), versions seen after kills, failures with the kill delay
   and the directory kept for inspection. ``--json`` writes it as JSON. Exit status 1 on any
   failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
"""The checkout whose pbgio and pbgtrain the killed commands run (the harness's own)."""
PBGIO = [sys.executable, "-m", "pbgio"]
PBGTRAIN = [sys.executable, "-m", "pbgtrain"]
FIT_ITERATIONS = 9  # num_epochs × num_edge_chunks
FIT_PARAMS = ["-p", "num_epochs=3", "-p", "num_edge_chunks=3", "-p", "workers=1", "-p", "eval_fraction=0.05"]
LOCK_FILE = ".pbg-lock"  # pbgio.spec.naming.CHECKPOINT_LOCK: left by a killed fit, removed by the next one
STATS_FILE = "training_stats.json"
STATS_TIME_KEYS = ("trained_from", "trained_until")


# --------------------------------------------------------------------------- results


@dataclass
class KillRecord:
    """One SIGKILL and what the harness found after it."""

    trial: int
    delay: float
    phase: str  # startup | training | commit (fit); startup | staging | commit | done (import, convert)
    state: str  # fit: "v<committed>"; import/convert: "absent", "incomplete" or "complete"
    problems: list[str] = field(default_factory=list)


@dataclass
class Summary:
    target: str
    kills_requested: int
    seed: int
    reference_seconds: float
    first_write_seconds: float | None
    deterministic: bool | None  # None: not checked (a single reference run)
    trials: int = 0
    kills: list[KillRecord] = field(default_factory=list)
    completed_before_kill: int = 0  # runs that ended before their kill delay (no kill; they count as resumes)
    h5_equal_by_content: int = 0  # HDF5 files whose bytes differ from the reference but content does not
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    workdir: str = ""

    def figures(self) -> dict[str, Any]:
        return {
            "target": self.target, "kills": len(self.kills), "trials": self.trials,
            "phases": dict(Counter(k.phase for k in self.kills)),
            "states": dict(sorted(Counter(k.state for k in self.kills).items())),
            "before_first_commit": sum(k.state in ("v0", "absent") for k in self.kills),
            "completed_before_kill": self.completed_before_kill,
            "h5_equal_by_content": self.h5_equal_by_content,
            "failures": len(self.failures), "reference_seconds": round(self.reference_seconds, 2),
            "first_write_seconds": None if self.first_write_seconds is None else round(self.first_write_seconds, 2),
            "deterministic": self.deterministic, "seconds": round(self.seconds, 1),
        }

    def text(self) -> str:
        f = self.figures()
        lines = [
            f"target {self.target}: {f['kills']} kills in {f['trials']} trials, {f['seconds']} s "
            f"(uninterrupted run {f['reference_seconds']} s, first write at {f['first_write_seconds']} s; "
            f"two uninterrupted runs identical: {f['deterministic']})",
            f"  where they landed: {f['phases']}",
            f"  state after the kill: {f['states']} ({f['before_first_commit']} before the first commit)",
            f"  runs that finished before their kill: {f['completed_before_kill']}; "
            f"HDF5 files equal by content but not bytes: {f['h5_equal_by_content']}",
            f"  failures: {f['failures']}" + (f" (trials kept under {self.workdir})" if self.failures else ""),
        ]
        for failure in self.failures[:20]:
            lines.append(f"    - trial {failure['trial']} (kill delays {failure['delays']}, kept in "
                         f"{failure['directory']}): {'; '.join(failure['problems'][:5])}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- comparing trees


def tree(root: Path) -> dict[str, Path]:
    """Every file and directory under ``root`` (hidden ones included), by relative path; dirs end in /."""
    out: dict[str, Path] = {}
    for top, dirs, files in os.walk(root):  # errors ignored: a running process may remove what is listed
        base = Path(top)
        for name in dirs:
            out[(base / name).relative_to(root).as_posix() + "/"] = base / name
        for name in files:
            out[(base / name).relative_to(root).as_posix()] = base / name
    return dict(sorted(out.items()))


def h5_content(path: Path) -> Any:
    """Datasets and attributes of an HDF5 file, as comparable Python values."""
    import h5py

    def attrs(obj: Any) -> dict[str, bytes]:
        return {k: np.asarray(v).tobytes() + str(np.asarray(v).dtype).encode() for k, v in obj.attrs.items()}

    items: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        items["/"] = attrs(f)

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                data = obj[()]
                items[name] = (str(obj.dtype), obj.shape, np.asarray(data).tobytes(), attrs(obj))
            else:
                items[name] = attrs(obj)

        f.visititems(visit)
    return items



def normalized_stats(path: Path) -> list[dict[str, Any]]:
    """``training_stats.json`` without wall-clock times and the runs' closing lines
    (:mod:`pbgtrain.run_log`), the last line of each record kept (an iteration trained again after
    a kill appends its lines again), in first-seen order."""
    records: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        extra = record.get("pbgtrain")
        if isinstance(extra, dict) and "run" in extra:  # how each fit ended: a killed one's resumes differ by nature
            continue
        if isinstance(extra, dict):
            for key in STATS_TIME_KEYS:
                extra.pop(key, None)
        key = json.dumps([record.get(k) for k in ("epoch_idx", "edge_path_idx", "edge_chunk_idx", "index")]
                         + ["eval_stats_chunk_avg" in record])
        records.pop(key, None)
        records[key] = record
    return list(records.values())


@dataclass
class Comparison:
    problems: list[str] = field(default_factory=list)
    h5_by_content: int = 0


def compare_trees(reference: Path, actual: Path, ignore: Callable[[str], bool] = lambda _: False) -> Comparison:
    """Differences of ``actual`` from ``reference`` (missing, extra, differing files)."""
    result = Comparison()
    ref, got = tree(reference), tree(actual)
    for rel in sorted(set(ref) | set(got)):
        if ignore(rel):
            continue
        if rel not in got:
            result.problems.append(f"missing {rel}")
        elif rel not in ref:
            result.problems.append(f"extra {rel}")
        elif rel.endswith("/"):
            continue
        elif Path(rel).name == STATS_FILE:
            if normalized_stats(ref[rel]) != normalized_stats(got[rel]):
                result.problems.append(f"differs {rel} (normalized)")
        elif ref[rel].read_bytes() != got[rel].read_bytes():
            if rel.endswith(".h5") and _h5_equal(ref[rel], got[rel]):
                result.h5_by_content += 1
            else:
                result.problems.append(f"differs {rel}")
    return result


def _h5_equal(a: Path, b: Path) -> bool:
    try:
        return bool(h5_content(a) == h5_content(b))
    except OSError:
        return False


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under ``root``: what a process changed."""
    out = {}
    for rel, path in tree(root).items():
        with contextlib.suppress(OSError):
            st = path.lstat()
            out[rel] = (st.st_mtime_ns, st.st_size)
    return out


# --------------------------------------------------------------------------- targets


class Target:
    """A command to kill: how to build its input, run it, and judge a directory after a kill."""

    name = ""

    def setup(self, template: Path) -> None:
        """Build the input in ``template`` (copied for every run)."""
        raise NotImplementedError

    def command(self, work: Path) -> list[str]:
        raise NotImplementedError

    def output(self, work: Path) -> Path:
        """The directory whose files are compared with the reference."""
        return work

    def watched(self, work: Path) -> Path:
        """The directory whose changes tell that the process wrote something."""
        return work

    def ignore(self, rel: str) -> bool:
        """Paths (relative to :meth:`output`) never compared."""
        return False

    def leftover(self, rel: str) -> bool:
        """Paths a kill may leave beside a complete output, removed by the next run (not compared
        when a kill left the output complete and no run followed)."""
        return False

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        """``(state, problems, complete)`` of ``work`` just after a kill."""
        raise NotImplementedError

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        raise NotImplementedError


def check_state(root: str) -> tuple[str, list[str]]:
    """``(v<committed>, problems)`` of the layout at ``root`` (a directory or an ``s3://`` URL): the
    fit target's checks (every file of the committed version loads, ``pbgio validate`` passes)."""
    from pbgio.checkpoint import CheckpointDir
    from pbgio.config import load_config
    from pbgio.storage import resolve
    from pbgio.validate import validate_path

    problems: list[str] = []
    config = f"{root}/config.json"
    cfg = load_config(resolve(config))
    ckpt = CheckpointDir(resolve(f"{root}/checkpoint"))
    try:
        version = ckpt.read_version()
    except Exception as exc:  # a torn version file is exactly what must never happen
        return "unreadable", [f"checkpoint_version.txt: {exc}"]
    if version > 0:
        for etype, entity in cfg.entities.items():
            for part in range(entity.num_partitions):
                try:
                    ckpt.read_embeddings(etype, part, version)
                except Exception as exc:
                    problems.append(f"v{version} embeddings {etype}/{part}: {type(exc).__name__}: {exc}")
        try:
            ckpt.read_model(version)
        except Exception as exc:
            problems.append(f"v{version} model: {type(exc).__name__}: {exc}")
    try:
        report = validate_path(config)
        problems += [f"validate: {issue}" for issue in report.errors]
    except Exception as exc:
        problems.append(f"validate raised {type(exc).__name__}: {exc}")
    return f"v{version}", problems


class FitTarget(Target):
    """``pbgtrain fit`` on the bundled example: 9 iterations, so 9 commits, per run."""

    name = "fit"

    def setup(self, template: Path) -> None:
        from pbgio.example import build_example

        build_example(template, num_edges=3000)

    def command(self, work: Path) -> list[str]:
        return [*PBGTRAIN, "fit", str(work / "config.json"), *FIT_PARAMS, "--seed", "5"]

    def output(self, work: Path) -> Path:
        return work / "checkpoint"

    def watched(self, work: Path) -> Path:
        return work / "checkpoint"

    def ignore(self, rel: str) -> bool:
        return rel == LOCK_FILE

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        state, problems = check_state(str(work))
        return state, problems, False

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        from pbgio.checkpoint import CheckpointDir
        from pbgio.spec import naming

        after = fingerprint(work / "checkpoint")
        changed = {rel for rel, sig in after.items() if before.get(rel) != sig and rel != LOCK_FILE}
        changed |= {rel for rel in before if rel not in after}
        if not changed:
            return "startup"
        ckpt = CheckpointDir(work / "checkpoint")
        try:
            committed = ckpt.read_version()
        except Exception:
            return "commit"
        names = {p.name for p in ckpt.path.iterdir()}
        pending = naming.model_file(committed + 1)
        commit_temps = {f".{pending}.tmp", pending, f".{naming.CHECKPOINT_VERSION}.tmp", f".{naming.CONFIG_JSON}.tmp"}
        superseded = [v for v in ckpt.versions_on_disk() if 0 < v < committed]
        if names & commit_temps or superseded:
            return "commit"
        return "finishing" if committed == FIT_ITERATIONS else "training"


def write_edge_lists(folder: Path, files: dict[str, int], *, seed: int, users: tuple[int, int],
                     items: tuple[int, int]) -> None:
    """Seeded random TSV edge lists, ``n`` edges per file: ``u<a> follows u<b>`` and ``u<a> likes i<b>``,
    ``a`` drawn from the ``users`` range and ``b`` from the ``items`` range (half-open)."""
    rng = np.random.default_rng(seed)
    for name, n in files.items():
        rel = rng.integers(0, 2, n)
        lhs = rng.integers(*users, n)
        rhs = rng.integers(*items, n)
        lines = [f"u{a}\t{'follows' if r == 0 else 'likes'}\t{'u' if r == 0 else 'i'}{b}"
                 for a, r, b in zip(lhs.tolist(), rel.tolist(), rhs.tolist(), strict=True)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")

def layout_invalid(work: Path) -> tuple[str, list[str], bool] | None:
    """The ``check`` result for a layout (``work/config.json``) that does not validate; None if it does."""
    from pbgio.validate import validate_path

    try:
        report = validate_path(work / "config.json")
    except Exception as exc:
        return "incomplete", [f"validate raised {type(exc).__name__}: {exc}"], False
    return None if report.ok else ("incomplete", [], False)


class ImportTarget(Target):
    """``pbgio import`` of two edge lists (train, test) into 4 ``user`` + 1 ``item`` partitions."""

    name = "import"

    def __init__(self, edges: int = 150_000) -> None:
        self.edges = edges

    def setup(self, template: Path) -> None:
        template.mkdir(parents=True, exist_ok=True)
        config = {
            "entities": {"user": {"num_partitions": 4}, "item": {"num_partitions": 1}},
            "relations": [{"name": "follows", "lhs": "user", "rhs": "user"},
                          {"name": "likes", "lhs": "user", "rhs": "item"}],
            "dimension": 8, "entity_path": "data/entities", "edge_paths": ["data/train", "data/test"],
            "checkpoint_path": "model",
        }
        (template / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        write_edge_lists(template, {"train.tsv": self.edges, "test.tsv": self.edges // 10}, seed=11,
                         users=(0, 20_000), items=(0, 5_000))

    def command(self, work: Path) -> list[str]:
        return [*PBGIO, "import", str(work / "config.json"), str(work / "train.tsv"), str(work / "test.tsv"),
                "--no-progress"]

    def watched(self, work: Path) -> Path:
        return work / "data"

    def leftover(self, rel: str) -> bool:
        return ".pbgio-import-" in rel

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        if not (work / "data").exists():
            return "absent", [], False
        if (invalid := layout_invalid(work)) is not None:
            return invalid
        diff = compare_trees(reference, work, lambda rel: self.ignore(rel) or self.leftover(rel))
        return "complete", [f"validates but {p}" for p in diff.problems], True

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        files = tree(work / "data")
        if not files:
            return "startup"
        layout = [rel for rel in files if not rel.endswith("/") and "/.pbgio-import-" not in f"/{rel}"]
        if not layout:
            return "staging"
        counts = [rel for rel in layout if Path(rel).name.startswith("entity_count_")]
        return "done" if len(counts) == 5 and not any(".pbgio-import-" in rel for rel in files) else "commit"


class AppendTarget(ImportTarget):
    """``pbgio import --append`` of new edges (half of their users and items new) to the layout the
    import target writes. After a kill the layout is the old one, byte for byte; or the appended
    one, identical to the reference; or, killed while moving files, it does not validate, and the
    next append puts the old one back before appending."""

    name = "append"

    def setup(self, template: Path) -> None:
        super().setup(template)
        done = subprocess.run(super().command(template), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the import before the appends failed: {done.stderr}")
        write_edge_lists(template, {"new_train.tsv": self.edges // 2, "new_test.tsv": self.edges // 20}, seed=12,
                         users=(10_000, 30_000), items=(2_500, 7_500))

    def command(self, work: Path) -> list[str]:
        return [*PBGIO, "import", "--append", str(work / "config.json"), str(work / "new_train.tsv"),
                str(work / "new_test.tsv"), "--no-progress"]

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        if (invalid := layout_invalid(work)) is not None:
            return invalid
        old = compare_trees(reference.parent / "template" / "data", work / "data", self.leftover)
        if not old.problems:
            return "old", [], False
        diff = compare_trees(reference, work, lambda rel: self.ignore(rel) or self.leftover(rel))
        return "complete", [f"validates but is neither the old layout nor the appended one: {p}"
                            for p in diff.problems], True

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        after = fingerprint(work / "data")
        changed = {rel for rel, sig in after.items() if before.get(rel) != sig} | set(before) - set(after)
        changed = {rel for rel in changed if not rel.endswith("/")}  # files only: staging makes directories change
        if not changed:
            return "startup"
        if all(".pbgio-import-" in rel for rel in changed):
            return "staging"
        return "commit" if any(".pbgio-import-" in rel for rel in after) else "done"


class ConvertTarget(Target):
    """``pbgio convert --from legacy SRC DST`` of a legacy layout of 3×3 buckets."""

    name = "convert"

    def __init__(self, edges_per_bucket: int = 60_000) -> None:
        self.edges_per_bucket = edges_per_bucket

    def setup(self, template: Path) -> None:
        from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

        write_legacy_layout(template / "legacy", LegacySpec(seed=7, num_partitions=3, num_users=300,
                                                            edges_per_bucket=self.edges_per_bucket))

    def command(self, work: Path) -> list[str]:
        return [*PBGIO, "convert", "--from", "legacy", str(work / "legacy"), str(work / "out"), "--no-progress"]

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        return destination_check(work / "out", reference / "out", validate=True)

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        return destination_phase(work, "out")


class CommandTarget(Target):
    """Any command writing one directory ``{dst}`` (with ``{work}`` its parent): DST must appear
    only complete. For testing the harness itself."""

    name = "command"

    def __init__(self, template_command: str) -> None:
        self.template_command = template_command

    def setup(self, template: Path) -> None:
        template.mkdir(parents=True, exist_ok=True)

    def command(self, work: Path) -> list[str]:
        return [part.format(dst=work / "out", work=work) for part in shlex.split(self.template_command)]

    def check(self, work: Path, reference: Path) -> tuple[str, list[str], bool]:
        return destination_check(work / "out", reference / "out", validate=False)

    def phase(self, work: Path, before: dict[str, tuple[int, int]]) -> str:
        return destination_phase(work, "out")


def destination_check(dst: Path, reference: Path, *, validate: bool) -> tuple[str, list[str], bool]:
    """DST either absent, or complete: valid and identical to the reference."""
    if not dst.exists():
        return "absent", [], False
    problems = []
    if validate:
        from pbgio.validate import validate_path

        try:
            report = validate_path(dst)
            problems += [f"DST exists but does not validate: {issue}" for issue in report.errors]
        except Exception as exc:
            problems.append(f"DST exists but validate raised {type(exc).__name__}: {exc}")
    problems += [f"DST exists but {p}" for p in compare_trees(reference, dst).problems]
    return "complete", problems, True


def destination_phase(work: Path, name: str) -> str:
    if (work / name).exists():
        return "done"
    staged = [p for p in work.iterdir() if p.name.startswith(f".{name}")]
    return "staging" if staged else "startup"


TARGETS: dict[str, Callable[[argparse.Namespace], Target]] = {
    "fit": lambda _: FitTarget(),
    "import": lambda _: ImportTarget(),
    "append": lambda _: AppendTarget(),
    "convert": lambda _: ConvertTarget(),
    "command": lambda args: CommandTarget(args.command),
}


# --------------------------------------------------------------------------- running


@dataclass
class Run:
    seconds: float  # until it ended, or until the kill
    returncode: int | None  # None: killed
    first_write: float | None = None  # seconds until it first changed the watched directory


@dataclass(frozen=True)
class KillPlan:
    """When to kill: ``delay`` seconds after the start or, with ``after_write``, that many seconds
    after the process first writes (stretched by how much slower than the reference it got there)."""

    delay: float
    after_write: bool = False
    reference_first_write: float | None = None


def run_command(target: Target, work: Path, plan: KillPlan | None = None, log: Path | None = None) -> Run:
    """Run the target's command in ``work``; SIGKILL it as ``plan`` says (if still running)."""
    watched = target.watched(work)
    before = fingerprint(watched)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        started = time.perf_counter()
        proc = subprocess.Popen(target.command(work), stdout=out, stderr=out, env=env, cwd=work)
        first_write = None
        deadline = None if plan is None or plan.after_write else started + plan.delay
        while True:
            now = time.perf_counter()
            if proc.poll() is not None:
                return Run(now - started, proc.returncode, first_write)
            if deadline is not None and now >= deadline:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return Run(now - started, None, first_write)
            if first_write is None and _changed(before, fingerprint(watched)):
                first_write = now - started
                if plan is not None and plan.after_write:
                    stretch = first_write / plan.reference_first_write if plan.reference_first_write else 1.0
                    deadline = now + plan.delay * max(stretch, 1.0)
            wait = 0.005 if deadline is None else min(0.005, max(deadline - now, 0.0))
            time.sleep(wait)
    finally:
        if log is not None and not isinstance(out, int):
            out.close()


def _changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> bool:
    return any(before.get(rel) != sig for rel, sig in after.items() if rel != LOCK_FILE) or \
        any(rel not in after for rel in before if rel != LOCK_FILE)


class Harness:
    def __init__(self, target: Target, kills: int, seed: int, jobs: int, chain: int, workdir: Path,
                 twice: bool = True) -> None:
        self.target, self.kills_requested, self.seed, self.jobs, self.chain = target, kills, seed, jobs, chain
        self.twice = twice
        self.workdir = workdir
        self.template = workdir / "template"
        self.reference = workdir / "reference"
        self._lock = threading.Lock()
        self._claimed = 0
        self._trial = 0

    def prepare(self) -> Summary:
        self.target.setup(self.template)
        runs = []
        for name in ("reference", "reference2") if self.twice else ("reference",):
            shutil.copytree(self.template, self.workdir / name, symlinks=True)
            run = run_command(self.target, self.workdir / name, log=self.workdir / f"{name}.log")
            if run.returncode != 0:
                raise SystemExit(f"the uninterrupted {self.target.name} run failed (exit {run.returncode}); "
                                 f"see {self.workdir / name}.log")
            runs.append(run)
        same = compare_trees(self.target.output(self.reference), self.target.output(self.workdir / "reference2"),
                             self.target.ignore) if self.twice else Comparison()
        summary = Summary(self.target.name, self.kills_requested, self.seed, max(r.seconds for r in runs),
                          runs[0].first_write, deterministic=not same.problems if self.twice else None)
        if same.problems:
            summary.failures.append({"trial": -1, "delays": [], "directory": str(self.workdir),
                                     "problems": ["two uninterrupted runs differ: " + p for p in same.problems]})
        return summary

    def kill_plan(self, rng: random.Random, summary: Summary) -> KillPlan:
        """One in four: uniform over the reference run; else uniform over what follows its first write."""
        total = summary.reference_seconds
        first = summary.first_write_seconds
        if first is not None and rng.random() < 0.75:
            return KillPlan(rng.uniform(0.0, total - first), after_write=True, reference_first_write=first)
        return KillPlan(rng.uniform(0.0, total))

    def claim(self) -> tuple[int, int] | None:
        with self._lock:
            left = self.kills_requested - self._claimed
            if left <= 0:
                return None
            quota = min(self.chain, left)
            self._claimed += quota
            self._trial += 1
            return self._trial, quota

    def unclaim(self, n: int) -> None:
        with self._lock:
            self._claimed -= n

    def worker(self, summary: Summary) -> None:
        while (claimed := self.claim()) is not None:
            trial, quota = claimed
            done = self.trial(trial, quota, summary)
            if done < quota:
                self.unclaim(quota - done)

    def trial(self, index: int, quota: int, summary: Summary) -> int:
        """Fresh copy, up to ``quota`` kills, a resume, a comparison; returns the kills done."""
        rng = random.Random(self.seed * 1_000_003 + index)
        work = self.workdir / f"trial{index:04d}"
        shutil.copytree(self.template, work, symlinks=True)
        log = work.parent / f"trial{index:04d}.log"
        delays: list[float] = []
        problems: list[str] = []
        kills: list[KillRecord] = []
        complete = False  # a kill left the output complete: no run follows
        finished_early = 0
        while len(kills) < quota and not complete:
            plan = self.kill_plan(rng, summary)
            before = fingerprint(self.target.watched(work))
            run = run_command(self.target, work, plan, log=log)
            delay = run.seconds
            if run.returncode is not None:  # finished before the kill
                finished_early += 1
                if run.returncode != 0:
                    problems.append(f"a run after {delays} exited {run.returncode} (see {log})")
                complete = True
                break
            delays.append(round(delay, 3))
            wrote = _changed(before, fingerprint(self.target.watched(work)))
            phase = self.target.phase(work, before) if wrote else "startup"
            state, found, complete = self.target.check(work, self.reference)
            kills.append(KillRecord(index, round(delay, 3), phase, state, found))
            problems += [f"after kill at {delay:.3f} s ({phase}, {state}): {p}" for p in found]
        if not complete and not problems:
            resumed = run_command(self.target, work, log=log)
            if resumed.returncode != 0:
                problems.append(f"the resume after kills at {delays} exited {resumed.returncode} (see {log})")
        if not problems:
            ignore = self.target.ignore
            if complete and not finished_early:
                def ignore(rel: str) -> bool:
                    return self.target.ignore(rel) or self.target.leftover(rel)
            diff = compare_trees(self.target.output(self.reference), self.target.output(work), ignore)
            problems += [f"after resume: {p}" for p in diff.problems]
        else:
            diff = Comparison()
        with self._lock:
            summary.trials += 1
            summary.kills += kills
            summary.completed_before_kill += finished_early
            summary.h5_equal_by_content += diff.h5_by_content
            if problems:
                summary.failures.append({"trial": index, "delays": delays, "directory": str(work),
                                         "problems": problems})
        if not problems:
            shutil.rmtree(work, ignore_errors=True)
            log.unlink(missing_ok=True)
        return len(kills)

    def run(self) -> Summary:
        started = time.perf_counter()
        import pbgio.checkpoint
        import pbgio.validate  # noqa: F401  (imported once here, not by the workers at the same time)
        summary = self.prepare()
        if not summary.failures:
            with ThreadPoolExecutor(self.jobs) as pool:
                for future in [pool.submit(self.worker, summary) for _ in range(self.jobs)]:
                    future.result()
        summary.kills.sort(key=lambda k: k.trial)  # stable: each trial's kills in the order they happened
        summary.failures.sort(key=lambda f: f["trial"])
        summary.seconds = time.perf_counter() - started
        return summary


def run_harness(target: Target, kills: int, *, seed: int = 0, jobs: int = 1, chain: int = 3,
                workdir: Path | None = None, twice: bool = True) -> Summary:
    """Run the harness in ``workdir`` (default: a temporary directory, removed unless a trial
    failed; failed trials are always kept). ``twice``: first run the command uninterrupted twice
    and require identical files."""
    work = workdir or Path(tempfile.mkdtemp(prefix="pbg-kill-"))
    work.mkdir(parents=True, exist_ok=True)
    summary = Harness(target, kills, seed, jobs, chain, work, twice).run()
    summary.workdir = str(work)
    if workdir is None and not summary.failures:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", choices=[*sorted(TARGETS), "distributed"], required=True)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--chain", type=int, default=3, help="kills in one directory before its resume")
    parser.add_argument("--workdir", type=Path, help="where copies go (default: a new temporary directory)")
    parser.add_argument("--command", help="for --target command: the command, with {dst} and {work}")
    parser.add_argument("--json", type=Path, help="write the summary as JSON here")
    parser.add_argument("--stalls", type=int, default=0,
                        help="for --target distributed: trainers to SIGSTOP (then SIGCONT) after the kills")
    parser.add_argument("--peer-timeout", type=float, default=5.0, help="for --target distributed: the trainers' "
                        "--peer-timeout")
    parser.add_argument("--storage", choices=["local", "s3"], default="local",
                        help="for --target distributed: where each trial's layout lives (s3: a moto S3 server "
                        "started for the campaign)")
    parser.add_argument("--original-venv", type=Path,
                        help="for --target distributed: an environment of the original PyTorch-BigGraph, which "
                        "loads every final checkpoint at the end (default: $PBG_ORIGINAL_VENV, else one created "
                        "under the workdir as tests/interop creates it)")
    args = parser.parse_args(argv)
    if args.target == "distributed":
        return _distributed(args)
    if args.target == "command" and not args.command:
        parser.error("--target command needs --command")
    summary = run_harness(TARGETS[args.target](args), args.kills, seed=args.seed, jobs=args.jobs,
                          chain=args.chain, workdir=args.workdir)
    print(summary.text())
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": summary.figures(), "kills": [asdict(k) for k in summary.kills],
                                         "failures": summary.failures}, indent=1), encoding="utf-8")
    return 1 if summary.failures else 0


def _distributed(args: argparse.Namespace) -> int:
    """``--target distributed``: tools/kill_distributed.py (3 trainers, one killed or stalled per trial)."""
    sys.modules.setdefault("kill_harness", sys.modules[__name__])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kill_distributed import ensure_original_venv, run_distributed, write_json

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pbg-kill-dist-"))
    workdir.mkdir(parents=True, exist_ok=True)
    venv = ensure_original_venv(args.original_venv, workdir)
    summary = run_distributed(args.kills, args.stalls, seed=args.seed, peer_timeout=args.peer_timeout,
                              workdir=workdir, storage=args.storage, original_venv=venv)
    print(summary.text())
    if args.json is not None:
        write_json(summary, args.json)
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
