"""``pbgio convert --from legacy SRC DST``: migrate a legacy (.pt era) layout.

Register it on the main app with ``app.command()(convert)``. Exit codes follow
:mod:`pbgio.cli.commands`: 0 converted (or planned), 1 refused or failed (unsafe pickle,
unreadable or invalid legacy data), 2 usage (SRC missing, DST not empty without
``--force``, DST inside SRC), 130 interrupted (DST is not written).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pbgio.console import exit_codes, printable, redact, stderr_console
from pbgio.options import AsJson, NoProgress
from pbgio.progress import progress_wanted

if TYPE_CHECKING:
    from pbgio.legacy.migrate import MigrationResult
    from pbgio.legacy.plan import MigrationPlan

PROGRESS_MIN_BYTES = 8 << 20
"""Inputs smaller than this convert without a progress bar."""


class SourceFormat(str, Enum):
    legacy = "legacy"



def _say(message: str, style: str | None = None) -> None:
    from rich.markup import escape

    text = escape(message)
    stderr_console().print(f"[{style}]{text}[/]" if style else text, soft_wrap=True)


def _show_progress(no_progress: bool, total: int) -> bool:
    return total >= PROGRESS_MIN_BYTES and progress_wanted(no_progress)


def convert(
    src: Annotated[Path, typer.Argument(help="The legacy directory: a run folder, or an entity, edge or "
                                             "checkpoint directory. Only read.")],
    dst: Annotated[Path, typer.Argument(help="The directory to create in the current layout; it must not "
                                             "exist or be empty (see --force).")],
    from_: Annotated[SourceFormat, typer.Option("--from", help="The layout of SRC.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and write nothing.")] = False,
    trust_pickle: Annotated[bool, typer.Option(
        "--trust-pickle", help="Unpickle SRC's .pt files without the allow-list. Unpickling can run "
                               "arbitrary code: only for files you trust.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace DST if it exists and is not empty.")] = False,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Migrate a legacy (.pt era) layout to the current one; the result validates clean.

    With --json, the plan (and the result) go to stdout as JSON."""
    from pbgio import confinement
    from pbgio.errors import MissingArtifactError
    from pbgio.legacy.migrate import DestinationError, migrate, plan_migration

    del from_  # one source format so far
    if trust_pickle:
        _say("warning: --trust-pickle: SRC's pickles are loaded without the allow-list and can run code",
             "yellow")
    with exit_codes(usage=(MissingArtifactError, DestinationError),
                    on_interrupt=lambda: _say(f"interrupted; {dst} was not written")):
        confinement.admit(src)  # read: the layout the user handed over, nothing outside it
        confinement.admit(dst, write=True)
        plan = plan_migration(src, trust_pickle=trust_pickle)
        if dry_run:
            result = migrate(src, dst, dry_run=True, trust_pickle=trust_pickle, force=force, plan=plan)
        elif _show_progress(no_progress, plan.total_bytes):
            result = _migrate_with_progress(src, dst, plan, trust_pickle=trust_pickle, force=force)
        else:
            result = migrate(src, dst, trust_pickle=trust_pickle, force=force, plan=plan)
    _report(result, plan, as_json)


def _migrate_with_progress(src: Path, dst: Path, plan: MigrationPlan, *, trust_pickle: bool,
                           force: bool) -> MigrationResult:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from pbgio.legacy.migrate import migrate

    with Progress(TextColumn("{task.description}"), BarColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                  console=stderr_console(), transient=True) as progress:
        task = progress.add_task("converting", total=plan.total_bytes)

        def on_progress(description: str, n: int) -> None:  # names files of the layout's: text, never markup
            progress.update(task, description=escape(printable(description)), advance=n)

        return migrate(src, dst, trust_pickle=trust_pickle, force=force, progress=on_progress, plan=plan)


def _report(result: MigrationResult, plan: MigrationPlan, as_json: bool) -> None:
    if as_json:
        data = plan.to_dict()
        data.update(dst=str(result.dst), written=result.written,
                    validation=[r.to_dict() for r in result.reports])
        typer.echo(json.dumps(data, indent=2))
    elif not result.written:  # the plan names the layout's files and config values: shown escaped
        typer.echo(printable(redact(plan.render(result.dst)), keep="\n"))
    if not result.written:
        _say(f"dry run: nothing written; {len(plan.steps)} files would be written to {result.dst}")
        return
    for warning in result.warnings:
        _say(f"warning: {warning}", "yellow")
    issues = sum(len(r.warnings) for r in result.reports)
    outside = (f" except that the config names {', '.join(sorted(plan.unmigrated_paths))}, outside SRC and "
               "not migrated" if plan.unmigrated_paths else "")
    _say(f"converted {plan.src} → {result.dst}: {len(plan.steps)} files; the result validates{outside} "
         f"({issues} warning(s)). Check it any time with `pbgio validate {result.dst}`.", "green")
