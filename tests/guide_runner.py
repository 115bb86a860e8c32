"""Running a guide's examples as written (the tests of docs/guides/featurized.md, training.md,
using-embeddings.md).

A guide's ``console`` blocks are shell sessions: each ``$ command`` runs in one directory (with
this interpreter's ``pbgio``/``pbgtrain`` first on PATH), must exit 0, and must print what the
guide shows under it (stdout and stderr together; ``...`` elides, whitespace is normalized). Its
``python`` blocks are doctests run in the same directory, in document order, each seeing what the
earlier ones defined. Other blocks (``bash`` command summaries, ``text``) are not run.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

BLOCK = re.compile(r"^```(console|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def block_kinds(guide: Path) -> list[str]:
    """The kinds of the guide's runnable blocks, in order."""
    return [kind for kind, _ in BLOCK.findall(guide.read_text(encoding="utf-8"))]


def sessions(body: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block."""
    pairs: list[tuple[str, str]] = []
    for line in body.splitlines(keepends=True):
        if line.startswith("$ "):
            pairs.append((line[2:].rstrip("\n"), ""))
        elif pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + line)
    return pairs


def console_blocks(guide: Path) -> list[str]:
    """The bodies of the guide's ``console`` blocks, in order."""
    return [body for kind, body in BLOCK.findall(guide.read_text(encoding="utf-8")) if kind == "console"]


def run_command(command: str, want: str, directory: Path) -> str:
    """Run one ``$ command`` of a guide in ``directory``: it must exit 0 and print ``want``; returns its output."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               CI="1", COLUMNS="200", NO_COLOR="1")
    proc = subprocess.run(["bash", "-c", command], cwd=directory, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    got = proc.stdout
    assert proc.returncode == 0, f"$ {command}\nexit {proc.returncode}\n{got}"
    assert doctest.OutputChecker().check_output(want, got, FLAGS), f"$ {command}\nwanted:\n{want}\ngot:\n{got}"
    return got


def run_guide(guide: Path, directory: Path) -> int:
    """Run every example of ``guide`` in ``directory`` (the caller makes it the working directory);
    returns how many commands and doctest examples ran. An example that fails fails the test."""
    globs: dict[str, object] = {}
    ran = 0
    for kind, body in BLOCK.findall(guide.read_text(encoding="utf-8")):
        if kind == "console":
            for command, want in sessions(body):
                run_command(command, want, directory)
                ran += 1
        else:
            test = doctest.DocTestParser().get_doctest(body, globs, guide.name, str(guide), 0)
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, clear_globs=False)
            globs.update(test.globs)  # later blocks use what earlier ones define
            assert runner.summarize(verbose=False).failed == 0
            ran += len(test.examples)
    return ran
