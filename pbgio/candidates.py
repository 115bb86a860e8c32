"""Which entities a search may return: a filter on the candidates' names.

``pbgio neighbors`` and ``pbgtrain predict`` rank every entity of a type; a
:class:`CandidateFilter` keeps those whose name starts with one of its prefixes
(``--candidates PREFIX``, repeatable) or is one of its exact names (``--candidates-file FILE``,
one name per line): with one entity type and dynamic relations, the way to ask for libraries
and not categories. Prefixes are case-sensitive, as names are.

:meth:`CandidateFilter.rows` reads the type's names files (streamed, a chunk at a time) into
:class:`AdmittedRows`: one boolean per row of every partition (memory: a byte per row of the
type), the rows a scan may score (:func:`pbgio.topk.scan_partitions`'s ``admitted``) and an
index search may keep (:func:`pbgio.index.widening.widened_proposals`). A filter no row passes
raises :class:`NoCandidatesError`, naming what the filter was given; the command lines exit 1
on it, as on an unknown name.

>>> import tempfile, pathlib
>>> from pbgio.entities import write_entity_names
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_entity_names(d, "pkg", 0, ["lib-numpy", "cat-science", "lib-scipy"])
>>> only = CandidateFilter(prefixes=("lib-",))
>>> admitted = only.rows(d, "pkg", [3])
>>> admitted.count, admitted.mask(0).tolist(), only.describe()
(2, [True, False, True], "names starting with 'lib-'")
>>> try:
...     CandidateFilter(prefixes=("zz",), given="--candidates zz").rows(d, "pkg", [3])
... except NoCandidatesError as exc:
...     print(str(exc).split(" (")[0])
--candidates zz: no 'pkg' entity has a name starting with 'zz'
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.entities import iter_entity_names
from pbgio.errors import PbgioError, UsageError
from pbgio.names import Position, names_command
from pbgio.storage import AnyPath

Mask = NDArray[np.bool_]


class NoCandidatesError(PbgioError, LookupError):
    """No entity of the candidates' type passes a :class:`CandidateFilter` (exit 1, as an unknown name)."""


@dataclass(frozen=True)
class CandidateFilter:
    """Candidates whose name starts with one of ``prefixes`` or is one of ``names`` (read from
    ``names_file``, when given). ``given``: how the user gave it, for messages (the command
    lines' options; empty from Python)."""

    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    names_file: str | None = None
    given: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.prefixes and self.names_file is None and not self.names:
            raise UsageError(f"{self.given or 'candidate filter'}: expected a name prefix or a file of names, "
                             "found neither")
        for prefix in self.prefixes:
            if not prefix:
                raise UsageError(f"{self.given or 'candidate filter'}: expected a non-empty name prefix (an empty "
                                 "one keeps every entity: leave the option out)")

    @classmethod
    def from_options(cls, prefixes: Sequence[str] | None, names_file: str | None) -> CandidateFilter | None:
        """The filter of ``--candidates PREFIX`` (repeatable) and ``--candidates-file FILE``, None
        when neither is given. An empty prefix, or a file that cannot be read or holds no
        names, raises :class:`~pbgio.errors.UsageError` naming the option (exit 2)."""
        prefixes = tuple(prefixes or ())
        if not prefixes and names_file is None:
            return None
        given = ", ".join([*(f"--candidates {shlex.quote(p)}" for p in prefixes),
                           *([f"--candidates-file {shlex.quote(names_file)}"] if names_file is not None else [])])
        names = frozenset() if names_file is None else _read_names_file(names_file)
        return cls(prefixes, names, names_file, given)

    def admits(self, name: str) -> bool:
        """Whether an entity named ``name`` may be a candidate."""
        return name in self.names or name.startswith(self.prefixes)

    def describe(self) -> str:
        """What passes, in words: ``names starting with 'lib-' or 'pkg-'``, ``the 120 names of
        tools.txt``, or both joined by ``or``."""
        parts = []
        if self.prefixes:
            parts.append("names starting with " + " or ".join(repr(p) for p in self.prefixes))
        if self.names_file is not None or self.names:
            source = f" of {self.names_file}" if self.names_file is not None else ""
            parts.append(f"the {len(self.names):,} name{'s' if len(self.names) != 1 else ''}{source}")
        return ", or ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the prefixes, the names file and how many names it holds."""
        return {"prefixes": list(self.prefixes), "names_file": self.names_file, "names": len(self.names)}

    def rows(self, entity_path: AnyPath, entity_type: str, partition_rows: Sequence[int]) -> AdmittedRows:
        """The rows of ``entity_type`` that pass (partition ``p`` has ``partition_rows[p]`` rows;
        a row without a name passes no filter), from its names files, streamed. None passing
        raises :class:`NoCandidatesError`."""
        masks = []
        matched: set[str] = set()
        for part, num_rows in enumerate(partition_rows):
            mask = np.zeros(num_rows, dtype=bool)
            row = 0
            for chunk in iter_entity_names(entity_path, entity_type, part):
                kept = [i for i, name in enumerate(chunk[:max(num_rows - row, 0)]) if self.admits(name)]
                mask[np.asarray(kept, dtype=np.int64) + row] = True
                if self.names:
                    matched.update(self.names.intersection(chunk))
                row += len(chunk)
            masks.append(mask)
        admitted = AdmittedRows(tuple(masks), self, len(matched))
        if not admitted.count:
            raise NoCandidatesError(self._nothing_passes(entity_type))
        return admitted

    def _nothing_passes(self, entity_type: str) -> str:
        what = []
        if self.prefixes:
            what.append("a name starting with " + " or ".join(repr(p) for p in self.prefixes))
        if self.names_file is not None or self.names:
            what.append(f"one of the {len(self.names):,} names"
                        + (f" of {self.names_file}" if self.names_file is not None else ""))
        message = f"no {entity_type!r} entity has {', or '.join(what)}"
        if self.prefixes:
            listing = " ".join(f"{names_command(entity_type)} {shlex.quote(p)}" for p in self.prefixes[:1])
            message += f" ({listing} lists the names that contain it)"
        if any(p.isdigit() for p in self.prefixes):
            message += ("; --candidates takes a name prefix: the rows an index proposes per query are "
                        "--proposals N")
        return f"{self.given}: {message}" if self.given else message


def old_form_proposals(prefixes: Sequence[str] | None, names_file: str | None, index: bool,
                       proposals: int | None) -> int | None:
    """``--candidates N`` as the command lines took it before the filter existed: with ``--index``,
    the rows the index proposes per query (now ``--proposals N``). Taken so for one release, with a
    warning on stderr, when it can mean nothing else the user could have written before: one
    ``--candidates`` that is a positive whole number, with ``--index``, without ``--proposals`` and
    ``--candidates-file``. None otherwise (the value is a name prefix).

    >>> old_form_proposals(["200"], None, False, None) is None  # without --index it never meant that
    True
    >>> old_form_proposals(["lib-"], None, True, None) is None
    True
    """
    import warnings

    from pbgio.errors import RenamedOptionWarning

    values = list(prefixes or ())
    if not (index and proposals is None and names_file is None and len(values) == 1 and values[0].isdigit()
            and int(values[0]) > 0):
        return None
    warnings.warn(f"--candidates {values[0]} with --index is the old spelling of --proposals {values[0]} (the rows "
                  "the index proposes per query) and is taken so; from the next release --candidates is only a name "
                  f"prefix: write --proposals {values[0]} (and, for names starting with {values[0]}, give --proposals "
                  "too)", RenamedOptionWarning, stacklevel=2)
    return int(values[0])


@dataclass(frozen=True)
class AdmittedRows:
    """The rows of one entity type that a :class:`CandidateFilter` lets be candidates: one mask
    per partition. ``file_names_found``: how many of the filter's exact names are names of the type."""

    masks: tuple[Mask, ...]
    filter: CandidateFilter
    file_names_found: int = 0

    @property
    def count(self) -> int:
        """Rows that pass, over every partition."""
        return sum(int(mask.sum()) for mask in self.masks)

    @property
    def total(self) -> int:
        """Rows of the type."""
        return sum(len(mask) for mask in self.masks)

    @property
    def share(self) -> float:
        """The share of the type's rows that pass (0 < share <= 1)."""
        return self.count / max(self.total, 1)

    def mask(self, part: int) -> Mask:
        """Partition ``part``'s rows that pass."""
        return self.masks[part]

    def by_partition(self) -> dict[int, Mask]:
        """``{partition: mask}``, as :func:`pbgio.topk.scan_partitions` takes it (``admitted``)."""
        return dict(enumerate(self.masks))

    def admits(self, partitions: NDArray[np.int64], offsets: NDArray[np.int64]) -> Mask:
        """Whether each row ``(partitions[i], offsets[i])`` passes (a position out of the type's rows does not)."""
        parts = np.asarray(partitions, dtype=np.int64)
        offs = np.asarray(offsets, dtype=np.int64)
        out = np.zeros(parts.shape, dtype=bool)
        for part in np.unique(parts[parts >= 0]):
            at = parts == part
            mask = self.masks[int(part)] if int(part) < len(self.masks) else np.zeros(0, dtype=bool)
            inside = at & (offs >= 0) & (offs < len(mask))
            out[inside] = mask[offs[inside]]
        return out

    def admits_position(self, position: Position) -> bool:
        """Whether the row at ``position`` passes."""
        return bool(self.admits(np.array([position.partition]), np.array([position.offset]))[0])

    def count_in(self, rows: dict[int, NDArray[np.int64]]) -> int:
        """How many of ``rows`` (``{partition: offsets}``, distinct) pass."""
        return sum(int(self.admits(np.full(len(offsets), part, np.int64), offsets).sum())
                   for part, offsets in rows.items())

    def describe(self, entity_type: str) -> str:
        """The filter in words, with how many of its exact names the type holds when that is not all of them."""
        text = self.filter.describe()
        names = len(self.filter.names)
        if names and self.file_names_found != names:
            text += f" ({self.file_names_found:,} of them {entity_type!r} entities)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the filter, the rows that pass and how many of the file's names the type holds."""
        return {**self.filter.to_dict(), "names_found": self.file_names_found, "entities": self.count}


def _read_names_file(path: str) -> frozenset[str]:
    """The names of ``--candidates-file``: one per line, exactly as written (the line break aside),
    blank lines skipped; a missing, unreadable or empty file is a usage error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--candidates-file {path}: the file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--candidates-file {path}: cannot read it as UTF-8 text ({exc})") from None
    names = frozenset(line.rstrip("\r") for line in text.split("\n") if line.strip())
    if not names:
        raise UsageError(f"--candidates-file {path}: no names in it (expected one entity name per line)")
    return names
