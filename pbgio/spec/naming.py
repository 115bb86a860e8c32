"""File names of the current (format_version 1) layout, and entity-type name safety.

Every file name pbgio reads or writes is built and parsed here, nowhere else (the legacy .pt
layout's own names are in :mod:`pbgio.legacy.spec`; its buckets are :data:`BUCKET_RE`'s).

>>> entity_count_file("user", 3)
'entity_count_user_3.txt'
>>> parse_entity_count_file("entity_count_my_type_12.txt")
('my_type', 12)
>>> bucket_file(0, 1), parse_bucket_file("edges_0_1.h5")
('edges_0_1.h5', (0, 1))
>>> parse_bucket_file("edges_\u0663_0.h5") is None  # numbers in file names are ASCII digits
True
>>> embeddings_file("user", 0, 7)
'embeddings_user_0.v7.h5'
>>> parse_versioned_file("embeddings_user_0.v7.h5")
('embeddings', 'user', 0, 7)
>>> parse_versioned_file("model.v7.h5")
('model', None, None, 7)
>>> parse_versioned_file("index_user.cos.flat.v7.h5")
('index', 'user', None, 7)
>>> entity_type_name_problem("../etc")
'contains a path separator'
>>> entity_type_name_portability("user:v1")
"contains ':', which some file systems forbid"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENTITY_COUNT_RE = re.compile(r"^entity_count_(?P<type>.+)_(?P<part>[0-9]+)\.txt$")
ENTITY_NAMES_RE = re.compile(r"^entity_names_(?P<type>.+)_(?P<part>[0-9]+)\.json$")
BUCKET_RE = re.compile(r"^edges_(?P<lhs>[0-9]+)_(?P<rhs>[0-9]+)\.h5$")
EMBEDDINGS_RE = re.compile(r"^embeddings_(?P<type>.+)_(?P<part>[0-9]+)\.v(?P<version>[0-9]+)\.h5$")
MODEL_RE = re.compile(r"^model\.v(?P<version>[0-9]+)\.h5$")
# index_{type}.{metric}.{kind}.v{version}.h5; index_{type}.v{version}.h5 is the name of pbgio
# 0.1's indexes, one per type and version (still read; its metric and kind are in its metadata).
INDEX_RE = re.compile(
    r"^index_(?P<type>.+?)(?:\.(?P<metric>[a-z0-9]+)\.(?P<kind>[a-z0-9]+))?\.v(?P<version>[0-9]+)\.h5$")
SNAPSHOT_DIR_RE = re.compile(r"^epoch_(?P<epoch>[0-9]+)$")
BEST_DIR = "best"  # pbgtrain fit --valid: the version that scored best on the validation edges

DYNAMIC_REL_COUNT = "dynamic_rel_count.txt"
DYNAMIC_REL_NAMES = "dynamic_rel_names.json"
CHECKPOINT_VERSION = "checkpoint_version.txt"
CONFIG_JSON = "config.json"
SHARED_PROBE = ".pbg-shared-probe"  # written and removed by the first trainer of a distributed run
CHECKPOINT_LOCK = ".pbg-lock"  # held by the writer of a checkpoint directory (pbgio.storage.lock); readers skip it
TRAINING_STATS = "training_stats.json"

# Names that mark the legacy (.pt era) layout; see pbgio.legacy for migration.
LEGACY_MARKERS_RE = re.compile(
    r"^(CHECKPOINT_VERSION|FILAMENT_CHECKPOINT_VERSION|METADATA_[01]\.pt(\.[0-9]+)?|"
    r"entity_count_.+_[0-9]+\.pt|dynamic_rel_count\.pt|dict\.pt|.+_[0-9]+\.pt(\.[0-9]+)?)$"
)

MAX_TYPE_NAME_BYTES = 200
MAX_FILE_NAME_BYTES = 255
_UNPORTABLE_CHARS = set('<>:"|?*')


def entity_count_file(entity_type: str, part: int) -> str:
    return f"entity_count_{entity_type}_{part}.txt"


def entity_names_file(entity_type: str, part: int) -> str:
    return f"entity_names_{entity_type}_{part}.json"


def bucket_file(lhs: int, rhs: int) -> str:
    return f"edges_{lhs}_{rhs}.h5"


def embeddings_file(entity_type: str, part: int, version: int) -> str:
    return f"embeddings_{entity_type}_{part}.v{version}.h5"


def model_file(version: int) -> str:
    return f"model.v{version}.h5"


def index_file(entity_type: str, version: int, metric: str, kind: str) -> str:
    """A nearest-neighbour index of one entity type built from one version, by ``metric``, of
    ``kind`` (:mod:`pbgio.spec.index`): several may sit beside a version, one per metric and kind."""
    return f"index_{entity_type}.{metric}.{kind}.v{version}.h5"


@dataclass(frozen=True)
class IndexName:
    """What an index file's name says: its type and version, and its metric and kind (None in
    the name of pbgio 0.1's indexes, ``index_{type}.v{version}.h5``: their metadata says)."""

    entity_type: str
    version: int
    metric: str | None
    kind: str | None


def parse_index_file(name: str) -> IndexName | None:
    """
    >>> parse_index_file("index_user.cos.ivf.v7.h5")
    IndexName(entity_type='user', version=7, metric='cos', kind='ivf')
    >>> parse_index_file("index_user.v7.h5")
    IndexName(entity_type='user', version=7, metric=None, kind=None)
    """
    m = INDEX_RE.match(name)
    return IndexName(m["type"], int(m["version"]), m["metric"], m["kind"]) if m else None


def snapshot_dir(epoch: int) -> str:
    return f"epoch_{epoch}"


def is_snapshot_dir(name: str) -> bool:
    """A subdirectory of a checkpoint directory holding one preserved version: ``epoch_{k}`` (the
    original's ``checkpoint_preservation_interval``) or ``best`` (pbgtrain's validation-driven runs).

    >>> [is_snapshot_dir(n) for n in ("epoch_3", "best", "epoch_x", "tmp")]
    [True, True, False, False]
    """
    return bool(SNAPSHOT_DIR_RE.match(name)) or name == BEST_DIR


def is_checkpoint_entry(name: str) -> bool:
    """A name pbg writes in a checkpoint directory: the version file, ``config.json``, the training
    stats, the lock and probe, a version's files, an index, a kept version (``best/``, ``epoch_k/``)
    or a temporary file of an atomic write. A directory that holds files and none of these is not a
    checkpoint, and ``pbgtrain fit`` does not write into it.

    >>> [is_checkpoint_entry(n) for n in ("model.v3.h5", ".model.v3.h5.tmp", "best", "notes.txt")]
    [True, True, True, False]
    """
    if is_snapshot_dir(name) or name in (CHECKPOINT_VERSION, CONFIG_JSON, TRAINING_STATS, CHECKPOINT_LOCK,
                                         SHARED_PROBE):
        return True
    if name.startswith(".") and name.endswith(".tmp"):
        name = name[1:-len(".tmp")]
    return bool(EMBEDDINGS_RE.match(name) or MODEL_RE.match(name) or INDEX_RE.match(name))


def parse_entity_count_file(name: str) -> tuple[str, int] | None:
    m = ENTITY_COUNT_RE.match(name)
    return (m["type"], int(m["part"])) if m else None


def parse_entity_names_file(name: str) -> tuple[str, int] | None:
    m = ENTITY_NAMES_RE.match(name)
    return (m["type"], int(m["part"])) if m else None


def parse_bucket_file(name: str) -> tuple[int, int] | None:
    m = BUCKET_RE.match(name)
    return (int(m["lhs"]), int(m["rhs"])) if m else None


def parse_versioned_file(name: str) -> tuple[str, str | None, int | None, int] | None:
    """``(kind, type, part, version)`` of a checkpoint file name (kind: embeddings, model or index),
    or None."""
    m = EMBEDDINGS_RE.match(name)
    if m:
        return ("embeddings", m["type"], int(m["part"]), int(m["version"]))
    m = MODEL_RE.match(name)
    if m:
        return ("model", None, None, int(m["version"]))
    m = INDEX_RE.match(name)
    if m:
        return ("index", m["type"], None, int(m["version"]))
    return None


def is_legacy_marker(name: str) -> bool:
    return bool(LEGACY_MARKERS_RE.match(name))


def entity_type_name_problem(name: str, num_partitions: int = 1) -> str | None:
    """Why the original cannot use ``name`` as an entity type of ``num_partitions`` partitions
    (rule ``entity-type-name-unsafe``), or None: it must fit in its file names (the longest is that
    of the last partition) and its model's parameter names.

    >>> name = "t" * 231
    >>> entity_type_name_problem(name) is None, entity_type_name_problem(name, num_partitions=11) is None
    (True, False)
    """
    if not name:
        return "is empty"
    if "/" in name:
        return "contains a path separator"
    if "\0" in name:
        return "contains a NUL character, which no file name can hold"
    if "." in name:
        return "contains a dot, which the model file's entities/{type}/global_embedding names cannot hold"
    longest = embeddings_file(name, max(num_partitions - 1, 0), 999_999)  # the longest, versions up to 999999
    if len(longest.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        return f"makes {longest[:40]}… longer than the {MAX_FILE_NAME_BYTES} bytes a file name may have"
    return None


def entity_type_name_portability(name: str) -> str | None:
    """Why ``name``, usable by the original on Linux, is not portable across file systems (rule
    ``entity-type-name-unportable``), or None."""
    if len(name.encode("utf-8")) > MAX_TYPE_NAME_BYTES:
        return f"is longer than {MAX_TYPE_NAME_BYTES} bytes in UTF-8"
    if "\\" in name:
        return "contains a backslash, a path separator on Windows"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    bad = sorted(_UNPORTABLE_CHARS.intersection(name))
    if bad:
        return f"contains {''.join(bad)!r}, which some file systems forbid"
    if name != name.strip(" "):
        return "starts or ends with a space"
    return None
