"""Read and write the entity side of a layout (``entity_path``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_entity_count(d, "user", 0, 3)
>>> write_entity_names(d, "user", 0, ["ann", "bob", "cy"])
>>> read_entity_count(d, "user", 0), read_entity_names(d, "user", 0)
(3, ['ann', 'bob', 'cy'])
>>> (d / "entity_count_user_0.txt").read_text()
'3\\n'
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.encoder import encode_basestring_ascii
from typing import IO

from pbgio.checks import entities as checks
from pbgio.checks.entities import CountFile, NamesFile
from pbgio.errors import FormatError, Issue, MissingArtifactError
from pbgio.formats import files
from pbgio.spec import naming
from pbgio.spec.entities import NAMES_JSON_INDENT, format_count
from pbgio.storage import AnyPath, atomic, is_remote, link_problem


def _read_text(path: AnyPath, what: str, kind: CountFile) -> str:
    """A count file's text, read through :func:`pbgio.formats.files.read_text`: a regular file whose
    links stay inside the layout, at most :data:`~pbgio.formats.files.TEXT_LIMIT` bytes (a link to
    ``/dev/zero`` or a FIFO is refused at once, never read until memory runs out or forever)."""
    try:
        return files.read_text(path, what)
    except MissingArtifactError:
        found = link_problem(path)
        if found is None:
            raise MissingArtifactError(str(path), what) from None
        raise FormatError(checks.text_unreadable(kind, str(path), found)) from None
    except (OSError, UnicodeDecodeError) as exc:
        found = link_problem(path) if isinstance(exc, OSError) else None
        raise FormatError(checks.text_unreadable(kind, str(path), found or exc)) from None


def _read_count(path: AnyPath, what: str, kind: CountFile) -> int:
    count = checks.count_format(kind, str(path), _read_text(path, what, kind))
    if isinstance(count, Issue):
        raise FormatError(count)
    return count


_JSON_WS = " \t\n\r"
NAMES_PER_CHUNK = 1 << 16  # names per chunk yielded by iter_name_chunks
_READ_CHARS = 1 << 20  # text read at a time
_MAX_FAST_PIECE = 1 << 23  # a line longer than this is parsed by the exact (slower) parser


class _Fallback(Exception):
    """The fast parser met something it does not handle: the exact parser takes over."""


def _fast_piece(piece: str, state: int) -> tuple[list[str], int]:
    """The names of ``piece`` (whole JSON tokens: the text up to a line break, which no JSON string
    holds) and the state after it: 0 before ``[``, 1 after it, 2 after a name, 3 after a comma,
    4 after ``]``. Anything unusual raises :class:`_Fallback`."""
    s = piece.strip(_JSON_WS)
    if not s:
        return [], state
    if state == 0:
        if s[0] != "[":
            raise _Fallback
        s, state = s[1:].lstrip(_JSON_WS), 1
    if state == 4:
        raise _Fallback
    if s[:1] == ",":
        if state != 2:
            raise _Fallback
        s, state = s[1:].lstrip(_JSON_WS), 3
    end = s.endswith("]")
    body = s[:-1].rstrip(_JSON_WS) if end else s
    trailing = body.endswith(",")
    if trailing:
        body = body[:-1]
    values: list[str] = []
    if body:
        if state == 2:
            raise _Fallback
        try:
            values = json.loads("[" + body + "]")
        except (ValueError, RecursionError):
            raise _Fallback from None
        if set(map(type, values)) != {str}:  # (C speed: no Python code per name)
            raise _Fallback
        state = 2
    elif trailing:
        raise _Fallback
    if trailing:
        state = 3
    if end:
        if state == 3:
            raise _Fallback
        state = 4
    return values, state


def _fast_chunks(f: IO[str]) -> Iterator[list[str]]:
    """Names of a JSON list written with line breaks between names (as every writer of the format
    does), parsed a block of whole lines at a time by ``json.loads``; :class:`_Fallback` when the
    text is not such a list (a long single line, bad JSON, a non-string)."""
    state, carry = 0, ""
    while True:
        data = f.read(_READ_CHARS)
        text = carry + data
        if not data:
            piece, carry = text, ""
        else:
            cut = text.rfind("\n") + 1
            if not cut:
                if len(text) > _MAX_FAST_PIECE:
                    raise _Fallback
                carry = text
                continue
            piece, carry = text[:cut], text[cut:]
        values, state = _fast_piece(piece, state)
        if len(values) <= NAMES_PER_CHUNK:
            if values:
                yield values
        else:
            for start in range(0, len(values), NAMES_PER_CHUNK):
                yield values[start:start + NAMES_PER_CHUNK]
        if not data:
            if state != 4:
                raise _Fallback
            return


def _describe_token(text: str) -> str:
    kinds = {"{": "an object", "[": "a list", '"': "a string", "t": "a boolean", "f": "a boolean",
             "n": "null", "N": "NaN", "I": "Infinity", "]": "']'", ",": "','"}
    kind = kinds.get(text[:1], "a number" if text[:1] in "-0123456789" else "text")
    return f"{kind} {text[:20]!r}" if kind[0] not in "'" else kind


def _exact_chunks(f: IO[str], fail: Callable[[str, int | None], FormatError], skip: int) -> Iterator[list[str]]:
    """Names of a JSON list of strings, token by token (any layout, names of any length); the
    first problem raises ``fail(message, element)`` naming the line. The first ``skip`` names are
    checked but not yielded (the fast parser yielded them)."""
    buf, pos, base_line, eof = "", 0, 1, False
    index = 0
    chunk: list[str] = []

    def more() -> bool:
        nonlocal buf, pos, base_line, eof
        if eof:
            return False
        data = f.read(_READ_CHARS)
        base_line += buf.count("\n", 0, pos)
        buf, pos = buf[pos:] + data, 0
        eof = not data
        return bool(data)

    def at() -> str:
        """The next non-blank character ('' at the end of the file), ``pos`` moved onto it."""
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in _JSON_WS:
                pos += 1
            if pos < len(buf) or not more():
                return buf[pos:pos + 1]

    def problem(message: str, element: int | None) -> FormatError:
        line = base_line + buf.count("\n", 0, pos)
        return fail(f"line {line}: {message}", element)

    def found() -> str:
        while len(buf) - pos < 20 and more():
            pass
        return _describe_token(buf[pos:]) if pos < len(buf) else "the end of the file"

    first = at()
    if first != "[":
        raise problem(f"expected a JSON list of strings, found {found() if first else 'an empty file'}", None)
    pos += 1
    if at() == "]":
        pos += 1
    else:
        quoted = False  # pos is known to be at the next name's opening quote
        while True:
            if not quoted and at() != '"':
                raise problem(f"expected a string (name {index}), found {found()}", index)
            while True:
                try:
                    name, end = scanstring(buf, pos + 1, True)
                    break
                except json.JSONDecodeError as exc:
                    offset = exc.pos - pos  # from the opening quote (more() moves the buffer)
                    near_end = exc.msg.startswith("Unterminated string") or exc.pos >= len(buf) - 12
                    if not (near_end and more()):
                        pos = min(pos + offset, len(buf))
                        raise problem(f"expected a JSON string (name {index}), found invalid text: {exc.msg}",
                                      index) from None
            pos = end
            if index >= skip:
                chunk.append(name)
                if len(chunk) >= NAMES_PER_CHUNK:
                    yield chunk
                    chunk = []
            index += 1
            quoted = buf.startswith(', "', pos) or buf.startswith(',"', pos)  # compact JSON, quickly
            if quoted:
                pos += 2 if buf[pos + 1] == " " else 1  # onto the quote
                continue
            sep = at()
            pos += 1
            if sep == "]":
                break
            if sep != ",":
                pos -= 1
                raise problem(f"expected ',' or ']' after name {index - 1}, found {found()}", index - 1)
    if at():
        raise problem(f"expected the end of the file after the list, found {found()}", None)
    if chunk:
        yield chunk


def iter_name_list(path: AnyPath, what: str, kind: NamesFile) -> Iterator[list[str]]:
    """The names of a JSON list of strings, streamed in chunks of at most :data:`NAMES_PER_CHUNK`
    (memory: one block of the file and one chunk, whatever the file's size).

    Bad content raises :class:`FormatError` under the format rule of ``kind`` naming the line and the name (its
    index in the list, as the issue's row); a missing file :class:`MissingArtifactError`.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "names.json"
    >>> _ = target.write_text('["a", "b",\\n 3]')
    >>> try:
    ...     list(iter_name_list(target, "names", "entity names"))
    ... except FormatError as exc:
    ...     print(exc.issue.message, exc.issue.rows)
    line 2: expected a string (name 2), found a number '3]' (2,)
    """

    def fail(message: str, element: int | None) -> FormatError:
        return FormatError(checks.names_format(kind, str(path), message, element))

    def opened() -> IO[str]:  # a regular file inside the layout: a FIFO or a device is refused, never read
        try:
            if is_remote(path):
                return path.open("r", encoding="utf-8", newline="")
            return io.TextIOWrapper(files.open_input(path, what), encoding="utf-8", newline="")
        except MissingArtifactError:
            found = link_problem(path)
            if found is None:
                raise MissingArtifactError(str(path), what) from None
            raise fail(f"expected a readable file, found {found}", None) from None
        except OSError as exc:
            raise fail(f"expected a readable file, found {link_problem(path) or exc}", None) from None

    done = 0
    try:
        with opened() as f:
            try:
                for values in _fast_chunks(f):
                    done += len(values)
                    yield values
                return
            except _Fallback:
                pass
        with opened() as f:
            yield from _exact_chunks(f, fail, done)
    except MissingArtifactError:
        raise
    except UnicodeDecodeError as exc:
        raise fail(f"expected UTF-8 text, found {exc.reason} (byte {exc.object[exc.start:exc.end]!r})",
                   None) from None
    except OSError as exc:
        raise fail(f"expected a readable file, found {exc}", None) from None


def _read_name_list(path: AnyPath, what: str, kind: NamesFile) -> list[str]:
    return [name for chunk in iter_name_list(path, what, kind) for name in chunk]


def read_entity_count(entity_path: AnyPath, entity_type: str, part: int) -> int:
    return _read_count(entity_path / naming.entity_count_file(entity_type, part),
                       f"entity count of {entity_type!r} partition {part}", "entity count")


def write_entity_count(entity_path: AnyPath, entity_type: str, part: int, count: int) -> None:
    atomic.make_dirs(entity_path, "entity directory")
    atomic.write_text(entity_path / naming.entity_count_file(entity_type, part), format_count(count))


def read_entity_names(entity_path: AnyPath, entity_type: str, part: int) -> list[str]:
    return _read_name_list(entity_path / naming.entity_names_file(entity_type, part),
                           f"entity names of {entity_type!r} partition {part}", "entity names")


def iter_entity_names(entity_path: AnyPath, entity_type: str, part: int) -> Iterator[list[str]]:
    """The names of a partition in chunks, streamed (see :func:`iter_name_list`)."""
    return iter_name_list(entity_path / naming.entity_names_file(entity_type, part),
                          f"entity names of {entity_type!r} partition {part}", "entity names")


_NAMES_PER_WRITE = 1 << 16


def write_name_list(path: AnyPath, names: Iterable[str]) -> None:
    """Write a JSON list of names atomically, streamed (memory bounded by one name).

    The bytes are exactly those of ``json.dumps(list(names), indent=4)``, as the original writes:

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "names.json"
    >>> names = ["ann", "b\u00f6b", 'quo"te']
    >>> write_name_list(target, iter(names))
    >>> target.read_text() == json.dumps(names, indent=4)
    True
    """
    sep = ",\n" + " " * NAMES_JSON_INDENT
    names = iter(names)
    with atomic.atomic_target(path) as tmp, tmp.open("w", encoding="utf-8") as out:
        written = False
        while chunk := list(itertools.islice(names, _NAMES_PER_WRITE)):
            out.write(sep if written else "[\n" + " " * NAMES_JSON_INDENT)
            try:
                out.write(sep.join(map(encode_basestring_ascii, chunk)))
            except TypeError:
                bad = next(n for n in chunk if not isinstance(n, str))
                raise TypeError(f"names are strings, got {type(bad).__name__} {bad!r}") from None
            written = True
        out.write("\n]" if written else "[]")


def write_entity_names(entity_path: AnyPath, entity_type: str, part: int, names: Iterable[str]) -> None:
    atomic.make_dirs(entity_path, "entity directory")
    write_name_list(entity_path / naming.entity_names_file(entity_type, part), names)


def read_dynamic_rel_count(entity_path: AnyPath) -> int:
    return _read_count(entity_path / naming.DYNAMIC_REL_COUNT, "dynamic relation count", "dynamic relation count")


def write_dynamic_rel_count(entity_path: AnyPath, count: int) -> None:
    atomic.make_dirs(entity_path, "entity directory")
    atomic.write_text(entity_path / naming.DYNAMIC_REL_COUNT, format_count(count))


def read_relation_names(entity_path: AnyPath) -> list[str]:
    return _read_name_list(entity_path / naming.DYNAMIC_REL_NAMES, "relation names", "relation names")


def write_relation_names(entity_path: AnyPath, names: Iterable[str]) -> None:
    atomic.make_dirs(entity_path, "entity directory")
    write_name_list(entity_path / naming.DYNAMIC_REL_NAMES, names)
