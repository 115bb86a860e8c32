"""``pbgio validate``: check every rule of the spec on a config's layout, a directory or a file.

>>> import tempfile, pathlib
>>> empty = pathlib.Path(tempfile.mkdtemp())
>>> report = validate_path(empty)
>>> report.ok, sorted(report.rule_ids())
(False, ['layout-unrecognized'])

What a path is taken to be:

- a ``.json`` file: a run config; its ``entity_path``, ``edge_paths``,
  ``checkpoint_path`` and ``init_path`` are validated together, with every
  cross-file rule. Relative paths resolve against ``base``, by default the
  config's directory, or, for the ``config.json`` inside a checkpoint
  directory, the directory that holds ``checkpoint_path`` (:class:`pbgio.layout.Layout`).
- a directory holding a ``config.json`` (a checkpoint directory, or a project
  folder): as above.
- a directory with entity files, buckets or checkpoint files only: that artifact,
  with the rules that need no config.
- a single ``.h5`` file: that bucket or checkpoint file.
- anything in the legacy ``.pt`` layout: reported as legacy, with the command that migrates it.

The validator walks a layout, reads each artifact (:mod:`pbgio.validate.entities`,
:mod:`pbgio.validate.edges`, :mod:`pbgio.validate.checkpoint`) and applies every rule to what it
read, collecting all the issues where a reader raises the first; the rules themselves are coded
in :mod:`pbgio.checks`, which readers and validator share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pbgio import confinement, storage
from pbgio.checks import layout as layout_rules
from pbgio.checks.config import key_case_issues, semantic_issues
from pbgio.config import read_config_json
from pbgio.errors import ConfigError, MissingArtifactError, PbgioError, Report
from pbgio.formats.h5 import format_version, open_h5
from pbgio.layout import Layout, find_config
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.validate.checkpoint import check_checkpoint_dir, check_checkpoint_file
from pbgio.validate.context import Context
from pbgio.validate.edges import check_bucket, check_edge_path
from pbgio.validate.entities import check_entity_dir
from pbgio.validate.files import check_config_paths, check_links

ProgressCallback = Callable[[str, int], None]
"""Called with a description and a byte size before each bucket is checked."""

LEGACY_SEARCH_DEPTH = 3


def validate_path(location: AnyPath | str, *, base: AnyPath | None = None,
                  on_bucket: ProgressCallback | None = None, overrides: Sequence[str] = ()) -> Report:
    """Validate whatever ``location`` (a path or URL) is (see the module doc) and return the full
    report; a config's ``overrides`` (``-p key=value``) apply as every command applies them.

    Outside a command's :func:`pbgio.confinement.scope`, one is opened for the call, with
    ``location`` in it: a library call judges links, outside paths and URLs as ``pbgio validate``
    does (:mod:`pbgio.validate.files`)."""
    if confinement.active() is None:
        with confinement.scope():
            return validate_path(location, base=base, on_bucket=on_bucket, overrides=overrides)
    confinement.admit(location if isinstance(location, str) else str(location))
    path = storage.resolve(location)
    with storage.remote_errors(path, "path to validate"):
        if not path.exists():
            raise MissingArtifactError(storage.display(path), "path to validate", found=storage.link_problem(path))
    report = Report(target=storage.display(path))
    root = path if path.is_dir() else path.parent
    ctx = Context(report, root=root)
    if path.is_file():
        if path.suffix == ".json":
            _validate_config_file(ctx, path, base, on_bucket, overrides)
        else:
            _validate_file(ctx, path)
        return report
    legacy = _legacy_markers(path)
    if legacy:
        report.kind = "legacy"
        what = ("a bucket without format_version" if legacy[0].suffix == ".h5"
                else "a file of the legacy .pt layout")
        ctx.add(layout_rules.legacy_layout(ctx.display(legacy[0]), str(path), what))
        return report
    config = find_config(path)
    if config is not None:
        _validate_config_file(ctx, config, base, on_bucket, overrides)
    else:
        _validate_dir(ctx, path, on_bucket)
    return report


def _legacy_markers(path: AnyPath, depth: int = LEGACY_SEARCH_DEPTH) -> list[AnyPath]:
    found = [p for p in storage.children(path) if naming.is_legacy_marker(p.name)]
    names = {p.name for p in storage.children(path)}
    buckets = sorted((path / n for n in names if naming.parse_bucket_file(n)), key=lambda p: p.name)
    if buckets and not any(_has_format_version(b) for b in buckets):
        found.append(buckets[0])
    if found or depth == 0:
        return found
    for sub in [p for p in storage.children(path) if p.is_dir() and not p.is_symlink()]:
        found = _legacy_markers(sub, depth - 1)
        if found:
            return found
    return []


def _has_format_version(bucket: AnyPath) -> bool:
    try:
        with open_h5(bucket) as f:
            return format_version(f) is not None
    except PbgioError:
        return True  # unreadable files are reported by the bucket checks, not as legacy


def validate_layout(layout: Layout, *, on_bucket: ProgressCallback | None = None,
                    cache: storage.LocalCache | None = None, checkpoints: bool = True) -> Report:
    """Validate a layout already loaded (e.g. with ``-p`` overrides applied, or from a Python
    config file); issues about the config itself name its source. Remote buckets are read into
    ``cache`` when one is given. ``checkpoints=False`` checks the entities and buckets only (not
    ``checkpoint_path`` and ``init_path``)."""
    report = Report(target=layout.source)
    ctx = Context(report, root=storage.absolute(layout.base), cache=cache)
    _validate_layout(ctx, layout, Path(layout.source), on_bucket, checkpoints=checkpoints)
    return report


def _validate_config_file(ctx: Context, config_path: AnyPath, base: AnyPath | None,
                          on_bucket: ProgressCallback | None, overrides: Sequence[str] = ()) -> None:
    try:
        raw = read_config_json(config_path)  # read and parsed once: the layout, and the keys' case
        layout = Layout.from_json(config_path, raw, base=base, overrides=overrides)
    except ConfigError as exc:
        ctx.report.kind = "config"
        for issue in exc.issues:
            ctx.add_at(issue, config_path)
        return
    for issue in key_case_issues(raw):
        ctx.add_at(issue, config_path)
    _validate_layout(ctx, layout, config_path, on_bucket)


def _validate_layout(ctx: Context, loaded: Layout, config_path: AnyPath,
                     on_bucket: ProgressCallback | None, *, checkpoints: bool = True) -> None:
    cfg = loaded.config
    ctx.report.kind = "config"
    for issue in semantic_issues(cfg):
        if issue.severity == "warning":
            ctx.add_at(issue, config_path)
    ctx.config = cfg
    ctx.root = storage.absolute(loaded.base)
    refused = check_config_paths(ctx, loaded, config_path)
    if refused:  # a URL nobody named, a directory linked out of the layout: read nothing of it
        return
    for directory in _layout_dirs(loaded, checkpoints):
        check_links(ctx, directory)
    entity_path = loaded.entity_path
    if _is_dir(entity_path):
        check_entity_dir(ctx, entity_path)
    else:
        ctx.add(layout_rules.path_missing(ctx.display(entity_path),
                                    f"expected the entity_path directory, found {storage.found_at(entity_path)}"))
    lhs_parts, rhs_parts = cfg.bucket_grid()
    for edge_path in loaded.edge_paths:
        if not _is_dir(edge_path):
            ctx.add(layout_rules.path_missing(ctx.display(edge_path),
                                        f"expected an edge_paths directory, found {storage.found_at(edge_path)}"))
            continue
        check_edge_path(ctx, edge_path, (lhs_parts, rhs_parts), on_bucket)
    if not checkpoints:
        return
    checkpoint_path = loaded.checkpoint_path
    if _is_dir(checkpoint_path):
        check_checkpoint_dir(ctx, checkpoint_path)
    elif (occupied := layout_rules.checkpoint_path_occupied(ctx.display(checkpoint_path),
                                                             loaded.checkpoint_path_found())) is not None:
        ctx.add(occupied)
    init_path = loaded.init_path
    if init_path is not None:
        if _is_dir(init_path):
            check_checkpoint_dir(ctx, init_path, warm_start=True)
        else:
            ctx.add(layout_rules.path_missing(ctx.display(init_path),
                                        f"expected the init_path directory, found {storage.found_at(init_path)}"))


def _layout_dirs(layout: Layout, checkpoints: bool) -> list[AnyPath]:
    found = [layout.entity_path, *layout.edge_paths]
    if checkpoints:
        found += [layout.checkpoint_path, *([layout.init_path] if layout.init_path is not None else [])]
    return list(dict.fromkeys(found))


def _is_dir(path: AnyPath) -> bool:
    """Whether a config's ``path`` is a directory: False where the system cannot even look it up (a
    name longer than the file system allows), which the path rule then reports (:func:`storage.found_at`)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _validate_dir(ctx: Context, path: AnyPath, on_bucket: ProgressCallback | None) -> None:
    check_links(ctx, path)
    names = [p.name for p in storage.children(path)]
    kinds = []
    if any(naming.parse_entity_count_file(n) or n == naming.DYNAMIC_REL_COUNT for n in names):
        kinds.append("entities")
        check_entity_dir(ctx, path)
    buckets = sorted((naming.parse_bucket_file(n), path / n) for n in names if naming.parse_bucket_file(n))
    if buckets:
        kinds.append("edges")
        for _, bucket in buckets:
            if on_bucket is not None:
                on_bucket(ctx.display(bucket), storage.file_size(bucket))
            check_bucket(ctx, bucket)
    if any(naming.parse_versioned_file(n) or n == naming.CHECKPOINT_VERSION for n in names):
        kinds.append("checkpoint")
        check_checkpoint_dir(ctx, path)
    if not kinds:
        ctx.add(layout_rules.layout_unrecognized(ctx.display(path), directory=True))
    ctx.report.kind = "+".join(kinds) or "unknown"


def _validate_file(ctx: Context, path: AnyPath) -> None:
    if naming.parse_bucket_file(path.name):
        ctx.report.kind = "bucket"
        check_bucket(ctx, path)
        return
    parsed = naming.parse_versioned_file(path.name)
    if parsed is not None:
        ctx.report.kind = parsed[0]
        check_checkpoint_file(ctx, path)
        return
    if naming.is_legacy_marker(path.name):
        ctx.report.kind = "legacy"
        ctx.add(layout_rules.legacy_layout(ctx.display(path)))
        return
    ctx.add(layout_rules.layout_unrecognized(ctx.display(path), directory=False))
