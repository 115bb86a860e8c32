"""Shared helpers of the ``tools/bench_*.py`` benchmarks (Unix; exact peak RSS on Linux).

Each measured job runs in a fresh child process so that its peak RSS is that of
the job alone. The child reports the peak itself: on Linux ``ru_maxrss`` cannot be
used for this, because ``execve`` keeps the high-water mark of the memory the
process had before (the parent's, when Python spawns with ``vfork``), so a child
of a 500 MB parent reports at least 500 MB. ``VmHWM`` in ``/proc/self/status``
belongs to the new program alone. :data:`CHILD_PROLOGUE` reads it (``ru_maxrss``
where there is no ``/proc``) and prints it at exit; the parent falls back to the
child's ``os.wait4`` ``ru_maxrss`` (an upper bound) when a child printed nothing.

A child reports its figures by printing one line ``BENCH_RESULT {json}``:

    from _benchutil import CHILD_PROLOGUE, run_python

    run = run_python(CHILD_PROLOGUE + "t0 = now()\\n...\\nemit(seconds=now() - t0)", {"n": 3})
    run.seconds, run.peak_rss_bytes, run.result

:func:`run_python_script` runs an existing script (a console entry point) the same way.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "BENCH_RESULT "
PEAK_PREFIX = "BENCH_PEAK_RSS "
MB = 1_000_000  # throughputs and sizes are in decimal megabytes
MIB = 1 << 20

# ru_maxrss is in kibibytes on Linux and in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024

CHILD_PROLOGUE = f"""\
import atexit as _atexit, json as _json, resource as _resource, sys as _sys, time as _time
now = _time.perf_counter
def peak_rss_bytes():
    try:
        with open("/proc/self/status") as _f:
            for _line in _f:
                if _line.startswith("VmHWM:"):
                    return int(_line.split()[1]) * 1024
    except OSError:
        pass
    return _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss * {_MAXRSS_UNIT}
def emit(**figures):
    _sys.stdout.write({RESULT_PREFIX!r} + _json.dumps(figures) + "\\n")
    _sys.stdout.flush()
def _emit_peak():
    _sys.stdout.write({PEAK_PREFIX!r} + str(peak_rss_bytes()) + "\\n")
    _sys.stdout.flush()
_atexit.register(_emit_peak)
ARGS = _json.loads(_sys.argv[1]) if len(_sys.argv) > 1 else {{}}
"""
"""Preamble for child code: ``now()``, ``peak_rss_bytes()``, ``emit(**figures)`` and ``ARGS``
(the JSON given as the first argument by :func:`run_python`); prints the peak RSS at exit."""


@dataclass
class ChildRun:
    """One finished child process."""

    argv: list[str]
    returncode: int
    wall_seconds: float  # the whole process: interpreter start, imports, job, exit
    peak_rss_bytes: int  # of this process alone (see the module doc)
    peak_rss_source: str  # "child" (VmHWM the child printed) or "ru_maxrss" (wait4: an upper bound)
    stdout: str
    stderr: str
    result: dict[str, Any] = field(default_factory=dict)  # the child's BENCH_RESULT, if any

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.result)

    @property
    def seconds(self) -> float:
        """The job's time as the child measured it, else the wall time of the process."""
        value = self.result.get("seconds")
        return float(value) if value is not None else self.wall_seconds

    def failure(self, tail: int = 2000) -> str:
        """Why the run has no result, with the end of its stderr."""
        return f"exit status {self.returncode} from {' '.join(self.argv[:3])} …\n{self.stderr[-tail:]}"


def run_child(argv: Sequence[str], *, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> ChildRun:
    """Run ``argv`` to completion; capture output, wall time and the peak RSS of that process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=dict(env) if env is not None else None)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen consistent
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result: dict[str, Any] = {}
    peak, source = usage.ru_maxrss * _MAXRSS_UNIT, "ru_maxrss"
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
        elif line.startswith(PEAK_PREFIX):
            peak, source = int(line[len(PEAK_PREFIX):]), "child"
    return ChildRun(list(argv), proc.returncode, wall, peak, source, stdout, stderr, result)


def run_python(code: str, args: Any = None, *, cwd: Path | None = REPO_ROOT,
               env: Mapping[str, str] | None = None) -> ChildRun:
    """Run ``sys.executable -c code`` with ``args`` as JSON in ``sys.argv[1]`` (``ARGS`` in the prologue).

    With the default ``cwd`` (the repo root) the child imports the working tree's ``pbgio``.
    """
    argv = [sys.executable, "-c", code]
    if args is not None:
        argv.append(json.dumps(args))
    return run_child(argv, cwd=cwd, env=env)


def run_python_script(script: Path, argv: Sequence[str], *, cwd: Path | None = REPO_ROOT,
                      env: Mapping[str, str] | None = None) -> ChildRun:
    """Run a Python script (e.g. a console entry point) as ``script argv...`` in a fresh
    interpreter with :data:`CHILD_PROLOGUE`, so its peak RSS is reported; the figures cover
    the whole process (interpreter start, imports, run, exit)."""
    code = (CHILD_PROLOGUE + "import runpy\n"
            f"_sys.argv = {[str(script), *argv]!r}\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return run_child([sys.executable, "-c", code], cwd=cwd, env=env)


def run_python_module(module: str, argv: Sequence[str], *, cwd: Path | None = REPO_ROOT,
                      env: Mapping[str, str] | None = None) -> ChildRun:
    """Like :func:`run_python_script` for ``python -m module argv...``."""
    code = (CHILD_PROLOGUE + "import runpy\n"
            f"_sys.argv = {[module, *argv]!r}\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    return run_child([sys.executable, "-c", code], cwd=cwd, env=env)


def warm_page_cache(paths: Iterable[Path], block: int = 16 * MIB) -> int:
    """Read every file once so later reads come from the page cache; return the bytes read."""
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def available_memory_bytes() -> int | None:
    """Memory available for the page cache without swapping (Linux ``MemAvailable``), if known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def best_and_median(values: Sequence[float], *, higher_is_better: bool = True) -> tuple[float, float]:
    """The best value and the median of a non-empty sequence."""
    best = max(values) if higher_is_better else min(values)
    return best, statistics.median(values)


def environment() -> dict[str, Any]:
    """Where the figures were taken."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    for module in ("numpy", "h5py"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    return info


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table, first column left-aligned and the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
