"""``python3 tools/card_run.py --kit card-kit``: the card's whole check, in one script of at most
five minutes on an image with Python and torch only (docs/guides/gpu.md, "Checking a card").

It needs nothing but the standard library to start. Stages, each a child process whose output is
printed and kept under ``--out`` (``$OUT`` when set):

1. **install**: the kit's wheels (``tools/card_kit.py prepare``) into ``--site`` (a fresh
   ``pbg-card-site`` under the temporary folder: the kit stays as it was made) with
   ``pip install --no-index --find-links KIT/wheels --target SITE`` (where the image has no pip,
   each wheel is unpacked there); every later stage runs with ``PYTHONPATH=SITE:<repo>``,
   so pbg is this checkout's working tree. ``--no-install`` uses the running environment as it is.
2. **environment**: Python, torch, CUDA, the device, and the versions of the kit's packages.
3. **pytest -m gpu**: every test file of ``tests/`` that marks a test ``gpu``; a file that cannot
   be collected (it imports what the kit left out) is an error of the stage, and the others run.
4. **check**: ``tools/bench_gpu.py --check`` (tools/gpu_check.py): the lines of issue 44's
   targets with their peak GPU memory and each run's notes (a capture that failed shows there),
   and a partitioned fit with read-ahead.

Then one table: every line with its target and verdict, and the whole run against its own
target (five minutes on a card; two on a CPU dry run). The exit code is 1 when a stage failed
or was stopped at ``--deadline-s`` (so that its logs still come back), else 0; a target not met
is a verdict in the table, not a failure of the script.

``--device cpu`` is the dry run: the same stages at a thousandth of the size (``--scale 0.001``,
one second per step rate, an iteration or two of FB15k-237 at dimension 32, batch 100, in 1,024
edge chunks, 1,000 test edges ranked: :data:`DRY_RUN`); on a CPU the gpu tests skip and the
check runs the GPU's step through the replay driver's CPU stand-in.

    python3 tools/card_run.py --kit card-kit                          # on the card
    .venv/bin/python tools/card_run.py --kit card-kit --device cpu --no-install   # dry run, this venv
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))

from _benchutil import format_table  # noqa: E402  (the standard library only)

TARGET_SECONDS = {"cuda": 300.0, "cpu": 120.0}  # the whole run: issue 55's bounds for the card and the dry run
# the check's sizes (tools/bench_gpu.py's --scale and --check-* options): the card's fit its five minutes (not
# measured yet: no card has run it); the dry run's its two on a 2-core CPU without native bfloat16
CARD = {"scale": 1.0, "check_seconds": 10.0, "check_fb15k_minutes": 1.5, "check_fb15k_dimension": 2000,
        "check_fb15k_batch": 1000, "check_fb15k_edge_chunks": 1, "check_fb15k_eval_sample": 0}
DRY_RUN = {"scale": 0.001, "check_seconds": 1.0, "check_fb15k_minutes": 0.1, "check_fb15k_dimension": 32,
           "check_fb15k_batch": 100, "check_fb15k_edge_chunks": 1024, "check_fb15k_eval_sample": 1000}
GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*\bpytest\.mark\.gpu\b)", re.MULTILINE)


@dataclass
class Stage:
    """One finished stage: its exit status, seconds and the output's last lines."""

    name: str
    returncode: int | None  # None: stopped at the deadline
    seconds: float
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Log:
    """Everything printed, also written to ``card-run.log`` under the output folder."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.file: TextIO = (out / "card-run.log").open("a", encoding="utf-8")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def gpu_test_files(tests: Path = REPO / "tests") -> list[Path]:
    """The test files that mark a test ``gpu`` (``pytest -m gpu`` over them; the other files are
    not collected, so that what they import need not be on the card)."""
    return sorted(p for p in tests.glob("test_*.py") if GPU_MARK.search(p.read_text(encoding="utf-8")))


def pytest_summary(lines: list[str]) -> str:
    """pytest's closing counts (``3 passed, 2 skipped, 71 deselected in 4.1s``), or ''.

    >>> pytest_summary(["x", "==== 3 passed, 2 skipped in 4.10s ====", ""])
    '3 passed, 2 skipped in 4.10s'
    """
    for line in reversed(lines):
        if re.search(r"\d+ (passed|failed|skipped|error|errors|deselected|xfailed)\b", line):
            return line.strip("= \n")
    return ""


def run_stage(log: Log, name: str, argv: list[str], env: dict[str, str], deadline: float) -> Stage:
    """Run ``argv`` in the repository, its output printed and kept in ``OUT/<name>.log``; stopped
    (its process group) at ``deadline`` (a ``time.monotonic()`` instant)."""
    log.say(f"== {name}: {' '.join(argv)}")
    started = time.monotonic()
    tail: list[str] = []
    with (log.out / f"{name}.log").open("w", encoding="utf-8") as keep:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), stop)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                print(line, flush=True)
                keep.write(line + "\n")
                log.file.write(line + "\n")
                tail = [*tail[-39:], line]
            proc.wait()
        finally:
            timer.cancel()
    code = None if stopped.is_set() else proc.returncode
    stage = Stage(name, code, time.monotonic() - started, tail)
    log.say(f"== {name}: {'stopped at the deadline' if code is None else f'exit {code}'} "
            f"after {stage.seconds:.1f} s")
    return stage


def unpack_wheels(wheels: Path, site: Path) -> None:
    """Where the image has no pip: every wheel unpacked into ``site`` (a wheel is a zip of its
    files as installed; a ``*.data/purelib`` or ``platlib`` folder goes to the top)."""
    site.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                parts = Path(member).parts
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue  # scripts and headers: nothing the check runs
                    target = site.joinpath(*parts[2:])
                else:
                    target = site / member
                if member.endswith("/"):
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(member))


def install(log: Log, kit: Path, site: Path, deadline: float, installer: str) -> tuple[Stage, dict[str, str]]:
    """The kit installed into ``site`` (emptied first); the environment of the later stages."""
    manifest = json.loads((kit / "kit.json").read_text(encoding="utf-8"))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python_version"] != here:
        raise SystemExit(f"card_run: the kit holds wheels for Python {manifest['python_version']}, this is {here}: "
                         f"make it with tools/card_kit.py prepare --python-version {here} (or run with --no-install)")
    shutil.rmtree(site, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    has_pip = pip.returncode == 0
    if installer == "pip" or (installer == "auto" and has_pip):
        argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                "--no-compile", "--no-cache-dir", "--find-links", str(kit / "wheels"), "--target", str(site),
                "--upgrade", "-r", str(kit / "requirements.txt")]
        return run_stage(log, "install", argv, env, deadline), env
    started = time.monotonic()
    log.say(f"== install: no pip here: unpacking {kit / 'wheels'} into {site}")
    unpack_wheels(kit / "wheels", site)
    return Stage("install", 0, time.monotonic() - started), env


ENVIRONMENT = r"""
import importlib.metadata as md, platform, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
      f"device: {torch.cuda.get_device_name() if cuda else 'no CUDA'}")
names = ["numpy", "h5py", "pydantic", "typer", "rich", "rapidfuzz", "pytest", "hypothesis", "polars"]
print("; ".join(f"{n} {version(n)}" for n in names))
import pbgtrain.train  # pbg imports with what is installed (no polars needed to train)
print(f"pbgtrain from {pbgtrain.__file__}")
"""


def summary(stages: list[Stage], check: dict[str, Any] | None, total: float, device: str) -> tuple[str, list[str]]:
    """The closing table and each run's notes."""
    rows = []
    for stage in stages:
        verdict = "ran" if stage.ok else ("STOPPED" if stage.returncode is None else "FAILED")
        measured = f"{stage.seconds:.1f} s"
        if stage.name == "pytest":
            measured = f"{pytest_summary(stage.tail) or 'no summary'}; {measured}"
        rows.append([f"stage {stage.name}", measured, "exit 0", "-", verdict])
    notes: list[str] = []
    if check is not None:
        seen = set()
        for line in check["lines"]:
            met = line["met"]
            verdict = (line["verdict"] or "-") if met is None else ("met" if met else "NOT met")
            peak = "-" if line["peak_gpu_bytes"] is None else f"{line['peak_gpu_bytes'] / (1 << 30):.1f} GiB"
            rows.append([line["what"], line["measured"], line["target"], peak, verdict])
            if line["run"] and line["run"] not in seen:
                seen.add(line["run"])
                notes.append(f"  {line['run']}: step: {line['step'] or '-'}")
                notes += [f"    note: {n}" for n in line["notes"]] or ["    notes: none"]
    target = TARGET_SECONDS["cuda" if device.startswith("cuda") else "cpu"]
    rows.append(["the whole card run", f"{total:.0f} s", f"≤ {target:.0f} s", "-",
                 "met" if total <= target else "NOT met"])
    return format_table(["line", "measured", "target", "peak GPU", ""], rows), notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--kit", type=Path, default=REPO / "card-kit", help="what tools/card_kit.py prepare made")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="logs (default: $OUT, else a new temporary folder)")
    parser.add_argument("--no-install", action="store_true", help="use the running environment as it is")
    parser.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "pbg-card-site",
                        help="where the kit is installed (emptied first)")
    parser.add_argument("--installer", choices=["auto", "pip", "unpack"], default="auto",
                        help="auto: pip where the image has it, else the wheels unpacked")
    parser.add_argument("--deadline-s", type=float, default=540.0,
                        help="stop what still runs then, so that the logs come back (a device command's limit is 600)")
    parser.add_argument("--scale", type=float, default=None, help="sizes (default: 1 on a card, 0.001 on a CPU)")
    parser.add_argument("--check-seconds", type=float, default=None, help="seconds each step rate is measured")
    parser.add_argument("--check-fb15k-minutes", type=float, default=None,
                        help="minutes of FB15k-237 training (the MRR line is judged at that minute)")
    parser.add_argument("--check-fb15k-dimension", type=int, default=None)
    parser.add_argument("--check-fb15k-batch", type=int, default=None)
    parser.add_argument("--check-fb15k-edge-chunks", type=int, default=None)
    parser.add_argument("--check-fb15k-eval-sample", type=int, default=None, help="0: every test edge")
    parser.add_argument("--skip-pytest", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.deadline_s
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="card-run-")))
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out)
    sizes = {**(CARD if args.device.startswith("cuda") else DRY_RUN)}
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    log.say(f"card run on {args.device}, kit {args.kit}, logs in {out}; sizes {sizes}")
    stages: list[Stage] = []
    if args.no_install:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    else:
        if not (args.kit / "kit.json").is_file():
            raise SystemExit(f"card_run: {args.kit / 'kit.json'} is missing: make the kit with tools/card_kit.py "
                             "prepare on a CPU machine (a kit over its limit has none)")
        stage, env = install(log, args.kit, args.site, deadline, args.installer)
        stages.append(stage)
    if all(s.ok for s in stages):
        stages.append(run_stage(log, "environment", [sys.executable, "-c", ENVIRONMENT], env, deadline))
    ready = all(s.ok for s in stages)  # installed, and torch imports
    if ready and not args.skip_pytest:
        files = [str(p.relative_to(REPO)) for p in gpu_test_files()]
        stages.append(run_stage(log, "pytest", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                "-m", "gpu", "-rs", "--continue-on-collection-errors", *files],
                                 env, deadline))
    check = None
    if ready:
        layouts = args.kit / "layouts"
        argv = [sys.executable, str(TOOLS / "bench_gpu.py"), "--check", "--device", args.device,
                *[a for key, value in sizes.items() for a in (f"--{key.replace('_', '-')}", str(value))],
                "--json", str(out / "check.json")]
        if (layouts / "fb15k-237" / "config.json").is_file():
            argv += ["--prepared", str(layouts)]
        stages.append(run_stage(log, "check", argv, env, deadline))
        if stages[-1].ok:
            check = json.loads((out / "check.json").read_text(encoding="utf-8"))
    total = time.monotonic() - started
    table, notes = summary(stages, check, total, args.device)
    log.say("\n" + table)
    if notes:
        log.say("each run's step and notes:\n" + "\n".join(notes))
    (out / "summary.json").write_text(json.dumps({"device": args.device, "sizes": sizes, "seconds": total,
                                                  "stages": [asdict(s) for s in stages], "check": check}, indent=2)
                                      + "\n", encoding="utf-8")
    return 0 if stages and all(s.ok for s in stages) else 1


if __name__ == "__main__":
    sys.exit(main())
