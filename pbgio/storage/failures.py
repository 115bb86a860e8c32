"""The errors of remote storage, and the one-line reasons they give (a layer below
:mod:`pbgio.storage.paths` and :mod:`pbgio.storage.retry`, which both raise them).

>>> describe_failure(TimeoutError("read timed out"))
'timed out (read timed out)'
"""

from __future__ import annotations

from pbgio.console import redact
from pbgio.errors import PbgioError


class StorageError(PbgioError):
    """Remote storage failed: a missing bucket, denied access, a time-out, a server gone.

    The message names the URL, with any secret it carries redacted.
    """

    def __init__(self, location: object, reason: str) -> None:
        self.url = redact(str(location))
        super().__init__(f"{self.url}: {redact(reason)}")


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
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
