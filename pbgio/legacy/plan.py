"""The migration plan: every file the conversion will write, from which legacy files, and why.

A :class:`MigrationPlan` lists the steps in the order they run, the config changes,
warnings, errors and what is not migrated; :meth:`MigrationPlan.render` prints it for
``pbgio convert --dry-run`` and :meth:`MigrationPlan.to_dict` serializes it. Each
:class:`MigrationStep` carries the action that performs it (:mod:`pbgio.legacy.actions`);
:func:`pbgio.legacy.planner.plan_migration` builds the plan and
:func:`pbgio.legacy.migrate.migrate` runs it.

DST mirrors SRC: every migrated directory keeps its path relative to SRC (so the
config's relative paths keep their meaning), and the config names those paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pbgio.config import ConfigSchema
from pbgio.legacy.reader import LegacyVariant

Advance = Callable[[int], None]
Action = Callable[[Path, Advance], None]
"""A step's work: given the staging root and a callback taking bytes of input done."""

PHASE_CONFIG, PHASE_NAMES, PHASE_COUNTS, PHASE_DATA = range(4)
"""The order steps run in (:attr:`MigrationStep.phase`): config and version files first, data last."""


@dataclass
class MigrationStep:
    """One file of DST: its path, the legacy files it comes from, and what is done to them."""

    target: str
    sources: tuple[str, ...]
    detail: str
    size: int = 0
    action: Action | None = field(default=None, repr=False, compare=False)
    phase: int = field(default=0, repr=False, compare=False)

    def __str__(self) -> str:
        origin = f"  ← {', '.join(self.sources)}" if self.sources else ""
        return f"{self.target}{origin}  ({self.detail})"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "sources": list(self.sources), "detail": self.detail,
                "bytes": self.size}


@dataclass
class MigrationPlan:
    """What a conversion will do; nothing is written until it is run."""

    src: Path
    variant: LegacyVariant
    config: ConfigSchema | None = None
    config_source: str | None = None
    steps: list[MigrationStep] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    case_changes: int = 0
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_migrated: list[str] = field(default_factory=list)
    unmigrated_paths: set[str] = field(default_factory=set)
    migrated_dirs: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.steps)

    @property
    def has_config(self) -> bool:
        return self.config is not None

    def render(self, dst: Path | None = None) -> str:
        lines = [f"legacy layout at {self.src}"]
        lines += [f"  {line}" for line in self.variant.describe()]
        if self.config_source:
            lines.append(f"config from {self.config_source}, with today's keys:")
            lines += [f"  {c}" for c in self.changes]
            if not self.changes and not self.case_changes:
                lines.append("  (no key or value needs renaming)")
            if self.case_changes:
                lines.append(f"  {self.case_changes} more keys only change from camelCase to snake_case")
        else:
            lines.append("config: none (no METADATA file); no config.json is written")
        where = f" into {dst}" if dst is not None else ""
        lines.append(f"plan: {len(self.steps)} files{where}, reading {_size(self.total_bytes)}:")
        lines += [f"  {step}" for step in self.steps]
        if self.warnings:
            lines.append("warnings:")
            lines += [f"  - {w}" for w in self.warnings]
        if self.not_migrated:
            lines.append("not migrated:")
            lines += [f"  - {n}" for n in self.not_migrated]
        if self.errors:
            lines.append("errors (nothing can be written):")
            lines += [f"  - {e}" for e in self.errors]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": str(self.src),
            "variant": {
                "index_bases": list(self.variant.index_bases),
                "config_era": self.variant.config_era,
                "version_file": self.variant.version_file,
                "version": self.variant.version,
                "init_layout": self.variant.init_layout,
                "containers": list(self.variant.containers),
                "dynamic_relations": self.variant.dynamic_relations,
            },
            "config_source": self.config_source,
            "config": self.config.to_dict() if self.config is not None else None,
            "config_changes": self.changes,
            "steps": [s.to_dict() for s in self.steps],
            "total_bytes": self.total_bytes,
            "warnings": self.warnings,
            "errors": self.errors,
            "not_migrated": self.not_migrated,
        }


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"
