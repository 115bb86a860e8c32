"""The command-line options every pbg command shares, defined once (``pbgio`` and ``pbgtrain``).

Each is a Typer annotation: a command declares ``config: ConfigArg, param: Overrides = None,
base: BaseOption = None`` and builds its :class:`pbgio.layout.Layout` from them
(``Layout.load(config, base=base, overrides=param or [])``). Paths named by these options follow
the one rule of :mod:`pbgio.layout`: relative to the config's folder, ``./`` for the current
directory. Imports only typer (the command lines import it anyway).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

RELATIVE_TO_CONFIG = " Relative to the config's folder, like its edge_paths (./PATH: the current directory)."
"""Said of every path option that names a part of the layout."""

ConfigArg = Annotated[str, typer.Argument(
    help="The run config: a .json file, or the original's Python config (.py), which is executed (in a subprocess) "
    "to obtain the config from its get_torchbiggraph_config(); the relative paths of a .py config resolve against "
    "the current directory, as in the original. A path or an fsspec URL (s3://…, gs://…, hdfs://…).")]
Overrides = Annotated[list[str] | None, typer.Option(
    "-p", "--param", help="Override a config key, e.g. -p num_epochs=5 -p relations.0.operator=diagonal "
    "-p checkpoint_path=model/best (lists split on commas; applied as the original applies them). Repeatable.")]
BaseOption = Annotated[str | None, typer.Option(
    "--base", help="Directory relative paths in the config resolve against (default: the config's directory; for a "
    "checkpoint's config.json, the directory holding checkpoint_path; for a .py config, the current directory).")]
CheckpointOption = Annotated[str | None, typer.Option(
    "--checkpoint", help="Checkpoint directory (default: the config's checkpoint_path; the same as "
    "-p checkpoint_path=PATH)." + RELATIVE_TO_CONFIG)]
VersionOption = Annotated[int | None, typer.Option(
    "--version", help="Checkpoint version (default: the committed one).")]
DeviceOption = Annotated[str | None, typer.Option(
    "--device", help="torch device: cpu, cuda, cuda:1 … (default: cuda when the config sets num_gpus=1, else cpu).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
CandidatesOption = Annotated[list[str] | None, typer.Option(
    "--candidates", metavar="PREFIX", help="Only entities whose name starts with PREFIX (case-sensitive) are "
    "candidates; repeatable (any of them), and with --candidates-file (either). Exit 1 when no entity passes.",
    show_default=False)]
CandidatesFileOption = Annotated[str | None, typer.Option(
    "--candidates-file", metavar="FILE", help="Only the entities named in FILE (one exact name per line, blank "
    "lines skipped) are candidates; names of FILE that are not entities of the type are counted and said.",
    show_default=False)]
ProposalsOption = Annotated[int | None, typer.Option(
    "--proposals", min=1, help="With --index: rows the index proposes per query, scored exactly (default 100; with "
    "--candidates or --candidates-file, that many divided by the share of entities that pass, then 4 times more "
    "while fewer than -k pass).", show_default=False)]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="Plain log lines instead of progress bars.")]


class ConfinedGroup(TyperGroup):
    """The commands of a pbg app (``typer.Typer(cls=ConfinedGroup)``): each runs in a
    :func:`pbgio.confinement.scope` that holds the paths of its own command line (every argument and
    option value, read and written where the command writes them), so that it reaches those and the
    folders of the layout it loads, nothing else (docs/security.md); and its output's reader going
    away ends it quietly (:func:`pbgio.console.closed_pipe_ends_quietly`)."""

    def invoke(self, ctx: Any) -> Any:
        from pbgio import confinement
        from pbgio.console import closed_pipe_ends_quietly

        tokens = getattr(ctx, "_protected_args", None)
        if tokens is None:  # click before 8.2
            tokens = ctx.protected_args
        tokens = [*tokens, *ctx.args]
        with closed_pipe_ends_quietly(), confinement.scope():
            for token in tokens[1:]:  # the first names the command
                for named in command_line_paths(token):
                    confinement.admit(named, write=True)
            return super().invoke(ctx)


def command_line_paths(token: str) -> list[str]:
    """The paths a command-line token may name: the token itself, or the value of ``--option=VALUE``
    and of ``KEY=VALUE`` (``-p checkpoint_path=…``); none for an option's name or ``-`` (stdin).

    >>> command_line_paths("--output=emb.tsv"), command_line_paths("-o"), command_line_paths("edges/test")
    (['emb.tsv'], [], ['edges/test'])
    >>> command_line_paths("entity_path=s3://KEY:SECRET@bucket/x")
    ['s3://KEY:SECRET@bucket/x']
    """
    if token in ("", "-"):
        return []
    if token.startswith("-"):
        found = [token.split("=", 1)[1]] if "=" in token else []
    elif "=" in token:  # KEY=VALUE: the value (the whole token too, a file name may hold '=', unless a URL follows)
        value = token.split("=", 1)[1]
        found = [value] if "://" in value else [token, value]
    else:
        found = [token]
    return [t for t in found if t and "\x00" not in t]
