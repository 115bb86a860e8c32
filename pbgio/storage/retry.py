"""The one retry policy of remote storage: which failures are tried again, how often, how long apart.

Only operations that are safe to repeat go through :func:`call`: reads (a listing, an object's
size, a download, a ranged read), a whole-object upload of a staged local file (repeating it puts
the same bytes under the same name), a server-side copy. A failure is tried again when it is
*transient* (a connection reset, a time-out, a server error: :func:`is_transient`), at most
``PBG_STORAGE_RETRIES`` attempts in all (3 by default), ``0.1 s``, ``0.2 s`` … apart (doubling,
capped at 2 s). An attempt that itself ran for a whole ``PBG_STORAGE_TIMEOUT`` is not tried
again: the client has already tried that request several times, and a store that stops answering
must fail the command after a few time-outs, not hang it. A missing object, denied access, or any
error of pbgio's own is never retried.

>>> attempts = []
>>> def flaky():
...     attempts.append(1)
...     if len(attempts) < 2:
...         raise ConnectionResetError("connection reset by peer")
...     return "done"
>>> Policy(attempts=3, base_delay=0.0).call(flaky)
'done'
>>> len(attempts)
2
>>> is_transient(FileNotFoundError("s3://b/k")), is_transient(TimeoutError("read timed out"))
(False, True)
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pbgio.errors import PbgioError
from pbgio.storage.failures import StorageError, describe_failure

T = TypeVar("T")

TIMEOUT_ENV = "PBG_STORAGE_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 60.0
_MARK = "_pbg_retries_requests"
RETRIES_ENV = "PBG_STORAGE_RETRIES"
DEFAULT_ATTEMPTS = 3
_PERMANENT = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
_PERMANENT_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EEXIST, errno.EISDIR,
                               errno.ENOTDIR, errno.ENOSPC, errno.EROFS, errno.EINVAL})
_TRANSIENT_NAMES = ("timeout", "connection", "throttl", "serviceunavailable", "slowdown", "endpoint",
                    "serverdisconnected", "incompleteread", "responseparser", "clientpayload")


def is_transient(exc: BaseException) -> bool:
    """Whether trying ``exc``'s operation again may succeed: an OSError other than a missing file,
    denied access, a full or read-only store (s3fs turns a server error into ``OSError(EIO)``), or a
    network/client error named as a time-out, a lost connection or throttling (aiohttp's, botocore's)."""
    if isinstance(exc, (PbgioError, *_PERMANENT)):
        return False
    if isinstance(exc, OSError):
        return exc.errno not in _PERMANENT_ERRNOS
    name = type(exc).__name__.lower()
    return any(word in name for word in _TRANSIENT_NAMES)


@dataclass
class Counts:
    """What the policy did in this process (for reports and the fault campaign)."""

    retried: int = 0  # attempts that failed transiently and were tried again
    gave_up: int = 0  # transient failures left standing after the last attempt


COUNTS = Counts()
_COUNTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Policy:
    attempts: int = DEFAULT_ATTEMPTS
    base_delay: float = 0.1
    max_delay: float = 2.0
    attempt_timeout: float | None = None
    """An attempt that ran this long is not tried again (the storage time-out)."""

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1, 2 …)."""
        return float(min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))

    def call(self, operation: Callable[[], T]) -> T:
        """``operation()``, tried again on a transient failure as the policy allows; the last
        failure is raised as it came."""
        attempt = 1
        while True:
            started = time.monotonic()
            try:
                return operation()
            except Exception as exc:
                if not self._again(exc, time.monotonic() - started, attempt):
                    raise
            time.sleep(self.delay(attempt))
            attempt += 1

    async def call_async(self, operation: Callable[[], Awaitable[T]]) -> T:
        """:meth:`call` for a coroutine (a request on fsspec's event loop)."""
        attempt = 1
        while True:
            started = time.monotonic()
            try:
                return await operation()
            except Exception as exc:
                if not self._again(exc, time.monotonic() - started, attempt):
                    raise
            await asyncio.sleep(self.delay(attempt))
            attempt += 1

    def _again(self, exc: Exception, took: float, attempt: int) -> bool:
        slow = self.attempt_timeout is not None and took >= self.attempt_timeout
        transient = is_transient(exc)
        with _COUNTS_LOCK:
            if transient and (slow or attempt >= self.attempts):
                COUNTS.gave_up += 1
            elif transient:
                COUNTS.retried += 1
        return transient and not slow and attempt < self.attempts


def policy() -> Policy:
    """The policy in force: ``PBG_STORAGE_RETRIES`` attempts, ``PBG_STORAGE_TIMEOUT`` per attempt."""
    attempts = int(os.environ.get(RETRIES_ENV) or DEFAULT_ATTEMPTS)
    timeout = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_SECONDS)
    return Policy(attempts=max(1, attempts), attempt_timeout=timeout)


def call(operation: Callable[[], T]) -> T:
    """``operation()`` under the policy in force (:func:`policy`)."""
    return policy().call(operation)


def retries_requests(fs: Any) -> bool:
    """Whether ``fs`` retries each of its requests itself (:func:`retry_requests`)."""
    return bool(getattr(fs, _MARK, False))


def retry_requests(fs: Any) -> None:
    """Make S3 filesystem ``fs`` try each request again under :func:`policy` (once per instance).

    Every S3 request is safe to repeat (a GET, HEAD or listing; a PUT of a whole object or of one
    part; a DELETE; a server-side COPY), so on S3 the policy applies to each request, below every
    caller: listings and existence checks as much as ranged reads and uploads. The request is
    made by the class's own ``_call_s3`` looked up at each call."""
    if retries_requests(fs):
        return
    from fsspec.asyn import sync_wrapper

    async def call_s3(method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await policy().call_async(lambda: type(fs)._call_s3(fs, method, *args, **kwargs))
        except Exception as exc:
            if not is_transient(exc):
                if isinstance(exc, (OSError, PbgioError)):
                    raise  # a missing object, denied access …: the caller's to handle
                # botocore's own, never a pbgio error (a bucket name it refuses: ParamValidationError …)
                raise request_error(method, kwargs, exc, tried=False) from None
            raise request_error(method, kwargs, exc) from None

    def isfile(path: str) -> bool:  # fsspec's own answers False to any exception
        try:
            return bool(fs.info(path)["type"] == "file")
        except StorageError:
            raise  # a store that failed for good is not a missing file
        except Exception:
            return False

    fs._call_s3 = call_s3
    fs.call_s3 = sync_wrapper(call_s3, obj=fs)
    fs.isfile = isfile
    setattr(fs, _MARK, True)


_REQUESTS = {"get_object": "read", "head_object": "stat", "list_objects_v2": "list", "put_object": "upload",
             "upload_part": "upload", "create_multipart_upload": "upload", "complete_multipart_upload": "upload",
             "copy_object": "copy", "delete_object": "remove", "delete_objects": "remove", "head_bucket": "stat"}


def request_error(method: str, kwargs: dict[str, Any], exc: BaseException, *, tried: bool = True) -> Exception:
    """The :class:`~pbgio.storage.StorageError` of an S3 request that failed for good (``tried``: after
    the retry policy; else a request the client refused to make): it names the object's URL (its
    secrets redacted), the operation, and the last failure (any command prints it without a traceback)."""
    key = kwargs.get("Key") or kwargs.get("Prefix") or ""
    url = f"s3://{kwargs.get('Bucket', '')}/{key}".rstrip("/")
    what = _REQUESTS.get(method, method)
    return StorageError(url, f"{what}: {describe_failure(exc)}" + (" (given up after the storage retry policy)"
                                                                      if tried else ""))
