"""The error hierarchy and the validation report.

Every problem pbgio finds is an :class:`Issue`: a stable rule id (see
:mod:`pbgio.spec.rules`), the file, the dataset, the first offending rows with
a total count, and an "expected …, found …" message. Readers raise the first
issue they meet as a :class:`FormatError`; the validator collects all of them
in a :class:`Report`.

>>> issue = Issue("edge-rel-range", "error", "edges/edges_0_0.h5", "rel",
...               "expected rel < 3, found 7", rows=(12,), count=1)
>>> print(issue)
edges/edges_0_0.h5: rel: row 12: expected rel < 3, found 7 [edge-rel-range]
>>> FormatError(issue).issue.rule
'edge-rel-range'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Issue:
    """One broken rule, located as precisely as the rule allows."""

    rule: str
    severity: Severity
    file: str | None
    dataset: str | None
    message: str
    rows: tuple[int, ...] = ()
    count: int | None = None

    def __str__(self) -> str:
        where = [part for part in (self.file, self.dataset) if part]
        if self.rows:
            shown = ", ".join(str(r) for r in self.rows)
            more = f" ({self.count} rows in all)" if self.count and self.count > len(self.rows) else ""
            where.append(f"row{'s' if len(self.rows) > 1 else ''} {shown}{more}")
        prefix = ": ".join(where)
        return f"{prefix + ': ' if prefix else ''}{self.message} [{self.rule}]"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rows"] = list(self.rows)
        return data


@dataclass
class Report:
    """All the issues found in one validation run.

    >>> report = Report(target="demo")
    >>> report.ok
    True
    >>> report.add(Issue("edge-file-missing", "error", "edges_0_1.h5", None, "missing"))
    >>> report.ok, report.exit_code
    (False, 1)
    """

    target: str
    kind: str = "unknown"
    issues: list[Issue] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    def add(self, issue: Issue) -> None:
        self.issues.append(issue)

    def extend(self, issues: Iterable[Issue]) -> None:
        self.issues.extend(issues)

    def count_checked(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def rule_ids(self) -> set[str]:
        return {i.rule for i in self.issues}

    def raise_if_errors(self) -> None:
        if self.errors:
            raise FormatError(self.errors[0], more=len(self.errors) - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "valid": self.ok,
            "error_count": len(self.errors),
            "warning_count": len(self.warnings),
            "checked": dict(sorted(self.checked.items())),
            "issues": [i.to_dict() for i in self.issues],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __iter__(self) -> Iterator[Issue]:
        return iter(self.issues)


class PbgioError(Exception):
    """Base of every error pbgio raises on purpose."""


class FormatError(PbgioError, ValueError):
    """An artifact breaks a rule of the format. Carries the :class:`Issue`."""

    def __init__(self, issue: Issue, *, more: int = 0) -> None:
        self.issue = issue
        self.more = more
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        super().__init__(f"{issue}{suffix}")

    @property
    def rule(self) -> str:
        return self.issue.rule

    @property
    def file(self) -> str | None:
        return self.issue.file

    @property
    def dataset(self) -> str | None:
        return self.issue.dataset


class CorruptFileError(FormatError):
    """A file that cannot be opened as what it should be (truncated, not HDF5, …)."""


class VersionError(FormatError):
    """A file of a format version this pbgio does not know."""


class StaleIndexError(FormatError):
    """A nearest-neighbour index that does not belong to the checkpoint version it would search
    (built from another version, or from tables that have changed since): never used."""


class MissingLibraryError(PbgioError, ImportError):
    """An optional library a feature needs is not installed; the message says how to install it."""


class MissingArtifactError(PbgioError, FileNotFoundError):
    """A file or directory the layout requires does not exist."""

    def __init__(self, path: str, what: str, rule: str = "artifact-missing", *, found: str | None = None) -> None:
        self.path = path
        self.rule = rule
        if found is None:
            super().__init__(f"{path}: {what} does not exist [{rule}]")
        else:  # something unusable is there (a symbolic link loop …)
            super().__init__(f"{path}: expected the {what}, found {found} [{rule}]")


class UsageError(PbgioError, ValueError):
    """An option or argument a command cannot run with (a device that is not here, an unknown entity
    type to freeze, a negative number of minutes …); the message starts with the option. The
    command lines print it and exit 2; called from Python, the same message is raised."""


class UnsafeWriteError(PbgioError):
    """A write pbg refuses because of where it would land: outside the folders the command may write,
    or through a symbolic link that a layout holds (:func:`pbgio.confinement.check_write`), or onto
    something that is not a regular file (a lock file that is a link or a FIFO …). Nothing was written.

    >>> print(UnsafeWriteError("/data/model/.pbg-lock", "the lock file is a symbolic link"))
    /data/model/.pbg-lock: refused to write: the lock file is a symbolic link
    """

    def __init__(self, path: str, reason: str) -> None:
        from pbgio.safe_text import redact

        self.path = path
        self.reason = reason
        super().__init__(redact(f"{path}: refused to write: {reason}"))


class RemoteRefusedError(UsageError):
    """A URL of remote storage that the command line did not name and the user did not allow
    (:func:`pbgio.confinement.url_refusal`): nothing was sent to it.

    >>> print(RemoteRefusedError("http://u:p@evil.example/x", "not named"))
    http://***@evil.example/x: refused to contact: not named
    """

    def __init__(self, url: str, reason: str) -> None:
        from pbgio.safe_text import redact

        self.url = redact(url)
        self.reason = reason
        super().__init__(f"{self.url}: refused to contact: {reason}")


class CheckpointInUseError(PbgioError):
    """A checkpoint directory another process is writing (``pbgtrain fit`` holds its lock).

    >>> err = CheckpointInUseError("model/run", "pbgtrain fit (pid 1234 on host gpu1, user ana, since "
    ...                            "2025-01-02 03:04:05)")
    >>> print(err)
    model/run: in use by pbgtrain fit (pid 1234 on host gpu1, user ana, since 2025-01-02 03:04:05); wait \
for it to finish or stop it, then run again
    >>> err.path
    'model/run'
    """

    def __init__(self, path: str, holder: str, detail: str = "") -> None:
        self.path = path
        self.holder = holder
        extra = f"; {detail}" if detail else ""
        super().__init__(f"{path}: in use by {holder}{extra}; wait for it to finish or stop it, then run again")


class ConfigError(PbgioError, ValueError):
    """A run config with problems; ``issues`` holds every one of them."""

    def __init__(self, source: str, issues: list[Issue]) -> None:
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {i.dataset or '<root>'}: {i.message} [{i.rule}]" for i in issues)
        count = len(issues)
        super().__init__(f"{source}: {count} problem{'s' if count != 1 else ''} in the config:\n{lines}")


class UnsafePickleError(FormatError):
    """A pickled legacy file the safe loader refuses: it names a global outside the allow-list.

    Unpickling can call any importable function, so pbgio never unpickles such a
    file unless the caller opts in (``--trust-pickle`` / ``trust_pickle=True``).

    >>> err = UnsafePickleError("ckpt/METADATA_1.pt", "posix.system")
    >>> err.global_name, err.file
    ('posix.system', 'ckpt/METADATA_1.pt')
    >>> "--trust-pickle" in str(err)
    True
    """

    OPT_IN = "--trust-pickle (trust_pickle=True)"

    def __init__(self, path: str, global_name: str | None, detail: str | None = None) -> None:
        self.path = path
        self.global_name = global_name
        extra = f" ({detail})" if detail else ""
        if global_name is not None:
            what = (f"the file references the global {global_name}{extra}, which is not in the allow-list "
                    "of what legacy PBG files contain, and unpickling it could run code")
        else:
            what = f"torch's restricted (weights_only) unpickler cannot read it{extra}"
        message = f"refused to unpickle: {what}; if you trust this file, pass {self.OPT_IN}"
        super().__init__(Issue("legacy-unsafe-pickle", "error", path, None, message))


class InputError(PbgioError, ValueError):
    """A problem in a user's input file (an edge list or a table), located by file and line.

    ``line`` counts from 1; for tables without lines (Parquet) it is the 1-based row and
    ``unit`` is ``"row"``. ``count`` is how many such problems the file holds in all.

    >>> err = InputError("train.tsv", 7, "expected 3 fields separated by '\\\\t', found 2", count=3)
    >>> print(err)
    train.tsv:7: expected 3 fields separated by '\\t', found 2 (3 problems in this file)
    >>> err.file, err.line
    ('train.tsv', 7)
    >>> print(InputError("edges.parquet", 4, "expected a value in column 'lhs', found null", unit="row"))
    edges.parquet: row 4: expected a value in column 'lhs', found null

    ``others`` lists further problems (line, message), each printed on a line of its own, so
    that one pass over the file fixes them all:

    >>> print(InputError("t.csv", 2, "bad quote", count=4, others=[(5, "expected 3 fields"), (9, "empty name")]))
    t.csv:2: bad quote (4 problems in this file)
      t.csv:5: expected 3 fields
      t.csv:9: empty name
      … and 1 more
    """

    def __init__(self, file: str | None, line: int | None, message: str, *, count: int = 1,
                 unit: str = "line", others: Sequence[tuple[int | None, str]] = ()) -> None:
        self.file = file
        self.line = line
        self.reason = message
        self.count = count
        self.unit = unit
        self.others = list(others)
        more = f" ({count} problems in this file)" if count > 1 else ""
        lines = [f"{self._where(line)}: {message}{more}"]
        lines += [f"  {self._where(other)}: {text}" for other, text in self.others]
        hidden = count - 1 - len(self.others)
        if self.others and hidden > 0:
            lines.append(f"  … and {hidden:,} more")
        super().__init__("\n".join(lines))

    def _where(self, line: int | None) -> str:
        where = self.file or "<input>"
        if line is None:
            return where
        return f"{where}:{line}" if self.unit == "line" else f"{where}: {self.unit} {line}"


class UnknownNameError(PbgioError, LookupError):
    """Names looked up in a dictionary (an entity type's names files, the relation names) that
    it does not hold. ``names`` are the unknown ones (all of them), ``what`` says what they
    should name, ``where`` is the dictionary searched, ``context`` where the names came from.

    >>> err = UnknownNameError(["bob"], "'user' entity", "data/entity_names_user_0.json",
    ...                        context="triples.tsv:4")
    >>> print(err)
    triples.tsv:4: no 'user' entity named 'bob' in data/entity_names_user_0.json
    >>> print(UnknownNameError(["likess", "x"], "relation", "the config's relations", hint="did you mean 'likes'?"))
    no relation named 'likess' in the config's relations (2 unknown names: 'likess', 'x'); did you mean 'likes'?
    """

    SHOWN = 5

    def __init__(self, names: list[str], what: str, where: str, *, context: str = "", hint: str = "") -> None:
        self.names = names
        self.what = what
        self.where = where
        self.context = context
        self.hint = hint
        shown = ", ".join(repr(n) for n in names[:self.SHOWN]) + (", …" if len(names) > self.SHOWN else "")
        more = f" ({len(names)} unknown names: {shown})" if len(names) > 1 else ""
        prefix = f"{context}: " if context else ""
        suffix = f"; {hint}" if hint else ""
        super().__init__(f"{prefix}no {what} named {names[0]!r} in {where}{more}{suffix}")


class OutputError(PbgioError):
    """An output could not be written: the disk is full, the device failed, the directory is
    read-only or vanished. Nothing under the output's final name changed.

    >>> import errno
    >>> print(OutputError("ckpt/model.v3.h5", OSError(errno.ENOSPC, "No space left on device")))
    ckpt/model.v3.h5: could not write: no space left on device (ENOSPC)
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        self.path = path
        self.cause = cause
        self.reason = describe_os_failure(cause)
        super().__init__(f"{path}: could not write: {self.reason}")

    def named_at(self, staged: object, final: object) -> OutputError:
        """This failure named at ``final`` when it happened under the staging directory
        ``staged`` (the user asked for ``final``; the staged copy is an implementation detail)."""
        import os

        prefix = f"{staged}{os.sep}"
        if self.path == str(staged):
            return OutputError(str(final), self.cause)
        if self.path.startswith(prefix):
            return OutputError(os.path.join(str(final), self.path[len(prefix):]), self.cause)
        return self


class Notice(UserWarning):
    """One line a library call says about what it did, when that differs from what its arguments
    may suggest; not an error. pbg's command lines print it on stderr as ``{label}: message``
    (:func:`pbgio.console.exit_codes`); called from Python, it is a warning of this category."""

    label = "note"


class StoredSettingsNote(Notice):
    """A checkpoint was read with the settings it was trained with (its ``config.json``), where the
    config passed describes the stored model otherwise (:meth:`pbgio.layout.Layout.open_checkpoint`)."""


class RenamedOptionWarning(Notice):
    """A command-line option given in the spelling of an earlier release, taken as it meant then
    for one more release (:func:`pbgio.candidates.old_form_proposals`)."""

    label = "warning"


def os_error_code(exc: BaseException) -> int | None:
    """The errno of a failed system call: an OSError's own, or the one another library puts in
    the text of its error (h5py's "errno = 28" when a flush fails, polars' "(os error 28)").

    >>> os_error_code(RuntimeError("file write failed: ..., errno = 28, error message = ..."))
    28
    >>> os_error_code(ValueError("no errno here")) is None
    True
    """
    import re

    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    found = re.search(r"errno = (\d+)|\(os error (\d+)\)", str(exc))
    return int(found[1] or found[2]) if found else None


def describe_os_failure(exc: BaseException) -> str:
    """``no space left on device (ENOSPC)`` for a failed system call (:func:`os_error_code`)."""
    import errno as errnos
    import os

    code = os_error_code(exc)
    if code is None:
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return f"{os.strerror(code)[:1].lower()}{os.strerror(code)[1:]} ({errnos.errorcode.get(code, code)})"
