"""Names and rows: where an entity's name lives (partition, row offset), and the names of rows.

An entity type's dictionary is its ``entity_names_{type}_{part}.json`` files, one per partition,
row ``i`` of the partition's embeddings being name ``i``; relation names are the config's
(static relations) or ``dynamic_rel_names.json`` (dynamic relations, one per relation id).
Names files are streamed (:func:`pbgio.entities.iter_entity_names`): memory holds one chunk
of names and the answers, whatever the size of the dictionary. A name found twice is taken
where it is first found (partition 0 first).

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
import difflib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pbgio.checks import raise_first
from pbgio.checks.entities import names_count
from pbgio.config import ConfigSchema
from pbgio.entities import iter_entity_names, read_relation_names
from pbgio.errors import UnknownNameError
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
        close = close_names(entity_path, entity_type, num_partitions, unknown[0])
        where = names_files(entity_path, entity_type, num_partitions)
        raise UnknownNameError(unknown, f"{entity_type!r} entity", where, context=context, hint=suggestion(close))
    return {name: found[name] for name in wanted}


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
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.utils import default_process

    wanted = default_process(name)
    cutoff = max(1, len(wanted) // 3)
    best: list[tuple[int, int, str]] = []
    for part in range(num_partitions):
        for chunk in iter_entity_names(entity_path, entity_type, part):
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


def locate_relations(config: ConfigSchema, entity_path: AnyPath, names: Iterable[str], *,
                     context: str = "") -> dict[str, int]:
    """The relation id of each of ``names`` (distinct, in their order); unknown names raise
    :class:`~pbgio.errors.UnknownNameError`, with the closest known name as a hint."""
    known = relation_names(config, entity_path)
    index: dict[str, int] = {}
    for rel_id, name in enumerate(known):
        index.setdefault(name, rel_id)
    wanted = list(dict.fromkeys(names))
    missing = [name for name in wanted if name not in index]
    if missing:
        close = suggestion(difflib.get_close_matches(missing[0], known, n=1))
        if config.dynamic_relations:  # the names file is named: with no close name, say what it holds
            where = str(entity_path / naming.DYNAMIC_REL_NAMES)
            listed = ", ".join(repr(n) for n in known[:10]) + (f", … ({len(known):,} in all)" if len(known) > 10
                                                               else "")
            hint = close or (f"the relations are {listed}" if known else "there are no relations")
        else:  # the config's relations are listed in the message itself
            shown = ", ".join(known[:10]) + (", …" if len(known) > 10 else "")
            where, hint = f"the config's relations ({shown})", close
        raise UnknownNameError(missing, "relation", where, context=context, hint=hint)
    return {name: index[name] for name in wanted}
