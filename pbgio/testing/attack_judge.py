"""Run one attempt of the attack corpus (:mod:`pbgio.testing.attacks`) as a user runs it, and judge it.

An attempt is a real command line (``pbgio validate``, ``pbgtrain fit`` …) run in a child process,
with the code of a chosen checkout (:func:`run_attempt`'s ``code_root``: its ``PYTHONPATH``, so that
the same case runs against the code before a change and after it), in the directory and the
environment a user would have, under a time and a memory bound. :func:`run_attempt` snapshots the
attempt's whole tree before and after (every file's bytes, every link's target) and returns a
:class:`Verdict` that fails when any of these does not hold:

- the exit code is one the attempt expects (a clear refusal, exit 1 or 2, or a safe success, exit 0),
  and a refusal names the file it refuses (:class:`Expect`);
- no ``Traceback`` in the output;
- nothing outside the layout changed, appeared or disappeared (the victim's files byte for byte,
  the target of a dangling link), except the outputs the attempt named on its command line;
- no marker file (the proof that an attacker's code ran);
- no secret of the setup (the victim's secret, credentials of a URL) in stdout, stderr or any file
  the attempt wrote;
- no ESC byte (``0x1b``: a terminal control sequence) in the output;
- no request reached the attacker's HTTP server, where the setup has one that must get none;
- under :data:`TIME_LIMIT` seconds and :data:`RSS_LIMIT` bytes of peak resident memory (the child
  is killed at either bound, so a hostile case against old code cannot take the machine down;
  files are capped at :data:`FILE_SIZE_LIMIT` bytes for the same reason).

The child is started as ``python -P -c "from pbgio.cli import main; main()"`` (``-P``: the current
directory is not put on ``sys.path``, as for the console scripts ``pbgio`` and ``pbgtrain``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TIME_LIMIT = 60.0
"""Seconds an attempt may run (the issue's bound); the child is killed past it."""
RSS_LIMIT = 2 << 30
"""Peak resident memory an attempt may use (2 GiB, the issue's bound); the child is killed past it."""
FILE_SIZE_LIMIT = 256 << 20
"""The largest file the child may write (``RLIMIT_FSIZE``): a case that writes gigabytes against old
code stops at this size instead of filling the disk."""
CODE_ROOT_ENV = "PBG_ATTACK_CODE_ROOT"
"""The checkout whose code the attempts run (default: the one this module belongs to)."""
OWN_ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ("layout", "home", "tmp")
"""Folders of an attempt's root the command may change: the layout it was handed, its ``HOME`` and
``TMPDIR`` (caches). Everything else under the root is the user's (the victim's) and must not change."""
REFUSED = frozenset({1, 2})
OK = frozenset({0})
EITHER = frozenset({0, 1, 2})


@dataclass(frozen=True)
class Expect:
    """The outcome an attempt must end in.

    ``codes``: exit codes allowed (:data:`REFUSED`, :data:`OK` or :data:`EITHER`); ``names``: a
    refusal (a non-zero exit) must name one of these (the file it refuses, the key, the URL);
    ``mentions``: the output must contain each of these, whatever the exit code; ``hides``: it must
    contain none of these.
    """

    codes: frozenset[int]
    names: tuple[str, ...] = ()
    mentions: tuple[str, ...] = ()
    hides: tuple[str, ...] = ()
    """What the output must not show: what reading through the attacker's link would show."""


def refused(*names: str) -> Expect:
    """A clear refusal (exit 1 or 2) whose message names one of ``names``."""
    return Expect(REFUSED, names)


def safe(*mentions: str) -> Expect:
    """A safe success (exit 0) whose output contains each of ``mentions``."""
    return Expect(OK, (), mentions)


def refused_or_safe(*names: str) -> Expect:
    """Either: a refusal naming one of ``names``, or a success (the link replaced, never followed)."""
    return Expect(EITHER, names)


@dataclass(frozen=True)
class Attempt:
    """One command line tried on a setup: ``argv`` starts with the tool (``pbgio`` or ``pbgtrain``);
    ``cwd`` and ``outputs`` are relative to the setup's root (``outputs``: files or folders outside
    the layout the command may create, named on its command line); ``env`` is added to the
    environment."""

    argv: tuple[str, ...]
    expect: Expect
    cwd: str = "layout"
    env: Mapping[str, str] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The command line as a user types it."""
        return " ".join(self.argv)


class RecordingServer:
    """An HTTP server on ``127.0.0.1`` (a free port) that answers 404 to everything and records each
    request: the attacker's host, or the user's storage where a command may contact it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        recorded = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                recorded.append(f"{self.command} {self.path}")
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Setup:
    """What a builder wrote: the root (``root/layout`` the layout, ``root/victim`` the user's other
    files), the attempts by command, the secrets no output may show, the marker file whose existence
    proves code ran, paths outside the root to snapshot too, and an HTTP server that must get no
    request (``server_must_stay_silent``) or may (``server`` alone)."""

    root: Path
    attempts: dict[str, Attempt]
    secrets: tuple[str, ...] = ()
    marker: Path | None = None
    watch: tuple[Path, ...] = ()
    server: RecordingServer | None = None
    server_must_stay_silent: bool = False

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class Verdict:
    """How one attempt ended, and every way in which it failed (empty: it held)."""

    attack: str
    command: str
    argv: tuple[str, ...]
    exit_code: int | None
    seconds: float
    peak_rss_mb: float
    first_line: str
    failures: list[str]
    stdout: str = ""
    stderr: str = ""

    @property
    def held(self) -> bool:
        return not self.failures

    @property
    def outcome(self) -> str:
        """The exit code and the first line of the error, or ``ok``."""
        if self.exit_code is None:
            return "killed"
        if self.exit_code == 0:
            return "ok"
        return f"exit {self.exit_code}: {self.first_line}" if self.first_line else f"exit {self.exit_code}"

    def explain(self) -> str:
        """The failures and the output tails, for a test's assertion message."""
        return (f"{self.attack} / {self.command}: {' '.join(self.argv)}\n  - " + "\n  - ".join(self.failures)
                + f"\n--- stdout (tail)\n{self.stdout[-2000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}")


# --------------------------------------------------------------------------- snapshots

Entry = tuple[str, ...]


def _entry(path: Path) -> Entry:
    """What stands at ``path``, never opening anything but a regular file: a link's target, a
    regular file's digest, the kind of anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("absent",)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir",)
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return ("file", digest.hexdigest(), str(st.st_size))
    return ("special", oct(stat.S_IFMT(st.st_mode)))


def snapshot(root: Path, skip: Callable[[Path], bool] = lambda _: False) -> dict[str, Entry]:
    """Every path under ``root`` (links not followed) with :func:`_entry`, except the folders ``skip``
    says to leave out."""
    found: dict[str, Entry] = {}
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        dirs[:] = [d for d in dirs if not skip(here / d)]
        for name in dirs + files:
            path = here / name
            if not skip(path):
                found[str(path.relative_to(root))] = _entry(path)
    return found


def _changes(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    changed = []
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key, ("absent",)), after.get(key, ("absent",))
        if was != now:
            what = "created" if was == ("absent",) else "removed" if now == ("absent",) else "changed"
            changed.append(f"{key} {what} ({was[0]} -> {now[0]})")
    return changed


# --------------------------------------------------------------------------- the child


def _session_rss(sid: int) -> int:
    """Resident bytes of every process of session ``sid`` (the child and whatever it started)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 of stat (after pid and comm): the session
                continue
            with open(f"/proc/{entry.name}/statm", "rb") as f:
                total += int(f.read().split()[1]) * resource.getpagesize()
        except (OSError, IndexError, ValueError):
            continue
    return total


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def base_env(root: Path, code_root: Path) -> dict[str, str]:
    """The environment of an attempt: the user's ``PATH``, ``HOME`` and ``TMPDIR`` inside the root
    (caches land there, not in the real home), no network proxies, no GPU, one thread."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONPATH": str(code_root), "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "160",
        "TERM": "dumb", "MPLBACKEND": "Agg", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
        "AWS_CONFIG_FILE": str(root / "home" / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "home" / "aws-credentials"), "NO_PROXY": "*",
    }


def _run(argv: tuple[str, ...], cwd: Path, env: Mapping[str, str], timeout: float,
         rss_limit: int) -> tuple[int | None, float, int, bytes, bytes, str | None]:
    """``(exit code or None when killed, seconds, peak RSS bytes, stdout, stderr, why killed)``."""
    tool, args = argv[0], argv[1:]
    code = f"import sys; from {tool}.cli import main; sys.argv = [{tool!r}, *sys.argv[1:]]; main()"
    out_dir = Path(env["TMPDIR"])
    out_path, err_path = out_dir / "attack.stdout", out_dir / "attack.stderr"
    killed: list[str] = []
    peak = [0]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-P", "-c", code, *args], cwd=cwd, env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                preexec_fn=_limits)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                rss = _session_rss(proc.pid)
                peak[0] = max(peak[0], rss)
                why = ("memory" if rss > rss_limit else
                       "time" if time.monotonic() - started > timeout else None)
                if why is not None:
                    killed.append(why)
                    _kill_group(proc.pid)
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        done.set()
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        _kill_group(proc.pid)  # whatever it left running
    peak[0] = max(peak[0], usage.ru_maxrss * 1024)
    exit_code = None if killed else proc.returncode
    return exit_code, seconds, peak[0], out_path.read_bytes(), err_path.read_bytes(), killed[0] if killed else None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- judging


def _first_error_line(stdout: str, stderr: str) -> str:
    """The error's first line (``error: …``), the exception of a traceback, or stderr's last line."""
    lines = [line.strip().strip("│ ").strip() for line in (stderr + "\n" + stdout).splitlines()]
    lines = [line for line in lines if line and not set(line) <= set("─╭╮╰╯│ ")]
    for line in lines:
        if line.lower().startswith("error"):
            return line[:200]
    if "Traceback" in stderr or "Traceback" in stdout:
        exceptions = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))]
        if exceptions:
            return exceptions[-1][:200]
    errors = [line.strip() for line in stderr.splitlines() if line.strip()]
    return errors[-1][:200] if errors else ""


def _secrets_in_files(root: Path, paths: list[str], secrets: tuple[str, ...]) -> list[str]:
    found = []
    for rel in paths:
        path = root / rel
        if not path.is_file() or path.is_symlink() or path.stat().st_size > FILE_SIZE_LIMIT:
            continue
        data = path.read_bytes()
        found += [f"{rel} holds the secret {s[:12]}…" for s in secrets if s.encode() in data]
    return found


def run_attempt(setup: Setup, label: str, *, attack: str = "", code_root: Path | None = None,
                timeout: float = TIME_LIMIT, rss_limit: int = RSS_LIMIT) -> Verdict:
    """Run ``setup.attempts[label]`` with the code of ``code_root`` (default: the environment's
    :data:`CODE_ROOT_ENV`, else this checkout) and judge it (see the module doc)."""
    attempt = setup.attempts[label]
    root = setup.root
    code_root = Path(code_root or os.environ.get(CODE_ROOT_ENV) or OWN_ROOT)
    for folder in SCRATCH:
        (root / folder).mkdir(parents=True, exist_ok=True)
    outputs = {root / o for o in attempt.outputs}

    def outside(path: Path) -> bool:
        return path in outputs or (path.parent == root and path.name in SCRATCH)

    def caches(path: Path) -> bool:
        return path.name in (SCRATCH[1], SCRATCH[2]) and path.parent == root

    before, everything_before = snapshot(root, outside), snapshot(root, caches)
    watched_before = {str(p): _entry(p) for p in setup.watch}
    requests_before = len(setup.server.requests) if setup.server else 0
    env = {**base_env(root, code_root), **attempt.env}
    exit_code, seconds, rss, out_bytes, err_bytes, killed = _run(attempt.argv, root / attempt.cwd, env, timeout,
                                                                 rss_limit)
    stdout, stderr = out_bytes.decode("utf-8", "replace"), err_bytes.decode("utf-8", "replace")
    output = stdout + "\n" + stderr
    failures: list[str] = []
    if killed == "time":
        failures.append(f"killed after {timeout:.0f} s (a hang or unbounded work)")
    elif killed == "memory":
        failures.append(f"killed past {rss_limit >> 20} MiB of resident memory")
    elif exit_code not in attempt.expect.codes:
        failures.append(f"exit code {exit_code}, expected one of {sorted(attempt.expect.codes)}")
    if "Traceback" in output:
        failures.append("a raw traceback in the output")
    if exit_code not in (0, None) and attempt.expect.names and not any(n in output for n in attempt.expect.names):
        failures.append(f"the refusal names none of {list(attempt.expect.names)}")
    failures += [f"the output does not mention {m!r}" for m in attempt.expect.mentions if m not in output]
    failures += [f"the output shows {h!r} (read through the attacker's link)" for h in attempt.expect.hides
                 if h in output]
    after = snapshot(root, outside)
    failures += [f"outside the layout: {c}" for c in _changes(before, after)]
    watched_after = {str(p): _entry(p) for p in setup.watch}
    failures += [f"watched: {c}" for c in _changes(watched_before, watched_after)]
    if setup.marker is not None and (setup.marker.exists() or setup.marker.is_symlink()):
        failures.append(f"the marker {setup.marker.name} exists: the attacker's code ran")
    for secret in setup.secrets:
        if secret in output or secret.lower() in output.lower():
            failures.append(f"the secret {secret[:12]}… is in the output")
    written = [k for k, v in snapshot(root, caches).items() if everything_before.get(k) != v and v[0] == "file"]
    failures += _secrets_in_files(root, written, setup.secrets)
    if b"\x1b" in out_bytes or b"\x1b" in err_bytes:
        failures.append("an ESC byte (terminal control) in the output")
    if setup.server is not None and setup.server_must_stay_silent and len(setup.server.requests) > requests_before:
        failures.append(f"{len(setup.server.requests) - requests_before} request(s) reached the layout's host: "
                        f"{setup.server.requests[requests_before]}")
    if seconds > timeout and killed is None:
        failures.append(f"took {seconds:.1f} s, over {timeout:.0f} s")
    if rss > rss_limit and killed is None:
        failures.append(f"peak RSS {rss >> 20} MiB, over {rss_limit >> 20} MiB")
    return Verdict(attack=attack, command=label, argv=attempt.argv, exit_code=exit_code, seconds=seconds,
                   peak_rss_mb=rss / (1 << 20), first_line=_first_error_line(stdout, stderr), failures=failures,
                   stdout=stdout, stderr=stderr)
