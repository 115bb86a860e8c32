"""The validator's view of a layout as files from a stranger (docs/security.md): where the config's
paths point, and where the links inside its directories lead.

- :func:`check_config_paths`: each path the config names is inside the config's folder (else the
  warning ``layout-path-outside``: read as named, never written without the user's word); a URL
  names storage the command line named or ``PBG_ALLOW_REMOTE`` lists (else ``layout-url-refused``,
  and the validator reads nothing there: no request is sent); a directory it names does not lead out
  of the layout through a link (``layout-link-outside``).
- :func:`check_links`: every symbolic link inside a directory of the layout (the entity path, the
  edge paths, the checkpoint and its ``best/`` and ``epoch_k/``) leads inside it, whether or not pbg
  reads the file: a shipped ``.pbg-lock`` linked to ``~/.ssh/authorized_keys`` is reported before
  ``pbgtrain fit`` would meet it (and refuse it).

What "inside" means is the command's :func:`pbgio.confinement.scope`; :func:`pbgio.validate.validate_path`
opens one when it runs outside a command, so that a library call judges a layout as ``pbgio validate`` does.
"""

from __future__ import annotations

import os

from pbgio import confinement, storage
from pbgio.checks import files as file_rules
from pbgio.layout import Layout
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.validate.context import Context


def check_config_paths(ctx: Context, layout: Layout, config_path: AnyPath) -> set[str]:
    """Report the config's paths that leave its folder, name storage nobody named, or lead out of the
    layout through a link; return the locations (as written) that must not be read."""
    refused: set[str] = set()
    shown = ctx.display(config_path)
    folder = storage.display(layout.base)
    overridden = {o.split("=", 1)[0].strip() for o in layout.overrides if "=" in o}
    for key, values in layout.config_paths().items():
        for value in values:
            if confinement.split_url(value) is not None:
                reason = confinement.url_refusal(value)
                if reason is not None:
                    ctx.add(file_rules.url_refused(shown, key, storage.redact(reason)))
                    refused.add(value)
                continue
            path = layout.path(value)
            if storage.is_remote(path):
                continue
            if key not in overridden and not layout.inside(path):
                ctx.add(file_rules.path_outside(shown, key, value, folder))
            target = confinement.read_escape(path)
            if target is not None and _lexists(path):
                ctx.add(file_rules.link_outside(ctx.display(path), target, directory=True))
                refused.add(value)
    return refused


def check_links(ctx: Context, directory: AnyPath) -> None:
    """Report each symbolic link directly inside the local ``directory`` (and, in a checkpoint, inside
    its ``best/`` and ``epoch_k/``) whose target lies outside the layout; one scan of the directory,
    no link followed but to learn where it leads."""
    if storage.is_remote(directory) or confinement.active() is None:
        return
    for entry in _entries(directory):
        if entry.is_symlink():
            target = confinement.read_escape(entry.path)
            if target is not None:
                ctx.add(file_rules.link_outside(ctx.display(type(directory)(entry.path)), target,
                                                directory=_is_dir(entry)))
        elif entry.is_dir(follow_symlinks=False) and naming.is_snapshot_dir(entry.name):
            check_links(ctx, type(directory)(entry.path))


def _lexists(path: AnyPath) -> bool:
    try:
        return os.path.lexists(str(path))
    except ValueError:  # a NUL in the path: the path rules say why it cannot be looked up
        return False


def _entries(directory: AnyPath) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(str(directory)) as found:
            return sorted(found, key=lambda e: e.name)
    except (OSError, ValueError):  # missing, not a directory, a NUL: the path rules report it
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
