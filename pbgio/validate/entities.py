"""The validator's walk over ``entity_path``: counts, names, dynamic relation files (the rules:
:mod:`pbgio.checks.entities`)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from pbgio import entities, storage
from pbgio.checks import entities as rules
from pbgio.errors import FormatError, MissingArtifactError, PbgioError
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.validate.context import Context, absent


def check_entity_dir(ctx: Context, entity_path: AnyPath) -> None:
    """Check every entity file; with a config, also completeness and relation files."""
    cfg = ctx.config
    present: dict[tuple[str, int], AnyPath] = {}
    for path in entity_path.iterdir():
        parsed = naming.parse_entity_count_file(path.name)
        if parsed:
            present[parsed] = path
    if cfg is not None:  # compared with the files found: a config's num_partitions is never walked
        found_of: dict[str, set[int]] = {}
        for etype, part in present:
            found_of.setdefault(etype, set()).add(part)
        for etype in sorted(cfg.entities):
            wanted = cfg.entities[etype].num_partitions
            first, total = absent(iter(range(wanted)), found_of.get(etype, set()), wanted, wanted.__gt__)
            if total:
                ctx.add(rules.count_missing(ctx.display(entity_path / naming.entity_count_file(etype, first[0])),
                                            etype, first[0], first=first, total=total))
        for etype, part in sorted(present):
            if etype not in cfg.entities or part >= cfg.entities[etype].num_partitions:
                ctx.add(rules.count_extra(ctx.display(present[(etype, part)]), etype, part, cfg))
    for (etype, part), path in sorted(present.items()):
        try:
            ctx.counts[(etype, part)] = entities.read_entity_count(entity_path, etype, part)
        except FormatError as exc:
            ctx.add_error(exc, path)
        ctx.report.count_checked("entity count files")
    hashes: dict[str, dict[int, NDArray[np.int64]]] = {}
    for path in storage.glob(entity_path, "entity_names_*_*.json"):
        parsed = naming.parse_entity_names_file(path.name)
        if parsed:
            sorted_hashes = _check_names(ctx, entity_path, *parsed)
            if sorted_hashes is not None:
                hashes.setdefault(parsed[0], {})[parsed[1]] = sorted_hashes
    for etype, parts in sorted(hashes.items()):
        if len(parts) > 1:
            _check_names_across_partitions(ctx, entity_path, etype, parts)
    _check_relation_files(ctx, entity_path)


def _check_names_across_partitions(ctx: Context, entity_path: AnyPath, etype: str,
                                   hashes: dict[int, NDArray[np.int64]]) -> None:
    """A name in two partitions of a type: found through one hash per name (memory bounded by
    8 bytes a name), confirmed on the strings of the partitions involved."""
    keys = sorted(hashes)
    all_hashes = np.concatenate([_distinct(hashes[p]) for p in keys])
    all_hashes.sort()
    suspects = _repeated(all_hashes)
    del all_hashes
    if not len(suspects):
        return
    seen: dict[str, int] = {}
    repeated: list[tuple[str, int, int]] = []
    for part in keys:
        for chunk in entities.iter_entity_names(entity_path, etype, part):
            for offset in np.flatnonzero(np.isin(_hashes(chunk), suspects)).tolist():
                name = chunk[offset]
                first = seen.setdefault(name, part)
                if first != part:
                    repeated.append((name, first, part))
    if repeated:
        part = repeated[0][2]
        ctx.add(rules.names_duplicate(ctx.display(entity_path / naming.entity_names_file(etype, part)), etype,
                                      across=repeated))


def _hashes(names: list[str]) -> NDArray[np.int64]:
    return np.fromiter(map(hash, names), dtype=np.int64, count=len(names))


def _distinct(sorted_values: NDArray[np.int64]) -> NDArray[np.int64]:
    """The distinct values of a sorted array."""
    if len(sorted_values) < 2:
        return sorted_values
    keep = np.empty(len(sorted_values), dtype=bool)
    keep[0] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=keep[1:])
    return sorted_values[keep]


def _repeated(sorted_values: NDArray[np.int64]) -> NDArray[np.int64]:
    """The values found more than once in a sorted array (each once)."""
    if len(sorted_values) < 2:
        return sorted_values[:0]
    same = sorted_values[1:] == sorted_values[:-1]
    return _distinct(sorted_values[1:][same])


def _check_names(ctx: Context, entity_path: AnyPath, etype: str, part: int) -> NDArray[np.int64] | None:
    """Check one names file, streamed: memory holds one 8-byte hash per name (sorted, returned for
    the check across partitions), never the names; repeated hashes are confirmed on the strings
    in a second pass over the file."""
    path = entity_path / naming.entity_names_file(etype, part)
    count = ctx.counts.get((etype, part))
    try:  # room for the count file's number of names (no copy while it is right), at most 1 per 3 bytes ('"",')
        room = min(count or 0, storage.file_size(path) // 3 + 1)
    except (OSError, PbgioError):
        room = 0
    hashes = np.empty(room, np.int64)
    size = 0
    try:
        for chunk in entities.iter_entity_names(entity_path, etype, part):
            if size + len(chunk) > len(hashes):
                hashes = np.resize(hashes, max(size + len(chunk), len(hashes) * 3 // 2))
            hashes[size:size + len(chunk)] = _hashes(chunk)
            size += len(chunk)
    except (FormatError, MissingArtifactError) as exc:
        ctx.add_error(exc, path)
        return None
    hashes = hashes[:size]
    ctx.report.count_checked("entity names files")
    if count is not None:
        ctx.add(rules.names_count(ctx.display(path), count, len(hashes), naming.entity_count_file(etype, part)))
    hashes.sort()
    suspects = _repeated(hashes)
    if len(suspects):
        _report_duplicates(ctx, entity_path, etype, part, suspects)
    return hashes


def _report_duplicates(ctx: Context, entity_path: AnyPath, etype: str, part: int,
                       suspects: NDArray[np.int64]) -> None:
    """Confirm names whose hashes repeat (a second pass, keeping only those names)."""
    rows_of: dict[str, list[int]] = {}
    row = 0
    for chunk in entities.iter_entity_names(entity_path, etype, part):
        for offset in np.flatnonzero(np.isin(_hashes(chunk), suspects)).tolist():
            rows_of.setdefault(chunk[offset], []).append(row + offset)
        row += len(chunk)
    dupes = [name for name, rows in rows_of.items() if len(rows) > 1]  # in order of first appearance
    if dupes:
        first_rows = sorted(r for name in dupes[:5] for r in rows_of[name])
        ctx.add(rules.names_duplicate(ctx.display(entity_path / naming.entity_names_file(etype, part)), etype,
                                      within=dupes, rows=tuple(first_rows[:5])))


def _check_relation_files(ctx: Context, entity_path: AnyPath) -> None:
    cfg = ctx.config
    count_path = entity_path / naming.DYNAMIC_REL_COUNT
    names_path = entity_path / naming.DYNAMIC_REL_NAMES
    if count_path.exists():
        try:
            ctx.dynamic_rel_count = entities.read_dynamic_rel_count(entity_path)
        except FormatError as exc:
            ctx.add_error(exc, count_path)
    else:
        ctx.add(rules.dynamic_rel_count_missing(ctx.display(count_path), cfg))
    if not names_path.exists():
        return
    try:
        names = entities.read_relation_names(entity_path)
    except FormatError as exc:
        ctx.add_error(exc, names_path)
        return
    ctx.extend(rules.relation_names(ctx.display(names_path), names, cfg, ctx.dynamic_rel_count))
