"""Generate the published JSON Schemas from the spec.

    python tools/gen_schemas.py            # write schemas/*.schema.json
    python tools/gen_schemas.py --check    # exit 1 naming each stale file; write nothing

``schemas/config.schema.json`` comes from :func:`pbgio.config.config_json_schema`,
``schemas/validate-report.schema.json`` from :func:`pbgio.spec.validation_report.report_json_schema`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pbgio.config import config_json_schema
from pbgio.spec.validation_report import report_json_schema

REPO = Path(__file__).resolve().parents[1]


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def outputs() -> dict[str, str]:
    """Generated files by path relative to the repository root."""
    return {
        "schemas/config.schema.json": render(config_json_schema()),
        "schemas/validate-report.schema.json": render(report_json_schema()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this one)")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in outputs().items():
        path = args.root / rel
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {rel}")
    for rel in stale:
        print(f"{rel} is stale; run python tools/gen_schemas.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
