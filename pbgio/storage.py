"""Where artifacts live: a URL or path becomes a local directory.

Only local paths (plain or ``file://``) are supported today. Remote schemes
(``hdfs://``, ``s3://`` …) will plug in here through fsspec; until then they are
refused with a clear error instead of being treated as odd local paths.

>>> local_path("file:///tmp/graph").as_posix()
'/tmp/graph'
>>> local_path("hdfs://cluster/graph")
Traceback (most recent call last):
...
pbgio.storage.UnsupportedStorageError: hdfs://cluster/graph: storage scheme 'hdfs' is not supported yet; ...
"""

from __future__ import annotations

import re
from pathlib import Path

from pbgio.errors import PbgioError

_SCHEME_RE = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]+)://")


class UnsupportedStorageError(PbgioError):
    """A path with a storage scheme pbgio cannot read or write."""


def local_path(location: str | Path, base: Path | None = None) -> Path:
    """The local directory or file ``location`` names, relative paths against ``base``."""
    if isinstance(location, Path):
        path = location
    else:
        m = _SCHEME_RE.match(location)
        if m and m["scheme"].lower() != "file":
            raise UnsupportedStorageError(
                f"{location}: storage scheme {m['scheme']!r} is not supported yet; use a local path"
            )
        path = Path(location[len(m.group(0)):] if m else location)
        if m:
            path = Path("/" + str(path).lstrip("/"))
    if base is not None and not path.is_absolute():
        path = base / path
    return path
