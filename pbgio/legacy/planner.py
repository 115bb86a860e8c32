"""Plan the migration of a legacy layout: one step per file of DST, in the order they run.

:func:`plan_migration` reads only what is small (counts, ``dict.pt``, METADATA,
bucket headers) and returns a :class:`~pbgio.legacy.plan.MigrationPlan`; nothing is written.
It checks every pickle first, then reads the run's config (:class:`~pbgio.legacy.run.LegacyRun`),
then plans the files of each legacy directory: entity counts and names, edge buckets, and each
checkpoint's version, config, embeddings and model. Each step carries its action
(:mod:`pbgio.legacy.actions`); :func:`pbgio.legacy.migrate.migrate` runs them.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pbgio.checkpoint import FileMetadata, IterationInfo
from pbgio.config import ConfigSchema
from pbgio.entities import (
    write_dynamic_rel_count,
    write_entity_count,
    write_entity_names,
    write_relation_names,
)
from pbgio.errors import MissingArtifactError
from pbgio.legacy import actions, spec
from pbgio.legacy.pickles import check_pickle
from pbgio.legacy.plan import (
    PHASE_CONFIG,
    PHASE_COUNTS,
    PHASE_DATA,
    PHASE_NAMES,
    Action,
    MigrationPlan,
    MigrationStep,
)
from pbgio.legacy.reader import (
    KNOWN_BUCKET_DATASETS,
    LegacyCheckpointDir,
    LegacyEdgeDir,
    LegacyEntityDir,
    LegacyLayout,
    LegacyVariant,
)
from pbgio.legacy.run import LegacyRun
from pbgio.legacy.spec import legacy_error
from pbgio.spec import naming
from pbgio.spec.entities import format_count
from pbgio.storage import local_path

__all__ = ["PLACEHOLDER_NAME", "plan_migration"]

PLACEHOLDER_NAME = "__pbgio_unnamed_{part}_{offset}"
"""Name given to rows ``dict.pt`` does not name (the legacy converter's padding rows)."""


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
        self.counts: dict[tuple[Path, str, int], int] = {}
        self.plan = MigrationPlan(root, LegacyVariant((), None, None, None, False, (), None))
        self.run = LegacyRun(root, layout, self.plan)

    def step(self, phase: int, target: str, sources: list[Path], detail: str, action: Action,
             size: int | None = None) -> None:
        total = sum(p.stat().st_size for p in sources) if size is None else size
        sources_rel = tuple(self.run.rel(p) for p in sources)
        self.plan.steps.append(MigrationStep(target, sources_rel, detail, total, action, phase))

    # ---- build
    def build(self) -> MigrationPlan:
        pickled: list[LegacyEntityDir | LegacyCheckpointDir] = [*self.layout.entity_dirs,
                                                                 *self.layout.checkpoint_dirs]
        for directory in pickled:
            for path in directory.files():  # every pickle, before anything is unpickled
                if path.name not in spec.VERSION_FILES:
                    check_pickle(path, trust=self.trust_pickle, limit=directory.size_limit(path))
        self.run.read()
        config = self.run.config
        dynamic = config.dynamic_relations if config is not None else (
            any(d.dynamic_rel_count_file for d in self.layout.entity_dirs) or None)
        self.plan.variant = self.layout.variant(
            self.run.migration.era if self.run.migration else None, dynamic, self.run.primary)
        self._plan_config_files()
        for entity_dir in self.layout.entity_dirs:
            self._plan_entities(entity_dir)
        for edge_dir in self.layout.edge_dirs:
            self._plan_edges(edge_dir)
        for checkpoint in self.layout.checkpoint_dirs:
            self._plan_checkpoint(checkpoint)
        for path in self.layout.current_buckets:
            self.plan.errors.append(f"{self.run.rel(path)}: already a current-layout bucket (it has "
                                    "format_version); convert a directory that holds only legacy files")
        for path in self.layout.other_files:
            self.plan.not_migrated.append(f"{self.run.rel(path)} (not a file of the legacy layout)")
        self.plan.migrated_dirs = sorted({self.run.dst(d.path) for d in self.layout.all_dirs()})
        # Config and version files first, data last: a directory left by an interrupted run
        # then names files it lacks, and never validates as complete.
        self.plan.steps.sort(key=lambda s: s.phase)
        return self.plan

    # ---- steps
    def _plan_config_files(self) -> None:
        if self.run.config is None or self.run.primary is None:
            return
        if self.run.dst(self.run.primary.path) != ".":
            text = self.run.config.to_json()
            self.step(PHASE_CONFIG, naming.CONFIG_JSON, [self.run.meta.path] if self.run.meta else [],
                      "the config with today's keys and every default",
                      actions.write_text(naming.CONFIG_JSON, text), size=0)

    def _plan_entities(self, entity_dir: LegacyEntityDir) -> None:
        types = entity_dir.types()
        config = self.run.config if entity_dir is self.run.entity_dir else None
        if config is not None:
            for etype, schema in config.entities.items():
                found = types.get(etype, 0)
                if found != schema.num_partitions:
                    self.plan.errors.append(
                        f"{self.run.rel(entity_dir.path)}: expected {schema.num_partitions} count files of "
                        f"{etype!r} (numPartitions), found {found}")
        shift = f", partition shifted by -{entity_dir.index_base}" if entity_dir.index_base else ""
        for etype, part in sorted(entity_dir.count_files):
            self.counts[(entity_dir.path, etype, part)] = entity_dir.read_entity_count(etype, part)
        self._plan_names(entity_dir)
        for (etype, part), path in sorted(entity_dir.count_files.items()):
            count = self.counts[(entity_dir.path, etype, part)]
            target = self.run.dst(entity_dir.path, naming.entity_count_file(etype, part))
            self.step(PHASE_COUNTS, target, [path], f"count {count}{shift}",
                      actions.write_entity(write_entity_count, self.run.dst(entity_dir.path), etype, part,
                                           count))
        rel_count = self.run.dynamic_rel_count if entity_dir is self.run.entity_dir else None
        if rel_count is None and entity_dir.dynamic_rel_count_file is not None:
            rel_count = entity_dir.read_dynamic_rel_count()
        if rel_count is not None:
            sources = [entity_dir.dynamic_rel_count_file] if entity_dir.dynamic_rel_count_file else (
                [self.run.meta.path] if self.run.meta else [])
            detail = f"{rel_count} relation types" + ("" if entity_dir.dynamic_rel_count_file else
                                                      " (from the config's numDynamicRels)")
            self.step(PHASE_COUNTS, self.run.dst(entity_dir.path, naming.DYNAMIC_REL_COUNT), sources, detail,
                      actions.write_dir(write_dynamic_rel_count, self.run.dst(entity_dir.path), rel_count),
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
                self.plan.warnings.append(f"{self.run.rel(source)}: {len(beyond)} names of {etype!r} have "
                                          f"indices beyond its {total} rows (from {beyond[0]}); they are "
                                          "dropped")
            for part in range(entity_dir.types()[etype]):
                names = entity_dir.read_entity_names(etype, part)
                if names is None:
                    continue
                filled, unnamed = _fill_placeholders(names, part)
                if unnamed:
                    self.plan.warnings.append(
                        f"{self.run.rel(source)}: {etype!r} partition {part} has {len(names)} rows but "
                        f"{len(names) - len(unnamed)} names (the legacy converter gave every partition "
                        f"ceil(N/P) rows); {'rows' if len(unnamed) > 1 else 'row'} "
                        f"{', '.join(map(str, unnamed[:5]))} {'get' if len(unnamed) > 1 else 'gets'} a "
                        f"placeholder name like {filled[unnamed[0]]!r}")
                detail = f"{len(names)} names" + (f", {len(unnamed)} placeholders" if unnamed else "")
                target = self.run.dst(entity_dir.path, naming.entity_names_file(etype, part))
                self.step(PHASE_NAMES, target, [source], detail,
                          actions.write_entity(write_entity_names, self.run.dst(entity_dir.path), etype, part,
                                               filled), size=0)
        self._plan_relation_names(entity_dir, dictionary.relation_names())

    def _plan_relation_names(self, entity_dir: LegacyEntityDir, names: list[str | None] | None) -> None:
        if names is None or entity_dir.dictionary_file is None:
            return
        source = self.run.rel(entity_dir.dictionary_file)
        config = self.run.config if entity_dir is self.run.entity_dir else None
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
        count = self.run.dynamic_rel_count if entity_dir is self.run.entity_dir else None
        if count is None and entity_dir.dynamic_rel_count_file is not None:
            count = entity_dir.read_dynamic_rel_count()
        if count is not None and (config is None or config.dynamic_relations) and len(complete) != count:
            self.plan.warnings.append(f"{source}: {len(complete)} relation names for {count} relation types; "
                                      "dynamic_rel_names.json is not written")
            return
        directory = self.run.dst(entity_dir.path)
        self.step(PHASE_NAMES, self.run.dst(entity_dir.path, naming.DYNAMIC_REL_NAMES),
                  [entity_dir.dictionary_file], f"{len(complete)} relation names",
                  actions.write_dir(write_relation_names, directory, complete), size=0)

    def _plan_edges(self, edge_dir: LegacyEdgeDir) -> None:
        config = self.run.config
        if config is not None and self.run.dst(edge_dir.path) not in config.edge_paths:
            config = None
        keys = set(edge_dir.bucket_files)
        if config is not None:
            lhs_parts, rhs_parts = config.bucket_grid()
            grid = {(lhs, rhs) for lhs in range(lhs_parts) for rhs in range(rhs_parts)}
            for lhs, rhs in sorted(keys - grid):
                where = self.run.rel(edge_dir.bucket_files[(lhs, rhs)])
                self.plan.warnings.append(f"{where}: bucket ({lhs}, {rhs}) lies outside the config's "
                                          f"{lhs_parts}x{rhs_parts} grid")
            for lhs, rhs in sorted(grid - keys):
                target = self.run.dst(edge_dir.path, naming.bucket_file(lhs, rhs))
                self.plan.warnings.append(f"{target}: the legacy directory has no bucket ({lhs}, {rhs}); an "
                                          "empty one is written (today every bucket of the grid must exist)")
                self.step(PHASE_DATA, target, [], "empty bucket", actions.empty_bucket(target), size=0)
        shift = edge_dir.index_base
        for (lhs, rhs), path in sorted(edge_dir.bucket_files.items()):
            names = edge_dir.datasets(lhs, rhs)
            unknown = [n for n in names if n not in KNOWN_BUCKET_DATASETS]
            if unknown:
                self.plan.warnings.append(f"{self.run.rel(path)}: datasets {unknown} are not part of the "
                                          "format; they are not copied")
            n = edge_dir.bucket_length(lhs, rhs)
            features = [n for n in names if n.endswith("_data")]
            what = "lhs, rhs, rel" + (" and " + ", ".join(features) if features else "")
            detail = f"{n:,} edges; {what} shifted by -{shift}" if shift else f"{n:,} edges"
            target = self.run.dst(edge_dir.path, naming.bucket_file(lhs, rhs))
            self.step(PHASE_DATA, target, [path], detail + "; format_version added",
                      functools.partial(actions.convert_bucket, edge_dir, lhs, rhs, target, path.stat().st_size))

    def _plan_checkpoint(self, checkpoint: LegacyCheckpointDir) -> None:
        is_primary = checkpoint is self.run.primary
        config = self.run.config if is_primary or checkpoint is self.run.init_dir else None
        version = checkpoint.read_version()
        dst = self.run.dst(checkpoint.path)
        if not is_primary and checkpoint.metadata_files and checkpoint is not self.run.init_dir and self.run.primary:
            self.plan.warnings.append(f"{self.run.rel(checkpoint.path)}: not named by the config; its "
                                      "embeddings are migrated without a config")
        if is_primary and self.run.config is None:
            return  # the config failed; errors already say why
        config_json = config.to_json() if config is not None else None
        iteration = _iteration(config, version) if config is not None and version > 0 else None
        metadata = FileMetadata(config_json, iteration)
        if version > 0:
            target = self.run.dst(checkpoint.path, naming.CHECKPOINT_VERSION)
            self.step(PHASE_CONFIG, target, [checkpoint.version_file] if checkpoint.version_file else [],
                      f"version {version}", actions.write_text(target, format_count(version)), size=0)
        if config is not None and (version > 0 or is_primary):
            target = self.run.dst(checkpoint.path, naming.CONFIG_JSON)
            self.step(PHASE_CONFIG, target, [], "the migrated config",
                      actions.write_text(target, config.to_json()), size=0)
        files = checkpoint.embeddings_of_version(version)
        if config is not None:
            for etype, schema in config.entities.items():
                for part in range(schema.num_partitions):
                    if (etype, part) not in files:
                        self.plan.errors.append(
                            f"{self.run.rel(checkpoint.path)}: no embeddings of {etype!r} partition {part} at "
                            f"version {version} ("
                            f"{spec.embeddings_file(etype, part + checkpoint.index_base, version)})")
        base = checkpoint.index_base
        for (etype, part), path in files.items():
            target = self.run.dst(checkpoint.path, naming.embeddings_file(etype, part, version))
            self.step(PHASE_DATA, target, [path],
                      "embeddings as float32, RowAdagrad sum kept, its legacy step dropped"
                      + (f"; partition shifted by -{base}" if base else ""),
                      functools.partial(actions.convert_embeddings, checkpoint, etype, part, version, dst,
                                        metadata))
        meta_path = checkpoint.metadata_path(version)
        if meta_path is not None:
            same = is_primary and self.run.meta is not None and self.run.meta.path == meta_path
            model = self.run.model if same else None
            self.step(PHASE_DATA, self.run.dst(checkpoint.path, naming.model_file(version)), [meta_path],
                      "model parameters with today's names"
                      + (f", {len(model.transposed)} transposed" if model and model.transposed else "")
                      + ("; optimizer state kept" if (model.optimizer if model else True) else ""),
                      functools.partial(actions.convert_model, checkpoint, version, config, model, dst, metadata))
        elif version > 0:
            self.plan.errors.append(f"{self.run.rel(checkpoint.path)}: no METADATA file of version {version}, "
                                    "so there is no model to migrate")
        for old in checkpoint.versions_on_disk():
            if old == version:
                continue
            old_files = [p for (_, _, v), p in checkpoint.embeddings_files.items() if v == old]
            if old in checkpoint.metadata_files:
                old_files.append(checkpoint.metadata_files[old])
            for p in sorted(old_files):
                self.plan.not_migrated.append(
                    f"{self.run.rel(p)} (version {old}; only version {version} is migrated)")


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
    """``names`` with a unique :data:`PLACEHOLDER_NAME` for each ``None``, and the offsets filled."""
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
