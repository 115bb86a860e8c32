"""pbgtrain reaches disk only through pbgio: no file APIs in its source.

The check reads every module of ``pbgtrain`` (AST, not text) and fails on imports of
file-format or filesystem modules and on calls that open, write, read or delete files.
A test below proves the checker catches each forbidden form.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pbgtrain

FORBIDDEN_MODULES = {"h5py", "pickle", "shutil", "tempfile", "io", "glob", "polars", "numpy.lib.format"}
FORBIDDEN_CALLS = {"open", "torch.save", "torch.load", "np.save", "np.load", "numpy.save", "numpy.load",
                   "np.savez", "np.fromfile", "os.remove", "os.unlink", "os.rename", "os.replace",
                   "os.makedirs", "os.mkdir", "os.rmdir", "os.open", "os.listdir", "os.scandir"}
FORBIDDEN_METHODS = {"write_text", "write_bytes", "read_text", "read_bytes", "unlink", "mkdir", "rmdir",
                     "touch", "rename", "replace", "iterdir", "glob", "rglob", "symlink_to", "tofile"}
# str.replace is common and harmless; a Path.replace is caught only on names that look like paths.
AMBIGUOUS_METHODS = {"replace"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def violations(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN_MODULES or a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES or node.module in FORBIDDEN_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in FORBIDDEN_CALLS:
                found.append(f"{filename}:{node.lineno}: {name}()")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS:
                receiver = _dotted(node.func.value) or ""
                if node.func.attr in AMBIGUOUS_METHODS and "path" not in receiver.lower():
                    continue
                found.append(f"{filename}:{node.lineno}: .{node.func.attr}()")
    return found


def test_pbgtrain_touches_disk_only_through_pbgio() -> None:
    root = Path(pbgtrain.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 3
    found = [v for m in modules for v in violations(m.read_text(encoding="utf-8"), str(m.relative_to(root)))]
    assert not found, "pbgtrain must use pbgio for every file access:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "import h5py", "from h5py import File", "import pickle", "import shutil", "from io import BytesIO",
    "open('x')", "torch.save(m, 'x')", "torch.load('x')", "np.save('x', a)", "os.remove('x')",
    "Path('x').write_text('y')", "p.read_bytes()", "path.unlink()", "out_path.replace(other)",
    "d.mkdir(parents=True)", "arr.tofile('x')",
])
def test_checker_catches(snippet: str) -> None:
    assert violations(snippet, "snippet.py"), snippet


@pytest.mark.parametrize("snippet", ["name.replace('a', 'b')", "json.dumps({})", "torch.randn(3)",
                                     "from pbgio.checkpoint import CheckpointDir"])
def test_checker_allows(snippet: str) -> None:
    assert not violations(snippet, "snippet.py"), snippet
