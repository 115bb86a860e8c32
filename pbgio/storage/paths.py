"""Where artifacts live: local paths, and fsspec URLs for layouts on remote storage.

Every location of a layout (``entity_path``, ``edge_paths``, ``checkpoint_path``, ``init_path``, a CLI
argument) is a plain path, a ``file://`` URL, or any URL that fsspec knows (``s3://``, ``gs://``,
``abfs://``, ``hdfs://``, ``memory://`` …). :func:`resolve` turns it into a path object: a
:class:`pathlib.Path` for local storage, a :class:`upath.UPath` (the pathlib API over fsspec) for
remote storage, so readers and writers handle both with one code path. What only remote
storage needs lives here:

- Credentials and endpoints (``storage_options``) come from fsspec's own configuration
  (``~/.config/fsspec``, ``FSSPEC_*`` variables) and the client's environment (``AWS_*``, …),
  never from a config file; :func:`redact` hides secrets that a URL carries, in every message.
- Writes go to a local staging file first (HDF5 needs a seekable local file) and are uploaded as
  one object (:func:`staged`): on object stores a single-object write is atomic, so a reader sees
  the old object or the complete new one. Stores with a real rename (HDFS, SFTP …) get an upload
  to a temporary name and a rename.
- Remote failures (missing object, access denied, time-out, a server gone) become
  :class:`StorageError` naming the (redacted) URL and the operation (:func:`remote_errors`);
  operations safe to repeat (reads, the upload of a staged file, a server-side copy) go through
  :func:`remote_call`, which tries a transient failure again under :mod:`pbgio.storage.retry`'s policy.
- :class:`LocalCache` keeps local copies of remote files that are read again and again (edge
  buckets, once an epoch), bounded in bytes.

>>> resolve("file:///tmp/graph").as_posix()
'/tmp/graph'
>>> resolve("data/edges", base=Path("/srv/project")).as_posix()
'/srv/project/data/edges'
>>> redact("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/graph")
's3://***@bucket/graph'
>>> redact("abfs://c/graph?sv=2024&sig=abc123&se=2026")
'abfs://c/graph?sv=2024&sig=***&se=2026'
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import os
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, Union

from typing_extensions import TypeIs

from pbgio import confinement
from pbgio.console import redact
from pbgio.errors import MissingArtifactError, PbgioError, UnsafeWriteError
from pbgio.storage import retry
from pbgio.storage.failures import StorageError, UnsupportedStorageError, describe_failure
from pbgio.storage.retry import DEFAULT_TIMEOUT_SECONDS, TIMEOUT_ENV

if TYPE_CHECKING:
    from upath import UPath

T = TypeVar("T")
AnyPath = Union[Path, "UPath"]
"""A local path or a remote one (both speak the pathlib API)."""

_SCHEME_RE = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]+)://")
LOCAL_SCHEMES = frozenset({"file", "local"})
REMOTE_EXTRA = "pip install 'pbg[remote]'"
READ_BLOCK_BYTES = 8 << 20
"""Ranged reads of remote files fetch this much at a time."""
READ_CACHE_BLOCKS = 8
"""Blocks a remote file keeps (least recently used dropped): the memory an open remote file holds
is at most ``READ_CACHE_BLOCKS * READ_BLOCK_BYTES``. Enough for readers that walk several datasets
of a bucket side by side to fetch each byte once."""
_READ_ONLY_WEB = frozenset({"http", "https"})
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "memory", "oci", "oss"})


def scheme_of(location: str) -> str | None:
    """The URL scheme of ``location`` in lower case, or None for a plain path."""
    m = _SCHEME_RE.match(location)
    return m["scheme"].lower() if m else None


def is_remote(path: AnyPath) -> TypeIs[UPath]:
    """Whether ``path`` lives on remote storage (anything but a local :class:`~pathlib.Path`)."""
    return not isinstance(path, Path)



def resolve(location: str | os.PathLike[str] | AnyPath, base: AnyPath | None = None) -> AnyPath:
    """The path object for ``location``; a relative path resolves against ``base``.

    Plain paths and ``file://`` URLs give a :class:`~pathlib.Path`; other URLs a remote path
    (an unknown scheme, or one whose fsspec implementation is not installed, raises
    :class:`UnsupportedStorageError` saying what to install).
    """
    if isinstance(location, Path):
        path: AnyPath = location
    elif isinstance(location, str):
        scheme = scheme_of(location)
        if scheme is None:
            path = Path(location)
        elif scheme in LOCAL_SCHEMES:
            path = Path("/" + location[len(scheme) + 3:].lstrip("/"))
        else:
            return remote_path(location)
    elif hasattr(location, "fs"):  # already a remote path
        return location  # type: ignore[return-value]
    else:
        path = Path(location)
    if base is not None and not path.is_absolute():
        return base / path
    return path


def local_path(location: str | os.PathLike[str], base: Path | None = None) -> Path:
    """The local path ``location`` names, for work that needs local files (a remote URL raises
    :class:`UnsupportedStorageError`; callers stage remote data with :func:`copy_tree` first)."""
    path = resolve(location, base)
    if is_remote(path):
        raise UnsupportedStorageError(location, "expected a local path here")
    return path


def remote_path(url: str) -> UPath:
    """The :class:`upath.UPath` of a remote URL, its filesystem configured by :func:`storage_options`."""
    scheme = scheme_of(url) or ""
    confinement.check_url(url)  # in a command: only storage the user named (docs/security.md)
    try:
        import fsspec
        from upath import UPath
    except ImportError:
        raise UnsupportedStorageError(
            url, f"remote storage needs fsspec and universal-pathlib: {REMOTE_EXTRA}") from None
    try:
        implementation = fsspec.get_filesystem_class(scheme)
        if implementation.__module__.startswith("fsspec.implementations.arrow"):
            import pyarrow  # noqa: F401  (imported lazily by fsspec; say what is missing up front)
    except ValueError:
        raise UnsupportedStorageError(url, f"storage scheme {scheme!r} is not known to fsspec") from None
    except ImportError as exc:
        hint = ("pip install pyarrow; HDFS also needs libhdfs and a JVM (docs/guides/remote.md)"
                if scheme in ("hdfs", "viewfs") else f"for s3:// {REMOTE_EXTRA}")
        raise UnsupportedStorageError(url, f"storage scheme {scheme!r} needs a package that is not installed "
                                           f"({str(exc).splitlines()[0]}); {hint}") from None
    try:
        remote: UPath = UPath(url, **storage_options(scheme))
    except Exception as exc:  # the library cannot parse the URL (a secret read as a port …): one line; its
        # message is left out, as it may quote a piece of the URL's user info
        raise StorageError(url, f"not a URL the {scheme} storage library can parse ({type(exc).__name__})") from None
    if scheme in ("s3", "s3a"):
        # s3fs retries a failed request 5 times around botocore's own retries: an unanswering store
        # would then take 5 x 3 timeouts per request. Instead each request goes through pbgio's one
        # policy (pbgio.storage.retry), around botocore's 3 attempts; it does not repeat an attempt
        # that ran a whole timeout, so an unanswering store still fails after about 3 timeouts.
        remote.fs.retries = 1
        retry.retry_requests(remote.fs)
    return remote


def storage_options(scheme: str) -> dict[str, Any]:
    """Options for the filesystem of ``scheme``: fsspec's configuration for it, over pbgio's defaults.

    The defaults hold no secret: listings are not cached (several processes share a layout), and
    an S3 request that gets no answer for ``PBG_STORAGE_TIMEOUT`` seconds (60 by default) is tried
    again at most twice, so an unanswering store fails an operation after about 3 timeouts.
    """
    import fsspec.config

    timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_SECONDS))
    options: dict[str, Any] = {"use_listings_cache": False}
    if scheme in ("s3", "s3a"):
        options["config_kwargs"] = {"connect_timeout": timeout, "read_timeout": timeout,
                                    "retries": {"max_attempts": 3, "mode": "standard"}}
    options.update(fsspec.config.conf.get(scheme, {}))
    return options


def absolute(path: AnyPath) -> AnyPath:
    """``path`` made absolute with symlinks resolved (remote paths are absolute already); a path
    through a symbolic link loop is made absolute without resolving (see :func:`link_problem`)."""
    if is_remote(path):
        return path
    try:
        return path.resolve()
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
        return Path(os.path.abspath(path))


def link_problem(path: AnyPath) -> str | None:
    """What stops a local ``path`` from being reached through its symbolic links, for messages:
    ``"a symbolic link loop"``, ``"a symbolic link to nothing (TARGET)"``; None when nothing does.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "self").symlink_to("self")
    >>> link_problem(d / "self"), link_problem(d / "self" / "below"), link_problem(d)
    ('a symbolic link loop', 'a symbolic link loop', None)
    """
    if is_remote(path):
        return None
    try:
        os.stat(path)
        return None
    except ValueError:  # a NUL in the path: nothing to follow (found_at says why it cannot be looked up)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
    with contextlib.suppress(OSError):
        if os.path.islink(path):
            return f"a symbolic link to nothing ({os.readlink(path)})"
    return None


def found_at(path: AnyPath) -> str:
    """What ``path`` holds, for "expected …, found …" messages: nothing, a file, a directory, or
    a broken symbolic link (:func:`link_problem`)."""
    if "\x00" in str(path):
        return "a path the system cannot look up (a NUL character in it)"
    problem = link_problem(path)
    if problem is not None:
        return problem
    try:
        if path.is_dir():
            return "a directory"
        if path.is_file():
            return "a file"
        return "something other than a file or directory" if path.exists() else "nothing"
    except OSError as exc:  # e.g. a name longer than the file system allows
        return f"a path the system cannot look up ({exc.strerror or type(exc).__name__})"


def children(path: AnyPath) -> list[AnyPath]:
    """The entries of directory ``path``, sorted by name (remote failures become pbgio errors)."""
    found: list[AnyPath] = remote_call(path, "list", lambda: list(path.iterdir()))
    return sorted(found, key=lambda p: p.name)


def glob(path: AnyPath, pattern: str) -> list[AnyPath]:
    """The entries of ``path`` matching ``pattern``, sorted by name."""
    found: list[AnyPath] = remote_call(path, "list", lambda: list(path.glob(pattern)))
    return sorted(found, key=lambda p: p.name)


def display(path: object) -> str:
    """``path`` as messages show it (secrets redacted)."""
    return redact(str(path))


@contextlib.contextmanager
def remote_errors(path: AnyPath, what: str) -> Iterator[None]:
    """Turn a failure of remote storage while handling ``path`` into a pbgio error naming it.

    A missing object becomes :class:`~pbgio.errors.MissingArtifactError`; anything else the store
    or the network raised a :class:`StorageError`. Local paths pass errors through unchanged.
    """
    try:
        yield
    except PbgioError:
        raise
    except FileNotFoundError:
        if not is_remote(path):
            raise
        raise MissingArtifactError(display(path), what) from None
    except Exception as exc:
        if not is_remote(path):
            raise
        raise StorageError(path, f"{what}: {describe_failure(exc)}") from None


def remote_call(path: AnyPath, what: str, operation: Callable[[], T]) -> T:
    """``operation()`` on ``path``, an operation that is safe to repeat (a read, the upload of a
    staged file, a server-side copy): on remote storage a transient failure is tried again under
    :func:`pbgio.storage.retry.policy`, and the last failure becomes a pbgio error naming ``path``
    and ``what`` (:func:`remote_errors`). Local paths run ``operation`` once, errors unchanged."""
    if not is_remote(path):
        return operation()
    with remote_errors(path, what):
        if retry.retries_requests(path.fs):  # S3: each request is retried already
            return operation()
        return retry.call(operation)


# ---------------------------------------------------------------------------------------- reading


def open_binary(path: AnyPath, what: str = "file") -> BinaryIO:
    """``path`` opened for reading bytes; remote files read in ranged blocks of
    :data:`READ_BLOCK_BYTES`, at most :data:`READ_CACHE_BLOCKS` of them kept. A missing remote
    object raises :class:`~pbgio.errors.MissingArtifactError`, denied access :class:`StorageError`."""
    if not is_remote(path):
        return open(path, "rb")
    opened: BinaryIO = remote_call(path, what, lambda: path.fs.open(
        path.path, "rb", block_size=READ_BLOCK_BYTES, cache_type="blockcache",
        cache_options={"maxblocks": READ_CACHE_BLOCKS}))
    return RetryingReader(opened, path, what)  # type: ignore[return-value]


class RetryingReader(io.RawIOBase):
    """A remote file opened for reading whose reads (ranged requests: idempotent) are tried again
    on a transient failure (:func:`remote_call`), from the same offset; h5py reads through it."""

    def __init__(self, raw: BinaryIO, path: AnyPath, what: str) -> None:
        super().__init__()
        self._raw = raw
        self._path = path
        self._what = what

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    def read(self, size: int | None = -1) -> bytes:
        start = self._raw.tell()

        def once() -> bytes:
            self._raw.seek(start)
            return self._raw.read(-1 if size is None else size)

        return remote_call(self._path, self._what, once)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def file_size(path: AnyPath) -> int:
    return remote_call(path, "size", lambda: int(path.stat().st_size))


# ---------------------------------------------------------------------------------------- writing


@contextlib.contextmanager
def staged(path: UPath) -> Iterator[Path]:
    """A local file to write in place of remote ``path``; on success it is uploaded and verified.

    Object stores get one single-object upload to the final name (atomic there); other stores an
    upload to a temporary name and a rename. On failure nothing is uploaded.
    """
    stage = Path(tempfile.mkdtemp(prefix="pbg-stage-"))
    confinement.admit(stage, write=True)  # the command's own staging: written before it is uploaded
    try:
        local = stage / (path.name or "file")
        yield local
        upload(local, path)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def upload(local: Path, path: UPath) -> None:
    """Copy ``local`` to remote ``path`` and check that the store holds every byte."""
    size = local.stat().st_size
    fs, target = path.fs, path.path
    if _protocol(path) in _READ_ONLY_WEB:
        raise UnsafeWriteError(display(path), "pbg never writes to a web server (http, https): its uploads "
                                              "would be requests to whatever host a URL names")

    def put() -> object:  # the whole object again on a retry: the same bytes under the same name
        if _protocol(path) in _OBJECT_STORES:
            fs.put_file(str(local), target)
        else:
            tmp = f"{target}.uploading"
            fs.put_file(str(local), tmp)
            fs.mv(tmp, target)
        return fs.info(target).get("size")

    stored = remote_call(path, "upload", put)
    if stored != size:
        raise StorageError(path, f"upload incomplete: wrote {size} bytes, the store holds {stored}")


def upload_bytes(path: UPath, data: bytes) -> None:
    """Write a small remote object in one request (atomic on object stores)."""
    with staged(path) as local:
        local.write_bytes(data)


def _protocol(path: UPath) -> str:
    protocol = path.fs.protocol
    return str(protocol[0] if isinstance(protocol, tuple | list) else protocol)


# ---------------------------------------------------------------------------------------- caching


class LocalCache:
    """Local copies of remote files, least recently used dropped past ``max_bytes``.

    A copy is keyed by the URL and the object's size and modification stamp (ETag where the store
    has one), so a file replaced on the store is fetched again. Local paths pass through.

    >>> cache = LocalCache(max_bytes=1 << 20)
    >>> cache.local(Path("/data/edges_0_0.h5")).as_posix()
    '/data/edges_0_0.h5'
    """

    def __init__(self, max_bytes: int, directory: Path | None = None) -> None:
        self.max_bytes = max_bytes
        self._dir = directory
        self._entries: OrderedDict[str, tuple[Path, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.hits = 0

    @property
    def directory(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="pbg-cache-"))
            confinement.admit(self._dir, write=True)  # the command's own copies: read where the layout's are
        return self._dir

    def local(self, path: AnyPath) -> Path:
        """A local file with the bytes of ``path``, fetched unless a current copy is cached."""
        if not is_remote(path):
            return path
        info = remote_call(path, "read", lambda: path.fs.info(path.path))
        size = int(info.get("size") or 0)
        stamp = str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
                    or info.get("created") or "")
        key = hashlib.sha256(f"{path}\0{size}\0{stamp}".encode()).hexdigest()[:32]
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit[0]
        local = self.directory / f"{key}-{path.name}"
        remote_call(path, "download", lambda: path.fs.get_file(path.path, str(local)))
        with self._lock:
            self.bytes_fetched += size
            self._entries[key] = (local, size)
            self._evict(keep=key)
        return local

    def _evict(self, keep: str) -> None:
        total = sum(size for _, size in self._entries.values())
        for key in list(self._entries):
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            local, size = self._entries.pop(key)
            local.unlink(missing_ok=True)
            total -= size

    def close(self) -> None:
        """Delete every cached copy."""
        with self._lock:
            self._entries.clear()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


@contextlib.contextmanager
def relocated(cache: LocalCache, path: AnyPath) -> Iterator[Path]:
    """A local copy of ``path`` from ``cache``; format errors found in it name ``path``, not the copy."""
    from dataclasses import replace

    from pbgio.errors import FormatError

    local = cache.local(path)
    if local is path:
        yield local
        return
    try:
        yield local
    except FormatError as exc:
        if exc.issue.file != str(local):
            raise
        moved = copy.copy(exc)  # the same class, whatever its constructor takes
        FormatError.__init__(moved, replace(exc.issue, file=display(path)), more=exc.more)
        raise moved from None
