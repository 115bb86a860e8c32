"""The errors of remote storage, and the one-line reasons they give (a layer below
:mod:`pbgio.storage.paths` and :mod:`pbgio.storage.retry`, which both raise them).

>>> describe_failure(TimeoutError("read timed out"))
'timed out (read timed out)'
"""

from __future__ import annotations

from pbgio.console import redact, redact_foreign, secrets_in
from pbgio.errors import PbgioError


class StorageError(PbgioError):
    """Remote storage failed: a missing bucket, denied access, a time-out, a server gone.

    The message names the URL, with any secret it carries redacted; the reason (often a storage
    library's message, which may quote a bucket name holding the URL's user info without the URL
    around it) has the URL's secrets removed too (:func:`pbgio.console.redact_foreign`).

    >>> str(StorageError("s3://KEY:SEC@RET@bucket/x", 'stat: Invalid bucket name "key:SEC@RET@bucket"'))
    's3://***@bucket/x: stat: Invalid bucket name "***@bucket"'
    """

    def __init__(self, location: object, reason: str) -> None:
        self.url = redact(str(location))
        super().__init__(f"{self.url}: {redact_foreign(reason, secrets_in(str(location)))}")


class UnsupportedStorageError(StorageError):
    """A URL whose scheme fsspec does not know, or whose implementation is not installed."""


def describe_failure(exc: BaseException) -> str:
    """A one-line reason for a remote failure."""
    if isinstance(exc, PermissionError):
        return f"access denied ({_first_line(exc)})"
    if isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        return f"timed out ({_first_line(exc)})"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, with the next one when it only announces it (botocore's
    ``Parameter validation failed:``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return " ".join(lines[:2]) if lines[0].endswith(":") and len(lines) > 1 else lines[0]
