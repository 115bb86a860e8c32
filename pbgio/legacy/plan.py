"""The migration plan: every file the conversion will write, from which legacy files, and why.

:func:`plan_migration` reads only what is small (counts, ``dict.pt``, METADATA,
bucket headers) and returns a :class:`MigrationPlan`: the steps in the order
they run, the config changes, warnings, and what is not migrated. Each step
carries the action that performs it; :func:`pbgio.legacy.migrate.migrate` runs them.

DST mirrors SRC: every migrated directory keeps its path relative to SRC (so the
config's relative paths keep their meaning), and the config names those paths.

Why this module is long: it plans every kind of legacy file (counts, names, buckets, METADATA,
embeddings, optimizer state, config) in the order the migration runs them, and each step carries
its action; split by file kind, the plan's cross-file decisions (renames, base shifts, warnings)
would be spread over several modules.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, FileMetadata, IterationInfo, ModelState
from pbgio.config import ConfigSchema, parse_config
from pbgio.edges import BucketWriter
from pbgio.entities import (
    write_dynamic_rel_count,
    write_entity_count,
    write_entity_names,
    write_relation_names,
)
from pbgio.errors import MissingArtifactError
from pbgio.legacy import spec
from pbgio.legacy.pickles import check_pickle
from pbgio.legacy.reader import (
    KNOWN_BUCKET_DATASETS,
    LegacyCheckpointDir,
    LegacyEdgeDir,
    LegacyEntityDir,
    LegacyLayout,
    LegacyMetadata,
    LegacyVariant,
)
from pbgio.legacy.spec import ConfigMigration, legacy_error
from pbgio.legacy.state import MigratedModel, serialize
from pbgio.spec import naming
from pbgio.spec.edges import WRITE_CHUNK_ELEMENTS
from pbgio.spec.entities import format_count
from pbgio.storage import atomic, local_path

Advance = Callable[[int], None]
Action = Callable[[Path, Advance], None]
"""A step's work: given the staging root and a callback taking bytes of input done."""

PHASE_CONFIG, PHASE_NAMES, PHASE_COUNTS, PHASE_DATA = range(4)

PLACEHOLDER_NAME = "__pbgio_unnamed_{part}_{offset}"
"""Name given to rows ``dict.pt`` does not name (the legacy converter's padding rows)."""


@dataclass
class MigrationStep:
    """One file of DST: its path, the legacy files it comes from, and what is done to them."""

    target: str
    sources: tuple[str, ...]
    detail: str
    size: int = 0
    action: Action | None = field(default=None, repr=False, compare=False)
    phase: int = field(default=0, repr=False, compare=False)

    def __str__(self) -> str:
        origin = f"  ← {', '.join(self.sources)}" if self.sources else ""
        return f"{self.target}{origin}  ({self.detail})"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "sources": list(self.sources), "detail": self.detail,
                "bytes": self.size}


@dataclass
class MigrationPlan:
    """What a conversion will do; nothing is written until it is run."""

    src: Path
    variant: LegacyVariant
    config: ConfigSchema | None = None
    config_source: str | None = None
    steps: list[MigrationStep] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    case_changes: int = 0
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_migrated: list[str] = field(default_factory=list)
    unmigrated_paths: set[str] = field(default_factory=set)
    migrated_dirs: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.steps)

    @property
    def has_config(self) -> bool:
        return self.config is not None

    def render(self, dst: Path | None = None) -> str:
        lines = [f"legacy layout at {self.src}"]
        lines += [f"  {line}" for line in self.variant.describe()]
        if self.config_source:
            lines.append(f"config from {self.config_source}, with today's keys:")
            lines += [f"  {c}" for c in self.changes]
            if not self.changes and not self.case_changes:
                lines.append("  (no key or value needs renaming)")
            if self.case_changes:
                lines.append(f"  {self.case_changes} more keys only change from camelCase to snake_case")
        else:
            lines.append("config: none (no METADATA file); no config.json is written")
        where = f" into {dst}" if dst is not None else ""
        lines.append(f"plan: {len(self.steps)} files{where}, reading {_size(self.total_bytes)}:")
        lines += [f"  {step}" for step in self.steps]
        if self.warnings:
            lines.append("warnings:")
            lines += [f"  - {w}" for w in self.warnings]
        if self.not_migrated:
            lines.append("not migrated:")
            lines += [f"  - {n}" for n in self.not_migrated]
        if self.errors:
            lines.append("errors (nothing can be written):")
            lines += [f"  - {e}" for e in self.errors]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": str(self.src),
            "variant": {
                "index_bases": list(self.variant.index_bases),
                "config_era": self.variant.config_era,
                "version_file": self.variant.version_file,
                "version": self.variant.version,
                "init_layout": self.variant.init_layout,
                "containers": list(self.variant.containers),
                "dynamic_relations": self.variant.dynamic_relations,
            },
            "config_source": self.config_source,
            "config": self.config.to_dict() if self.config is not None else None,
            "config_changes": self.changes,
            "steps": [s.to_dict() for s in self.steps],
            "total_bytes": self.total_bytes,
            "warnings": self.warnings,
            "errors": self.errors,
            "not_migrated": self.not_migrated,
        }


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"


def plan_migration(src: Path | str, *, trust_pickle: bool = False) -> MigrationPlan:
    """Read the legacy layout under ``src`` and plan its migration (writes nothing)."""
    root = local_path(src).absolute()
    if not root.is_dir():
        raise MissingArtifactError(str(root), "legacy directory to convert")
    layout = LegacyLayout.discover(root, trust_pickle=trust_pickle)
    if layout.empty:
        raise legacy_error("legacy-not-found", str(root),
                           "expected legacy files (entity_count_*.pt, edges_*_*.h5 without format_version, "
                           "METADATA_*.pt, {type}_{part}.pt, CHECKPOINT_VERSION), found none")
    return _Planner(root, layout, trust_pickle).build()


class _Planner:
    def __init__(self, root: Path, layout: LegacyLayout, trust_pickle: bool) -> None:
        self.root = root
        self.layout = layout
        self.trust_pickle = trust_pickle
        self.primary: LegacyCheckpointDir | None = None
        self.meta: LegacyMetadata | None = None
        self.migration: ConfigMigration | None = None
        self.config: ConfigSchema | None = None
        self.dst_of: dict[Path, str] = {}
        self.entity_dir: LegacyEntityDir | None = None
        self.init_dir: LegacyCheckpointDir | None = None
        self.counts: dict[tuple[Path, str, int], int] = {}
        self.dynamic_rel_count: int | None = None
        self.model: MigratedModel | None = None
        self.metadata_versions: dict[Path, int] = {}
        self.plan = MigrationPlan(root, LegacyVariant((), None, None, None, False, (), None))

    # ---- helpers
    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def dst(self, directory: Path, name: str | None = None) -> str:
        base = self.dst_of.get(directory, self.rel(directory))
        if name is None:
            return base
        return name if base == "." else f"{base}/{name}"

    def step(self, phase: int, target: str, sources: list[Path], detail: str, action: Action,
             size: int | None = None) -> None:
        total = sum(p.stat().st_size for p in sources) if size is None else size
        sources_rel = tuple(self.rel(p) for p in sources)
        self.plan.steps.append(MigrationStep(target, sources_rel, detail, total, action, phase))

    # ---- build
    def build(self) -> MigrationPlan:
        pickled: list[LegacyEntityDir | LegacyCheckpointDir] = [*self.layout.entity_dirs,
                                                                 *self.layout.checkpoint_dirs]
        for directory in pickled:
            for path in directory.files():  # every pickle, before anything is unpickled
                if path.name not in spec.VERSION_FILES:
                    check_pickle(path, trust=self.trust_pickle)
        self._choose_primary()
        self._read_config()
        dynamic = self.config.dynamic_relations if self.config is not None else (
            any(d.dynamic_rel_count_file for d in self.layout.entity_dirs) or None)
        self.plan.variant = self.layout.variant(
            self.migration.era if self.migration else None, dynamic, self.primary)
        self._plan_config_files()
        for entity_dir in self.layout.entity_dirs:
            self._plan_entities(entity_dir)
        for edge_dir in self.layout.edge_dirs:
            self._plan_edges(edge_dir)
        for checkpoint in self.layout.checkpoint_dirs:
            self._plan_checkpoint(checkpoint)
        for path in self.layout.current_buckets:
            self.plan.errors.append(f"{self.rel(path)}: already a current-layout bucket (it has "
                                    "format_version); convert a directory that holds only legacy files")
        for path in self.layout.other_files:
            self.plan.not_migrated.append(f"{self.rel(path)} (not a file of the legacy layout)")
        self.plan.migrated_dirs = sorted({self.dst(d.path) for d in self.layout.all_dirs()})
        # Config and version files first, data last: a directory left by an interrupted run
        # then names files it lacks, and never validates as complete.
        self.plan.steps.sort(key=lambda s: s.phase)
        return self.plan

    def _choose_primary(self) -> None:
        candidates = [c for c in self.layout.checkpoint_dirs if c.metadata_files]
        if len(candidates) > 1:
            named = [c for c in candidates if self._names_itself(c)]
            inits = {self._resolve_stored(c, "init_path") for c in named}
            named = [c for c in named if c.path not in inits] or named
            if len(named) != 1:
                self.plan.errors.append(
                    "several checkpoint directories hold METADATA files ("
                    + ", ".join(self.rel(c.path) for c in candidates)
                    + "); convert each run's folder separately")
                return
            candidates = named
        if candidates:
            self.primary = candidates[0]
            self.meta = self._metadata_of(self.primary)

    def _metadata_version(self, checkpoint: LegacyCheckpointDir) -> int:
        """The version whose METADATA holds the config: the committed one, else the newest before it."""
        if checkpoint.path in self.metadata_versions:
            return self.metadata_versions[checkpoint.path]
        version = checkpoint.read_version()
        if checkpoint.metadata_path(version) is None:
            older = [v for v in checkpoint.metadata_files if v <= version] or list(checkpoint.metadata_files)
            chosen = max(older)
            self.plan.warnings.append(
                f"{self.rel(checkpoint.path)}: no METADATA of version {version}; the config comes from "
                f"{self.rel(checkpoint.metadata_files[chosen])}")
            version = chosen
        self.metadata_versions[checkpoint.path] = version
        return version

    def _metadata_of(self, checkpoint: LegacyCheckpointDir) -> LegacyMetadata:
        return checkpoint.read_metadata(self._metadata_version(checkpoint))

    def _names_itself(self, checkpoint: LegacyCheckpointDir) -> bool:
        return self._resolve_stored(checkpoint, "checkpoint_path") == checkpoint.path

    def _resolve_stored(self, checkpoint: LegacyCheckpointDir, key: str) -> Path | None:
        config = self._metadata_of(checkpoint).config_migration().config
        stored = config.get(key)
        ckpt = config.get("checkpoint_path")
        if not isinstance(stored, str) or not isinstance(ckpt, str):
            return None
        return _Resolver(self.root, ckpt, checkpoint.path).resolve(stored)

    # ---- config
    def _read_config(self) -> None:
        if self.primary is None or self.meta is None:
            return
        meta = self.meta
        self.migration = meta.config_migration()
        raw = dict(self.migration.config)
        for change in self.migration.changes:
            if change.reason == "camelCase → snake_case":
                self.plan.case_changes += 1
            else:
                self.plan.changes.append(str(change))
        self.plan.config_source = self.rel(meta.path)
        self.dst_of[self.primary.path] = self.rel(self.primary.path)
        stored_ckpt = raw.get("checkpoint_path")
        stored = stored_ckpt if isinstance(stored_ckpt, str) else ""
        resolver = _Resolver(self.root, stored, self.primary.path)
        raw["checkpoint_path"] = self.rel(self.primary.path)
        if raw["checkpoint_path"] != stored_ckpt:
            self.plan.changes.append(f"checkpoint_path: {stored_ckpt!r} → {raw['checkpoint_path']!r} "
                                     "(its place in DST)")
        self._map_entity_path(raw, resolver)
        self._map_edge_paths(raw, resolver)
        self._map_init_path(raw, resolver)
        self._dynamic(raw)
        self._featurized_negatives(raw)
        self.config = parse_config(raw, str(meta.path))
        self.plan.config = self.config
        implied = meta.implied_version(self.config.num_edge_chunks or 1)
        version = self.primary.read_version()
        if version > 0 and implied != version:
            self.plan.warnings.append(
                f"{self.rel(meta.path)}: its iteration fields (edge_path_count={meta.edge_path_count}, "
                f"edge_chunk={meta.edge_chunk}) describe version {implied}, the version file says {version}; "
                "the version file wins")
        self.model = self.primary.migrate_model(self._metadata_version(self.primary), self.config)
        self.plan.warnings += self.model.warnings
        for old, new in self.model.renamed.items():
            how = " (transposed)" if new in self.model.transposed else ""
            self.plan.changes.append(f"model parameter {old} → {new}{how}")

    def _featurized_negatives(self, raw: dict[str, Any]) -> None:
        """all_negs on a featurized side cannot run (the legacy trainer refused it, today's original
        fails): it becomes false. Uniform negatives stay: the original skips them for featurized
        types and keeps them for plain ones, and so does pbgtrain (a warning, not a change)."""
        entities = raw.get("entities")
        if not isinstance(entities, dict):
            return
        featurized = {name for name, e in entities.items() if isinstance(e, dict) and e.get("featurized") in
                      (True, 1, "1", "true", "True")}
        if not featurized:
            return
        for i, rel in enumerate(raw.get("relations") or []):
            if isinstance(rel, dict) and rel.get("all_negs") and {rel.get("lhs"), rel.get("rhs")} & featurized:
                self.plan.changes.append(f"relations[{i}].all_negs: {rel['all_negs']!r} → False (a featurized side; "
                                         "the legacy trainer refused all_negs for featurized types)")
                rel["all_negs"] = False

    def _map(self, key: str, stored: str, found: Path | None, legacy: bool, what: str) -> str:
        """The DST path for a config path; ``legacy``: ``found`` holds legacy files and is migrated."""
        if found is None or not legacy:
            reason = "is not inside SRC" if found is None else f"holds no legacy {what} files"
            self.plan.warnings.append(f"{key} {stored!r} {reason}, so it is not migrated; the migrated "
                                      "config still names it")
            self.plan.unmigrated_paths.add(stored)
            return stored
        dst = self.rel(found)
        self.dst_of[found] = dst
        if dst != stored:
            self.plan.changes.append(f"{key}: {stored!r} → {dst!r} (its place in DST)")
        return dst

    def _map_entity_path(self, raw: dict[str, Any], resolver: _Resolver) -> None:
        stored = raw.get("entity_path")
        if not isinstance(stored, str):
            return
        found = resolver.resolve(stored)
        dirs = {d.path: d for d in self.layout.entity_dirs}
        if found not in dirs and len(dirs) == 1:
            found = next(iter(dirs))
            self.plan.warnings.append(f"entity_path {stored!r} is taken to be {self.rel(found)!r}, the only "
                                      "legacy entity directory in SRC")
        self.entity_dir = dirs.get(found) if found is not None else None
        raw["entity_path"] = self._map("entity_path", stored, found, self.entity_dir is not None, "entity")

    def _map_edge_paths(self, raw: dict[str, Any], resolver: _Resolver) -> None:
        stored = raw.get("edge_paths")
        if not isinstance(stored, list):
            return
        dirs = {d.path for d in self.layout.edge_dirs}
        by_name: dict[str, list[Path]] = {}
        for d in dirs:
            by_name.setdefault(d.name, []).append(d)
        mapped = []
        for i, path in enumerate(stored):
            if not isinstance(path, str):
                mapped.append(path)
                continue
            found = resolver.resolve(path)
            name = PurePosixPath(path).name
            if found not in dirs and len(by_name.get(name, [])) == 1:
                found = by_name[name][0]
                self.plan.warnings.append(f"edge_paths[{i}] {path!r} is taken to be {self.rel(found)!r}, the "
                                          "legacy edge directory of that name in SRC")
            mapped.append(self._map(f"edge_paths[{i}]", path, found, found in dirs, "edge"))
        raw["edge_paths"] = mapped

    def _map_init_path(self, raw: dict[str, Any], resolver: _Resolver) -> None:
        stored = raw.get("init_path")
        if not isinstance(stored, str):
            return
        found = resolver.resolve(stored)
        dirs = {d.path: d for d in self.layout.checkpoint_dirs}
        self.init_dir = dirs.get(found) if found is not None else None
        raw["init_path"] = self._map("init_path", stored, found, self.init_dir is not None, "checkpoint")

    def _dynamic(self, raw: dict[str, Any]) -> None:
        assert self.migration is not None and self.meta is not None
        from_config = self.migration.num_dynamic_rels
        from_file = None
        if self.entity_dir is not None and self.entity_dir.dynamic_rel_count_file is not None:
            from_file = self.entity_dir.read_dynamic_rel_count()
        if from_file is not None and from_config and from_file != from_config:
            self.plan.warnings.append(f"{spec.DYNAMIC_REL_COUNT} says {from_file} relation types, the "
                                      f"config's numDynamicRels {from_config}; the file wins")
        self.dynamic_rel_count = from_file if from_file is not None else (from_config or None)
        if raw.get("dynamic_relations") and raw.get("global_emb", True) not in (False, 0):
            if any(spec.PRIVATE_GLOBAL_RE.match(str(k)) for k in self.meta.model_state):
                self.plan.errors.append(
                    f"{self.rel(self.meta.path)}: global embeddings with dynamic relations, which today's "
                    "PBG cannot train; this checkpoint cannot be migrated as is")
            else:
                raw["global_emb"] = False
                self.plan.changes.append("global_emb: true → false (dynamic relations; the model has no "
                                         "global embeddings, and today's PBG rejects the combination)")

    # ---- steps
    def _plan_config_files(self) -> None:
        if self.config is None or self.primary is None:
            return
        if self.dst(self.primary.path) != ".":
            text = self.config.to_json()
            self.step(PHASE_CONFIG, naming.CONFIG_JSON, [self.meta.path] if self.meta else [],
                      "the config with today's keys and every default", _write_text(naming.CONFIG_JSON, text),
                      size=0)

    def _plan_entities(self, entity_dir: LegacyEntityDir) -> None:
        types = entity_dir.types()
        config = self.config if entity_dir is self.entity_dir else None
        if config is not None:
            for etype, schema in config.entities.items():
                found = types.get(etype, 0)
                if found != schema.num_partitions:
                    self.plan.errors.append(
                        f"{self.rel(entity_dir.path)}: expected {schema.num_partitions} count files of "
                        f"{etype!r} (numPartitions), found {found}")
        shift = f", partition shifted by -{entity_dir.index_base}" if entity_dir.index_base else ""
        for etype, part in sorted(entity_dir.count_files):
            self.counts[(entity_dir.path, etype, part)] = entity_dir.read_entity_count(etype, part)
        self._plan_names(entity_dir)
        for (etype, part), path in sorted(entity_dir.count_files.items()):
            count = self.counts[(entity_dir.path, etype, part)]
            target = self.dst(entity_dir.path, naming.entity_count_file(etype, part))
            self.step(PHASE_COUNTS, target, [path], f"count {count}{shift}",
                      _write_entity(write_entity_count, self.dst(entity_dir.path), etype, part, count))
        rel_count = self.dynamic_rel_count if entity_dir is self.entity_dir else None
        if rel_count is None and entity_dir.dynamic_rel_count_file is not None:
            rel_count = entity_dir.read_dynamic_rel_count()
        if rel_count is not None:
            sources = [entity_dir.dynamic_rel_count_file] if entity_dir.dynamic_rel_count_file else (
                [self.meta.path] if self.meta else [])
            detail = f"{rel_count} relation types" + ("" if entity_dir.dynamic_rel_count_file else
                                                      " (from the config's numDynamicRels)")
            self.step(PHASE_COUNTS, self.dst(entity_dir.path, naming.DYNAMIC_REL_COUNT), sources, detail,
                      _write_dir(write_dynamic_rel_count, self.dst(entity_dir.path), rel_count),
                      size=0 if not entity_dir.dynamic_rel_count_file else None)

    def _plan_names(self, entity_dir: LegacyEntityDir) -> None:
        if entity_dir.dictionary_file is None:
            return
        dictionary = entity_dir.read_dictionary()
        assert dictionary is not None
        source = entity_dir.dictionary_file
        for etype in sorted(entity_dir.types()):
            total = sum(c for (d, t, _), c in self.counts.items() if d == entity_dir.path and t == etype)
            table = dictionary.entities.get(etype)
            if table is None:
                continue
            beyond = sorted(i for i in table if i >= total)
            if beyond:
                self.plan.warnings.append(f"{self.rel(source)}: {len(beyond)} names of {etype!r} have "
                                          f"indices beyond its {total} rows (from {beyond[0]}); they are "
                                          "dropped")
            for part in range(entity_dir.types()[etype]):
                names = entity_dir.read_entity_names(etype, part)
                if names is None:
                    continue
                filled, unnamed = _fill_placeholders(names, part)
                if unnamed:
                    self.plan.warnings.append(
                        f"{self.rel(source)}: {etype!r} partition {part} has {len(names)} rows but "
                        f"{len(names) - len(unnamed)} names (the legacy converter gave every partition "
                        f"ceil(N/P) rows); {'rows' if len(unnamed) > 1 else 'row'} "
                        f"{', '.join(map(str, unnamed[:5]))} {'get' if len(unnamed) > 1 else 'gets'} a "
                        f"placeholder name like {filled[unnamed[0]]!r}")
                detail = f"{len(names)} names" + (f", {len(unnamed)} placeholders" if unnamed else "")
                target = self.dst(entity_dir.path, naming.entity_names_file(etype, part))
                self.step(PHASE_NAMES, target, [source], detail,
                          _write_entity(write_entity_names, self.dst(entity_dir.path), etype, part, filled),
                          size=0)
        self._plan_relation_names(entity_dir, dictionary.relation_names())

    def _plan_relation_names(self, entity_dir: LegacyEntityDir, names: list[str | None] | None) -> None:
        if names is None or entity_dir.dictionary_file is None:
            return
        source = self.rel(entity_dir.dictionary_file)
        config = self.config if entity_dir is self.entity_dir else None
        if None in names:
            unnamed = [i for i, n in enumerate(names) if n is None]
            self.plan.warnings.append(f"{source}: relation ids {unnamed} have no name; "
                                      "dynamic_rel_names.json is not written")
            return
        complete = [n for n in names if n is not None]
        if config is not None and not config.dynamic_relations:
            expected = [r.name for r in config.relations]
            if complete != expected:
                self.plan.warnings.append(f"{source}: relation names {complete} differ from the config's "
                                          f"{expected}; dynamic_rel_names.json is not written")
                return
        count = self.dynamic_rel_count if entity_dir is self.entity_dir else None
        if count is None and entity_dir.dynamic_rel_count_file is not None:
            count = entity_dir.read_dynamic_rel_count()
        if count is not None and (config is None or config.dynamic_relations) and len(complete) != count:
            self.plan.warnings.append(f"{source}: {len(complete)} relation names for {count} relation types; "
                                      "dynamic_rel_names.json is not written")
            return
        directory = self.dst(entity_dir.path)
        self.step(PHASE_NAMES, self.dst(entity_dir.path, naming.DYNAMIC_REL_NAMES),
                  [entity_dir.dictionary_file], f"{len(complete)} relation names",
                  _write_dir(write_relation_names, directory, complete), size=0)

    def _plan_edges(self, edge_dir: LegacyEdgeDir) -> None:
        config = self.config if self.dst(edge_dir.path) in (self.config.edge_paths if self.config else []) \
            else None
        keys = set(edge_dir.bucket_files)
        if config is not None:
            lhs_parts, rhs_parts = config.bucket_grid()
            grid = {(lhs, rhs) for lhs in range(lhs_parts) for rhs in range(rhs_parts)}
            for lhs, rhs in sorted(keys - grid):
                where = self.rel(edge_dir.bucket_files[(lhs, rhs)])
                self.plan.warnings.append(f"{where}: bucket ({lhs}, {rhs}) lies outside the config's "
                                          f"{lhs_parts}x{rhs_parts} grid")
            for lhs, rhs in sorted(grid - keys):
                target = self.dst(edge_dir.path, naming.bucket_file(lhs, rhs))
                self.plan.warnings.append(f"{target}: the legacy directory has no bucket ({lhs}, {rhs}); an "
                                          "empty one is written (today every bucket of the grid must exist)")
                self.step(PHASE_DATA, target, [], "empty bucket", _empty_bucket(target), size=0)
        shift = edge_dir.index_base
        for (lhs, rhs), path in sorted(edge_dir.bucket_files.items()):
            names = edge_dir.datasets(lhs, rhs)
            unknown = [n for n in names if n not in KNOWN_BUCKET_DATASETS]
            if unknown:
                self.plan.warnings.append(f"{self.rel(path)}: datasets {unknown} are not part of the format; "
                                          "they are not copied")
            n = edge_dir.bucket_length(lhs, rhs)
            features = [n for n in names if n.endswith("_data")]
            what = "lhs, rhs, rel" + (" and " + ", ".join(features) if features else "")
            detail = f"{n:,} edges; {what} shifted by -{shift}" if shift else f"{n:,} edges"
            target = self.dst(edge_dir.path, naming.bucket_file(lhs, rhs))
            self.step(PHASE_DATA, target, [path], detail + "; format_version added",
                      functools.partial(_convert_bucket, edge_dir, lhs, rhs, target, path.stat().st_size))

    def _plan_checkpoint(self, checkpoint: LegacyCheckpointDir) -> None:
        is_primary = checkpoint is self.primary
        config = self.config if is_primary or checkpoint is self.init_dir else None
        version = checkpoint.read_version()
        dst = self.dst(checkpoint.path)
        if not is_primary and checkpoint.metadata_files and checkpoint is not self.init_dir and self.primary:
            self.plan.warnings.append(f"{self.rel(checkpoint.path)}: not named by the config; its embeddings "
                                      "are migrated without a config")
        if is_primary and self.config is None:
            return  # the config failed; errors already say why
        config_json = config.to_json() if config is not None else None
        iteration = _iteration(config, version) if config is not None and version > 0 else None
        metadata = FileMetadata(config_json, iteration)
        if version > 0:
            target = self.dst(checkpoint.path, naming.CHECKPOINT_VERSION)
            self.step(PHASE_CONFIG, target, [checkpoint.version_file] if checkpoint.version_file else [],
                      f"version {version}", _write_text(target, format_count(version)), size=0)
        if config is not None and (version > 0 or is_primary):
            self.step(PHASE_CONFIG, self.dst(checkpoint.path, naming.CONFIG_JSON), [], "the migrated config",
                      _write_text(self.dst(checkpoint.path, naming.CONFIG_JSON), config.to_json()), size=0)
        files = checkpoint.embeddings_of_version(version)
        if config is not None:
            for etype, schema in config.entities.items():
                for part in range(schema.num_partitions):
                    if (etype, part) not in files:
                        self.plan.errors.append(
                            f"{self.rel(checkpoint.path)}: no embeddings of {etype!r} partition {part} at "
                            f"version {version} ("
                            f"{spec.embeddings_file(etype, part + checkpoint.index_base, version)})")
        base = checkpoint.index_base
        for (etype, part), path in files.items():
            target = self.dst(checkpoint.path, naming.embeddings_file(etype, part, version))
            self.step(PHASE_DATA, target, [path],
                      "embeddings as float32, RowAdagrad sum kept, its legacy step dropped"
                      + (f"; partition shifted by -{base}" if base else ""),
                      functools.partial(_convert_embeddings, checkpoint, etype, part, version, dst, metadata))
        meta_path = checkpoint.metadata_path(version)
        if meta_path is not None:
            same = is_primary and self.meta is not None and self.meta.path == meta_path
            model = self.model if same else None
            self.step(PHASE_DATA, self.dst(checkpoint.path, naming.model_file(version)), [meta_path],
                      "model parameters with today's names"
                      + (f", {len(model.transposed)} transposed" if model and model.transposed else "")
                      + ("; optimizer state kept" if (model.optimizer if model else True) else ""),
                      functools.partial(_convert_model, checkpoint, version, config, model, dst, metadata))
        elif version > 0:
            self.plan.errors.append(f"{self.rel(checkpoint.path)}: no METADATA file of version {version}, "
                                    "so there is no model to migrate")
        for old in checkpoint.versions_on_disk():
            if old == version:
                continue
            old_files = [p for (_, _, v), p in checkpoint.embeddings_files.items() if v == old]
            if old in checkpoint.metadata_files:
                old_files.append(checkpoint.metadata_files[old])
            for p in sorted(old_files):
                self.plan.not_migrated.append(
                    f"{self.rel(p)} (version {old}; only version {version} is migrated)")


class _Resolver:
    """Maps a path stored in the legacy config to a directory under SRC.

    The stored ``checkpoint_path`` and the directory its METADATA was found in
    share a tail; what precedes the tail is the run's working directory, then and now.
    """

    def __init__(self, root: Path, stored_checkpoint: str, found_checkpoint: Path) -> None:
        self.root = root
        stored = PurePosixPath(stored_checkpoint)
        parts = [p for p in stored.parts if p != "."]
        found = found_checkpoint.relative_to(root).parts
        k = 0
        while k < min(len(parts), len(found)) and parts[-1 - k] == found[-1 - k]:
            k += 1
        self.old_cwd: PurePosixPath | None
        if stored.is_absolute():
            self.old_cwd = PurePosixPath(*parts[: len(parts) - k]) if k else None
            self.new_cwd = Path(root, *found[: len(found) - k]) if k else root
        else:
            self.old_cwd = PurePosixPath()
            self.new_cwd = Path(root, *found[: len(found) - k]) if k == len(parts) else root

    def resolve(self, stored: str) -> Path | None:
        path = PurePosixPath(stored)
        if path.is_absolute():
            if self.old_cwd is None or not self.old_cwd.is_absolute():
                return None
            try:
                relative = path.relative_to(self.old_cwd)
            except ValueError:
                return None
            candidate = self.new_cwd / relative
        else:
            candidate = self.new_cwd / path
        try:
            candidate.resolve().relative_to(self.root.resolve())
        except ValueError:
            return None
        return candidate if candidate.is_dir() else None


def _iteration(config: ConfigSchema, version: int) -> IterationInfo:
    """The iteration that wrote version N (index N - 1), chunk varying fastest."""
    chunks = config.num_edge_chunks or 1
    paths = len(config.edge_paths)
    index = version - 1
    return IterationInfo(
        num_epochs=config.num_epochs, epoch_idx=index // (chunks * paths), num_edge_paths=paths,
        edge_path_idx=(index // chunks) % paths, edge_path=config.edge_paths[(index // chunks) % paths],
        num_edge_chunks=chunks, edge_chunk_idx=index % chunks)


def _fill_placeholders(names: list[str | None], part: int) -> tuple[list[str], list[int]]:
    taken = {n for n in names if n is not None}
    filled: list[str] = []
    unnamed: list[int] = []
    for offset, name in enumerate(names):
        if name is None:
            unnamed.append(offset)
            name = PLACEHOLDER_NAME.format(part=part, offset=offset)
            while name in taken:
                name += "_"
            taken.add(name)
        filled.append(name)
    return filled, unnamed


# --------------------------------------------------------------------------- actions


def _write_text(target: str, text: str) -> Action:
    def run(staging: Path, advance: Advance) -> None:
        path = staging / target
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, text)
    return run


def _write_entity(writer: Callable[[Path, str, int, Any], None], directory: str, etype: str, part: int,
                  value: Any) -> Action:
    def run(staging: Path, advance: Advance) -> None:
        writer(staging / directory, etype, part, value)
        advance(0)
    return run


def _write_dir(writer: Callable[[Path, Any], None], directory: str, value: Any) -> Action:
    def run(staging: Path, advance: Advance) -> None:
        writer(staging / directory, value)
    return run


def _empty_bucket(target: str) -> Action:
    def run(staging: Path, advance: Advance) -> None:
        BucketWriter(staging / target).close()
    return run


def _convert_bucket(edge_dir: LegacyEdgeDir, lhs: int, rhs: int, target: str, size: int, staging: Path,
                    advance: Advance) -> None:
    n = max(1, edge_dir.bucket_length(lhs, rhs))
    done = 0
    with BucketWriter(staging / target, buffer_edges=WRITE_CHUNK_ELEMENTS) as writer:
        for start, end, block in edge_dir.iter_blocks(lhs, rhs):
            writer.append(block)
            step = size * end // n - done if end < n else size - done
            done += step
            advance(step)
            del start


def _convert_embeddings(checkpoint: LegacyCheckpointDir, etype: str, part: int, version: int, dst: str,
                        metadata: FileMetadata, staging: Path, advance: Advance) -> None:
    state: EmbeddingsState = checkpoint.read_embeddings(etype, part, version)
    CheckpointDir(staging / dst).write_embeddings(etype, part, version, state, metadata)
    advance(checkpoint.embeddings_of_version(version)[(etype, part)].stat().st_size)


def _convert_model(checkpoint: LegacyCheckpointDir, version: int, config: ConfigSchema | None,
                   model: MigratedModel | None, dst: str, metadata: FileMetadata, staging: Path,
                   advance: Advance) -> None:
    migrated = model if model is not None else checkpoint.migrate_model(version, config)
    state = ModelState(migrated.params, None if migrated.optimizer is None else serialize(migrated.optimizer))
    CheckpointDir(staging / dst).write_model(version, state, metadata)
    path = checkpoint.metadata_path(version)
    advance(path.stat().st_size if path is not None else 0)


def plan_summary(plan: MigrationPlan) -> str:
    """One line: files, bytes, warnings."""
    return (f"{len(plan.steps)} files from {_size(plan.total_bytes)} of legacy files, "
            f"{len(plan.warnings)} warning(s)")


def plan_json(plan: MigrationPlan) -> str:
    return json.dumps(plan.to_dict(), indent=2)
