"""Storage: where a layout's files live and how they are written (a layer of :mod:`pbgio`).

- :mod:`pbgio.storage.paths`: local paths and fsspec URLs, remote staging and errors, the
  bounded local copies of remote files (:class:`LocalCache`).
- :mod:`pbgio.storage.retry`: the one retry policy of remote storage (what is tried again, how
  often); :mod:`pbgio.storage.failures`: its errors (:class:`StorageError`).
- :mod:`pbgio.storage.atomic`: atomic writes (temporary file, fsync, rename) and copies.
- :mod:`pbgio.storage.lock`: the single-writer lock of a checkpoint directory.

This package is their public face (``from pbgio import storage``; tools such as
pbgtrain use these names, not the modules behind them):

>>> from pbgio import storage
>>> storage.display(storage.resolve("file:///tmp/graph"))
'/tmp/graph'
"""

from __future__ import annotations

from pbgio.console import redact
from pbgio.storage.atomic import copy_file, copy_tree, together, write_bytes, write_text
from pbgio.storage.failures import StorageError, UnsupportedStorageError, describe_failure
from pbgio.storage.lock import CheckpointLock, Holder, holder_of
from pbgio.storage.paths import (
    LOCAL_SCHEMES,
    READ_BLOCK_BYTES,
    READ_CACHE_BLOCKS,
    REMOTE_EXTRA,
    AnyPath,
    LocalCache,
    absolute,
    children,
    display,
    file_size,
    found_at,
    glob,
    is_remote,
    link_problem,
    local_path,
    open_binary,
    relocated,
    remote_call,
    remote_errors,
    remote_path,
    resolve,
    scheme_of,
    staged,
    storage_options,
    upload,
    upload_bytes,
)
from pbgio.storage.retry import DEFAULT_TIMEOUT_SECONDS, RETRIES_ENV, TIMEOUT_ENV

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS", "LOCAL_SCHEMES", "READ_BLOCK_BYTES", "READ_CACHE_BLOCKS", "REMOTE_EXTRA",
    "RETRIES_ENV", "TIMEOUT_ENV", "AnyPath", "CheckpointLock", "Holder", "LocalCache", "StorageError",
    "UnsupportedStorageError", "absolute", "children", "copy_file", "copy_tree", "describe_failure",
    "display", "file_size", "found_at", "glob", "holder_of", "is_remote", "link_problem", "local_path",
    "open_binary", "redact", "relocated", "remote_call", "remote_errors", "remote_path", "resolve", "scheme_of",
    "staged", "storage_options", "together", "upload", "upload_bytes", "write_bytes", "write_text",
]
