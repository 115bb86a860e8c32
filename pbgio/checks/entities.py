"""Checks of ``entity_path``: counts, names, dynamic relation files."""

from __future__ import annotations

from collections import Counter

import numpy as np
from numpy.typing import NDArray

from pbgio import entities, storage
from pbgio.checks import Context
from pbgio.errors import FormatError, MissingArtifactError
from pbgio.spec import naming
from pbgio.storage import AnyPath


def check_entity_dir(ctx: Context, entity_path: AnyPath) -> None:
    """Check every entity file; with a config, also completeness and relation files."""
    cfg = ctx.config
    present: dict[tuple[str, int], AnyPath] = {}
    for path in entity_path.iterdir():
        parsed = naming.parse_entity_count_file(path.name)
        if parsed:
            present[parsed] = path
    expected: set[tuple[str, int]] = set()
    if cfg is not None:
        expected = {(t, p) for t, e in cfg.entities.items() for p in range(e.num_partitions)}
        for etype, part in sorted(expected - set(present)):
            ctx.add("entity-count-missing", entity_path / naming.entity_count_file(etype, part), None,
                    f"expected the entity count of {etype!r} partition {part}, found no file")
        for etype, part in sorted(set(present) - expected):
            ctx.add("entity-count-extra", present[(etype, part)], None,
                    f"expected partitions 0..{cfg.entities[etype].num_partitions - 1} of {etype!r}"
                    if etype in cfg.entities else
                    f"expected an entity type of the config {sorted(cfg.entities)}, found {etype!r}")
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
            names = _check_names(ctx, entity_path, *parsed)
            if names is not None:
                hashes.setdefault(parsed[0], {})[parsed[1]] = np.fromiter(
                    (hash(n) for n in names), dtype=np.int64, count=len(names))
    for etype, parts in sorted(hashes.items()):
        if len(parts) > 1:
            _check_names_across_partitions(ctx, entity_path, etype, parts)
    _check_relation_files(ctx, entity_path)


def _check_names_across_partitions(ctx: Context, entity_path: AnyPath, etype: str,
                                   hashes: dict[int, NDArray[np.int64]]) -> None:
    """A name in two partitions of a type: found through one hash per name (memory bounded by
    8 bytes a name), confirmed on the strings of the partitions involved."""
    keys = sorted(hashes)
    all_hashes = np.concatenate([np.unique(hashes[p]) for p in keys])
    values, counts = np.unique(all_hashes, return_counts=True)
    suspects = set(values[counts > 1].tolist())
    if not suspects:
        return
    seen: dict[str, int] = {}
    repeated: list[tuple[str, int, int]] = []
    for part in keys:
        rows = np.flatnonzero(np.isin(hashes[part], list(suspects)))
        names = entities.read_entity_names(entity_path, etype, part)
        for row in rows.tolist():
            name = names[row]
            first = seen.setdefault(name, part)
            if first != part:
                repeated.append((name, first, part))
    if repeated:
        name, first, part = repeated[0]
        ctx.add("entity-names-duplicate", entity_path / naming.entity_names_file(etype, part), None,
                f"expected each name of {etype!r} in one partition, found {name!r} in partitions {first} "
                f"and {part}" + (f" ({len(repeated)} names in all)" if len(repeated) > 1 else ""),
                count=len(repeated))


def _check_names(ctx: Context, entity_path: AnyPath, etype: str, part: int) -> list[str] | None:
    path = entity_path / naming.entity_names_file(etype, part)
    try:
        names = entities.read_entity_names(entity_path, etype, part)
    except (FormatError, MissingArtifactError) as exc:
        ctx.add_error(exc, path)
        return None
    ctx.report.count_checked("entity names files")
    count = ctx.counts.get((etype, part))
    if count is not None and len(names) != count:
        ctx.add("entity-names-count", path, None,
                f"expected {count} names (entity_count_{etype}_{part}.txt), found {len(names)}")
    dupes = [name for name, n in Counter(names).items() if n > 1]
    if dupes:
        first_rows = [i for i, name in enumerate(names) if name in set(dupes[:5])]
        ctx.add("entity-names-duplicate", path, None,
                f"expected unique names, found {len(dupes)} repeated, e.g. {dupes[0]!r}",
                rows=tuple(first_rows[:5]), count=len(dupes))
    return names


def _check_relation_files(ctx: Context, entity_path: AnyPath) -> None:
    cfg = ctx.config
    count_path = entity_path / naming.DYNAMIC_REL_COUNT
    names_path = entity_path / naming.DYNAMIC_REL_NAMES
    if count_path.exists():
        try:
            ctx.dynamic_rel_count = entities.read_dynamic_rel_count(entity_path)
        except FormatError as exc:
            ctx.add_error(exc, count_path)
    elif cfg is not None and cfg.dynamic_relations:
        ctx.add("dynamic-rel-count-missing", count_path, None,
                "expected the dynamic relation count (dynamic_relations is true), found no file")
    if not names_path.exists():
        return
    try:
        names = entities.read_relation_names(entity_path)
    except FormatError as exc:
        ctx.add_error(exc, names_path)
        return
    dynamic = cfg.dynamic_relations if cfg is not None else ctx.dynamic_rel_count is not None
    if dynamic and ctx.dynamic_rel_count is not None and len(names) != ctx.dynamic_rel_count:
        ctx.add("dynamic-rel-names-count", names_path, None,
                f"expected {ctx.dynamic_rel_count} names ({naming.DYNAMIC_REL_COUNT}), found {len(names)}")
    if cfg is not None and not cfg.dynamic_relations:
        expected = [r.name for r in cfg.relations]
        if len(names) != len(expected):
            ctx.add("dynamic-rel-names-count", names_path, None,
                    f"expected {len(expected)} names (the config's relations), found {len(names)}")
        elif names != expected:
            row = next(i for i, (a, b) in enumerate(zip(names, expected, strict=True)) if a != b)
            ctx.add("relation-names-mismatch", names_path, None,
                    f"expected {expected[row]!r} (relations[{row}].name), found {names[row]!r}",
                    rows=(row,), count=sum(a != b for a, b in zip(names, expected, strict=True)))
