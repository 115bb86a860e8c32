"""Faults the OS raises on writes, for tests: a full disk, a failing device, a read-only directory.

Two sources, both real errors from the kernel's interface rather than patched Python:

* :func:`shim_env` preloads ``faultshim.c`` (built once with the C compiler) into a child
  process: its ``write``/``pwrite``/``sendfile``/``fsync``/``open``/``mkdir`` calls on paths that
  contain ``match`` fail with ``ENOSPC``, ``EIO`` or ``EROFS`` (after ``after`` bytes, if given),
  exactly as libc reports them to h5py, torch and Python alike.
* :func:`small_tmpfs` mounts a size-limited tmpfs where the kernel permits (root with
  CAP_SYS_ADMIN): a disk that really fills up.

>>> sorted(FAULTS)
['eio', 'eio-fsync', 'enospc', 'erofs']
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

FAULTS = {
    "enospc": "no space left on the device (writes fail)",
    "eio": "an I/O error on write",
    "eio-fsync": "an I/O error on fsync",
    "erofs": "a read-only file system (opening for writing and mkdir fail)",
}
SOURCE = Path(__file__).with_name("faultshim.c")


class FaultsUnavailable(RuntimeError):
    """This machine cannot inject the fault (no C compiler, not Linux, no mount permission)."""


def build_shim(cache: Path | None = None) -> Path:
    """The shared library built from ``faultshim.c`` (cached by the source's hash)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not Path("/proc/self/fd").is_dir():
        raise FaultsUnavailable("the fault shim needs a C compiler and Linux's /proc")
    source = SOURCE.read_bytes()
    directory = cache or Path(tempfile.gettempdir()) / "pbg-faultshim"
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"faultshim-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not library.exists():
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise FaultsUnavailable(f"building the fault shim failed: {done.stderr.strip()[:500]}")
        partial.replace(library)
    return library


def shim_env(fault: str, match: str | Path, *, after: int = 0, log: Path | None = None) -> dict[str, str]:
    """Environment variables that make a child process meet ``fault`` on paths containing ``match``."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {sorted(FAULTS)}")
    env = {"LD_PRELOAD": str(build_shim()), "PBG_FAULT": fault, "PBG_FAULT_MATCH": str(match),
           "PBG_FAULT_AFTER": str(after)}
    if log is not None:
        env["PBG_FAULT_LOG"] = str(log)
    return env


@contextlib.contextmanager
def small_tmpfs(mountpoint: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``mountpoint`` (unmounted after)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise FaultsUnavailable(f"cannot mount a tmpfs here: {done.stderr.strip()[:200]}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
