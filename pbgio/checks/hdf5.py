"""The HDF5 rules every ``.h5`` file of the format keeps: ``h5-unreadable``, ``h5-format-version``,
``h5-external-link`` and ``h5-size-bound`` (the last two checked as the file opens:
:func:`pbgio.formats.h5guard.check_contained`).

>>> print(format_version("edges_0_0.h5", None))
edges_0_0.h5: expected root attribute format_version=1, found none [h5-format-version]
>>> format_version("edges_0_0.h5", 1) is None
True
>>> print(external_link("edges_0_0.h5", "lhs", "an external link to", "/etc/passwd", "/x"))
edges_0_0.h5: lhs: expected data inside this file, found an external link to /etc/passwd (object /x) [h5-...]
>>> print(size_bound("edges_0_0.h5", "lhs", chunk_bytes=1 << 31, claimed=800, stored=10, compressing=1).message)
expected filtered chunks that inflate to at most 67,108,864 bytes (64 MiB), found chunks of 2,147,483,648 bytes
>>> size_bound("edges_0_0.h5", "lhs", chunk_bytes=1 << 20, claimed=10_320, stored=10, compressing=1) is None
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pbgio.errors import Issue
from pbgio.spec import FORMAT_VERSION, FORMAT_VERSION_ATTR
from pbgio.spec.rules import rule

MAX_FILTERED_CHUNK_BYTES = 64 << 20
"""Bytes a chunk of a filtered dataset may inflate to (``h5-size-bound``): 64 MiB. Each read of a
filtered chunk inflates it whole, so one 2 GiB chunk would cost 2 GiB of memory and its full inflation
at every read; pbg's writers and the original's write unfiltered chunks, which are not bounded."""
DEFLATE_MAX_RATIO = 1032
"""Bytes a compressing filter may give back per stored byte (``h5-size-bound``): deflate's greatest ratio,
about 1032:1, allowed to every compressing filter of a pipeline."""
NON_COMPRESSING_FILTERS = frozenset({2, 3})
"""HDF5 filter ids that do not compress: shuffle (``H5Z_FILTER_SHUFFLE``, 2) and fletcher32
(``H5Z_FILTER_FLETCHER32``, 3). Every other filter counts as compressing (deflate, lzf, szip,
scaleoffset, nbit, plugins)."""


def unreadable(file: str | None, dataset: str | None, message: str) -> Issue:
    """``h5-unreadable``: the file does not open as HDF5, or does not store what it claims
    (``message`` says what was expected and found: a signature, bytes, chunks, intact structures)."""
    return rule("h5-unreadable").issue(file, dataset, message)


def format_version(file: str | None, found: Any) -> Issue | None:
    """``h5-format-version``: ``found``, the root attribute ``format_version`` (None: absent), is 1."""
    if _is_version(found):
        return None
    return rule("h5-format-version").issue(
        file, None, f"expected root attribute {FORMAT_VERSION_ATTR}={FORMAT_VERSION}, "
        f"found {'none' if found is None else repr(found)}")


def _is_version(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            return False
        value = value.reshape(()).item()
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == FORMAT_VERSION


def external_link(file: str | None, where: str, kind: str, target: str, obj: str | None = None) -> Issue:
    """``h5-external-link``: the link or dataset at ``where`` (its path inside the file) reads another
    file: ``kind`` (an external link to, a user-defined link to, external raw storage in, a virtual
    dataset mapping) ``target`` (a file name; ``obj``, the object inside it, when known)."""
    inside = f" (object {_shown(obj)})" if obj else ""
    return rule("h5-external-link").issue(
        file, where, f"expected data inside this file, found {kind} {_shown(target)}{inside}")


def compressing_filters(filter_ids: list[int] | tuple[int, ...]) -> int:
    """How many of a pipeline's filters compress (all but :data:`NON_COMPRESSING_FILTERS`).

    >>> compressing_filters((2, 1, 3))
    1
    """
    return sum(1 for code in filter_ids if code not in NON_COMPRESSING_FILTERS)


def size_bound(file: str | None, dataset: str, *, chunk_bytes: int, claimed: int, stored: int,
               compressing: int) -> Issue | None:
    """``h5-size-bound`` for a filtered chunked dataset: a chunk inflates to ``chunk_bytes``, at most
    :data:`MAX_FILTERED_CHUNK_BYTES`; the dataset claims ``claimed`` bytes, at most its ``stored`` bytes
    times :data:`DEFLATE_MAX_RATIO` per compressing filter (``compressing`` of them)."""
    if chunk_bytes > MAX_FILTERED_CHUNK_BYTES:
        return rule("h5-size-bound").issue(
            file, dataset, f"expected filtered chunks that inflate to at most {MAX_FILTERED_CHUNK_BYTES:,} bytes "
            f"({MAX_FILTERED_CHUNK_BYTES >> 20} MiB), found chunks of {chunk_bytes:,} bytes")
    bound = stored * DEFLATE_MAX_RATIO ** compressing
    if claimed > bound:
        filters = f"{compressing} compressing filter{'' if compressing == 1 else 's'}"
        return rule("h5-size-bound").issue(
            file, dataset, f"expected at most {bound:,} bytes from its {stored:,} stored bytes ({filters}, "
            f"each at most {DEFLATE_MAX_RATIO}:1), found {claimed:,} bytes claimed")
    return None


def _shown(text: str) -> str:
    """``text`` with its control characters escaped (a file name taken from a file is data)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
