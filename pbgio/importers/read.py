"""Reading edge lists with polars: delimited text (TSV, CSV, whitespace) and Parquet.

Every input file becomes a :class:`Source`: consecutive blocks of the file, each a lazy
frame with the same columns whatever the format, so the rest of the importer never
looks at formats:

- ``line`` (Int64): the 1-based line of the row in a text file, or its 1-based row in a table;
- ``lhs``, ``rhs`` (String, or List[String] for a Parquet list column): the entity names, or
  the feature list of a featurized entity;
- ``rel`` (String): the relation name, when a relation column is given;
- ``weight`` (Float64): the edge weight, when a weight column is given;
- ``problem`` (Int32): the code of the first :class:`Check` the row fails, null when it is
  well-formed; messages are built only for the few rows that are reported
  (:func:`describe`), never for every row.

Text is read in blocks of whole lines (:data:`BLOCK_BYTES`), each split into lines
(``scan_lines``) and on the delimiter by polars, so a row with the wrong number of
fields is one malformed row with its line number rather than a parser error, and memory
holds one block, not the file. Fields may be quoted as CSV writers quote them (RFC 4180, with
:data:`QUOTE`, by default for every delimiter but tab; ``quote`` sets it): a quoted field may
hold the delimiter and doubled quotes (``"a ""b"", c"`` is ``a "b", c``), not a line break (a row is one line; an
unclosed quote is a malformed row). Only lines holding the quote character take the quoting
parser (Python's ``csv``, strict); the others are split by polars, so unquoted files read as
fast as before. Line ends may be LF or CRLF. Empty lines are skipped (and keep their line
numbers). A row must have as many fields as the header, or, without a header, as most of the
first 1,000 non-empty lines that hold every column read (on a tie, the fewer fields). Parquet
is read in slices of :data:`PARQUET_ROWS` rows.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "edges.tsv"
>>> _ = path.write_text("ann\\tfollows\\tbob\\n\\nbob\\tfollows\\n")
>>> source = open_source(path, InputOptions())
>>> rows = source.collect()
>>> rows.select("line", "lhs", "rhs", "rel", "problem").rows()
[(1, 'ann', 'bob', 'follows', None), (3, 'bob', None, 'follows', 0)]
>>> print(rows.filter(pl.col("problem").is_not_null()).select(describe(source.checks)).item())
expected 3 fields separated by '\\t', found 2
"""

from __future__ import annotations

import dataclasses
import io
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import polars as pl

from pbgio.errors import InputError, MissingArtifactError
from pbgio.fields import (
    QUOTE,
    WHITESPACE,
    default_quote,
    delimiter_name,
    holds,
    parse_delimiter,
    split_fields,
    split_lines,
)
from pbgio.importers.parquet_check import check_parquet
from pbgio.importers.sniff import SAMPLE_LINES, likely_delimiter, refuse_undeclared_header

ColumnRef = int | str
FileFormat = Literal["auto", "text", "parquet"]
PARQUET_SUFFIXES = (".parquet", ".pq")
_BOM = "\ufeff"
_ROW = "__pbgio_row"
_PEEK_BYTES = 1 << 20
_PEEK_LINES = 1000
BLOCK_BYTES = 4 << 20  # text is parsed this many bytes (rounded to whole lines) at a time
__all__ = ["QUOTE", "WHITESPACE", "Block", "Check", "InputOptions", "Source", "default_quote", "describe", "message",
           "open_source", "parse_column", "parse_delimiter", "problem_code", "split_fields"]
PARQUET_ROWS = 1 << 18  # Parquet is read this many rows at a time



def parse_column(text: str | None) -> ColumnRef | None:
    """A column reference from the command line: a 0-based index, a name, or none.

    >>> parse_column("2"), parse_column("tail"), parse_column("none")
    (2, 'tail', None)
    """
    if text is None or text.lower() in ("", "none", "-"):
        return None
    return int(text) if text.isdigit() else text


@dataclass(frozen=True)
class InputOptions:
    """How to read the edge-list files (one set of options for all of them).

    Columns are 0-based indexes, or names (from the header of a text file, or of a
    Parquet table). ``rel_col=None`` gives every edge relation 0, which needs a config
    with one static relation. ``delimiter`` is one character or ``"whitespace"`` (runs
    of spaces and tabs, the original importer's only mode). ``quote``: fields of delimited text
    may be quoted with it (RFC 4180; not with ``"whitespace"``); None reads every delimiter as a
    split; ``"auto"`` (the default) is ``'"'`` for every delimiter but tab (TSV, as IANA defines
    it, has no quoting, so a name may hold any character but a tab) and whitespace. Cells of
    featurized entity types hold features separated by ``feature_separator`` (Parquet may use
    list columns). ``header`` None (not said): a first line that looks like a header is refused.
    """

    delimiter: str = "\t"
    header: bool | None = None
    lhs_col: ColumnRef = 0
    rel_col: ColumnRef | None = 1
    rhs_col: ColumnRef = 2
    weight_col: ColumnRef | None = None
    feature_separator: str = " "
    file_format: FileFormat = "auto"
    quote: str | None = "auto"

    def __post_init__(self) -> None:
        if self.quote == "auto":
            object.__setattr__(self, "quote", default_quote(self.delimiter))
        if self.quote is not None and (len(self.quote) != 1 or self.quote in ("\n", "\r", self.delimiter)):
            raise ValueError(f"the quote is one character other than a line break and the delimiter, got "
                             f"{self.quote!r}")
        if self.delimiter != WHITESPACE and len(self.delimiter) != 1:
            raise ValueError(f"the delimiter is one character or 'whitespace', got {self.delimiter!r}")
        if self.delimiter in ("\n", "\r"):
            raise ValueError("the delimiter cannot be a line break")
        if not self.feature_separator:
            raise ValueError("the feature separator cannot be empty")
        if self.file_format not in ("auto", "text", "parquet"):
            raise ValueError(f"file_format is auto, text or parquet, got {self.file_format!r}")
        for role, ref in self.columns().items():
            if isinstance(ref, int) and ref < 0:
                raise ValueError(f"column indexes are 0-based and non-negative, got {ref} for {role}")
        refs = list(self.columns().values())
        if len(set(refs)) != len(refs):
            raise ValueError(f"the lhs, rel, rhs and weight columns must differ, got {self.columns()}")

    def columns(self) -> dict[str, ColumnRef]:
        """The column of each role that is read (``rel`` and ``weight`` only when given)."""
        refs: dict[str, ColumnRef | None] = {"lhs": self.lhs_col, "rel": self.rel_col, "rhs": self.rhs_col,
                                             "weight": self.weight_col}
        return {role: ref for role, ref in refs.items() if ref is not None}

    def format_of(self, path: Path) -> Literal["text", "parquet"]:
        if self.file_format != "auto":
            return self.file_format
        return "parquet" if path.suffix.lower() in PARQUET_SUFFIXES else "text"


class Block(NamedTuple):
    """Consecutive rows of a file, and how much of the file has been read once they are."""

    frame: pl.LazyFrame
    done: float  # share of the file (bytes, or rows of a table), 1.0 at the last block


@dataclass(frozen=True)
class Source:
    """One input file as consecutive blocks, lazy frames of the standard columns (see the module doc).

    ``blocks()`` yields at least one block (an empty one for an empty file).
    """

    path: Path
    blocks: Callable[[], Iterator[Block]]  # a fresh pass over the file on every call
    whole: Callable[[], pl.LazyFrame]  # the whole file as one query (faster for small files)
    unit: Literal["line", "row"]
    columns: dict[str, str]  # role -> how messages name its column ("column 2 ('tail')")
    list_columns: frozenset[str]  # roles whose values are already feature lists (Parquet lists)
    first_line: int  # the line (or row) where data starts, for problems about the whole file
    checks: tuple[Check, ...]  # what ``problem`` codes mean

    def problem(self, line: int | None, message: str, count: int = 1,
                others: Sequence[tuple[int | None, str]] = ()) -> InputError:
        return InputError(str(self.path), line, message, count=count, unit=self.unit, others=others)

    def collect(self) -> pl.DataFrame:
        """Every row of the file (for small files and tests)."""
        return self.whole().collect()

    def cached(self) -> Source:
        """The same source, parsed once and kept in memory (for small files read twice)."""
        frame = self.collect().lazy()
        return dataclasses.replace(self, blocks=lambda: iter([Block(frame, 1.0)]), whole=lambda: frame)


def open_source(path: Path, options: InputOptions) -> Source:
    """The :class:`Source` of one input file; problems with the whole file raise :class:`InputError`."""
    if not path.is_file():
        from pbgio.storage import link_problem

        raise MissingArtifactError(str(path), "input edge list", found=link_problem(path))
    if options.format_of(path) == "parquet":
        return _parquet_source(path, options)
    return _text_source(path, options)


# --------------------------------------------------------------------------- messages


def message(*parts: str | pl.Expr) -> pl.Expr:
    """A per-row message from literal text and expressions (no format-string escaping needed)."""
    return pl.concat_str([pl.lit(p) if isinstance(p, str) else p.cast(pl.String) for p in parts])


@dataclass(frozen=True)
class Check:
    """A row is malformed where ``condition`` holds; ``message`` says why (evaluated on such rows only)."""

    code: int
    condition: pl.Expr
    message: pl.Expr


def problem_code(checks: Sequence[Check]) -> pl.Expr:
    """The code of the first check a row fails, else null (cheap: literals only)."""
    if not checks:
        return pl.lit(None, dtype=pl.Int32)
    first, *rest = checks
    chain: Any = pl.when(first.condition).then(pl.lit(first.code, dtype=pl.Int32))
    for check in rest:
        chain = chain.when(check.condition).then(pl.lit(check.code, dtype=pl.Int32))
    code: pl.Expr = chain.otherwise(pl.lit(None, dtype=pl.Int32))
    return code


def describe(checks: Sequence[Check]) -> pl.Expr:
    """The message of each row's ``problem`` code (use on the offending rows only)."""
    chain: Any = None
    for check in checks:
        cond = pl.col("problem") == check.code
        chain = pl.when(cond).then(check.message) if chain is None else chain.when(cond).then(check.message)
    return pl.lit(None, dtype=pl.String) if chain is None else chain.otherwise(pl.lit(None, dtype=pl.String))


class _Checks:
    def __init__(self, start: int = 0) -> None:
        self.items: list[Check] = []
        self.next = start

    def add(self, condition: pl.Expr, msg: pl.Expr) -> None:
        self.items.append(Check(self.next, condition, msg))
        self.next += 1


def _value_checks(checks: _Checks, columns: dict[str, str], skip: frozenset[str] = frozenset()) -> None:
    for role, what in (("lhs", "an entity name"), ("rhs", "an entity name"), ("rel", "a relation name")):
        if role in columns and role not in skip:
            checks.add(pl.col(role) == "",
                       message(f"expected {what} in {columns[role]} ({role}), found an empty field"))
    if "weight" in columns:
        weight, raw = pl.col("weight"), pl.col("weight_text")
        checks.add(weight.is_null(), message(f"expected a number in {columns['weight']} (weight), found '",
                                             raw.fill_null(""), "'"))
        checks.add(weight.is_nan() | weight.is_infinite() | (weight < 0),
                   message("expected a finite non-negative weight, found ", raw))


# --------------------------------------------------------------------------- text


@dataclass(frozen=True)
class _Peek:
    header: list[str] | None
    counts: Counter[int]  # field counts of the sampled non-empty lines
    first_line: int  # the first data line (the line after the header, for an empty file)
    bom: bool
    lines: list[str]  # the first non-empty lines as read (the header included): a delimiter to suggest
    rows: list[list[str]]  # the fields of every non-empty line peeked at (the header included): a header to notice


def _split(text: str, options: InputOptions) -> list[str]:
    """A peeked line's fields (a malformed quoted line counts as one field: it is reported later)."""
    fields = split_fields(text, options.delimiter, options.quote)
    return [text] if fields is None else fields


def _peek(path: Path, options: InputOptions) -> _Peek:
    """The header, and the field counts of the first few non-empty lines (read in Python)."""
    bom = False
    header: list[str] | None = None
    counts: Counter[int] = Counter()
    first_line = 0
    lines: list[str] = []
    rows: list[list[str]] = []
    budget = _PEEK_BYTES
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(str(path), number, f"expected UTF-8 text, found {exc.reason} "
                                 f"at byte {exc.start} of the line") from None
            text = text.rstrip("\n").removesuffix("\r")
            if number == 1 and text.startswith(_BOM):
                bom, text = True, text[1:]
            fields = _split(text, options)
            if text:
                rows.append(fields)
                if len(lines) < SAMPLE_LINES:
                    lines.append(text)
            if options.header and number == 1:
                header = fields
                continue
            if text and fields:  # empty lines (and blank ones, split on whitespace) hold no row
                first_line = first_line or number
                counts[len(fields)] += 1
            budget -= len(raw)
            if sum(counts.values()) >= _PEEK_LINES or budget <= 0:
                break
    return _Peek(header, counts, first_line or (2 if options.header else 1), bom, lines, rows)


def _text_columns(path: Path, options: InputOptions, peek: _Peek) -> tuple[dict[str, int], int]:
    """Column index of each role, and the number of fields a row must have."""
    found: dict[str, int] = {}
    for role, ref in options.columns().items():
        if isinstance(ref, int):
            found[role] = ref
            continue
        if peek.header is None:
            raise InputError(str(path), None, f"expected a column index for {role} (the file has no "
                             f"header; pass --header to name columns), found {ref!r}")
        matches = [i for i, name in enumerate(peek.header) if name == ref]
        if len(matches) != 1:
            raise InputError(str(path), 1, f"expected one column named {ref!r} ({role}) in the header, "
                             f"found {len(matches)} among {peek.header}")
        found[role] = matches[0]
    needed = max(found.values()) + 1
    if peek.header is not None:
        expected, where, what = len(peek.header), 1, "in the header"
    else:
        fitting = [(-n, k) for k, n in peek.counts.items() if k >= needed]
        expected = min(fitting)[1] if fitting else max(peek.counts, default=needed)
        where, what = peek.first_line, f"in the first {sum(peek.counts.values())} lines"
    if expected < needed:
        role, index = max(found.items(), key=lambda item: item[1])
        other = likely_delimiter(peek.lines, needed, options.delimiter)
        hint = "" if other is None else \
            f"; the lines split into {needed} or more fields on {delimiter_name(other)}: try -d {delimiter_name(other)}"
        raise InputError(str(path), where, f"expected at least {needed} fields for column {index} ({role}), "
                         f"found at most {expected} {what} split on {delimiter_name(options.delimiter)}"
                         f"{hint}")
    return found, expected


def _text_source(path: Path, options: InputOptions) -> Source:
    peek = _peek(path, options)
    index, expected = _text_columns(path, options, peek)
    names = {role: f"column {i}" + (f" ({peek.header[i]!r})" if peek.header else "")
             for role, i in index.items()}
    whitespace = options.delimiter == WHITESPACE
    quote = None if whitespace else options.quote
    checks = _Checks()
    separated = "whitespace" if whitespace else repr(options.delimiter)
    checks.add(pl.col("nfields") != expected,
               message(f"expected {expected} fields separated by {separated}, found ", pl.col("nfields")))
    if quote is not None:  # a line the quoting parser refused has no fields (null: after the check above)
        checks.add(pl.col("nfields").is_null(),
                   message(f"expected each quoted field to end with {quote} followed by {separated} or the end of "
                           f"the line: a quoted field may hold {separated} and doubled quotes ({quote * 2}), not a "
                           "line break"))
    _value_checks(checks, names)
    text = pl.col("text").str.strip_prefix(_BOM) if peek.bom else pl.col("text")

    def parse(block: bytes | Path, first_line: int) -> pl.LazyFrame:
        """The rows of a block of lines (or of the file) whose first line is ``first_line``."""
        lf = pl.scan_lines(block, name="text", row_index_name=_ROW)
        if options.header and first_line == 1:
            lf = lf.filter(pl.col(_ROW) > 0)
        line = (pl.col(_ROW).cast(pl.Int64) + first_line).alias("line")
        if whitespace:
            lf = lf.select(line, fields=text.str.extract_all(r"\S+")).filter(pl.col("fields").list.len() > 0)
        elif quote is None or not holds(block, quote):
            lf = lf.filter(pl.col("text").str.len_bytes() > 0).select(line, fields=text.str.split(options.delimiter))
        else:  # the lines holding a quote take the quoting parser; the others are split by polars
            lf = lf.filter(pl.col("text").str.len_bytes() > 0)
            quoted = pl.col("text").str.contains(quote, literal=True)
            lines = lf.filter(quoted).select(line, text=text).collect()
            parsed = pl.DataFrame({"line": lines["line"], "fields": _field_lists(
                split_lines(lines["text"].to_list(), options.delimiter, quote), joinable=not holds(block, _JOIN))})
            lf = pl.concat([lf.filter(~quoted).select(line, fields=text.str.split(options.delimiter)),
                            parsed.lazy()]).sort("line")

        def field(i: int) -> pl.Expr:
            return pl.col("fields").list.get(i, null_on_oob=True)

        columns = [field(i).alias(role) for role, i in index.items() if role != "weight"]
        if "weight" in index:
            weight = field(index["weight"])
            number = weight.str.strip_chars().cast(pl.Float64, strict=False)
            columns += [weight.alias("weight_text"), number.alias("weight")]
        lf = lf.select("line", pl.col("fields").list.len().alias("nfields"), *columns)
        return lf.with_columns(problem=problem_code(checks.items))

    def blocks() -> Iterator[Block]:
        size = max(path.stat().st_size, 1)
        for block, first_line, end in _line_blocks(path):
            yield Block(parse(block, first_line), min(end / size, 1.0))

    refuse_undeclared_header(path, peek.rows, index, options.header)
    return Source(path, blocks, lambda: parse(path, 1), "line", names, frozenset(), peek.first_line,
                  tuple(checks.items))


_JOIN = "\x1f"  # the unit separator


def _field_lists(rows: list[list[str] | None], *, joinable: bool) -> pl.Series:
    """A List[String] column of parsed rows (None: malformed). ``joinable`` (the block never holds
    :data:`_JOIN`): built fast, the fields joined by it and split by polars; otherwise from the
    Python lists, 20 times slower."""
    if not joinable:
        return pl.Series(rows, dtype=pl.List(pl.String))
    joined = [None if row is None else _JOIN.join(row) for row in rows]
    return pl.Series(joined, dtype=pl.String).str.split(_JOIN)


def _line_blocks(path: Path) -> Iterator[tuple[bytes, int, int]]:
    """Blocks of whole lines (about :data:`BLOCK_BYTES` each), the number of their first line,
    and the file offset where they end.

    The file is read a block at a time; what follows a block's last line break is read
    again as the start of the next block. An empty file is one empty block.
    """
    size, first_line = BLOCK_BYTES, 1
    with path.open("rb") as f:
        while True:
            data = f.read(size)
            if len(data) < size:  # the end: the last line needs no line break
                yield data, first_line, f.tell()
                return
            cut = data.rfind(b"\n") + 1
            if not cut:  # a line longer than the block
                f.seek(-len(data), io.SEEK_CUR)
                size *= 2
                continue
            f.seek(cut - len(data), io.SEEK_CUR)
            yield data[:cut], first_line, f.tell()
            size, first_line = BLOCK_BYTES, first_line + data.count(b"\n", 0, cut)


# --------------------------------------------------------------------------- parquet


def _parquet_source(path: Path, options: InputOptions) -> Source:
    with open(path, "rb") as stream:  # polars aborts the process on some false claims: check them first
        rows = check_parquet(stream, str(path))
    lf = pl.scan_parquet(path, row_index_name=_ROW, row_index_offset=1)
    try:
        schema = lf.collect_schema()
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as exc:  # a panic: damaged metadata
        raise InputError(str(path), None,
                         f"expected a Parquet file, found an unreadable file ({exc})") from None
    names = [name for name in schema.names() if name != _ROW]
    found: dict[str, str] = {}
    for role, ref in options.columns().items():
        if isinstance(ref, int):
            if ref >= len(names):
                raise InputError(str(path), None, f"expected at least {ref + 1} columns for column {ref} "
                                 f"({role}), found {len(names)}: {names}")
            found[role] = names[ref]
        elif ref not in names:
            raise InputError(str(path), None, f"expected a column named {ref!r} ({role}), found {names}")
        else:
            found[role] = ref
    columns = {role: f"column {name!r}" for role, name in found.items()}
    exprs: list[pl.Expr] = [pl.col(_ROW).cast(pl.Int64).alias("line")]
    lists: set[str] = set()
    checks = _Checks()
    for role, name in found.items():
        dtype = schema[name]
        col = pl.col(name)
        if role == "weight":
            if not dtype.is_numeric():
                raise InputError(str(path), None,
                                 f"expected numbers in {columns[role]} (weight), found {dtype}")
            exprs.append(col.cast(pl.Float64).alias("weight"))
            exprs.append(col.cast(pl.String).alias("weight_text"))
        elif isinstance(dtype, pl.List) and role != "rel" and _is_name_type(dtype.inner):
            lists.add(role)
            exprs.append(col.cast(pl.List(pl.String)).alias(role))
        elif _is_name_type(dtype):
            exprs.append(col.cast(pl.String).alias(role))
        else:
            raise InputError(str(path), None, f"expected strings or integers in {columns[role]} ({role})"
                             f"{' or lists of them' if role != 'rel' else ''}, found {dtype}")
        checks.add(pl.col(role).is_null(),
                   message(f"expected a value in {columns[role]} ({role}), found null"))
    _value_checks(checks, columns, skip=frozenset(lists))  # empty lists are checked as feature bags
    frame = lf.select(exprs).with_columns(problem=problem_code(checks.items))

    def blocks() -> Iterator[Block]:
        for start in range(0, max(rows, 1), PARQUET_ROWS):
            yield Block(frame.slice(start, PARQUET_ROWS), min((start + PARQUET_ROWS) / max(rows, 1), 1.0))

    return Source(path, blocks, lambda: frame, "row", columns, frozenset(lists), 1, tuple(checks.items))


def _is_name_type(dtype: pl.DataType | pl.datatypes.DataTypeClass) -> bool:
    return dtype == pl.String or isinstance(dtype, pl.Enum | pl.Categorical) or dtype.is_integer()
