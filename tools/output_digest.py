"""Fingerprint what the commands write, so a redesign can prove it changed no byte.

``run`` builds a layout, trains it, evaluates it and exports it with the real command lines, then
writes the SHA-256 of every file the pipeline produced into ``DIGEST.json`` (one per pipeline
directory). ``compare`` compares two such runs file by file. Run it once on the code before a
change and once after, on the same machine (floating-point sums depend on the CPU's kernels and
the thread count), and compare::

    python tools/output_digest.py run /tmp/before --pipelines example kinship
    # ... the change ...
    python tools/output_digest.py run /tmp/after --pipelines example kinship
    python tools/output_digest.py compare /tmp/before /tmp/after

What is fingerprinted: checkpoints (every ``.h5``, ``checkpoint_version.txt``, ``config.json``,
``best/``), entity and edge files, exports (TSV, Parquet, ``.npy``), the eval report (``--json``),
predict's answers, and ``training_stats.json``, the eval report and predict's JSON answers with the
figures that measure time removed
(``seconds``, edges per second, wall-clock stamps) and the pipeline's directory written as
``<root>``: the only parts of the outputs that may differ between two runs.

Pipelines:

- ``example``: ``pbgio example``, ``pbgtrain fit`` (2 partitions of users, translation and
  diagonal operators), ``pbgtrain eval`` on the held-out edges, ``pbgio export`` to TSV, Parquet
  and ``.npy``, ``pbgtrain predict`` (a filtered top-k, a triple, a file of queries).
- ``example-valid``: the same layout trained with ``--valid`` (best version kept, learning rate
  decayed, stopped early), evaluated on ``best/``.
- ``kinship``: the recipe's import of ``../shared/datasets/kinship.tar.gz``, a validation-driven
  fit (dynamic relations, ComplEx, 1-vs-all, N3, bf16) of 12 epochs, eval of ``best/`` on test,
  export.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
DIGEST = "DIGEST.json"
NORMALIZED_JSON = frozenset({"training_stats.json", "eval.json", "topk.json", "triple.json"})

TIMING_KEYS = frozenset({"seconds", "edges_per_second", "trained_from", "trained_until", "time", "wall",
                         "started", "finished", "elapsed", "eval_seconds", "minutes"})
"""Keys of ``training_stats.json`` whose values measure time (dropped before hashing)."""


def _command(tool: str, *args: str | Path, cwd: Path) -> str:
    """Run ``pbgio`` or ``pbgtrain`` with this interpreter (so ``PYTHONPATH`` picks the code)."""
    code = f"import sys; from {tool}.cli import main; sys.argv = [{tool!r}, *sys.argv[1:]]; main()"
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tool} {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _fingerprint(path: Path, root: Path) -> str:
    """SHA-256 of the file; of a JSON report (training stats, eval), without its timings and with the
    pipeline's own directory written as ``<root>`` (two runs live in two directories)."""
    if path.name in NORMALIZED_JSON:
        text = path.read_text().replace(str(root.resolve()), "<root>")
        documents = text.splitlines() if path.name == "training_stats.json" else [text]  # JSON lines, or one
        lines = [json.dumps(_without_timing(json.loads(doc)), sort_keys=True) for doc in documents if doc.strip()]
        data = "\n".join(lines).encode()
    else:
        data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()


def write_digest(root: Path, skip: Sequence[str] = ()) -> dict[str, str]:
    digest = {str(p.relative_to(root)): _fingerprint(p, root) for p in sorted(root.rglob("*"))
              if p.is_file() and p.name != DIGEST and not any(part in skip for part in p.relative_to(root).parts)
              and ".lock" not in p.name}
    (root / DIGEST).write_text(json.dumps(digest, indent=1, sort_keys=True) + "\n")
    return digest


def _example(dest: Path) -> None:
    _command("pbgio", "example", dest, cwd=dest.parent)
    _command("pbgtrain", "fit", "config.json", "--no-progress", cwd=dest)
    (dest / "out").mkdir()
    (dest / "out" / "eval.json").write_text(_command(
        "pbgtrain", "eval", "config.json", "--edges", "edges/test", "--all-entities", "--json", "--no-progress",
        cwd=dest))
    _command("pbgio", "export", "config.json", "-o", "out/emb.tsv", cwd=dest)
    _command("pbgio", "export", "config.json", "-o", "out/emb.parquet", cwd=dest)
    _command("pbgio", "export", "config.json", "-o", "out/npy", "--format", "npy", cwd=dest)
    _predictions(dest)


def _predictions(dest: Path) -> None:
    """``pbgtrain predict``'s three kinds of answer: a filtered top-k, a triple ranked on both
    sides, and a file of queries."""
    (dest / "out" / "topk.json").write_text(_command(
        "pbgtrain", "predict", "config.json", "--lhs", "user001", "--rel", "likes", "-k", "5", "--filter",
        "edges/train", "--json", cwd=dest))
    (dest / "out" / "triple.json").write_text(_command(
        "pbgtrain", "predict", "config.json", "--lhs", "user001", "--rel", "follows", "--rhs", "user002",
        "--filter", "edges/train", "--json", cwd=dest))
    (dest / "out" / "queries.tsv").write_text("user003\tfollows\t\n\tlikes\titem001\n")
    (dest / "out" / "answers.tsv").write_text(_command(
        "pbgtrain", "predict", "config.json", "--queries", "out/queries.tsv", "-k", "3", cwd=dest))


def _example_valid(dest: Path) -> None:
    _command("pbgio", "example", dest, cwd=dest.parent)
    _command("pbgtrain", "fit", "config.json", "--no-progress", "-p", "num_epochs=8", "--valid", "edges/test",
             "--patience", "3", "--lr-decay", "0.5", "--lr-patience", "1", "--operator-init", "random", cwd=dest)
    (dest / "out").mkdir()
    (dest / "out" / "eval.json").write_text(_command(
        "pbgtrain", "eval", "config.json", "-p", "checkpoint_path=checkpoint/best", "--edges", "edges/test",
        "--filter", "edges/train", "--json", "--no-progress", cwd=dest))
    _command("pbgio", "export", "config.json", "--checkpoint", "checkpoint/best", "-o", "out/emb.tsv", cwd=dest)


def _kinship(dest: Path) -> None:
    archive = SHARED / "datasets" / "kinship.tar.gz"
    if not archive.is_file():
        raise SystemExit(f"{archive}: missing (the kinship pipeline needs ../shared beside the checkout)")
    dest.mkdir()
    (dest / "config.json").write_text((REPO_ROOT / "recipes" / "kinship.json").read_text())
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "raw", filter="data")
    splits = {p.stem: p for p in (dest / "raw").rglob("*.tsv")}
    _command("pbgio", "import", "config.json", splits["train"], splits["valid"], splits["test"], "--no-progress",
             cwd=dest)
    filters = ["--filter", "data/train", "--filter", "data/valid", "--filter", "data/test"]
    _command("pbgtrain", "fit", "config.json", "--no-progress", "-p", "edge_paths=data/train", "-p", "num_epochs=12",
             "--valid", "data/valid", *filters, "--precision", "bf16", "--eval-every", "3", "--patience", "4",
             "--lr-decay", "0.5", "--lr-patience", "2", cwd=dest)
    (dest / "out").mkdir()
    (dest / "out" / "eval.json").write_text(_command(
        "pbgtrain", "eval", "config.json", "-p", "checkpoint_path=model/best", "--edges", "data/test", *filters,
        "--json", "--no-progress", cwd=dest))
    _command("pbgio", "export", "config.json", "--checkpoint", "model/best", "-o", "out/emb.tsv", cwd=dest)


PIPELINES: dict[str, Callable[[Path], None]] = {
    "example": _example, "example-valid": _example_valid, "kinship": _kinship}


def run(root: Path, names: Sequence[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        dest = root / name
        if dest.exists():
            raise SystemExit(f"{dest}: exists; give a new directory")
        PIPELINES[name](dest)
        digest = write_digest(dest, skip=("raw",))
        print(f"{name}: {len(digest)} files fingerprinted in {dest / DIGEST}")


def compare(before: Path, after: Path) -> int:
    different = 0
    for digest in sorted(before.glob(f"*/{DIGEST}")):
        name = digest.parent.name
        other = after / name / DIGEST
        if not other.is_file():
            print(f"{name}: not run in {after}")
            different += 1
            continue
        old, new = json.loads(digest.read_text()), json.loads(other.read_text())
        changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
        gone, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
        for label, files in (("differs", changed), ("only before", gone), ("only after", added)):
            for f in files:
                print(f"{name}: {f}: {label}")
        different += len(changed) + len(gone) + len(added)
        print(f"{name}: {len(old.keys() & new.keys()) - len(changed)} of {len(old)} files identical")
    return 1 if different else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    run_p = sub.add_parser("run", help="run pipelines into ROOT and fingerprint their files")
    run_p.add_argument("root", type=Path)
    run_p.add_argument("--pipelines", nargs="+", choices=sorted(PIPELINES), default=sorted(PIPELINES))
    cmp_p = sub.add_parser("compare", help="compare the fingerprints of two runs")
    cmp_p.add_argument("before", type=Path)
    cmp_p.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "run":
        run(args.root, args.pipelines)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
