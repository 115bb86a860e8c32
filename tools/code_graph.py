"""A knowledge graph of a Python code base, as a user's own graph to train on: TSV edge lists.

Entities are modules, classes and functions (qualified names, ``json.decoder.JSONDecoder.decode``);
relations, read from the source with :mod:`ast` (nothing is imported or run):

- ``imports``: module → module (``import x``, ``from x import y``; relative imports resolved);
- ``defines``: module → its top-level classes and functions;
- ``has_method``: class → the functions defined in its body;
- ``subclass_of``: class → each base class named in its definition (resolved through the module's
  own classes and imports, else kept as written);
- ``calls``: function → a function or class of the same module it calls by name.

The edges are shuffled with ``--seed`` and split into train/valid/test (``--valid-fraction`` each for
valid and test); a held-out edge whose entity never occurs in train is moved to train, so that
every evaluated entity has an embedding that trained.

    .venv/bin/python tools/code_graph.py OUT_DIR                 # the running Python's standard library
    .venv/bin/python tools/code_graph.py OUT_DIR --source SRC_DIR

Prints the counts; writes ``OUT_DIR/{train,valid,test}.tsv`` (lhs, relation, rhs; tab-separated).
"""

from __future__ import annotations

import argparse
import ast
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

Edge = tuple[str, str, str]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def module_edges(module: str, tree: ast.Module, is_package: bool) -> Iterator[Edge]:
    """The edges one module's source gives."""
    aliases: dict[str, str] = {}  # a name in the module → the qualified name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
                yield module, "imports", alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_relative(module, is_package, node.level, node.module) if node.level else \
                node.module or ""
            if not source:
                continue
            yield module, "imports", source
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    local = {n.name: f"{module}.{n.name}" for n in tree.body
             if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    names = {**aliases, **local}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            qualified = local[node.name]
            yield module, "defines", qualified
            yield from _calls(qualified, node, local)
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                written = ast.unparse(base)
                head, _, rest = written.partition(".")
                target = names.get(head)
                yield qualified, "subclass_of", f"{target}.{rest}" if target and rest else target or written
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    method = f"{qualified}.{item.name}"
                    yield qualified, "has_method", method
                    yield from _calls(method, item, local)


def _calls(caller: str, node: ast.AST, local: dict[str, str]) -> Iterator[Edge]:
    seen = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in local:
            callee = local[inner.func.id]
            if callee != caller and callee not in seen:
                seen.add(callee)
                yield caller, "calls", callee


SKIPPED = frozenset({"test", "tests", "site-packages", "idlelib", "lib2to3"})
"""Folders below the source whose files are left out (tests, and a nested environment's packages)."""


def code_graph(root: Path) -> list[Edge]:
    """Every edge of the ``.py`` files under ``root`` (files that do not parse are skipped)."""
    edges: set[Edge] = set()
    for path in sorted(root.rglob("*.py")):
        if any(part in SKIPPED for part in path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        edges.update(module_edges(module_name(root, path), tree, path.name == "__init__.py"))
    return sorted(e for e in edges if e[0] != e[2] and all("\t" not in x and "\n" not in x for x in e))


def split(edges: list[Edge], fraction: float, seed: int) -> tuple[list[Edge], list[Edge], list[Edge]]:
    """Shuffled train/valid/test; held-out edges of entities absent from train go to train."""
    shuffled = list(edges)
    random.Random(seed).shuffle(shuffled)
    held = int(len(shuffled) * fraction)
    valid, test, train = shuffled[:held], shuffled[held:2 * held], shuffled[2 * held:]
    known = {x for lhs, _, rhs in train for x in (lhs, rhs)}
    kept: list[list[Edge]] = [[], []]
    for i, part in enumerate((valid, test)):
        for edge in part:
            (kept[i] if edge[0] in known and edge[2] in known else train).append(edge)
    return train, kept[0], kept[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                        help="the code base (default: this Python's standard library)")
    parser.add_argument("--valid-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        sys.exit(f"--source {args.source}: not a directory")
    write_splits(args.out, code_graph(args.source), args.valid_fraction, args.seed, str(args.source))
    return 0


def write_splits(out: Path, edges: list[Edge], fraction: float, seed: int, source: str) -> None:
    """``out/{train,valid,test}.tsv`` of ``edges`` (:func:`split`), and a line of their counts."""
    parts = split(edges, fraction, seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "valid", "test"), parts, strict=True):
        (out / f"{name}.tsv").write_text("".join(f"{lhs}\t{rel}\t{rhs}\n" for lhs, rel, rhs in part))
    entities = {x for lhs, _, rhs in edges for x in (lhs, rhs)}
    relations = sorted({rel for _, rel, _ in edges})
    print(f"{source}: {len(entities):,} entities, {len(relations)} relations ({', '.join(relations)}), "
          f"{len(edges):,} edges: train {len(parts[0]):,}, valid {len(parts[1]):,}, test {len(parts[2]):,}")


if __name__ == "__main__":
    raise SystemExit(main())
