"""Read the legacy (.pt era) layout through the same typed API as the current one.

Each directory kind has a reader that detects its own variant and hands out
today's types, already 0-based and renamed:

* :class:`LegacyEntityDir`: ``entity_count_{type}_{part}.pt``, ``dynamic_rel_count.pt``,
  ``dict.pt`` (names);
* :class:`LegacyEdgeDir`: ``edges_{l}_{r}.h5`` without ``format_version``, read as
  :class:`~pbgio.edges.EdgeBucket` with partitions, offsets, relation and feature ids
  shifted to 0-based (feature *offsets* are positions and stay);
* :class:`LegacyCheckpointDir`: ``CHECKPOINT_VERSION``, ``METADATA_{base}.pt[.N]`` and
  ``{type}_{part}.pt[.N]``, read as :class:`~pbgio.config.ConfigSchema`,
  :class:`~pbgio.checkpoint.EmbeddingsState` and :class:`~pbgio.checkpoint.ModelState`.

:class:`LegacyLayout` finds all three under a directory and sums up the
:class:`LegacyVariant`. Every pickle goes through :func:`pbgio.legacy.pickles.load_pickle`.

A legacy layout is read as one from a stranger (docs/security.md): every file is opened through
:func:`pbgio.formats.files.open_input` (pickles, the version file; a count within
:data:`COUNT_LIMIT`) or :func:`pbgio.formats.h5.open_h5` (buckets), so a link out of the layout, a
FIFO or a device under a legacy name is refused, never followed or skipped; every bucket dataset is
checked by :func:`pbgio.formats.h5.check_written` (stored in the file, every row it claims written)
before any of it is read.

Partition numbers given to and returned by these readers are 0-based.

Why this module is long: it holds the three directory readers of the legacy layout, which share
the detection of the layout's variant (1-based parts, camelCase era, metadata base); each reader
is read on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pbgio.checkpoint import EmbeddingsState, ModelState
from pbgio.config import ConfigSchema, parse_config
from pbgio.edges import EdgeBucket, FeatureLists
from pbgio.errors import FormatError, MissingArtifactError
from pbgio.formats import files
from pbgio.formats.h5 import check_written, format_version, open_h5
from pbgio.legacy import spec
from pbgio.legacy.pickles import Container, inspect_pickle, load_pickle
from pbgio.legacy.spec import ConfigMigration, LegacyDictionary, legacy_error, migrate_config_dict
from pbgio.legacy.state import (
    MigratedModel,
    migrate_embeddings_optimizer,
    migrate_model,
    serialize,
    to_float32,
)
from pbgio.spec.edges import INDEX_DATASETS, SIDES, WRITE_CHUNK_ELEMENTS, data_name, offsets_name

IndexBase = Literal[0, 1]
KNOWN_BUCKET_DATASETS = frozenset({*INDEX_DATASETS, "weight", *(offsets_name(s) for s in SIDES),
                                   *(data_name(s) for s in SIDES)})


def _base_of(parts: list[int], where: Path, what: str) -> IndexBase:
    """0 when partition 0 exists, else 1 (the 1-based era never wrote a partition 0)."""
    if not parts:
        return 1
    low = min(parts)
    if low not in (0, 1):
        raise legacy_error("legacy-layout-conflict", str(where),
                           f"expected {what} numbered from 0 or 1, found the lowest at {low}")
    return 0 if low == 0 else 1


def _as_count(value: Any, path: Path, what: str) -> int:
    if is_int_tensor(value):
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise legacy_error("legacy-structure", str(path),
                           f"expected {what} as a non-negative int, found {type(value).__name__} "
                           f"{value!r:.40}")
    return value


def _present(path: Path) -> bool:
    """Whether something stands at ``path`` that is read as the file of its name (:func:`_listed`)."""
    return (path.is_symlink() or path.exists()) and _listed(path)


def _listed(path: Path) -> bool:
    """Whether a directory entry is read as a file of its name: anything but a real directory. A link, a
    FIFO or a device under a legacy file's name is read, and refused there
    (:func:`pbgio.formats.files.open_input`), never skipped in silence."""
    return path.is_symlink() or not path.is_dir()


COUNT_LIMIT = files.TEXT_LIMIT
"""Bytes of a legacy count file (``entity_count_*.pt``, ``dynamic_rel_count.pt``) read at most: a
genuine one is about a kilobyte."""


def is_int_tensor(value: Any) -> bool:
    from pbgio.legacy.state import is_tensor

    return bool(is_tensor(value) and value.dim() == 0 and not value.is_floating_point())


# --------------------------------------------------------------------------- entities


class LegacyEntityDir:
    """A legacy ``entityPath``: counts, the dynamic relation count and ``dict.pt``."""

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        self.path = path
        self.trust_pickle = trust_pickle
        raw: dict[tuple[str, int], Path] = {}
        for p in sorted(path.iterdir()):
            parsed = spec.parse_entity_count_file(p.name)
            if parsed and _listed(p):
                raw[parsed] = p
        self.index_base: IndexBase = _base_of([part for _, part in raw], path, "entity count partitions")
        self.count_files = {(t, part - self.index_base): p for (t, part), p in raw.items()}
        for etype in self.types():
            parts = sorted(part for t, part in self.count_files if t == etype)
            if parts != list(range(len(parts))):
                raise legacy_error(
                    "legacy-layout-conflict", str(path),
                    f"expected the count files of {etype!r} numbered {self.index_base}.."
                    f"{self.index_base + len(parts) - 1}, found "
                    f"{[p + self.index_base for p in parts]}")
        dyn = path / spec.DYNAMIC_REL_COUNT
        self.dynamic_rel_count_file = dyn if _present(dyn) else None
        dictionary = path / spec.DICTIONARY
        self.dictionary_file = dictionary if _present(dictionary) else None
        self._dictionary: LegacyDictionary | None = None

    def types(self) -> dict[str, int]:
        """Entity types with count files, and their number of partitions."""
        out: dict[str, int] = {}
        for etype, part in sorted(self.count_files):
            out[etype] = max(out.get(etype, 0), part + 1)
        return out

    def files(self) -> list[Path]:
        return sorted([*self.count_files.values(),
                       *(p for p in (self.dynamic_rel_count_file, self.dictionary_file) if p is not None)])

    def size_limit(self, path: Path) -> int | None:
        """Bytes of ``path`` read at most: :data:`COUNT_LIMIT` for a count file, None (no cap) for ``dict.pt``."""
        return None if path == self.dictionary_file else COUNT_LIMIT

    def read_entity_count(self, entity_type: str, part: int) -> int:
        path = self.count_files.get((entity_type, part))
        if path is None:
            raise MissingArtifactError(
                str(self.path / f"entity_count_{entity_type}_{part + self.index_base}.pt"),
                f"legacy entity count of {entity_type!r} partition {part}")
        return _as_count(load_pickle(path, trust=self.trust_pickle, limit=COUNT_LIMIT), path, "the entity count")

    def read_dynamic_rel_count(self) -> int:
        if self.dynamic_rel_count_file is None:
            raise MissingArtifactError(str(self.path / spec.DYNAMIC_REL_COUNT),
                                       "legacy dynamic relation count")
        path = self.dynamic_rel_count_file
        return _as_count(load_pickle(path, trust=self.trust_pickle, limit=COUNT_LIMIT), path,
                         "the dynamic relation count")

    def read_dictionary(self) -> LegacyDictionary | None:
        if self.dictionary_file is None:
            return None
        if self._dictionary is None:
            value = load_pickle(self.dictionary_file, trust=self.trust_pickle)
            self._dictionary = LegacyDictionary.from_value(value, str(self.dictionary_file))
        return self._dictionary

    def read_entity_names(self, entity_type: str, part: int) -> list[str | None] | None:
        """Names of a partition's rows from ``dict.pt``; None for rows it does not name.

        The legacy converter numbered a type's entities globally; partition ``p``
        holds the indices after the counts of partitions ``0..p-1``. It gave every
        partition ``ceil(N/P)`` rows, so the last one can have unnamed rows.
        Returns None when ``dict.pt`` has no table for the type.
        """
        dictionary = self.read_dictionary()
        if dictionary is None or entity_type not in dictionary.entities:
            return None
        table = dictionary.entities[entity_type]
        start = sum(self.read_entity_count(entity_type, p) for p in range(part))
        count = self.read_entity_count(entity_type, part)
        return [table.get(start + i) for i in range(count)]

    def read_relation_names(self) -> list[str | None] | None:
        dictionary = self.read_dictionary()
        return None if dictionary is None else dictionary.relation_names()


# --------------------------------------------------------------------------- edges


class LegacyEdgeDir:
    """A legacy edge path: ``edges_{l}_{r}.h5`` without ``format_version``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        raw: dict[tuple[int, int], Path] = {}
        for p in sorted(path.iterdir()):
            parsed = spec.parse_bucket_file(p.name)
            if parsed and _listed(p):
                raw[parsed] = p
        self.index_base: IndexBase = _base_of([i for key in raw for i in key], path, "bucket partitions")
        base = self.index_base
        self.bucket_files = {(lhs - base, rhs - base): p for (lhs, rhs), p in raw.items()}

    def files(self) -> list[Path]:
        return sorted(self.bucket_files.values())

    def bucket_path(self, lhs: int, rhs: int) -> Path:
        path = self.bucket_files.get((lhs, rhs))
        if path is None:
            raise MissingArtifactError(
                str(self.path / f"edges_{lhs + self.index_base}_{rhs + self.index_base}.h5"),
                f"legacy bucket ({lhs}, {rhs})")
        return path

    def datasets(self, lhs: int, rhs: int) -> list[str]:
        path = self.bucket_path(lhs, rhs)
        with open_h5(path) as f:
            self._check(f, path)
            return sorted(f.keys())

    def bucket_length(self, lhs: int, rhs: int) -> int:
        path = self.bucket_path(lhs, rhs)
        with open_h5(path) as f:
            self._check(f, path)
            return int(f["rel"].shape[0])

    def _check(self, f: Any, path: Path) -> None:
        if format_version(f) is not None:
            raise legacy_error("legacy-bucket", str(path),
                               f"expected a legacy bucket without format_version, found format_version="
                               f"{format_version(f)!r} (this file is already in the current layout)")
        for name in INDEX_DATASETS:
            if name not in f:
                raise legacy_error("legacy-bucket", str(path), f"expected dataset {name}, found none", name)
        n = f["rel"].shape
        for name in f:
            ds = f[name]
            if not hasattr(ds, "dtype") or ds.ndim != 1:
                raise legacy_error("legacy-bucket", str(path), "expected a one-dimensional dataset", name)
            check_written(ds, path)  # stored in this file, every row it claims written: before any is read
            if name in KNOWN_BUCKET_DATASETS and name != "weight" and ds.dtype.kind not in "iu":
                raise legacy_error("legacy-bucket", str(path), f"expected integers, found {ds.dtype}", name)
        for name in ("lhs", "rhs", "weight"):
            if name in f and f[name].shape != n:
                raise legacy_error("legacy-bucket", str(path),
                                   f"expected {n[0]} entries like rel, found {f[name].shape[0]}", name)
        for side in SIDES:
            has_off, has_data = offsets_name(side) in f, data_name(side) in f
            if has_off != has_data:
                raise legacy_error("legacy-bucket", str(path),
                                   f"expected {offsets_name(side)} and {data_name(side)} together, found one",
                                   offsets_name(side))
            if has_off and f[offsets_name(side)].shape[0] != n[0] + 1:
                raise legacy_error("legacy-bucket", str(path),
                                   f"expected {n[0] + 1} offsets, found {f[offsets_name(side)].shape[0]}",
                                   offsets_name(side))

    def iter_blocks(self, lhs: int, rhs: int, *,
                    block_edges: int = WRITE_CHUNK_ELEMENTS) -> Iterator[tuple[int, int, EdgeBucket]]:
        """``(start, end, edges)`` blocks of a bucket, shifted to 0-based."""
        path = self.bucket_path(lhs, rhs)
        with open_h5(path) as f:
            self._check(f, path)
            n = int(f["rel"].shape[0])
            for start in range(0, n, block_edges):
                end = min(n, start + block_edges)
                yield start, end, self._read(f, start, end)
            if n == 0:
                yield 0, 0, self._read(f, 0, 0)

    def read_bucket(self, lhs: int, rhs: int, *, edge_range: tuple[int, int] | None = None) -> EdgeBucket:
        """A whole bucket (or an edge range of it), shifted to 0-based."""
        path = self.bucket_path(lhs, rhs)
        with open_h5(path) as f:
            self._check(f, path)
            n = int(f["rel"].shape[0])
            start, end = (0, n) if edge_range is None else (max(0, edge_range[0]), min(n, edge_range[1]))
            return self._read(f, start, max(start, end))

    def _read(self, f: Any, start: int, end: int) -> EdgeBucket:
        base = self.index_base

        def shifted(name: str, lo: int, hi: int) -> np.ndarray[Any, np.dtype[np.int64]]:
            return np.asarray(f[name][lo:hi], dtype=np.int64) - base

        weight = np.asarray(f["weight"][start:end], dtype=np.float32) if "weight" in f else None
        feats: dict[str, FeatureLists | None] = {}
        for side in SIDES:
            if offsets_name(side) in f:
                off = np.asarray(f[offsets_name(side)][start:end + 1], dtype=np.int64)
                data = shifted(data_name(side), int(off[0]), int(off[-1]))
                feats[side] = FeatureLists(off - off[0], data)
            else:
                feats[side] = None
        return EdgeBucket(shifted("rel", start, end), shifted("lhs", start, end), shifted("rhs", start, end),
                          weight, feats["lhs"], feats["rhs"])


# --------------------------------------------------------------------------- checkpoint


@dataclass
class LegacyMetadata:
    """The 5-tuple of a ``METADATA`` file, raw (legacy keys, tensors)."""

    path: Path
    config: dict[str, Any]
    edge_path_count: int
    edge_chunk: int
    model_state: Mapping[str, Any]
    model_optimizer: Any

    def implied_version(self, num_edge_chunks: int) -> int:
        """The checkpoint version these iteration fields describe (vN = N completed iterations)."""
        return self.edge_path_count * num_edge_chunks + self.edge_chunk + 1

    def config_migration(self) -> ConfigMigration:
        return migrate_config_dict(self.config, str(self.path))


class LegacyCheckpointDir:
    """A legacy ``outdir`` (or ``loadPath``): version file, METADATA and embeddings files."""

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        self.path = path
        self.trust_pickle = trust_pickle
        self.version_file: Path | None = next(
            (path / n for n in spec.VERSION_FILES if _present(path / n)), None)
        self.metadata_files: dict[int, Path] = {}
        bases: set[int] = set()
        raw: list[tuple[str, int, int, Path]] = []
        for p in sorted(path.iterdir()):
            if not _listed(p):
                continue
            meta = spec.parse_metadata_file(p.name)
            if meta is not None:
                bases.add(meta[0])
                self.metadata_files[meta[1] or 0] = p
                continue
            parsed = spec.parse_embeddings_file(p.name)
            if parsed is not None:
                raw.append((parsed[0], parsed[1], parsed[2] or 0, p))
        if len(bases) > 1:
            raise legacy_error("legacy-layout-conflict", str(path),
                               "expected METADATA files of one index base, found both METADATA_0 and "
                               "METADATA_1")
        self.index_base: IndexBase = (0 if bases.pop() == 0 else 1) if bases else \
            _base_of([part for _, part, _, _ in raw], path, "embeddings partitions")
        low = [part for _, part, _, _ in raw if part < self.index_base]
        if low:
            raise legacy_error("legacy-layout-conflict", str(path),
                               f"expected embeddings partitions numbered from {self.index_base} like "
                               f"METADATA_{self.index_base}, found partition {low[0]}")
        self.embeddings_files = {(t, part - self.index_base, v): p for t, part, v, p in raw}
        self._metadata: dict[Path, LegacyMetadata] = {}

    @property
    def init_layout(self) -> bool:
        """No version file: a loadPath-style directory whose files carry no suffix."""
        return self.version_file is None

    def versions_on_disk(self) -> list[int]:
        return sorted({v for _, _, v in self.embeddings_files} | set(self.metadata_files))

    def read_version(self) -> int:
        """The committed version: the version file (empty means 0), else the newest files on disk."""
        if self.version_file is None:
            versions = self.versions_on_disk()
            return versions[-1] if versions else 0
        try:
            text = files.read_text(self.version_file, "legacy version file", encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            if isinstance(exc, MissingArtifactError):
                raise
            raise legacy_error("legacy-structure", str(self.version_file),
                               f"expected a decimal version, found an unreadable file ({exc})") from None
        if not text:
            return 0
        if not text.isdigit():
            raise legacy_error("legacy-structure", str(self.version_file),
                               f"expected a decimal version, found {text[:40]!r}")
        return int(text)

    def files(self) -> list[Path]:
        return sorted([*self.metadata_files.values(), *self.embeddings_files.values(),
                       *([self.version_file] if self.version_file else [])])

    def size_limit(self, path: Path) -> int | None:
        """Bytes of ``path`` read at most: None, no cap (checkpoint files are as large as their data)."""
        del path
        return None

    def embeddings_of_version(self, version: int) -> dict[tuple[str, int], Path]:
        return {(t, part): p for (t, part, v), p in sorted(self.embeddings_files.items()) if v == version}

    def metadata_path(self, version: int) -> Path | None:
        return self.metadata_files.get(version)

    def containers(self) -> set[Container]:
        return {inspect_pickle(p).container for p in self.files() if p != self.version_file}

    # ---- typed reading
    def read_metadata(self, version: int | None = None) -> LegacyMetadata:
        version = self.read_version() if version is None else version
        path = self.metadata_path(version)
        if path is None:
            raise MissingArtifactError(str(self.path / spec.metadata_file(self.index_base, version)),
                                       f"legacy METADATA of version {version}")
        if path not in self._metadata:
            self._metadata[path] = self._parse_metadata(path, load_pickle(path, trust=self.trust_pickle))
        return self._metadata[path]

    @staticmethod
    def _parse_metadata(path: Path, value: Any) -> LegacyMetadata:
        if not isinstance(value, tuple | list) or len(value) != len(spec.METADATA_FIELDS):
            raise legacy_error("legacy-structure", str(path),
                               f"expected the tuple {spec.METADATA_FIELDS}, found {type(value).__name__}"
                               + (f" of {len(value)}" if isinstance(value, tuple | list) else ""))
        config, path_count, chunk, state, optimizer = value
        if not isinstance(config, Mapping):
            raise legacy_error("legacy-structure", str(path),
                               f"expected the config as a dict, found {type(config).__name__}")
        for what, v in (("edge_path_count", path_count), ("edge_chunk", chunk)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise legacy_error("legacy-structure", str(path),
                                   f"expected {what} as an int, found {v!r:.40}")
        if not isinstance(state, Mapping):
            raise legacy_error("legacy-structure", str(path),
                               f"expected the model state dict, found {type(state).__name__}")
        return LegacyMetadata(path, dict(config), 0 if path_count is None else path_count,
                              -1 if chunk is None else chunk, state, optimizer)

    def read_config(self, version: int | None = None) -> ConfigSchema:
        """The stored config with today's keys (paths as stored), validated."""
        meta = self.read_metadata(version)
        return parse_config(meta.config_migration().config, str(meta.path))

    def read_embeddings(self, entity_type: str, part: int, version: int | None = None) -> EmbeddingsState:
        """Embeddings as float32 and the RowAdagrad state as a today's-format blob."""
        version = self.read_version() if version is None else version
        path = self.embeddings_of_version(version).get((entity_type, part))
        if path is None:
            raise MissingArtifactError(
                str(self.path / spec.embeddings_file(entity_type, part + self.index_base, version)),
                f"legacy embeddings of {entity_type!r} partition {part}, version {version}")
        value = load_pickle(path, trust=self.trust_pickle)
        if not isinstance(value, tuple | list) or len(value) != len(spec.EMBEDDINGS_FIELDS):
            raise legacy_error("legacy-structure", str(path),
                               f"expected the tuple {spec.EMBEDDINGS_FIELDS}, found {type(value).__name__}")
        embs = to_float32(value[0], str(path), "the embeddings")
        if embs.ndim != 2:
            raise legacy_error("legacy-structure", str(path),
                               f"expected 2-D embeddings (count, dimension), found shape {embs.shape}")
        optimizer = migrate_embeddings_optimizer(value[1], str(path))
        return EmbeddingsState(embs, None if optimizer is None else serialize(optimizer))

    def migrate_model(self, version: int | None = None, config: ConfigSchema | None = None) -> MigratedModel:
        """The model of a version with today's names, order and optimizer state (unserialized)."""
        meta = self.read_metadata(version)
        return migrate_model(meta.model_state, meta.model_optimizer, config, str(meta.path))

    def read_model(self, version: int | None = None, config: ConfigSchema | None = None) -> ModelState:
        model = self.migrate_model(version, config)
        return ModelState(model.params, None if model.optimizer is None else serialize(model.optimizer))


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class LegacyVariant:
    """Which legacy layout a directory is in (as far as its files tell)."""

    index_bases: tuple[int, ...]
    config_era: Literal["camelCase", "snake_case"] | None
    version_file: str | None
    version: int | None
    init_layout: bool
    containers: tuple[str, ...]
    dynamic_relations: bool | None

    def describe(self) -> list[str]:
        bases = " and ".join(f"{b}-based" for b in self.index_bases) or "unknown"
        era = {"camelCase": "camelCase (January–early February 2019)",
               "snake_case": "snake_case (February 2019)", None: "none found"}[self.config_era]
        kinds = {"zip": "zip (torch >= 1.6)", "legacy": "legacy non-zip torch.save", "pickle": "bare pickle"}
        lines = [
            f"index base: {bases}" + (" (the 0-based interim)" if self.index_bases == (0,) else ""),
            f"config: {era}",
            "version file: " + (f"{self.version_file} (version {self.version})" if self.version_file
                                else "none" + (" (init/loadPath layout, files without suffix)"
                                               if self.init_layout else "")),
            "serialization: " + (", ".join(kinds[c] for c in self.containers) or "none"),
        ]
        if self.dynamic_relations is not None:
            lines.append(f"relations: {'dynamic' if self.dynamic_relations else 'static'}")
        return lines


@dataclass
class LegacyLayout:
    """Every legacy directory under a root, by kind."""

    root: Path
    entity_dirs: list[LegacyEntityDir] = field(default_factory=list)
    edge_dirs: list[LegacyEdgeDir] = field(default_factory=list)
    checkpoint_dirs: list[LegacyCheckpointDir] = field(default_factory=list)
    other_files: list[Path] = field(default_factory=list)
    current_buckets: list[Path] = field(default_factory=list)

    @classmethod
    def discover(cls, root: Path, *, trust_pickle: bool = False) -> LegacyLayout:
        """Walk ``root`` (not following links, skipping hidden directories) and classify directories."""
        layout = cls(root)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            here = Path(dirpath)
            names = sorted(filenames)
            claimed: set[str] = set()
            if any(spec.parse_entity_count_file(n) or n in (spec.DYNAMIC_REL_COUNT, spec.DICTIONARY)
                   for n in names):
                entity_dir = LegacyEntityDir(here, trust_pickle=trust_pickle)
                layout.entity_dirs.append(entity_dir)
                claimed |= {p.name for p in entity_dir.files()}
            if any(spec.parse_bucket_file(n) for n in names):
                edge_dir = LegacyEdgeDir(here)
                legacy: list[Path] = []
                current: list[Path] = []
                for p in edge_dir.files():
                    (current if _has_format_version(p) else legacy).append(p)
                if legacy:
                    layout.edge_dirs.append(edge_dir)
                    claimed |= {p.name for p in edge_dir.files()}
                layout.current_buckets += current
            if any(n in spec.VERSION_FILES or spec.parse_metadata_file(n) or spec.parse_embeddings_file(n)
                   for n in names if n not in claimed):
                checkpoint = LegacyCheckpointDir(here, trust_pickle=trust_pickle)
                layout.checkpoint_dirs.append(checkpoint)
                claimed |= {p.name for p in checkpoint.files()}
            layout.other_files += [here / n for n in names if n not in claimed]
        return layout

    @property
    def empty(self) -> bool:
        return not (self.entity_dirs or self.edge_dirs or self.checkpoint_dirs)

    def all_dirs(self) -> list[LegacyEntityDir | LegacyEdgeDir | LegacyCheckpointDir]:
        return [*self.entity_dirs, *self.edge_dirs, *self.checkpoint_dirs]

    def variant(self, config_era: Literal["camelCase", "snake_case"] | None = None,
                dynamic_relations: bool | None = None,
                primary: LegacyCheckpointDir | None = None) -> LegacyVariant:
        bases = sorted({d.index_base for d in self.all_dirs()
                        if not isinstance(d, LegacyEdgeDir) or d.bucket_files})
        containers: set[str] = set()
        for d in self.entity_dirs:
            containers |= {inspect_pickle(p).container for p in d.files()}
        for c in self.checkpoint_dirs:
            containers |= c.containers()
        primary = primary or (self.checkpoint_dirs[0] if self.checkpoint_dirs else None)
        return LegacyVariant(
            index_bases=tuple(bases),
            config_era=config_era,
            version_file=primary.version_file.name if primary and primary.version_file else None,
            version=primary.read_version() if primary else None,
            init_layout=bool(primary and primary.init_layout),
            containers=tuple(sorted(containers)),
            dynamic_relations=dynamic_relations,
        )


def _has_format_version(path: Path) -> bool:
    try:
        with open_h5(path) as f:
            return format_version(f) is not None
    except (FormatError, MissingArtifactError):
        return False  # unreadable: reported when the bucket is read
