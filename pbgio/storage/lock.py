"""The writer's lock on a checkpoint directory: one ``pbgtrain fit`` at a time.

A run holds the lock from its start to its end (in a distributed run, rank 0 holds it for every
rank). A second writer is refused at once with a :class:`~pbgio.errors.CheckpointInUseError`
naming the holder: command, pid, host, user and start time, read from the lock file
``.pbg-lock`` (:data:`pbgio.spec.naming.CHECKPOINT_LOCK`) inside the directory. Readers
(validate, export, eval) never take it; see docs/guides/concurrency.md.

- **Local directories** (NFS included): ``fcntl.flock`` on the lock file. The kernel releases it
  when the holder's process ends, however it ends (``kill -9`` too), so a dead holder never blocks
  the next run; the lock file itself is removed on a clean release and rewritten by the next
  holder otherwise.
- **Remote directories** (object stores have no locks): a *lease* object, the same JSON plus an
  expiry, renewed by a heartbeat thread every :data:`LEASE_RENEW_SECONDS`. A lease past its expiry,
  or one whose holder ran on this host and is gone, is stale and taken over. Best effort: object
  stores have no atomic create-if-absent here, so two writers that start within moments of each
  other may both start; the loser notices at its next renewal (:meth:`CheckpointLock.check`).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp())
>>> with CheckpointLock(path, command="demo") as held:
...     holder_of(path) is None  # this process's own lock is not "another writer"
...     try:
...         CheckpointLock(path, command="second", wait=0).acquire()
...     except CheckpointInUseError as exc:
...         print("refused:", exc.holder.split(" (")[0])
True
refused: demo
>>> sorted(p.name for p in path.iterdir())  # released: nothing left behind
[]
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import json
import os
import shlex
import socket
import stat
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pbgio import confinement
from pbgio.errors import CheckpointInUseError, OutputError, UnsafeWriteError
from pbgio.spec import naming
from pbgio.storage import atomic, paths
from pbgio.storage.paths import AnyPath

WAIT_SECONDS = 1.0
"""How long an acquire tries before refusing: a reader probing the lock holds it for a moment."""
LEASE_SECONDS = 60.0
"""A remote lease not renewed for this long is stale."""
LEASE_RENEW_SECONDS = 15.0
"""How often the heartbeat thread renews a remote lease."""
LEASE_SETTLE_SECONDS = 0.5
"""Pause between writing a remote lease and reading it back to see whether another writer won."""

HOLDER_BYTES = 64 << 10
"""The most of a lock file read: a holder's JSON is a few hundred bytes."""

_HELD: dict[str, CheckpointLock] = {}
_HELD_GUARD = threading.Lock()


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its lock file says.

    >>> h = Holder(command="pbgtrain fit", pid=1234, host="gpu1", user="ana", started=0.0, argv="pbgtrain fit c.json")
    >>> h.describe().startswith("pbgtrain fit (pid 1234 on host gpu1, user ana, since 1970-01-01")
    True
    >>> Holder.from_json(h.to_json()) == h
    True
    >>> Holder.from_json("{half written") is None
    True
    """

    command: str
    pid: int
    host: str
    user: str
    started: float
    argv: str = ""
    token: str = ""
    expires: float | None = None  # remote leases only (seconds since the epoch)

    @classmethod
    def of_this_process(cls, command: str, lease: float | None = None) -> Holder:
        try:
            user = getpass.getuser()
        except Exception:  # no name for this uid (containers)
            user = str(os.getuid())
        now = time.time()
        return cls(command=command, pid=os.getpid(), host=socket.gethostname(), user=user, started=now,
                   argv=shlex.join(sys.argv)[:500], token=os.urandom(8).hex(),
                   expires=None if lease is None else now + lease)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        text = f"{self.command} (pid {self.pid} on host {self.host}, user {self.user}, since {since}"
        if self.expires is not None:
            text += f"; lease expires {time.strftime('%H:%M:%S', time.localtime(self.expires))} unless renewed"
        return text + ")"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Holder | None:
        try:
            data = json.loads(text)
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (ValueError, TypeError, KeyError):
            return None

    def stale(self, now: float) -> bool:
        """Whether a lease of this holder may be taken over: expired, or its process on this host gone."""
        if self.expires is not None and self.expires < now:
            return True
        return self.host == socket.gethostname() and not process_alive(self.pid)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's process counts).

    >>> process_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def lock_path(directory: AnyPath) -> AnyPath:
    return directory / naming.CHECKPOINT_LOCK


def _key(directory: AnyPath) -> str:
    return str(paths.absolute(directory))


@dataclass
class CheckpointLock:
    """The writer's lock on checkpoint directory ``path`` (a context manager).

    ``wait`` is how long :meth:`acquire` tries before it raises
    :class:`~pbgio.errors.CheckpointInUseError`.
    """

    path: AnyPath
    command: str = "pbgtrain fit"
    wait: float = WAIT_SECONDS
    holder: Holder | None = None
    _fd: int | None = field(default=None, repr=False)
    _created: bool = field(default=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _heartbeat: threading.Thread | None = field(default=None, repr=False)
    _lost: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.path = paths.resolve(self.path)

    def __enter__(self) -> CheckpointLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- acquire
    def acquire(self) -> None:
        if paths.is_remote(self.path):
            self._acquire_lease()
        else:
            self._acquire_flock(self.path)
        with _HELD_GUARD:
            _HELD[_key(self.path)] = self

    def _acquire_flock(self, directory: Path) -> None:
        import fcntl

        file = directory / naming.CHECKPOINT_LOCK
        confinement.check_write(file, "checkpoint lock file")
        self._created = not directory.exists()
        atomic.make_dirs(directory, "checkpoint directory")
        deadline = time.monotonic() + self.wait
        while True:
            fd = _open_lock_file(file)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    holder = _describe(_read_local_holder(file))
                    raise CheckpointInUseError(paths.display(directory), holder) from None
                time.sleep(0.05)
                continue
            try:  # a releasing holder unlinks the file: a lock on the unlinked one guards nothing
                same = os.stat(file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.holder = Holder.of_this_process(self.command)
        data = self.holder.to_json().encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except OSError as exc:  # a full disk or a failing device: say which file
            os.close(fd)
            raise OutputError(paths.display(file), exc) from None
        self._fd = fd

    def _acquire_lease(self) -> None:
        remote = self.path
        file = lock_path(remote)
        deadline = time.monotonic() + self.wait
        while True:
            current = _read_remote_holder(file)
            if current is None or current.stale(time.time()):
                break
            if time.monotonic() >= deadline:
                raise CheckpointInUseError(paths.display(remote), current.describe())
            time.sleep(0.05)
        self.holder = Holder.of_this_process(self.command, lease=LEASE_SECONDS)
        _write_remote(file, self.holder.to_json())
        time.sleep(LEASE_SETTLE_SECONDS)
        won = _read_remote_holder(file)
        if won is None or won.token != self.holder.token:
            self.holder = None
            raise CheckpointInUseError(paths.display(remote), _describe(won),
                                       "it took the lease at the same moment")
        self._heartbeat = threading.Thread(target=confinement.inherited(self._renew), name="pbg-lease", daemon=True)
        self._heartbeat.start()

    def _renew(self) -> None:
        file = lock_path(self.path)
        while not self._stop.wait(LEASE_RENEW_SECONDS):
            assert self.holder is not None
            try:
                current = _read_remote_holder(file)
                if current is not None and current.token != self.holder.token:
                    self._lost = f"{paths.display(self.path)}: lost the lease to {current.describe()}"
                    return
                self.holder = Holder(**{**asdict(self.holder), "expires": time.time() + LEASE_SECONDS})
                _write_remote(file, self.holder.to_json())
            except Exception as exc:  # a store that fails now may answer at the next renewal
                if self.holder.expires is not None and self.holder.expires <= time.time():
                    self._lost = f"{paths.display(self.path)}: could not renew the lease ({exc})"

    def check(self) -> None:
        """Raise :class:`~pbgio.errors.CheckpointInUseError` when a remote lease was lost to another writer."""
        if self._lost is not None:
            raise CheckpointInUseError(paths.display(self.path), "another writer", self._lost)

    # ---- release
    def release(self) -> None:
        with _HELD_GUARD:
            if _HELD.get(_key(self.path)) is self:
                del _HELD[_key(self.path)]
        if self._fd is not None:
            self._release_flock()
        elif self.holder is not None and paths.is_remote(self.path):
            self._stop.set()
            if self._heartbeat is not None:
                self._heartbeat.join()
            file = lock_path(self.path)
            with contextlib.suppress(Exception):
                current = _read_remote_holder(file)
                if current is not None and current.token == self.holder.token:
                    file.unlink()
        self.holder = None

    def _release_flock(self) -> None:
        assert self._fd is not None and not paths.is_remote(self.path)
        file = self.path / naming.CHECKPOINT_LOCK
        with contextlib.suppress(OSError):
            if os.stat(file).st_ino == os.fstat(self._fd).st_ino:
                file.unlink()  # while still locked: the next holder re-checks the inode
        os.close(self._fd)
        self._fd = None
        if self._created:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty: a run refused before writing anything


def _open_lock_file(file: Path) -> int:
    """The lock file opened for reading and writing (created if missing): a regular file, never
    through a symbolic link (a link a layout shipped there, to a victim file or to nowhere, is
    refused: :class:`~pbgio.errors.UnsafeWriteError`), never blocking on a FIFO."""
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeWriteError(paths.display(file), "the checkpoint lock file is a symbolic link (to "
                                   f"{_link_target(file)}); pbg never writes through a link a layout holds: "
                                   "remove it") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeWriteError(paths.display(file), "expected the checkpoint lock file to be a regular "
                                                        "file, found a FIFO") from None
        raise
    atomic.check_regular(fd, paths.display(file), "checkpoint lock file")
    return fd


def _link_target(file: Path) -> str:
    try:
        return os.readlink(file)
    except OSError:
        return "?"


def _open_to_read(file: Path) -> int | None:
    """The lock file opened for reading when it is a regular file reached without a link; else None."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def holder_of(directory: str | AnyPath) -> Holder | None:
    """Who writes ``directory`` now, if another process does (None: nobody, or this process).

    For readers: a local probe takes a shared lock for a moment (a writer starting then waits it
    out); a remote one reads the lease. Never raises for a missing or unreadable lock file.
    """
    directory = paths.resolve(directory)
    with _HELD_GUARD:
        if _key(directory) in _HELD:
            return None  # opening our own lock file again could drop the lock on NFS
    file = lock_path(directory)
    if paths.is_remote(file):
        current = _read_remote_holder(file)
        return None if current is None or current.stale(time.time()) else current
    import fcntl

    fd = _open_to_read(file)
    if fd is None:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_local_holder(file) or Holder("another process", 0, "?", "?", time.time())
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _describe(holder: Holder | None) -> str:
    return holder.describe() if holder is not None else "another process (its lock file names no holder yet)"


def _read_local_holder(file: Path) -> Holder | None:
    """The holder a local lock file names; a holder that has just locked it may not have written it
    yet, so an empty file is read again for a moment."""
    for _ in range(10):
        fd = _open_to_read(file)
        if fd is None:
            return None
        try:
            holder = Holder.from_json(os.read(fd, HOLDER_BYTES))
        except OSError:
            return None
        finally:
            os.close(fd)
        if holder is not None:
            return holder
        time.sleep(0.05)
    return None


def _read_remote_holder(file: Any) -> Holder | None:
    with paths.remote_errors(file, "checkpoint lease"):
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
    return Holder.from_json(data)


def _write_remote(file: Any, text: str) -> None:
    paths.upload_bytes(file, text.encode())
