"""Fuzz pbgio's readers of user files (see docs/guides/fuzzing.md).

    python tools/fuzz.py --list
    python tools/fuzz.py --target edges-read --inputs 5000 --jobs 2
    python tools/fuzz.py --all --inputs 100000 --jobs 2 --seconds-per-target 100 --json fuzz.json
    python tools/fuzz.py --target edges-read --replay fuzz-crashes/edges-read/*.bin
    python tools/fuzz.py --target config --replay tests/fuzz_inputs/config/*  # the regression inputs
    python tools/fuzz.py --target config --minimize fuzz-crashes/config/exception-123-ab.bin
    python tools/fuzz.py --guided --minutes 15 --family edges --family import   # atheris, then coverage
    python tools/fuzz.py --guided --minutes 0 --family config   # replay the corpus under coverage only

Exit status: 0 when no input failed, 1 when one did, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pbgio.testing import fuzz, fuzz_seeds, fuzzrun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", action="append", help="a target name (repeatable)")
    which.add_argument("--all", action="store_true", help="every target")
    which.add_argument("--list", action="store_true", help="list the targets and exit")
    which.add_argument("--guided", action="store_true",
                       help="coverage-guided (atheris) by reader family, then the branch coverage of its corpus")
    parser.add_argument("--family", action="append", help="--guided: a family (repeatable; default every family)")
    parser.add_argument("--minutes", type=float, default=1.0, help="--guided: minutes per family (default 1)")
    parser.add_argument("--corpus", type=Path, default=Path("fuzz-corpus"),
                        help="--guided: the corpus, grown across runs (default fuzz-corpus/<family>/)")
    parser.add_argument("--inputs", type=int, default=1000, help="inputs per target (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per input (default 5)")
    parser.add_argument("--memory-mb", type=int, default=1024,
                        help="address space a worker may add while reading one input (default 1024; 0: no limit)")
    parser.add_argument("--seconds-per-target", type=float, default=None,
                        help="stop a target after this many seconds even if --inputs are not all run")
    parser.add_argument("--crashes", type=Path, default=Path("fuzz-crashes"),
                        help="where failing inputs are written (default fuzz-crashes/)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--replay", type=Path, nargs="+", help="run these input files instead of generated ones")
    parser.add_argument("--only", type=int, default=None, help="run only generated input number N")
    parser.add_argument("--minimize", type=Path, default=None,
                        help="shrink this failing input (in-process) and write it next to the original")
    args = parser.parse_args(argv)

    if args.list:
        for target in fuzz.TARGETS.values():
            print(f"{target.name:24} {target.filename:28} {target.kind:11} {target.description}")
        return 0
    if args.guided:
        return _guided(parser, args)
    names = list(fuzz.TARGETS) if args.all else args.target
    unknown = [n for n in names if n not in fuzz.TARGETS and n not in fuzz.SELFTEST_TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; see --list")
    if args.minimize is not None:
        if len(names) != 1:
            parser.error("--minimize takes one --target")
        return _minimize(names[0], args.minimize, args.timeout)

    results: dict[str, fuzzrun.TargetStats] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pbgio-fuzz-corpus-") as tmp:
        corpus = Path(tmp)
        fuzz_seeds.build_corpus(corpus, names)
        print(f"seed corpus built in {time.monotonic() - started:.1f} s", flush=True)
        with fuzzrun.Campaign(names, corpus, seed=args.seed, jobs=args.jobs, timeout=args.timeout,
                              memory_mb=args.memory_mb, crashes=args.crashes,
                              log=lambda line: print(line, flush=True)) as campaign:
            for name in names:
                if args.replay:
                    tasks = fuzzrun.replayed(name, args.replay)
                elif args.only is not None:
                    tasks = list(fuzzrun.generated(name, 1, start=args.only))
                else:
                    tasks = list(fuzzrun.generated(name, args.inputs))
                deadline = time.monotonic() + args.seconds_per_target if args.seconds_per_target else None
                results[name] = stats = campaign.run(name, tasks, deadline=deadline)
                print(stats.summary(), flush=True)
    total = sum(s.inputs for s in results.values())
    failed = sum(s.failed for s in results.values())
    print(f"total: {total} inputs, {failed} failures, {time.monotonic() - started:.0f} s wall"
          + (f"; failing inputs under {args.crashes}/" if failed else ""))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "command": " ".join(sys.argv), "seed": args.seed, "jobs": args.jobs, "timeout": args.timeout,
            "memory_mb": args.memory_mb, "targets": {n: s.to_dict() for n, s in results.items()},
        }, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


def _guided(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Fuzz each family with atheris for --minutes, then replay its corpus under coverage.py."""
    from pbgio.testing import guided

    names = args.family or list(guided.FAMILIES)
    unknown = [n for n in names if n not in guided.FAMILIES]
    if unknown:
        parser.error(f"unknown famil(ies) {', '.join(unknown)}; known: {', '.join(guided.FAMILIES)}")
    results: dict[str, dict[str, object]] = {}
    findings = 0
    data_dir = Path(tempfile.mkdtemp(prefix="pbgio-guided-data-"))
    data_files = {name: data_dir / f"{name}.coverage" for name in names}
    for name in names:
        family = guided.FAMILIES[name]
        corpus = args.corpus / name
        started = time.monotonic()
        if args.minutes > 0:
            stats = guided.fuzz_family(family, corpus, args.crashes / name, args.minutes * 60, timeout=args.timeout,
                                       memory_mb=args.memory_mb, log=lambda line: print(line, flush=True))
        else:
            guided.write_seeds(family, corpus)
            stats = {"family": name, "inputs": 0, "outcomes": {}, "findings": {}}
        found = stats["findings"]
        assert isinstance(found, dict)
        findings += len(found)
        covered = guided.measure(family, [corpus], timeout=max(args.timeout, 10.0), memory_mb=args.memory_mb,
                                 data_file=data_files[name])
        stats["coverage"] = covered
        results[name] = stats
        print(f"{name}: {stats['inputs']} inputs in {time.monotonic() - started:.0f} s, outcomes {stats['outcomes']}, "
              f"{len(found)} finding(s), corpus {covered['inputs']} inputs", flush=True)
        for module, entry in covered["modules"].items():
            print(f"  {module:34} branches {entry['covered_branches']:4}/{entry['branches']:<4} "
                  f"{guided.branch_percent(entry):5.1f}%   lines {entry['covered_lines']}/{entry['statements']}",
                  flush=True)
    together = guided.measure_together(data_files)
    print(f"every reader module, from the corpora of {', '.join(names)} together:")
    for module, entry in together.items():
        print(f"  {module:34} branches {entry['covered_branches']:4}/{entry['branches']:<4} "
              f"{guided.branch_percent(entry):5.1f}%", flush=True)
    shutil.rmtree(data_dir, ignore_errors=True)
    print(f"total: {findings} finding(s)" + (f"; inputs under {args.crashes}/" if findings else ""))
    if args.json is not None:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "families": results, "modules": together},
                                        indent=2) + "\n", encoding="utf-8")
    return 1 if findings else 0


def _minimize(name: str, path: Path, timeout: float) -> int:
    """Delta-debug an input in-process: drop chunks while the same failure signature reproduces."""
    import signal

    target = fuzz.get_target(name)
    scratch = Path(tempfile.mkdtemp(prefix="pbgio-fuzz-min-"))
    signal.signal(signal.SIGALRM, fuzzrun._on_alarm)

    def signature(data: bytes) -> str:
        exc, _ = fuzzrun.run_bounded(target, data, scratch, timeout)
        outcome, kind = fuzz.classify(exc)
        return fuzzrun._signature(kind, exc) if outcome == "failure" else outcome

    data = path.read_bytes()
    wanted = signature(data)
    if not wanted.startswith(("exception", "memory", "recursion", "hang")):
        print(f"{path}: does not fail ({wanted})")
        return 1
    print(f"{path}: {len(data)} bytes, {wanted}")
    chunk = max(1, len(data) // 2)
    tries = 0
    while chunk >= 1 and tries < 2000:
        i, shrunk = 0, False
        while i < len(data) and tries < 2000:
            candidate = data[:i] + data[i + chunk:]
            tries += 1
            if signature(candidate) == wanted:
                data, shrunk = candidate, True
            else:
                i += chunk
        if not shrunk:
            chunk //= 2
    out = path.with_name(path.stem + ".min" + path.suffix)
    out.write_bytes(data)
    print(f"{out}: {len(data)} bytes after {tries} tries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
