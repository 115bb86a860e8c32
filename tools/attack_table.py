"""Run the project's attack corpus (:mod:`pbgio.testing.attacks`) and print the table of attempts.

    python tools/attack_table.py                          # every attack x command, this checkout's code
    python tools/attack_table.py -k fifo -k lock          # the cases whose "attack command" contains fifo or lock
    python tools/attack_table.py --code-root /work/before # the same cases against another checkout's code
    python tools/attack_table.py --fast                   # only the cases of the default test suite

Each case is built in a fresh directory and run as a user runs it (a child process with the code of
``--code-root`` on its ``PYTHONPATH``, killed past ``--timeout`` seconds or 2 GiB), then judged by
:func:`pbgio.testing.attack_judge.run_attempt`. The table (markdown) has one row per attempt: the
attack, its class, the command, the outcome (``ok``, or the exit code and the first line of the
error), seconds, peak RSS in MB, and the verdict (``held``, or every way it failed). ``--json FILE``
also writes the rows. The exit status is 1 when an attempt failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pbgio.testing.attack_judge import TIME_LIMIT, Verdict  # noqa: E402
from pbgio.testing.attacks import Attack, cases, run_attempt  # noqa: E402


def selected(patterns: list[str], *, fast: bool, slow: bool) -> list[tuple[Attack, str]]:
    """The cases whose ``"attack command"`` contains one of ``patterns`` (all without any)."""
    chosen = []
    for found, command in cases():
        if patterns and not any(p in f"{found.name} {command}" for p in patterns):
            continue
        if (fast and found.is_slow(command)) or (slow and not found.is_slow(command)):
            continue
        chosen.append((found, command))
    return chosen


def run_case(found: Attack, command: str, code_root: Path | None, timeout: float) -> Verdict:
    """Build the attack in a fresh directory, run its attempt of ``command``, clean up."""
    root = Path(tempfile.mkdtemp(prefix=f"pbg-attack-{found.name}-"))
    try:
        setup = found.build(root)
        try:
            return run_attempt(setup, command, attack=found.name, code_root=code_root, timeout=timeout)
        finally:
            setup.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("\x1b", "\\x1b")


def table(rows: list[tuple[Attack, Verdict]]) -> str:
    lines = ["| attempt | class | command | outcome | seconds | peak RSS (MB) | verdict |",
             "|---|---|---|---|---:|---:|---|"]
    for found, verdict in rows:
        outcome = verdict.outcome if len(verdict.outcome) <= 140 else verdict.outcome[:139] + "…"
        judged = "held" if verdict.held else "FAILED: " + "; ".join(verdict.failures)
        lines.append(f"| {found.name} | {found.klass} | {verdict.command} | {_cell(outcome)} | "
                     f"{verdict.seconds:.1f} | {verdict.peak_rss_mb:.0f} | {_cell(judged)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", action="append", default=[], metavar="TEXT",
                        help="run the cases whose 'attack command' contains TEXT (repeatable)")
    parser.add_argument("--code-root", type=Path, default=None,
                        help="the checkout whose code runs the commands (default: this one)")
    parser.add_argument("--timeout", type=float, default=TIME_LIMIT, help="seconds an attempt may run")
    parser.add_argument("--fast", action="store_true", help="only the cases of the default test suite")
    parser.add_argument("--slow", action="store_true", help="only the cases marked slow")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for found, command in selected(args.k, fast=args.fast, slow=args.slow):
        verdict = run_case(found, command, args.code_root, args.timeout)
        rows.append((found, verdict))
        print(f"{found.name} / {command}: {'held' if verdict.held else 'FAILED'} ({verdict.seconds:.1f} s)",
              file=sys.stderr, flush=True)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([
            {"attack": f.name, "class": f.klass, "command": v.command, "argv": list(v.argv), "exit_code": v.exit_code,
             "outcome": v.outcome, "seconds": round(v.seconds, 2), "peak_rss_mb": round(v.peak_rss_mb, 1),
             "held": v.held, "failures": v.failures} for f, v in rows], indent=1) + "\n")
    return 0 if all(v.held for _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
