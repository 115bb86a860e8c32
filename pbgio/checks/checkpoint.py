"""Checks of a checkpoint directory (or an init_path laid out like one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from pbgio import storage
from pbgio.checkpoint import CheckpointDir
from pbgio.checks import Context, RowCollector
from pbgio.config import parse_config
from pbgio.errors import ConfigError, FormatError, MissingArtifactError
from pbgio.formats.h5 import (
    attr_str,
    byte_dataset_file,
    check_format_version,
    check_written,
    is_float32,
    link_name,
    open_h5,
)
from pbgio.optimizer_state import (
    accumulator_value_problem,
    accumulators,
    adagrad_problems,
    read_state,
    row_adagrad_problems,
)
from pbgio.spec import naming
from pbgio.spec.checkpoint import (
    CONFIG_JSON_ATTR,
    EMBEDDINGS_DATASET,
    GROWN_LAYOUT_HINT,
    ITERATION_ATTRS,
    MODEL_DEFINING_KEYS,
    MODEL_GROUP,
    OPTIMIZER_DATASET,
    STATE_DICT_KEY_ATTR,
    expected_model_params,
    public_to_private,
)
from pbgio.spec.stats import line_problems
from pbgio.storage import AnyPath

ROW_BLOCK_BYTES = 16 << 20


MAX_CHECK_ATTEMPTS = 20
"""Times a checkpoint directory is checked again because a writer committed during the check."""


def check_checkpoint_dir(ctx: Context, path: AnyPath, *, warm_start: bool = False) -> None:
    """Check versions, files, attributes, embeddings, model, snapshots and stats.

    ``warm_start``: the directory is an ``init_path``, read only to start a run from; its tables
    may hold fewer rows than the entity counts and its dynamic relation operators fewer relations
    than ``dynamic_rel_count`` (after ``pbgio import --append``; the trainer initialises the
    rest), never more.

    One complete version is checked even while ``pbgtrain fit`` commits: when the committed
    version changed during a check that found problems (a file of the checked version removed by
    the commit, say), its issues are dropped and the directory is checked again. While a writer
    holds the directory (:mod:`pbgio.storage.lock`), files of other versions are its commit in progress,
    not leftovers: no ``checkpoint-stale-files`` warning then.
    """
    previous = ctx.warm_start
    ctx.warm_start = warm_start
    try:
        _check_checkpoint_dir(ctx, path)
    finally:
        ctx.warm_start = previous


def _check_checkpoint_dir(ctx: Context, path: AnyPath) -> None:
    for attempt in range(MAX_CHECK_ATTEMPTS):
        mark, checked, config = len(ctx.report.issues), dict(ctx.report.checked), ctx.config
        version = _check_checkpoint_once(ctx, path)
        if version is None or len(ctx.report.issues) == mark or attempt == MAX_CHECK_ATTEMPTS - 1:
            return
        try:
            if CheckpointDir(path).read_version() == version:
                return
        except FormatError:
            return
        del ctx.report.issues[mark:]
        ctx.report.checked, ctx.config = checked, config


def _check_checkpoint_once(ctx: Context, path: AnyPath) -> int | None:
    """One check of the directory; the committed version it checked (None: unreadable)."""
    from pbgio.storage.lock import holder_of

    ckpt = CheckpointDir(path)
    try:
        version: int | None = ckpt.read_version()
    except FormatError as exc:
        ctx.add_error(exc, ckpt.version_path)
        version = None
    reference = _reference_config(ctx, path)
    if version is None:
        return None
    ctx.report.count_checked("checkpoint versions")
    if version > 0 and not (path / naming.CONFIG_JSON).is_file():
        ctx.add("checkpoint-config-missing", path / naming.CONFIG_JSON, None,
                f"expected config.json beside committed version {version}, found none")
    cfg = ctx.config
    if version > 0:
        expected = [ckpt.model_path(version)]
        if cfg is not None:
            expected += [ckpt.embeddings_path(t, p, version)
                         for t, e in cfg.entities.items() for p in range(e.num_partitions)]
        for file in expected:
            if not file.is_file():
                ctx.add("checkpoint-file-missing", file, None,
                        f"expected this file of committed version {version}, found none")
    for file in ckpt.files_of_version(version):
        _check_versioned_file(ctx, file, reference)
    kept = ckpt.snapshot_versions() | {0, version}
    stale_versions = sorted(set(ckpt.versions_on_disk()) - kept)
    if stale_versions and holder_of(path) is not None:
        stale_versions = []  # a commit in progress, or the versions it is about to remove
    for stale in stale_versions:
        files = ckpt.files_of_version(stale)
        ctx.add("checkpoint-stale-files", files[0], None,
                f"expected only files of version {version} (and v0 or snapshots), found {len(files)} "
                f"file(s) of version {stale}, likely left by an interrupted checkpoint write")
    _check_snapshots(ctx, path)
    _check_stats(ctx, path / naming.TRAINING_STATS)
    return version


def _reference_config(ctx: Context, path: AnyPath) -> dict[str, Any] | None:
    """The normalized config.json of the checkpoint; compared with ctx.config and file attrs."""
    config_path = path / naming.CONFIG_JSON
    if not config_path.is_file():
        return ctx.config.to_dict() if ctx.config is not None else None
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        stored = parse_config(raw, ctx.display(config_path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        ctx.add("config-unreadable", config_path, None, f"expected a JSON config, found {exc}")
        return None
    except ConfigError as exc:
        for issue in exc.issues:
            ctx.add(issue.rule, config_path, issue.dataset, issue.message)
        return None
    stored_dict = stored.to_dict()
    if ctx.config is None:
        ctx.config = stored
    else:
        _compare_configs(ctx, config_path, ctx.config.to_dict(), stored_dict,
                         "the validated config", drift=False)
    return stored_dict


def _compare_configs(ctx: Context, file: AnyPath, reference: dict[str, Any], found: dict[str, Any],
                     what: str, *, drift: bool, dataset: str | None = None) -> None:
    differ = sorted(k for k in set(reference) | set(found) if reference.get(k) != found.get(k))
    defining = [k for k in differ if k in MODEL_DEFINING_KEYS]
    if defining:
        key = defining[0]
        ctx.add("checkpoint-config-mismatch", file, dataset,
                f"expected {key} = {json.dumps(reference.get(key))} as in {what}, found "
                f"{json.dumps(found.get(key))}"
                + (f" (and {len(defining) - 1} more keys)" if len(defining) > 1 else ""))
    others = [k for k in differ if k not in MODEL_DEFINING_KEYS]
    if drift and others:
        ctx.add("checkpoint-config-drift", file, dataset,
                f"expected the same config as {what}, found different {', '.join(others[:5])}")


def _check_attrs(ctx: Context, file: AnyPath, f: h5py.File, reference: dict[str, Any] | None) -> None:
    missing = [k for k in (CONFIG_JSON_ATTR, *ITERATION_ATTRS) if k not in f.attrs]
    if missing:
        ctx.add("checkpoint-attrs", file, None,
                f"expected root attributes {', '.join(missing)}, found none")
    text = attr_str(f, CONFIG_JSON_ATTR)
    if text is None or reference is None:
        return
    try:
        found = parse_config(json.loads(text)).to_dict()
    except (json.JSONDecodeError, ConfigError) as exc:
        ctx.add("checkpoint-attrs", file, CONFIG_JSON_ATTR,
                f"expected a valid config in attribute {CONFIG_JSON_ATTR}, found one that fails: "
                f"{str(exc).splitlines()[0]}")
        return
    _compare_configs(ctx, file, reference, found, "config.json", drift=True, dataset=CONFIG_JSON_ATTR)


def _check_blob(ctx: Context, file: AnyPath, f: h5py.File, *, count: int | None = None,
                shapes: list[tuple[int, ...] | None] | None = None, model: bool = False) -> None:
    """The optimizer blob: a torch payload that loads safely, holding the state the original resumes
    from (RowAdagrad of ``count`` rows for embeddings; Adagrad of ``shapes`` for the model)."""
    if OPTIMIZER_DATASET not in f:
        return
    ds = f[OPTIMIZER_DATASET]
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.itemsize != 1 or ds.dtype.kind != "V":
        found = f"{ds.ndim}-D {ds.dtype}" if isinstance(ds, h5py.Dataset) else "a group"
        ctx.add("optimizer-blob", file, OPTIMIZER_DATASET, f"expected a 1-D |V1 blob, found {found}")
        return
    if not _written(ctx, file, ds):
        return
    try:
        with byte_dataset_file(ds) as blob:
            state = read_state(blob, ctx.display(file))
            problems = adagrad_problems(state, shapes) if model else row_adagrad_problems(state, count)
            if problems:
                rule_id = "optimizer-state-model" if model else "optimizer-state-embeddings"
                ctx.add(rule_id, file, OPTIMIZER_DATASET, problems[0])
                return
            for where, ref in accumulators(state):
                problem = accumulator_value_problem(state, where, ref)
                if problem:
                    ctx.add("optimizer-state-values", file, OPTIMIZER_DATASET, problem)
                    return
    except FormatError as exc:
        ctx.add_error(exc, file)


def _with_open(ctx: Context, file: AnyPath, check: Callable[[h5py.File], None]) -> None:
    """Open ``file`` (errors become issues), check its format_version, then run ``check``."""
    try:
        with open_h5(file) as f:
            try:
                check_format_version(f, file)
            except FormatError as exc:
                ctx.add_error(exc, file)
            check(f)
    except (FormatError, MissingArtifactError) as exc:
        ctx.add_error(exc, file)


def _check_embeddings_file(ctx: Context, file: AnyPath, etype: str, part: int,
                           reference: dict[str, Any] | None) -> None:
    _with_open(ctx, file, lambda f: _check_embeddings(ctx, file, f, etype, part, reference))


def _check_embeddings(ctx: Context, file: AnyPath, f: h5py.File, etype: str, part: int,
                      reference: dict[str, Any] | None) -> None:
    ctx.report.count_checked("embeddings files")
    _check_attrs(ctx, file, f, reference)
    ds = f.get(EMBEDDINGS_DATASET)
    if not isinstance(ds, h5py.Dataset) or not is_float32(ds.dtype) or ds.ndim != 2:
        found = "none" if ds is None else (
            f"{ds.ndim}-D {ds.dtype}" if isinstance(ds, h5py.Dataset) else "a group")
        ctx.add("embeddings-dataset", file, EMBEDDINGS_DATASET,
                f"expected a 2-D float32 dataset, found {found}")
        _check_blob(ctx, file, f, count=None)
        return
    cfg = ctx.config
    known = ctx.count(etype, part) if cfg is not None and etype in cfg.entities else None
    rows = known if known is not None else ds.shape[0]  # the entity count, else the dataset's rows
    if ctx.warm_start and known is not None and ds.shape[0] < known:
        rows = ds.shape[0]  # an init_path older than the layout's growth: the trainer adds the rows
    _check_blob(ctx, file, f, count=rows)
    if cfg is not None and etype in cfg.entities:
        expected = (rows, cfg.entity_dimension(etype))
        if tuple(ds.shape) != expected:
            hint = f"; {GROWN_LAYOUT_HINT}" if known is not None and ds.shape[0] < known else ""
            ctx.add("embeddings-shape", file, EMBEDDINGS_DATASET,
                    f"expected shape {expected} (entity count x dimension of {etype!r}), "
                    f"found {tuple(ds.shape)}{hint}")
    _check_finite(ctx, file, ds, "embeddings-nonfinite", EMBEDDINGS_DATASET)


def _written(ctx: Context, file: AnyPath, ds: h5py.Dataset) -> bool:
    """Whether ``ds`` stores all it claims; if not, the issue is recorded (nothing more is read)."""
    try:
        check_written(ds, file)
    except FormatError as exc:
        ctx.add_error(exc, file)
        return False
    return True


def _check_finite(ctx: Context, file: AnyPath, ds: Any, rule_id: str, dataset: str) -> None:
    if not _written(ctx, file, ds):
        return
    rows = RowCollector(ctx, rule_id, file, dataset)
    if ds.ndim == 0:
        value = np.asarray(ds[()])
        if not np.isfinite(value).all():
            ctx.add(rule_id, file, dataset, f"expected a finite value, found {value}")
        return
    row_bytes = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize)
    step = max(1, ROW_BLOCK_BYTES // row_bytes)
    for start in range(0, ds.shape[0], step):
        block = ds[start:start + step]
        bad = ~np.isfinite(block).reshape(len(block), -1).all(axis=1)
        if bad.any():
            if (i := rows.add(start, bad)) is not None:
                rows.describe(
                    f"expected finite values, found {block[i][~np.isfinite(block[i])].ravel()[0]}"
                )
    rows.flush()


def _check_model_file(ctx: Context, file: AnyPath, reference: dict[str, Any] | None) -> None:
    _with_open(ctx, file, lambda f: _check_model(ctx, file, f, reference))


def _check_model(ctx: Context, file: AnyPath, f: h5py.File, reference: dict[str, Any] | None) -> None:
    ctx.report.count_checked("model files")
    _check_attrs(ctx, file, f, reference)
    cfg = ctx.config
    expected = expected_model_params(cfg, ctx.dynamic_rel_count) if cfg is not None else None
    if ctx.warm_start and cfg is not None and cfg.dynamic_relations and ctx.dynamic_rel_count is not None:
        stored = _stored_relations(f)
        if stored is not None and stored < ctx.dynamic_rel_count:  # fewer relations: the trainer adds the rest
            expected = expected_model_params(cfg, stored)
    _check_blob(ctx, file, f, model=True, shapes=None if expected is None else list(expected.values()))
    seen = set()
    group = f.get(MODEL_GROUP)
    for name, ds in _walk(group) if isinstance(group, h5py.Group) else ():
        seen.add(name)
        _check_param(ctx, file, name, ds, expected)
    if expected is not None:
        for name in sorted(set(expected) - seen):
            ctx.add("model-param-missing", file, f"{MODEL_GROUP}/{name}",
                    "expected this parameter (from the config's operators and global_emb), found none")


def _stored_relations(f: h5py.File) -> int | None:
    """The relations of a dynamic model file: the first dimension of its first operator parameter."""
    group = f.get(MODEL_GROUP)
    for name, ds in _walk(group) if isinstance(group, h5py.Group) else ():
        if name.startswith("relations/") and ds.ndim >= 1:
            return int(ds.shape[0])
    return None


def _walk(group: h5py.Group, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for raw, item in group.items():
        key = link_name(raw)
        if isinstance(item, h5py.Dataset):
            out.append((prefix + key, item))
        else:
            out.extend(_walk(item, f"{prefix}{key}/"))
    return out


def _check_param(ctx: Context, file: AnyPath, name: str, ds: Any,
                 expected: dict[str, tuple[int, ...] | None] | None) -> None:
    full = f"{MODEL_GROUP}/{name}"
    private = public_to_private(name)
    if private is None or (expected is not None and name not in expected):
        ctx.add("model-param-name", file, full,
                "expected relations/{idx}/operator/{side}/{param} or entities/{type}/global_embedding "
                "for an index, side, parameter and type the config has, found this dataset")
        return
    key = attr_str(ds, STATE_DICT_KEY_ATTR) if STATE_DICT_KEY_ATTR in ds.attrs else None
    if key != private:
        ctx.add("model-state-dict-key", file, full,
                f"expected attribute {STATE_DICT_KEY_ATTR} = {private!r}, found {key!r}")
    if not is_float32(ds.dtype):
        ctx.add("model-param-dtype", file, full, f"expected float32, found {ds.dtype}")
        return
    shape = expected.get(name) if expected is not None else None
    if shape is not None and tuple(ds.shape) != shape:
        ctx.add("model-param-shape", file, full, f"expected shape {shape}, found {tuple(ds.shape)}")
    _check_finite(ctx, file, ds, "model-param-nonfinite", full)


def _check_snapshots(ctx: Context, path: AnyPath) -> None:
    """Each ``epoch_{k}/`` is a loadable checkpoint: a version file and, for that version, the model
    and every partition's embeddings, resolving to existing files (the original writes absolute
    symlinks, which dangle once the directory moves or the linked version is deleted)."""
    cfg = ctx.config
    for snap in storage.children(path):
        if not (naming.SNAPSHOT_DIR_RE.match(snap.name) and snap.is_dir()):
            continue
        ctx.report.count_checked("snapshots")
        for entry in storage.children(snap):
            if entry.is_symlink() and not entry.exists():
                ctx.add("checkpoint-snapshot-broken", entry, None,
                        f"expected the link to resolve, found it points to missing {entry.readlink()}")
        try:
            version = CheckpointDir(snap).read_version()
        except FormatError as exc:
            ctx.add_error(exc, snap / naming.CHECKPOINT_VERSION)
            continue
        has_version_file = (snap / naming.CHECKPOINT_VERSION).is_file()
        if not has_version_file or version == 0:
            ctx.add("checkpoint-snapshot-broken", snap, None,
                    f"expected {naming.CHECKPOINT_VERSION} naming the preserved version, found "
                    f"{'version 0' if has_version_file else 'none'}")
            continue
        expected = [naming.model_file(version)]
        if cfg is not None:
            expected += [naming.embeddings_file(t, p, version)
                         for t, e in cfg.entities.items() for p in range(e.num_partitions)]
        missing = [name for name in expected if not (snap / name).is_symlink() and not (snap / name).exists()]
        if missing:
            ctx.add("checkpoint-snapshot-broken", snap / missing[0], None,
                    f"expected this file of preserved version {version} in the snapshot, found none"
                    + (f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""))


def _check_stats(ctx: Context, path: AnyPath) -> None:
    from pbgio.storage.lock import holder_of

    if not path.is_file():
        return
    rows: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    with path.open(encoding="utf-8", errors="replace") as lines:
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            if not line.endswith("\n") and holder_of(path.parent) is not None:
                break  # the last line, being appended by the writer right now
            try:
                problems = line_problems(json.loads(line))
            except json.JSONDecodeError as exc:
                problems = [("training-stats-format", f"expected a JSON object, found invalid JSON ({exc.msg})")]
            for rule_id, message in problems:
                rows.setdefault(rule_id, []).append(index)
                first.setdefault(rule_id, f"line {index + 1}: {message}")
    for rule_id, found in rows.items():
        ctx.add(rule_id, path, None, first[rule_id], rows=tuple(found[:5]), count=len(found))


def check_checkpoint_file(ctx: Context, file: AnyPath) -> None:
    """Check one checkpoint .h5 file on its own (no config: structure and values only)."""
    _check_versioned_file(ctx, file, None)


def _check_versioned_file(ctx: Context, file: AnyPath, reference: dict[str, Any] | None) -> None:
    parsed = naming.parse_versioned_file(file.name)
    if parsed is None:
        return
    kind, etype, part, _ = parsed
    if kind == "model":
        _check_model_file(ctx, file, reference)
    elif etype is not None and part is not None:
        _check_embeddings_file(ctx, file, etype, part, reference)
