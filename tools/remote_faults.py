#!/usr/bin/env python
"""Storage faults on a remote layout: errors and time-outs injected into s3fs's requests during
``pbgio import``, ``pbgtrain fit`` (its commit), ``pbgio export`` and ``pbgio index build`` on an
``s3://`` layout (moto's S3 server on localhost; :mod:`pbgio.testing.storage_faults`).

Usage::

    python tools/remote_faults.py --faults 100 --seed 0

Each trial runs one command (in this process, as its CLI) with a burst of 1 to 4 consecutive
requests failing from a random request on (half the time one that writes: an upload, a copy, a
delete, the requests of a commit); bursts shorter than the retry policy's attempts must be
retried and succeed, longer ones may fail, but only with an error naming the URL and the
operation (no traceback). After every trial the committed state must be valid (``pbgio validate``)
and byte-identical to a fault-free run's (the state before the command, or after it). Prints per
operation: trials, faults injected, succeeded after a retry, failed cleanly, unclean failures, lost
or damaged states (the last two must be 0; the exit code is 1 otherwise); and how many failed fits
left the new run's ``config.json`` beside the previous committed version ("config.json ahead":
the commit protocol writes it before the version file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

OPERATIONS = ("import", "fit", "export", "index")
WRITES = frozenset({"put_object", "upload_part", "create_multipart_upload", "complete_multipart_upload",
                    "copy_object", "delete_object", "delete_objects"})
CONFIG = {"entities": {"node": {"num_partitions": 2}},
          "relations": [{"name": "link", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
          "dimension": 8, "num_epochs": 1, "num_edge_chunks": 1, "batch_size": 200, "num_batch_negs": 20,
          "num_uniform_negs": 20, "eval_fraction": 0.0, "workers": 1,
          "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model"}


def _cli(app_name: str, *args: str) -> tuple[int, str, BaseException | None]:
    """A command run in this process: exit code, output, an exception that escaped (a traceback)."""
    import typer
    from typer.testing import CliRunner

    if app_name == "pbgio":
        from pbgio.cli import app
    else:
        from pbgtrain.cli import app

    def exit_at_once(code: int) -> None:
        raise typer.Exit(code)

    with mock.patch("pbgio.console._exit_at_once", exit_at_once):
        result = CliRunner().invoke(app, list(args))
    escaped = result.exception if result.exception and not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.output, escaped


def _digest(root: str) -> dict[str, str]:
    """sha256 of every object under ``root`` (lease, stats and probe objects left out)."""
    import s3fs

    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
    out = {}
    for key in sorted(fs.find(root.removeprefix("s3://"))):
        name = key[len(root.removeprefix("s3://")) + 1:]
        if "lock" in name or "lease" in name or "training_stats" in name or "probe" in name:
            continue
        out[name] = hashlib.sha256(fs.cat_file(key)).hexdigest()
    return out


def _copy(source: str, target: str, names: list[str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
    for name in names:
        fs.copy(f"{source}/{name}".removeprefix("s3://"), f"{target}/{name}".removeprefix("s3://"))


class Campaign:
    def __init__(self, server: Any, work: Path) -> None:
        self.server = server
        self.work = work
        self.stats: dict[str, Counter[str]] = {op: Counter() for op in OPERATIONS}
        self.problems: list[str] = []
        self.calls: dict[str, int] = {}
        self.writes: dict[str, list[int]] = {}  # numbers of the requests that write (half the faults go there)
        self.tsv = work / "edges.tsv"
        rng = np.random.default_rng(0)
        lhs = rng.integers(0, 120, 2000)
        self.tsv.write_text("".join(f"n{a}\tn{(a + b) % 120}\n" for a, b in zip(lhs, rng.integers(1, 4, 2000),
                                                                                   strict=True)))
        self.base = self._fresh()
        self._run("import", self.base)
        self.imported = _digest(self.base)
        self._run("fit", self.base, epochs=1)
        self.fitted = _digest(self.base)  # version 1: the state fit, export and index start from
        fit_ref = self._copy_of_base()
        self._run("fit", fit_ref)
        self.fit_done = _digest(fit_ref)
        self.export_ref = self._export_output()
        index_ref = self._copy_of_base()
        self._run("index", index_ref)
        self.index_done = _digest(index_ref)

    def _fresh(self) -> str:
        from pbgio import storage

        root: str = self.server.url(uuid.uuid4().hex[:8])
        storage.write_text(storage.resolve(f"{root}/config.json"), json.dumps(CONFIG))
        storage.write_bytes(storage.resolve(f"{root}/input/edges.tsv"), self.tsv.read_bytes())
        return root

    def _copy_of_base(self) -> str:
        root: str = self.server.url(uuid.uuid4().hex[:8])
        _copy(self.base, root, ["config.json", "input/edges.tsv", *self.fitted])
        return root

    def _export_output(self) -> str:
        out = self.work / f"export-{uuid.uuid4().hex[:8]}.tsv"
        code, output, escaped = self._command("export", self.base, out=out)
        if code != 0 or escaped:
            raise RuntimeError(f"fault-free export failed: {output} {escaped!r}")
        return out.read_text()

    def _command(self, op: str, root: str, *, epochs: int = 2, out: Path | None = None
                 ) -> tuple[int, str, BaseException | None]:
        config = f"{root}/config.json"
        if op == "import":
            return _cli("pbgio", "import", config, f"{root}/input/edges.tsv", "-d", "\t", "-l", "0", "-r", "1",
                        "--rel-col", "none", "--seed", "3", "--no-progress")
        if op == "fit":
            return _cli("pbgtrain", "fit", config, "-p", f"num_epochs={epochs}", "--seed", "1", "--no-progress")
        if op == "export":
            assert out is not None
            return _cli("pbgio", "export", config, "-o", str(out), "--no-progress")
        return _cli("pbgio", "index", "build", config, "--kind", "flat")

    def _run(self, op: str, root: str, epochs: int = 2) -> None:
        code, output, escaped = self._command(op, root, epochs=epochs)
        if code != 0 or escaped:
            raise RuntimeError(f"fault-free {op} failed ({code}): {output} {escaped!r}")

    def count_calls(self, op: str) -> int:
        """Requests a fault-free run of ``op`` makes (the range faults are drawn from)."""
        from pbgio.testing.storage_faults import Plan, inject

        root = self._target(op)
        with inject(Plan()) as plan:
            self._command(op, root, out=self.work / "count.tsv")
        self.writes[op] = [n for n, method in enumerate(plan.methods) if method in WRITES]
        return plan.calls

    def _target(self, op: str) -> str:
        return self._fresh() if op == "import" else self.base if op == "export" else self._copy_of_base()

    def trial(self, op: str, rng: random.Random) -> None:
        from pbgio.storage import retry
        from pbgio.testing.storage_faults import Plan, inject

        root = self._target(op)
        before = _digest(root)
        out = self.work / f"out-{uuid.uuid4().hex[:8]}.tsv"
        writes = self.writes.get(op) or []
        at = rng.choice(writes) if writes and rng.random() < 0.5 else rng.randrange(self.calls[op])
        plan = Plan(at=at, burst=rng.choice([1, 1, 2, 3, 4]),
                    kind=rng.choice(["error", "timeout"]))
        retried = retry.COUNTS.retried
        with inject(plan):
            code, output, escaped = self._command(op, root, out=out)
        stats = self.stats[op]
        stats["trials"] += 1
        stats["faults"] += plan.injected
        where = f"{op} at request {at} ({plan.methods[at] if at < len(plan.methods) else '-'})" \
                f" x{plan.burst} {plan.kind}"
        if escaped is not None or "Traceback" in output:
            stats["unclean"] += 1
            self.problems.append(f"{where}: traceback {escaped!r}")
        elif code == 0:
            stats["retried and succeeded" if retry.COUNTS.retried > retried else "succeeded"] += 1
        elif "s3://" in output and ("injected fault" in output or "timed out" in output):
            stats["failed cleanly"] += 1
            if plan.injected < retry.DEFAULT_ATTEMPTS:
                stats["failed on a short burst"] += 1
        else:
            stats["unclean"] += 1
            self.problems.append(f"{where}: exit {code} without the URL or the reason: {output.strip()[-300:]}")
        damage = self._damage(op, root, before, code, out)
        if damage:
            stats["lost or damaged"] += 1
            self.problems.append(f"{where}: {damage}")

    def _damage(self, op: str, root: str, before: dict[str, str], code: int, out: Path) -> str | None:
        from pbgio.validate import validate_path

        after = _digest(root)
        if op == "import":
            done = {k: v for k, v in after.items() if k.startswith("data/")}
            reference = {k: v for k, v in self.imported.items() if k.startswith("data/")}
            if done == reference:
                return None
            if code == 0:
                return "import succeeded with different files"
            return "a failed import left a layout that validates" if validate_path(f"{root}/config.json").ok \
                else None
        report = validate_path(f"{root}/config.json")
        if not report.ok:
            return f"the layout no longer validates: {report.issues[:2]}"
        if op == "export":
            if after != before:
                return "export changed the layout"
            if code == 0 and out.read_text() != self.export_ref:
                return "export wrote different embeddings"
            if code != 0 and out.exists():
                return "a failed export left its output"
            return None
        finished = self.fit_done if op == "fit" else self.index_done
        config = "model/config.json"
        if code != 0 and after.get(config) == finished.get(config) != before.get(config):
            # The commit protocol writes the run's config.json before the version file (locally
            # too): a failure between the two leaves the previous version committed beside the new
            # run's config. Counted apart, and the rest of the state checked as strictly.
            self.stats[op]["config.json ahead"] += 1
            before = {**before, config: finished[config]}
        return _committed_damage(after, before, finished, code)


def _committed_damage(after: dict[str, str], before: dict[str, str], finished: dict[str, str], code: int
                      ) -> str | None:
    """What is wrong with the objects ``after`` a command, given those ``before`` it and those a
    fault-free run leaves (``finished``): the committed state must be one of the two, every one of
    its files intact; other objects may only be leftovers (an uncommitted version, a superseded one
    not yet removed, an index of the committed version), which the next run removes or replaces."""
    version = "model/checkpoint_version.txt"
    states = [("the state before", before), ("a fault-free run's state", finished)]
    for name, state in states[::-1] if code == 0 else states:  # a success must leave a fault-free run's
        if after.get(version) == state.get(version):
            whole = code == 0  # a success leaves every file of its run, its index too
            damaged = sorted(k for k in state if after.get(k) != state[k] and (whole or "index_" not in k))
            if damaged:
                return f"committed as in {name}, but {damaged[:4]} differ"
            return None
    return f"the committed version is neither the one before nor a fault-free run's: {after.get(version)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=40, help="trials (each injects a burst of 1 to 4 faults)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from pbgio.testing.s3server import S3Server

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as work, S3Server(bucket=f"faults-{uuid.uuid4().hex[:8]}") as server:
        campaign = Campaign(server, Path(work))
        for op in OPERATIONS:
            campaign.calls[op] = campaign.count_calls(op)
        for number in range(args.faults):
            campaign.trial(OPERATIONS[number % len(OPERATIONS)], rng)
    return report(campaign, print)


def report(campaign: Campaign, say: Callable[[str], None]) -> int:
    columns = ["trials", "faults", "retried and succeeded", "succeeded", "failed cleanly",
               "failed on a short burst", "config.json ahead", "unclean", "lost or damaged"]
    say(f"{'operation':<10}" + "".join(f"{c:>24}" for c in columns) + f"{'requests':>10}")
    total: Counter[str] = Counter()
    for op, stats in campaign.stats.items():
        total.update(stats)
        say(f"{op:<10}" + "".join(f"{stats[c]:>24}" for c in columns) + f"{campaign.calls.get(op, 0):>10}")
    say(f"{'total':<10}" + "".join(f"{total[c]:>24}" for c in columns))
    for problem in campaign.problems:
        say(f"PROBLEM {problem}")
    return 1 if total["unclean"] or total["lost or damaged"] else 0


if __name__ == "__main__":
    sys.exit(main())
