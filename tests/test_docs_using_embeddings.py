"""The guide to trained embeddings (docs/guides/using-embeddings.md) runs as written.

Its ``console`` blocks are shell sessions: each ``$ command`` runs in one temporary directory
(with this interpreter's ``pbgio``/``pbgtrain`` first on PATH), must exit 0, and must print
what the guide shows under it (stdout and stderr together; ``...`` elides, whitespace is
normalized). Its ``python`` blocks are doctests run in the same directory, in document order.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "using-embeddings.md"
BLOCK = re.compile(r"^```(console|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _sessions(body: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block."""
    pairs: list[tuple[str, str]] = []
    for line in body.splitlines(keepends=True):
        if line.startswith("$ "):
            pairs.append((line[2:].rstrip("\n"), ""))
        elif pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + line)
    return pairs


def test_guide_blocks_are_found() -> None:
    kinds = [kind for kind, _ in BLOCK.findall(GUIDE.read_text(encoding="utf-8"))]
    assert kinds.count("console") >= 6 and kinds.count("python") >= 3


@pytest.mark.slow  # trains the example, appends to a copy and warm-starts it; starts pbgtrain ten times: 30-60 s
def test_using_embeddings_guide_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               CI="1", COLUMNS="200", NO_COLOR="1")
    checker = doctest.OutputChecker()
    globs: dict[str, object] = {}
    monkeypatch.chdir(tmp_path)
    ran = 0
    for kind, body in BLOCK.findall(GUIDE.read_text(encoding="utf-8")):
        if kind == "console":
            for command, want in _sessions(body):
                proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=600)
                got = proc.stdout
                assert proc.returncode == 0, f"$ {command}\nexit {proc.returncode}\n{got}"
                assert checker.check_output(want, got, FLAGS), f"$ {command}\nwanted:\n{want}\ngot:\n{got}"
                ran += 1
        else:
            test = doctest.DocTestParser().get_doctest(body, globs, GUIDE.name, str(GUIDE), 0)
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, clear_globs=False)
            globs.update(test.globs)  # later blocks use what earlier ones define
            assert runner.summarize(verbose=False).failed == 0
            ran += len(test.examples)
    assert ran > 20
