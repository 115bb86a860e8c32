"""Migrate a legacy layout into a new directory, all or nothing.

The smallest legacy layout, two 1-based entity count files, becomes two 0-based ones
(a whole run, with its METADATA config, checkpoint and buckets, migrates the same way):

>>> import tempfile, pathlib, torch
>>> work = pathlib.Path(tempfile.mkdtemp())
>>> (work / "old").mkdir()
>>> torch.save(5, work / "old" / "entity_count_user_1.pt")
>>> torch.save(4, work / "old" / "entity_count_user_2.pt")
>>> result = migrate(work / "old", work / "new")
>>> result.ok, sorted(p.name for p in (work / "new").iterdir())
(True, ['entity_count_user_0.txt', 'entity_count_user_1.txt'])
>>> (work / "new" / "entity_count_user_0.txt").read_text().strip()
'5'
>>> migrate(work / "old", work / "new")
Traceback (most recent call last):
...
pbgio.legacy.migrate.DestinationError: ...new: exists and is not empty; pass --force to replace it

How it stays safe:

* SRC is only read; DST may not lie inside SRC (nor SRC inside DST).
* DST is written under a hidden sibling (``.DST.pbgio-convert.<pid>.tmp``), checked
  with :func:`pbgio.validate.validate_path`, and renamed into place only when the
  whole layout validates. An error or Ctrl-C removes the staging directory; a kill
  leaves it behind under its hidden name (the next run removes it), never a DST.
* Inside the staging directory the config and version files come first, so even a
  leftover staging directory names the files it lacks and fails validation.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pbgio import confinement, interrupts
from pbgio.errors import OutputError, PbgioError, Report
from pbgio.legacy.plan import MigrationPlan, MigrationStep
from pbgio.legacy.planner import plan_migration
from pbgio.storage import atomic, local_path
from pbgio.storage.lock import process_alive

__all__ = ["DestinationError", "MigrationError", "MigrationPlan", "MigrationResult", "MigrationStep",
           "ProgressCallback", "migrate", "plan_migration"]

ProgressCallback = Callable[[str, int], None]
"""Called with a description and the bytes of legacy input just processed."""

STAGING_TAG = ".pbgio-convert"
_STAGING_RE = re.compile(rf"^\.(?P<name>.+){re.escape(STAGING_TAG)}\.(?P<pid>\d+)\.(?:tmp|old)$")
MAX_ISSUES_SHOWN = 10


class DestinationError(PbgioError):
    """DST cannot be written: not empty (without force), or overlapping SRC."""


class MigrationError(PbgioError):
    """The plan has errors, or the migrated layout does not validate; nothing was written to DST."""

    def __init__(self, message: str, problems: list[str], reports: list[Report] | None = None) -> None:
        self.problems = problems
        self.reports = reports or []
        shown = "\n".join(f"  - {p}" for p in problems[:MAX_ISSUES_SHOWN])
        hidden = len(problems) - MAX_ISSUES_SHOWN
        more = f"\n  … and {hidden} more" if hidden > 0 else ""
        super().__init__(f"{message}:\n{shown}{more}")


@dataclass
class MigrationResult:
    """The plan that ran (or would run), and the validation of what it wrote."""

    plan: MigrationPlan
    dst: Path
    written: bool
    reports: list[Report] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    @property
    def warnings(self) -> list[str]:
        return [*self.plan.warnings, *(str(i) for r in self.reports for i in r.warnings)]


def _inside(path: Path, other: Path) -> bool:
    try:
        path.resolve().relative_to(other.resolve())
    except ValueError:
        return False
    return True


def check_destination(src: Path, dst: Path, *, force: bool) -> None:
    """Raise :class:`DestinationError` unless DST may be written."""
    if _inside(dst, src):
        raise DestinationError(f"{dst}: lies inside SRC {src}, which is never written to; choose another DST")
    if _inside(src, dst):
        raise DestinationError(f"{dst}: contains SRC {src}; choose another DST")
    if dst.is_symlink() or dst.exists():
        empty_dir = dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir())
        if not empty_dir and not force:
            raise DestinationError(f"{dst}: exists and is not empty; pass --force to replace it")


def migrate(src: Path | str, dst: Path | str, *, dry_run: bool = False, trust_pickle: bool = False,
            force: bool = False, progress: ProgressCallback | None = None,
            plan: MigrationPlan | None = None) -> MigrationResult:
    """Convert the legacy layout under ``src`` into a new current layout at ``dst``.

    ``dry_run`` plans and writes nothing. ``trust_pickle`` loads pickles without the
    allow-list (only for files you trust). ``force`` replaces a non-empty ``dst``.
    ``plan``, from :func:`plan_migration` on the same ``src``, saves planning twice.
    Raises :class:`DestinationError`, :class:`MigrationError`, or the reader's
    :class:`~pbgio.errors.FormatError` / :class:`~pbgio.errors.UnsafePickleError`.
    """
    source = local_path(src).absolute()
    target = local_path(dst).absolute()
    check_destination(source, target, force=force)
    if plan is None:
        plan = plan_migration(source, trust_pickle=trust_pickle)
    if plan.errors:
        raise MigrationError(f"{source}: cannot be migrated", plan.errors)
    if dry_run:
        return MigrationResult(plan, target, written=False)
    staging = _staging_path(target, "tmp")
    confinement.admit(staging, write=True)  # DST's staging twin, beside it (a no-op outside a command)
    with atomic.write_failures(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(target)
        staging.mkdir()
    try:
        with interrupts.noticed():  # a Ctrl-C swallowed by a finalizer still stops the migration
            report = progress or (lambda _description, _n: None)
            for step in plan.steps:
                assert step.action is not None

                def advance(n: int, _step: MigrationStep = step) -> None:
                    interrupts.check()
                    report(f"writing {_step.target}", n)

                step.action(staging, advance)
                interrupts.check()
            reports = _validate(plan, staging, report)
            errors = [str(i) for r in reports for i in r.errors]
            if errors:
                raise MigrationError(f"{source}: the migrated layout does not validate, so nothing was "
                                     f"written to {target}", errors, reports)
            interrupts.check()
            with atomic.write_failures(target):
                _swap_into_place(staging, target)
    except OutputError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise exc.named_at(staging, target) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return MigrationResult(plan, target, written=True, reports=reports)


def _validate(plan: MigrationPlan, staging: Path, report: ProgressCallback) -> list[Report]:
    from pbgio.checks.layout import path_missing
    from pbgio.validate import validate_path

    def on_bucket(name: str, _size: int) -> None:
        report(f"validating {name}", 0)

    roots = ["."] if plan.has_config else plan.migrated_dirs
    reports = [validate_path(staging / root, on_bucket=on_bucket) for root in roots]
    expected = {p.rstrip("/") for p in plan.unmigrated_paths}
    for r in reports:
        r.target = r.target.replace(str(staging), "DST", 1)
        r.issues = [i for i in r.issues
                    if not (i.rule == path_missing(None, "").rule and (i.file or "").rstrip("/") in expected)]
    return reports


def _staging_path(dst: Path, kind: str) -> Path:
    return dst.parent / f".{dst.name}{STAGING_TAG}.{os.getpid()}.{kind}"


def remove_stale_staging(dst: Path) -> list[Path]:
    """Remove staging directories of DST left by conversions that were killed."""
    removed: list[Path] = []
    if not dst.parent.is_dir():
        return removed
    for path in dst.parent.iterdir():
        m = _STAGING_RE.match(path.name)
        if m and m["name"] == dst.name and int(m["pid"]) != os.getpid() and not process_alive(int(m["pid"])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _swap_into_place(staging: Path, dst: Path) -> None:
    """Rename the staging directory to DST; an existing DST is moved aside first, then removed."""
    old = None
    if dst.is_symlink() or dst.exists():
        if dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir()):
            dst.rmdir()
        else:
            old = _staging_path(dst, "old")
            os.rename(dst, old)
    try:
        os.rename(staging, dst)
    except OSError:
        if old is not None:  # put the replaced DST back
            os.rename(old, dst)
        raise
    atomic.fsync_dir(dst.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                old.unlink()
