"""Names and rows: where an entity's name lives (partition, row offset), and the names of rows.

An entity type's dictionary is its ``entity_names_{type}_{part}.json`` files, one per partition,
row ``i`` of the partition's embeddings being name ``i``; relation names are the config's
(static relations) or ``dynamic_rel_names.json`` (dynamic relations, one per relation id).
Names files are streamed (:func:`pbgio.entities.iter_entity_names`): memory holds one chunk
of names and the answers, whatever the size of the dictionary. A name found twice is taken
where it is first found (partition 0 first).

Names are also found by a part of them (:func:`iter_name_matches`: ``dog`` finds
``dog.n.02084071``; ``pbgio names``), and an unknown name's message lists the names that
contain it, or the closest ones (:func:`unknown_name_hint`), every list there complete or
followed by the ``pbgio names`` command that lists it all.

>>> import tempfile, pathlib
>>> from pbgio.entities import write_entity_names
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_entity_names(d, "user", 0, ["ann", "bob"])
>>> write_entity_names(d, "user", 1, ["cy", "dee"])
>>> locate_entities(d, "user", 2, ["dee", "ann"])
{'dee': Position(partition=1, offset=1), 'ann': Position(partition=0, offset=0)}
>>> names_at(d, "user", 1, [1, 0, 1])
['dee', 'cy', 'dee']
>>> try:
...     locate_entities(d, "user", 2, ["bob", "eve"])
... except UnknownNameError as exc:
...     print(exc.names, exc.where.endswith("entity_names_user_1.json"))
['eve'] True
"""

from __future__ import annotations

import bisect
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from pbgio.checks import raise_first
from pbgio.checks.entities import names_count
from pbgio.config import ConfigSchema, entity_type_or_only
from pbgio.entities import iter_entity_names, read_relation_names
from pbgio.errors import UnknownNameError, UsageError
from pbgio.spec import naming
from pbgio.storage import AnyPath


class Position(NamedTuple):
    """Where an entity is: its partition and its row offset within the partition."""

    partition: int
    offset: int


def names_files(entity_path: AnyPath, entity_type: str, num_partitions: int) -> str:
    """The names files of a type, for messages: one path, or the first and the last."""
    first = entity_path / naming.entity_names_file(entity_type, 0)
    if num_partitions == 1:
        return str(first)
    last = naming.entity_names_file(entity_type, num_partitions - 1)
    return f"{first}{', ' if num_partitions == 2 else ' … '}{last}"


def locate_entities(entity_path: AnyPath, entity_type: str, num_partitions: int, names: Iterable[str], *,
                    context: str = "") -> dict[str, Position]:
    """The position of each of ``names`` (distinct, in their order) among the type's partitions.

    Reads the names files until every name is found; names found in none of them raise
    :class:`~pbgio.errors.UnknownNameError` listing them all (``context`` prefixes the message).
    """
    wanted = list(dict.fromkeys(names))
    missing = set(wanted)
    found: dict[str, Position] = {}
    for part in range(num_partitions):
        if not missing:
            break
        row = 0
        for chunk in iter_entity_names(entity_path, entity_type, part):
            hits = missing.intersection(chunk)
            if hits:
                for i, name in enumerate(chunk):
                    if name in hits and name not in found:
                        found[name] = Position(part, row + i)
                missing -= hits
                if not missing:
                    break
            row += len(chunk)
    if missing:
        unknown = [n for n in wanted if n in missing]
        hint = unknown_name_hint(unknown[0], lambda: entity_name_chunks(entity_path, entity_type, num_partitions),
                                 names_command(entity_type))
        where = names_files(entity_path, entity_type, num_partitions)
        raise UnknownNameError(unknown, f"{entity_type!r} entity", where, context=context, hint=hint)
    return {name: found[name] for name in wanted}


def entity_name_chunks(entity_path: AnyPath, entity_type: str, num_partitions: int) -> Iterator[list[str]]:
    """The names of every partition of a type, partition 0 first, streamed a chunk at a time."""
    for part in range(num_partitions):
        yield from iter_entity_names(entity_path, entity_type, part)


def names_command(entity_type: str | None, config: str = "CONFIG") -> str:
    """The ``pbgio names`` command that lists the names of ``entity_type`` (None: the relations).

    >>> names_command("synset"), names_command(None, "my graph.json")
    ('pbgio names CONFIG --type synset', "pbgio names 'my graph.json' --relations")
    """
    config = config if config == "CONFIG" else shlex.quote(config)
    return f"pbgio names {config} " + ("--relations" if entity_type is None else f"--type {shlex.quote(entity_type)}")


SHOWN_MATCHES = 5
"""Names an unknown name's message lists among those containing it, before saying how many more."""


class NameMatches(NamedTuple):
    """The names that contain a pattern: the first ones (:func:`iter_name_matches`' order) and
    how many there are in all."""

    names: list[str]
    total: int


WORD_SEPARATORS = "-._: "
"""What bounds a word of a name (``numpy`` in ``python3-numpy``, ``dog`` in ``dog.n.02084071``)."""

EXACT, WHOLE_WORD, PREFIX, INSIDE = range(4)
"""How a name holds a pattern, best first (:func:`name_matcher`)."""


def name_matcher(pattern: str) -> Callable[[str], int | None]:
    """How a name holds ``pattern``, case set aside: :data:`EXACT` (the name is the pattern, as
    written), :data:`WHOLE_WORD` (the pattern is a whole word of it: each side a
    :data:`WORD_SEPARATORS` character or an end), :data:`PREFIX` (the name starts with it),
    :data:`INSIDE` (it is further on), None (not in it). The empty pattern: every name, a prefix.

    >>> match = name_matcher("numpy")
    >>> [match(n) for n in ("numpy", "python3-NumPy", "numpydoc", "libnumpy", "scipy")]
    [0, 1, 2, 3, None]
    >>> name_matcher("dog")("hotdog.dog.n.1"), name_matcher("")("dog")
    (1, 2)
    """
    folded = pattern.casefold()
    if not folded:
        return lambda name: PREFIX
    separators = re.escape(WORD_SEPARATORS)
    word = re.compile(f"(?<![^{separators}]){re.escape(folded)}(?![^{separators}])")

    def match(name: str) -> int | None:
        if name == pattern:
            return EXACT
        held = name.casefold()
        at = held.find(folded)
        if at < 0:
            return None
        if word.search(held):
            return WHOLE_WORD
        return PREFIX if at == 0 else INSIDE

    return match


def iter_name_matches(chunks: Callable[[], Iterable[Sequence[str]]], pattern: str) -> Iterator[str]:
    """Every name of ``chunks()`` that contains ``pattern`` (case set aside), best first: the name
    itself, then those holding it as a whole word, shortest first, then those that start with it,
    then the others, each kind in the dictionary's order (:func:`name_matcher`); the empty pattern:
    every name, in that order. Streamed: the names are read three times (``chunks`` is called once a
    pass; once for the empty pattern), and memory holds one chunk and the whole-word matches.

    >>> names = lambda: [["hotdog", "Dog.n.1", "dogma"], ["cat", "dog.v.20", "sea-dog", "dog"]]
    >>> list(iter_name_matches(names, "dog"))
    ['dog', 'Dog.n.1', 'sea-dog', 'dog.v.20', 'dogma', 'hotdog']
    """
    if not pattern:  # every name, in the dictionary's order: one pass
        for chunk in chunks():
            yield from chunk
        return
    match = name_matcher(pattern)
    exact: list[str] = []
    words: list[str] = []
    for chunk in chunks():
        for name in chunk:
            kind = match(name)
            if kind == EXACT:
                exact.append(name)
            elif kind == WHOLE_WORD:
                words.append(name)
    yield from exact
    yield from sorted(words, key=len)  # a stable sort: names of one length in the dictionary's order
    for wanted in (PREFIX, INSIDE):
        for chunk in chunks():
            yield from (name for name in chunk if match(name) == wanted)


def count_name_matches(chunks: Iterable[Sequence[str]], pattern: str, limit: int = SHOWN_MATCHES, *,
                       leave_out: Iterable[str] = ()) -> NameMatches:
    """The first ``limit`` names that contain ``pattern``, in :func:`iter_name_matches`' order,
    and how many names contain it, the names of ``leave_out`` set aside; one pass over the
    names, memory for one chunk and a few times ``limit`` names.

    >>> count_name_matches([["hotdog", "Dog.n.1"], ["cat", "dog.v.2", "dog.n.3"]], "dog", limit=2)
    NameMatches(names=['Dog.n.1', 'dog.v.2'], total=4)
    >>> count_name_matches([["dogma", "hotdog", "sea-dog", "dog.n"]], "dog", limit=3)
    NameMatches(names=['dog.n', 'sea-dog', 'dogma'], total=4)
    """
    match = name_matcher(pattern)
    skip = set(leave_out)
    first: tuple[list[str], ...] = ([], [], [], [])
    total = 0
    for chunk in chunks:
        for name in chunk:
            kind = match(name)
            if kind is None or name in skip:
                continue
            total += 1
            found = first[kind]
            if kind == WHOLE_WORD:  # the shortest ``limit`` so far, the earliest first among equals
                found.append(name)
                if len(found) > limit:
                    found.sort(key=len)
                    del found[limit:]
            elif len(found) < limit:
                found.append(name)
    first[WHOLE_WORD].sort(key=len)
    return NameMatches([name for kind in first for name in kind][:limit], total)


def listed(names: Sequence[str], total: int, see_all: str) -> str:
    """``'a', 'b'``: names quoted, then, when they are not all of the ``total``, how many more
    there are and the command ``see_all`` that lists them all.

    >>> listed(["a", "b"], 2, "pbgio names CONFIG --relations")
    "'a', 'b'"
    >>> listed(["a", "b"], 12, "pbgio names CONFIG --relations")
    "'a', 'b', … (10 more: pbgio names CONFIG --relations)"
    """
    shown = ", ".join(repr(n) for n in names)
    return shown + (f", … ({total - len(names):,} more: {see_all})" if total > len(names) else "")


def unknown_name_hint(name: str, chunks: Callable[[], Iterable[Sequence[str]]], see_all: str,
                      noun: str = "name") -> str:
    """What an unknown ``name``'s message adds: the closest known names (near-typos: ``did you
    mean 'virus'?``), then the other names that contain it (``3 names contain it: 'dog.n.02084071',
    …``; when they are too many to show, how many more and the command that lists them all:
    ``see_all`` followed by the name), or nothing. ``chunks()`` streams the dictionary; it is
    read twice.

    >>> names = lambda: [["dog.n.01", "dog.v.02", "hotdog.n.03", "dot.n.04"]]
    >>> unknown_name_hint("dog", names, "pbgio names CONFIG")
    "3 names contain it: 'dog.n.01', 'dog.v.02', 'hotdog.n.03'"
    >>> unknown_name_hint("dog.n.1", names, "pbgio names CONFIG")
    "did you mean 'dog.n.01'?"
    >>> unknown_name_hint("hot", names, "pbgio names CONFIG", "relation")
    "1 relation contains it: 'hotdog.n.03'"
    """
    close = close_names_in(chunks(), name)
    found = count_name_matches(chunks(), name, leave_out=close)
    if not found.total:
        return suggestion(close)
    other = "other " if close else ""
    count = (f"{found.total:,} {other}{noun}s contain it" if found.total > 1
             else f"1 {other}{noun} contains it")
    shown = listed(found.names, found.total, f"{see_all} {shlex.quote(name)}")
    return f"{suggestion(close)} {count}: {shown}".lstrip()


SUGGESTIONS = 3


def close_names(entity_path: AnyPath, entity_type: str, num_partitions: int, name: str,
                limit: int = SUGGESTIONS) -> list[str]:
    """The known names closest to a mistyped ``name``, best first (at most ``limit``).

    Close means a small edit distance once case and punctuation are set aside (``Virus`` and
    ``viruss`` both find ``virus``; at most a third of the name's length, and at least 1),
    then the edit distance as written. The names files are streamed a chunk at a time through
    RapidFuzz, so memory holds one chunk and ``limit`` names, whatever the size of the type.

    >>> import tempfile, pathlib
    >>> from pbgio.entities import write_entity_names
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_entity_names(d, "all", 0, ["virus", "bacterium", "alga", "Vitamin"])
    >>> close_names(d, "all", 1, "viruss"), close_names(d, "all", 1, "VIRUS"), close_names(d, "all", 1, "zzz")
    (['virus'], ['virus'], [])
    """
    return close_names_in(entity_name_chunks(entity_path, entity_type, num_partitions), name, limit)


def close_names_in(chunks: Iterable[Sequence[str]], name: str, limit: int = SUGGESTIONS) -> list[str]:
    """:func:`close_names` among the names of ``chunks`` (any dictionary, streamed)."""
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.utils import default_process

    wanted = default_process(name)
    cutoff = max(1, len(wanted) // 3)
    best: list[tuple[int, int, str]] = []
    for chunk in chunks:
        for found, distance, _ in process.extract(name, chunk, scorer=Levenshtein.distance,
                                                  processor=default_process, limit=limit, score_cutoff=cutoff):
            best.append((int(distance), Levenshtein.distance(name, found), found))
        best = sorted(set(best))[:limit]
    if best and best[0][0] == 0:  # the same name but for case or punctuation: only those
        best = [item for item in best if item[0] == 0]
    return [found for _, _, found in best]


def suggestion(names: Sequence[str]) -> str:
    """``did you mean 'a'?`` / ``did you mean 'a', 'b' or 'c'?``, or empty for no names."""
    if not names:
        return ""
    quoted = [repr(n) for n in names]
    return f"did you mean {quoted[0] if len(quoted) == 1 else ', '.join(quoted[:-1]) + ' or ' + quoted[-1]}?"


def names_at(entity_path: AnyPath, entity_type: str, part: int, offsets: Sequence[int]) -> list[str]:
    """The names of rows ``offsets`` of a partition, in the order given (repeats allowed).

    A names file shorter than a row asked for is a :class:`~pbgio.errors.FormatError`
    (``entity-names-count``): the checkpoint has more rows than the type has names.
    """
    wanted = sorted(set(int(o) for o in offsets))
    got: dict[int, str] = {}
    row = 0
    if wanted:
        for chunk in iter_entity_names(entity_path, entity_type, part):
            end = row + len(chunk)
            for offset in wanted[bisect.bisect_left(wanted, row):bisect.bisect_left(wanted, end)]:
                got[offset] = chunk[offset - row]
            row = end
            if len(got) == len(wanted):
                break
    if len(got) != len(wanted):
        path = entity_path / naming.entity_names_file(entity_type, part)
        raise_first([names_count(str(path), max(wanted) + 1, row, "rows of the checkpoint's embeddings",
                                 at_least=True)])
    return [got[int(o)] for o in offsets]


def names_of(entity_path: AnyPath, entity_type: str, positions: Iterable[Position]) -> dict[Position, str]:
    """The names at ``positions`` (partition, offset) of one type, each names file read once."""
    by_part: dict[int, list[int]] = {}
    for pos in positions:
        by_part.setdefault(pos.partition, []).append(pos.offset)
    out: dict[Position, str] = {}
    for part, offsets in by_part.items():
        for offset, name in zip(offsets, names_at(entity_path, entity_type, part, offsets), strict=True):
            out[Position(part, offset)] = name
    return out


def relation_names(config: ConfigSchema, entity_path: AnyPath) -> list[str]:
    """Relation type names by relation id: ``dynamic_rel_names.json`` with dynamic relations, else
    the names of the config's relations."""
    if config.dynamic_relations:
        return read_relation_names(entity_path)
    return [r.name for r in config.relations]


SHOWN_RELATIONS = 10
"""Relation names an unknown relation's message lists before saying how many more there are."""


def locate_relations(config: ConfigSchema, entity_path: AnyPath, names: Iterable[str], *,
                     context: str = "") -> dict[str, int]:
    """The relation id of each of ``names`` (distinct, in their order); unknown names raise
    :class:`~pbgio.errors.UnknownNameError`, with the relations that contain the first unknown
    name, or the closest ones, as a hint (:func:`unknown_name_hint`)."""
    known = relation_names(config, entity_path)
    index: dict[str, int] = {}
    for rel_id, name in enumerate(known):
        index.setdefault(name, rel_id)
    wanted = list(dict.fromkeys(names))
    missing = [name for name in wanted if name not in index]
    if missing:
        see_all = names_command(None)
        hint = unknown_name_hint(missing[0], lambda: [known], see_all, "relation")
        if config.dynamic_relations:  # the names file is named: with no better hint, say what it holds
            where = str(entity_path / naming.DYNAMIC_REL_NAMES)
            every = f"the relations are {listed(known[:SHOWN_RELATIONS], len(known), see_all)}"
            hint = hint or (every if known else "there are no relations")
        else:  # the config's relations are listed in the message itself
            shown = ", ".join(known[:SHOWN_RELATIONS])
            more = f", … ({len(known) - SHOWN_RELATIONS:,} more: {see_all})" if len(known) > SHOWN_RELATIONS else ""
            where = f"the config's relations ({shown}{more})"
        raise UnknownNameError(missing, "relation", where, context=context, hint=hint)
    return {name: index[name] for name in wanted}


class Dictionary(NamedTuple):
    """The names of an entity type or the relation names, as :func:`dictionary` finds them."""

    what: str
    """What the names name, for messages: ``'synset' entity`` or ``relation``."""
    chunks: Callable[[], Iterable[Sequence[str]]]
    """Streams the names (a chunk at a time), each call from the first."""
    see_all: str
    """The ``pbgio names`` command that lists them (CONFIG standing for the config)."""


def dictionary(config: ConfigSchema, entity_path: AnyPath, entity_type: str | None = None, *,
               relations: bool = False) -> Dictionary:
    """The names of ``entity_type`` (None: the config's only type), or with ``relations`` the
    relation names (:func:`relation_names`). A type the config does not have, or none given when
    it has several, is a :class:`~pbgio.errors.UsageError`."""
    if relations:
        if entity_type is not None:
            raise UsageError("--relations lists the relation names: give it without --type")
        return Dictionary("relation", lambda: [relation_names(config, entity_path)], names_command(None))
    types = sorted(config.entities)
    entity_type = entity_type_or_only(config, entity_type)
    if entity_type not in config.entities:
        raise UsageError(f"--type: expected an entity type of the config ({', '.join(types)}), found "
                         f"{entity_type!r}")
    known = entity_type
    parts = config.num_partitions(known)
    return Dictionary(f"{known!r} entity", lambda: entity_name_chunks(entity_path, known, parts),
                      names_command(known))
