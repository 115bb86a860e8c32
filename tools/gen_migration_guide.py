"""Regenerate the tables in docs/guides/migration.md from pbgio.legacy.spec.

    python tools/gen_migration_guide.py            # rewrite the generated blocks
    python tools/gen_migration_guide.py --check    # exit 1 when they are stale; write nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pbgio.legacy.spec import render_guide

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "migration.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    text = GUIDE.read_text(encoding="utf-8")
    fresh = render_guide(text)
    if fresh == text:
        return 0
    if args.check:
        print(f"{GUIDE}: stale; run python tools/gen_migration_guide.py", file=sys.stderr)
        return 1
    GUIDE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
