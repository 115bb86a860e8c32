"""The validator's walk over a checkpoint directory (or an init_path laid out like one); the
rules: :mod:`pbgio.checks.checkpoint` and :mod:`pbgio.checks.optimizer`."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
from collections.abc import Callable
from typing import Any, cast

import h5py
import numpy as np

from pbgio import storage
from pbgio.checkpoint import CheckpointDir
from pbgio.checks import RowProblem
from pbgio.checks import checkpoint as rules
from pbgio.checks import config as config_rules
from pbgio.checks import hdf5 as hdf5_rules
from pbgio.checks import index as index_rules
from pbgio.checks import optimizer as optimizer_rules
from pbgio.config import parse_config
from pbgio.errors import ConfigError, FormatError, Issue, MissingArtifactError
from pbgio.formats import files
from pbgio.formats.h5 import (
    attr_str,
    byte_dataset_file,
    check_written,
    format_version,
    open_h5,
    read_row_chunks,
)
from pbgio.index_file import dataset_digest, meta_problem, payload_claims_issue, stale_issue
from pbgio.optimizer_state import read_state
from pbgio.spec import naming
from pbgio.spec.checkpoint import (
    CONFIG_JSON_ATTR,
    EMBEDDINGS_DATASET,
    ITERATION_ATTRS,
    MODEL_GROUP,
    OPTIMIZER_DATASET,
    STATE_DICT_KEY_ATTR,
    expected_model_params,
    public_to_private,
)
from pbgio.spec.config import ConfigSchema
from pbgio.spec.index import PAYLOAD_DATASET
from pbgio.storage import AnyPath
from pbgio.validate.context import Context, RowCollector, absent

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
    if not (path / naming.CONFIG_JSON).is_file():
        ctx.add(rules.config_missing(ctx.display(path / naming.CONFIG_JSON), version))
    cfg = ctx.config
    if version > 0:
        listed = {file.name for file in ckpt.files_of_version(version) if file.is_file()}
        first, total = _absent_files(cfg, version, listed)
        if total:
            ctx.add(rules.file_missing(ctx.display(path / first[0]), version, total=total))
    for file in ckpt.files_of_version(version):
        _check_versioned_file(ctx, file, reference)
    kept = ckpt.snapshot_versions() | {0, version}
    stale_versions = sorted(set(ckpt.versions_on_disk()) - kept)
    if stale_versions and holder_of(path) is not None:
        stale_versions = []  # a commit in progress, or the versions it is about to remove
    for stale in stale_versions:
        files = ckpt.files_of_version(stale)
        ctx.add(rules.stale_files(ctx.display(files[0]), version, stale, len(files)))
    _check_snapshots(ctx, path)
    _check_stats(ctx, path / naming.TRAINING_STATS)
    return version


def _reference_config(ctx: Context, path: AnyPath) -> dict[str, Any] | None:
    """The normalized config.json of the checkpoint; compared with ctx.config and file attrs."""
    config_path = path / naming.CONFIG_JSON
    if not config_path.is_file():
        return ctx.config.to_dict() if ctx.config is not None else None
    try:
        raw = json.loads(files.read_text(config_path, "checkpoint config", limit=files.CONFIG_LIMIT))
        stored = parse_config(raw, ctx.display(config_path))
    except FormatError as exc:  # a link out of the layout, not a regular file, too large
        ctx.add_error(exc, config_path)
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        ctx.add(config_rules.unreadable(ctx.display(config_path), f"expected a JSON config, found {exc}"))
        return None
    except ConfigError as exc:
        for issue in exc.issues:
            ctx.add_at(issue, config_path)
        return None
    stored_dict = stored.to_dict()
    if ctx.config is None:
        ctx.config = stored
    else:
        ctx.extend(rules.config_mismatch(ctx.display(config_path), ctx.config.to_dict(), stored_dict,
                                         "the validated config"))
    return stored_dict


def _check_attrs(ctx: Context, file: AnyPath, f: h5py.File, reference: dict[str, Any] | None) -> None:
    shown = ctx.display(file)
    ctx.add(rules.file_attrs(shown, missing=[k for k in (CONFIG_JSON_ATTR, *ITERATION_ATTRS) if k not in f.attrs]))
    text = attr_str(f, CONFIG_JSON_ATTR)
    if text is None or reference is None:
        return
    try:
        found = parse_config(json.loads(text)).to_dict()
    except RecursionError:
        ctx.add(rules.file_attrs(shown, bad_config="invalid JSON (nesting too deep to decode)"))
        return
    except ValueError as exc:  # invalid JSON, an integer past the digit limit (a guided fuzzer's find), a bad config
        ctx.add(rules.file_attrs(shown, bad_config=(str(exc).splitlines() or [type(exc).__name__])[0][:300]))
        return
    ctx.extend(rules.config_mismatch(shown, reference, found, "config.json", dataset=CONFIG_JSON_ATTR))
    ctx.add(rules.config_drift(shown, reference, found, "config.json", dataset=CONFIG_JSON_ATTR))


def _check_blob(ctx: Context, file: AnyPath, f: h5py.File, *, count: int | None = None,
                shapes: list[tuple[int, ...] | None] | None = None, model: bool = False) -> None:
    """The optimizer blob: a torch payload that loads safely, holding the state the original resumes
    from (RowAdagrad of ``count`` rows for embeddings; Adagrad of ``shapes`` for the model)."""
    if OPTIMIZER_DATASET not in f:
        return
    ds = f[OPTIMIZER_DATASET]
    shown = ctx.display(file)
    kind = "Dataset" if isinstance(ds, h5py.Dataset) else "Group"
    problem = optimizer_rules.blob_dataset(shown, kind, *((ds.ndim, ds.dtype) if kind == "Dataset" else ()))
    if problem is not None:
        ctx.add(problem)
        return
    if not _written(ctx, file, ds):
        return
    try:
        with byte_dataset_file(ds) as blob:
            state = read_state(blob, shown)
            problems = (optimizer_rules.adagrad_problems(state.value, shapes) if model
                        else optimizer_rules.row_adagrad_problems(state.value, count))
            if problems:
                ctx.add(optimizer_rules.state_issue(shown, problems, model=model))
                return
            for where, ref in optimizer_rules.accumulators(state.value):
                issue = optimizer_rules.values_issue(
                    shown, optimizer_rules.accumulator_value_problem(state.blocks(ref), where))
                if issue is not None:
                    ctx.add(issue)
                    return
    except FormatError as exc:
        ctx.add_error(exc, file)


def _with_open(ctx: Context, file: AnyPath, check: Callable[[h5py.File], None]) -> None:
    """Open ``file`` (errors become issues), check its format_version, then run ``check``."""
    try:
        with open_h5(file) as f:
            try:
                ctx.add(hdf5_rules.format_version(ctx.display(file), format_version(f)))
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
    shown = ctx.display(file)
    ds = f.get(EMBEDDINGS_DATASET)
    kind = None if ds is None else ("Dataset" if isinstance(ds, h5py.Dataset) else "Group")
    problem = rules.embeddings_dataset(shown, kind, *((ds.ndim, ds.dtype) if kind == "Dataset" else ()))
    if problem is not None:
        ctx.add(problem)
        _check_blob(ctx, file, f, count=None)
        return
    cfg = ctx.config
    known = ctx.count(etype, part) if cfg is not None and etype in cfg.entities else None
    rows = known if known is not None else ds.shape[0]  # the entity count, else the dataset's rows
    if ctx.warm_start and known is not None and ds.shape[0] < known:
        rows = ds.shape[0]  # an init_path older than the layout's growth: the trainer adds the rows
    _check_blob(ctx, file, f, count=rows)
    if cfg is not None and etype in cfg.entities:
        ctx.add(rules.embeddings_shape(shown, etype, tuple(ds.shape), (rows, cfg.entity_dimension(etype)),
                                       grown=known is not None and ds.shape[0] < known))
    _check_finite(ctx, file, ds, rules.embeddings_nonfinite)


def _written(ctx: Context, file: AnyPath, ds: h5py.Dataset) -> bool:
    """Whether ``ds`` stores all it claims; if not, the issue is recorded (nothing more is read)."""
    try:
        check_written(ds, file)
    except FormatError as exc:
        ctx.add_error(exc, file)
        return False
    return True


def _check_finite(ctx: Context, file: AnyPath, ds: Any, check: Callable[[Any], RowProblem | None]) -> None:
    """Stream ``ds`` a row chunk at a time (``PBG_ROW_CHUNK_BYTES``) through ``check`` (a non-finite rule);
    offending rows are named by their row in the file."""
    if not _written(ctx, file, ds):
        return
    rows = RowCollector(ctx, file)
    if ds.ndim == 0:
        problem = check(np.asarray(ds[()]))
        if problem is not None:
            ctx.add(problem.issue(ctx.display(file), problem.describe(0)))  # a scalar: no rows
        return
    for start, values in read_row_chunks(ds, file):
        rows.add(start, check(values))
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
        ctx.extend(rules.param_missing(ctx.display(file), sorted(set(expected) - seen)))


def _stored_relations(f: h5py.File) -> int | None:
    """The relations of a dynamic model file: the first dimension of its first operator parameter."""
    group = f.get(MODEL_GROUP)
    for name, ds in _walk(group) if isinstance(group, h5py.Group) else ():
        if name.startswith("relations/") and ds.ndim >= 1:
            return int(ds.shape[0])
    return None


def _walk(group: h5py.Group) -> list[tuple[str, Any]]:
    """The parameter datasets under the model group, walked as the reader walks them: a member that is
    neither a dataset nor a group (a dangling or external link, a named datatype) or a link back to an
    enclosing group raises a FormatError naming it, which the caller reports (a dangling link made
    the validator's own walk fail with AttributeError: found by the guided fuzzer)."""
    from pbgio.checkpoint import _datasets

    return list(_datasets(group))


def _check_param(ctx: Context, file: AnyPath, name: str, ds: Any,
                 expected: dict[str, tuple[int, ...] | None] | None) -> None:
    shown = ctx.display(file)
    private = public_to_private(name)
    unknown = rules.param_name(shown, name, known=private is not None and (expected is None or name in expected))
    if unknown is not None or private is None:
        ctx.add(unknown)
        return
    key = attr_str(ds, STATE_DICT_KEY_ATTR) if STATE_DICT_KEY_ATTR in ds.attrs else None
    ctx.add(rules.state_dict_key(shown, name, private, key))
    dtype = rules.param_dtype(shown, name, ds.dtype)
    if dtype is not None:
        ctx.add(dtype)
        return
    ctx.add(rules.param_shape(shown, name, tuple(ds.shape), expected.get(name) if expected is not None else None))
    _check_finite(ctx, file, ds, lambda values: rules.param_nonfinite(name, values))


def _check_snapshots(ctx: Context, path: AnyPath) -> None:
    """Each ``epoch_{k}/`` (and ``best/``) is a loadable checkpoint: a version file and, for that version, the model
    and every partition's embeddings, resolving to existing files (the original writes absolute
    symlinks, which dangle once the directory moves or the linked version is deleted)."""
    cfg = ctx.config
    for snap in storage.children(path):
        if not (naming.is_snapshot_dir(snap.name) and snap.is_dir()):
            continue
        ctx.report.count_checked("snapshots")
        for entry in storage.children(snap):
            if entry.is_symlink() and not entry.exists():
                ctx.add(rules.snapshot_broken(ctx.display(entry), dangling=entry.readlink()))
        try:
            version = CheckpointDir(snap).read_version()
        except FormatError as exc:
            ctx.add_error(exc, snap / naming.CHECKPOINT_VERSION)
            continue
        broken = rules.snapshot_broken(ctx.display(snap), version=version if (
            snap / naming.CHECKPOINT_VERSION).is_file() else None)
        if broken is not None:
            ctx.add(broken)
            continue
        missing, total = _absent_files(cfg, version, {entry.name for entry in storage.children(snap)})
        if total:
            ctx.add(rules.snapshot_broken(ctx.display(snap / missing[0]), version=version, missing=missing,
                                          total=total))


def _absent_files(cfg: ConfigSchema | None, version: int, names: set[str]) -> tuple[list[str], int]:
    """The first few files of ``version`` (its model, then each partition's embeddings by the config)
    that ``names`` (a directory's listing) lacks, and how many it lacks: the work follows the files
    listed, never the config's number of partitions."""
    model = naming.model_file(version)
    entities = {} if cfg is None else {t: e.num_partitions for t, e in cfg.entities.items()}

    def expected(name: str) -> bool:
        if name == model:
            return True
        parsed = naming.parse_versioned_file(name)
        if parsed is None or parsed[0] != "embeddings" or parsed[3] != version:
            return False
        _, etype, part, _ = parsed
        return (etype in entities and part is not None and part < entities[etype]
                and naming.embeddings_file(etype, part, version) == name)

    every = itertools.chain([model], (naming.embeddings_file(t, p, version)
                                      for t, n in entities.items() for p in range(n)))
    return absent(every, names, 1 + sum(entities.values()), expected)


def _check_stats(ctx: Context, path: AnyPath) -> None:
    from pbgio.storage.lock import holder_of

    if not path.is_file():
        return
    shown = ctx.display(path)
    rows: dict[str, list[int]] = {}
    first: dict[str, Issue] = {}
    try:
        raw = files.open_input(path, "training stats file")
    except FormatError as exc:  # a link out of the layout, a FIFO
        ctx.add_error(exc, path)
        return
    buffered = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(cast(Any, raw))
    with io.TextIOWrapper(buffered, encoding="utf-8", errors="replace") as lines:
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            if not line.endswith("\n") and holder_of(path.parent) is not None:
                break  # the last line, being appended by the writer right now
            try:
                issues = rules.stats_line(shown, index, json.loads(line))
            except json.JSONDecodeError as exc:
                issues = [rules.stats_format(shown, index, f"expected a JSON object, found invalid JSON ({exc.msg})")]
            for issue in issues:
                rows.setdefault(issue.rule, []).append(index)
                first.setdefault(issue.rule, issue)
    for rule_id, found in rows.items():
        ctx.add(dataclasses.replace(first[rule_id], rows=tuple(found[:5]), count=len(found)))


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
    elif kind == "index" and (name := naming.parse_index_file(file.name)) is not None:
        _with_open(ctx, file, lambda f: _check_index(ctx, file, f, name))
    elif etype is not None and part is not None:
        _check_embeddings_file(ctx, file, etype, part, reference)


def _check_index(ctx: Context, file: AnyPath, f: h5py.File, name: naming.IndexName) -> None:
    """An index file: what it holds, whose it is, whether it is intact, whether it is stale."""
    ctx.report.count_checked("index files")
    shown = ctx.display(file)
    meta, issue = meta_problem(shown, f)
    if meta is None:
        ctx.add(issue)
        return
    fields = dataclasses.asdict(meta)
    cfg = ctx.config
    problems = [index_rules.name_mismatch(shown, name, fields)]
    if cfg is not None:
        problems.append(index_rules.entity_type(shown, fields, {t: e.featurized for t, e in cfg.entities.items()}))
    for problem in problems:
        if problem is not None:
            ctx.add(problem)
            return
    ds = f[PAYLOAD_DATASET]
    if not _written(ctx, file, ds):
        return
    damaged = index_rules.damaged(shown, fields, dataset_digest(ds), ds.shape[0])
    ctx.add(damaged if damaged is not None else payload_claims_issue(shown, meta, ds))  # the header: a few reads
    if cfg is None or name.entity_type not in cfg.entities:
        return
    with contextlib.suppress(FormatError, MissingArtifactError):  # the version's own files have their rules
        ctx.add(stale_issue(cfg, CheckpointDir(file.parent), name.version, meta, shown))
