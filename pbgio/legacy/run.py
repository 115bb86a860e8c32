"""The training run a legacy layout came from: its primary checkpoint, its config, its paths.

:class:`LegacyRun` is the first half of planning a migration
(:func:`pbgio.legacy.planner.plan_migration`): it chooses the checkpoint directory whose
METADATA holds the run's config, migrates that config to today's keys, and decides where each
directory the config names goes in DST (the stored paths are found under SRC with
:class:`~pbgio.legacy.resolver.PathResolver`). It also reads the run's model, so the config's
changes list its renamed parameters. What it finds wrong or changes goes into the plan's
``errors``, ``warnings`` and ``changes``; the planner then plans one step per file from it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from pbgio.config import ConfigSchema, parse_config
from pbgio.legacy import spec
from pbgio.legacy.plan import MigrationPlan
from pbgio.legacy.reader import LegacyCheckpointDir, LegacyEntityDir, LegacyLayout, LegacyMetadata
from pbgio.legacy.resolver import PathResolver
from pbgio.legacy.spec import ConfigMigration
from pbgio.legacy.state import MigratedModel

__all__ = ["LegacyRun"]


class LegacyRun:
    """The run's config and where its directories go; :meth:`read` fills it in.

    Every attribute but ``root``, ``layout`` and ``plan`` stays ``None`` (or empty) when SRC has
    no METADATA file, or several checkpoint directories hold one and none is clearly the run's.
    """

    def __init__(self, root: Path, layout: LegacyLayout, plan: MigrationPlan) -> None:
        self.root = root
        self.layout = layout
        self.plan = plan
        self.primary: LegacyCheckpointDir | None = None
        self.meta: LegacyMetadata | None = None
        self.migration: ConfigMigration | None = None
        self.config: ConfigSchema | None = None
        self.dst_of: dict[Path, str] = {}
        self.entity_dir: LegacyEntityDir | None = None
        self.init_dir: LegacyCheckpointDir | None = None
        self.dynamic_rel_count: int | None = None
        self.model: MigratedModel | None = None
        self.metadata_versions: dict[Path, int] = {}

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def dst(self, directory: Path, name: str | None = None) -> str:
        """Where ``directory`` (or file ``name`` in it) goes in DST."""
        base = self.dst_of.get(directory, self.rel(directory))
        if name is None:
            return base
        return name if base == "." else f"{base}/{name}"

    def read(self) -> None:
        """Choose the primary checkpoint and migrate its config (call after every pickle is checked)."""
        self._choose_primary()
        self._read_config()

    # ---- the primary checkpoint
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
        return PathResolver(self.root, ckpt, checkpoint.path).resolve(stored)

    # ---- the config
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
        resolver = PathResolver(self.root, stored, self.primary.path)
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

    def _map_entity_path(self, raw: dict[str, Any], resolver: PathResolver) -> None:
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

    def _map_edge_paths(self, raw: dict[str, Any], resolver: PathResolver) -> None:
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

    def _map_init_path(self, raw: dict[str, Any], resolver: PathResolver) -> None:
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
