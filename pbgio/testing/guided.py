"""Coverage-guided fuzzing of the readers, by family (guide: docs/guides/fuzzing.md).

:mod:`pbgio.testing.fuzz` mutates blindly; here `atheris <https://github.com/google/atheris>`_
(libFuzzer for Python) keeps the mutated inputs that reach new code in the readers and mutates
those. A *family* groups the catalogue's targets that share reader modules (every checkpoint
file, every entity file, …). One fuzzer process runs one family: an input's first byte picks
the target (modulo the family's size), the rest is the target's file. The corpus starts as the
catalogue's seeds (:func:`pbgio.testing.fuzz_seeds.build_corpus`) and grows in ``corpus/<family>/``.

The contract is the catalogue's (:func:`pbgio.testing.fuzz.classify`): an input either returns or
raises a :class:`~pbgio.errors.PbgioError`; any other exception, a ``RecursionError``, a
``MemoryError`` under the address-space bound, a run past the time bound or an executed pickle
payload is a *finding*, written to ``crashes/<family>/`` with its traceback (the fuzzer goes on).
A process that dies (abort, segfault) or hangs in C code is stopped by libFuzzer, which writes
the input under ``crashes/<family>/`` itself.

:func:`measure` replays a corpus under coverage.py and gives the branch coverage of the family's
reader modules. ``tools/fuzz.py --guided`` is the command line; atheris and coverage come with
the ``fuzz`` extra.

>>> sorted(FAMILIES)
['checkpoint', 'config', 'edges', 'entities', 'import', 'index', 'legacy']
>>> family_of(FAMILIES["edges"], bytes([5]) + b"HDF")
('edges-validate', b'HDF')
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pbgio.testing import fuzz, fuzz_mutators, fuzz_seeds, fuzzrun


@dataclass(frozen=True)
class Family:
    """Catalogue targets fuzzed together, and the reader modules their coverage is measured on."""

    name: str
    targets: tuple[str, ...]
    modules: tuple[str, ...]
    description: str


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("checkpoint", ("checkpoint-embeddings", "checkpoint-model", "checkpoint-version", "training-stats",
                          "optimizer-blob", "torch-payload", "checkpoint-layout-embeddings", "checkpoint-layout-model",
                          "checkpoint-layout-version"),
           ("pbgio.checkpoint", "pbgio.checks.checkpoint", "pbgio.optimizer_state", "pbgio.checks.optimizer",
            "pbgio.formats.torch_payload", "pbgio.formats.h5", "pbgio.formats.h5heap"),
           "checkpoint embeddings and model files, their optimizer blobs, the version and stats files"),
    Family("edges", ("edges-read", "edges-validate", "edges-layout", "edges-layout-dynamic"),
           ("pbgio.edges", "pbgio.checks.edges", "pbgio.formats.h5"),  # no heap: buckets have no text attribute
           "edge buckets: the reader and the validator"),
    Family("entities", ("entity-count", "entity-names", "dynamic-rel-count", "dynamic-rel-names", "entities-layout"),
           ("pbgio.entities", "pbgio.checks.entities"),
           "entity counts and names, dynamic relation counts and names, alone and in a layout"),
    Family("config", ("config", "config-py", "config-layout", "config-py-source"),
           ("pbgio.config", "pbgio.checks.config", "pbgio.python_config"),
           "run configs: JSON, the answer a config.py's child process writes, a config in a layout, "
           "a config.py run"),
    Family("index", ("index", "index-layout"), ("pbgio.index_file", "pbgio.checks.index"),
           "nearest-neighbour index files: metadata, digest and payload; in a checkpoint of a layout"),
    Family("legacy", ("legacy-pt",), ("pbgio.legacy.pickles",), "legacy .pt pickles (METADATA_1.pt and the others)"),
    Family("import", ("import-tsv", "import-csv", "import-parquet", "import-options"),
           ("pbgio.importers.read", "pbgio.importers.parquet_check", "pbgio.importers.sniff"),
           "the importer's TSV, CSV and Parquet inputs, and its options picked by a byte"),
]}


SELFTEST_FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("selftest", ("selftest-raise",), ("pbgio.testing.fuzz",), "a deliberately broken reader (tests use it)"),
]}
"""Families the harness must report findings for."""


def get_family(name: str) -> Family:
    if name in FAMILIES:
        return FAMILIES[name]
    if name in SELFTEST_FAMILIES:
        return SELFTEST_FAMILIES[name]
    raise KeyError(f"unknown fuzz family {name!r}; known: {', '.join(FAMILIES)}")


def family_of(family: Family, data: bytes) -> tuple[str, bytes]:
    """The target an input runs (its first byte, modulo the family's size) and the target's bytes."""
    if not data:
        return family.targets[0], b""
    return family.targets[data[0] % len(family.targets)], data[1:]


def write_seeds(family: Family, corpus: Path) -> int:
    """Write the catalogue's seeds of ``family`` into ``corpus`` (each prefixed with its target's
    byte); files already there stay. Returns the number of seeds."""
    corpus.mkdir(parents=True, exist_ok=True)
    count = 0
    with tempfile.TemporaryDirectory(prefix="pbgio-guided-seeds-") as tmp:
        seeds = fuzz_seeds.build_corpus(Path(tmp), list(family.targets))
        for i, name in enumerate(family.targets):
            for path in seeds[name]:
                data = bytes([i]) + path.read_bytes()
                (corpus / f"seed-{name}-{hashlib.sha1(data).hexdigest()[:12]}").write_bytes(data)
                count += 1
    return count


def module_files(family: Family) -> list[str]:
    """The source files of the family's reader modules."""
    files = []
    for module in family.modules:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        files.append(spec.origin)
    return files


# --------------------------------------------------------------------------- the fuzzer process

WARM_UP = 4
"""Inputs run before the address-space bound is set (imports, thread pools, caches)."""
CURRENT = "current-input"
"""The file (under the crashes folder) holding the input the fuzzer runs now."""


def _limit_memory(memory_mb: int) -> None:
    """Bound the address space to its current size plus ``memory_mb`` (0: no bound): an allocation
    driven by a size a file claims raises MemoryError instead of taking the machine's memory."""
    if memory_mb > 0:
        limit = fuzzrun._vm_bytes() + memory_mb * (1 << 20)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))



STRUCTURE_RATE = 0.25
"""The share of mutations that are the catalogue's structure-level ones (the rest: libFuzzer's bytes)."""


class StructureMutator:
    """The fuzzer's custom mutator: with probability ``rate``, one of the catalogue's structure-level
    mutators for the kind of the input's target (:data:`pbgio.testing.fuzz_mutators.STRUCTURE_MUTATORS`:
    HDF5 datasets and attributes rewritten through h5py, pickles, JSON …), else ``fallback``
    (``atheris.Mutate``: libFuzzer's byte-level mutations). The first byte (the target) is kept.
    HDF5 edits run in a forked child (the input may be damaged), so HDF5 breaking on it cannot
    take the fuzzer down."""

    def __init__(self, family: Family, scratch: Path, fallback: Any, rate: float = STRUCTURE_RATE) -> None:
        self.family, self.scratch, self.fallback, self.rate = family, scratch, fallback, rate
        self.applied = 0

    def __call__(self, data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if data and rng.random() < self.rate:
            name, payload = family_of(self.family, data)
            mutators = fuzz_mutators.STRUCTURE_MUTATORS.get(fuzz.get_target(name).kind, [])
            if mutators and payload:
                ctx = fuzz_mutators.MutationContext(rng, [payload], self.scratch, self.scratch / "PICKLE-PAYLOAD-RAN",
                                           damaged=True)
                with contextlib.suppress(Exception):
                    mutated = data[:1] + rng.choice(mutators)(ctx, payload)
                    if len(mutated) <= max_size:
                        self.applied += 1
                        return mutated
        out: bytes = self.fallback(data, max_size)
        return out


class _Runner:
    """Runs one input of a family and records findings (the atheris callback)."""

    def __init__(self, family: Family, crashes: Path, deadline: float, timeout: float, stats_path: Path) -> None:
        self.family, self.crashes, self.deadline, self.timeout = family, crashes, deadline, timeout
        self.stats_path = stats_path
        self.current = crashes / CURRENT
        self.scratch = Path(tempfile.mkdtemp(prefix="pbgio-guided-"))
        self.marker = self.scratch / "PICKLE-PAYLOAD-RAN"
        os.environ[fuzz.MARKER_ENV] = str(self.marker)
        self.outcomes: Counter[str] = Counter()
        self.findings: dict[str, str] = {}  # signature -> saved input
        self.inputs = 0
        self.started = time.monotonic()
        self.last_write = 0.0

    def run(self, data: bytes) -> tuple[str, str, str, BaseException | None, str]:
        """Run one input: its target, outcome (clean, error, failure), detail, exception and traceback."""
        name, payload = family_of(self.family, data)
        exc, trace = fuzzrun.run_bounded(fuzz.get_target(name), payload, self.scratch, self.timeout)
        outcome, kind = fuzz.classify(exc)
        if self.marker.exists():
            self.marker.unlink()
            outcome, kind = "failure", "pickle-executed"
        return name, outcome, kind, exc, trace

    def __call__(self, data: bytes) -> None:
        now = time.monotonic()
        if now > self.deadline:
            self.write_stats()
            shutil.rmtree(self.scratch, ignore_errors=True)
            fuzz.remove_templates()
            sys.stdout.flush()
            os._exit(0)  # libFuzzer's own exit skips Python's; the corpus is already on disk
        self.inputs += 1
        self.current.write_bytes(data)  # what the parent saves if this input hangs in C code
        name, outcome, detail, exc, trace = self.run(data)
        if outcome == "failure":
            signature = f"{name}:" + fuzzrun._signature(detail, exc)
            self.outcomes["failure"] += 1
            if signature not in self.findings:
                digest = hashlib.sha1(data).hexdigest()[:12]
                path = self.crashes / f"{name}-{detail}-{digest}.bin"
                path.write_bytes(data[1:])
                path.with_suffix(".txt").write_text(
                    f"target: {name}\nkind: {detail}\nsignature: {signature}\n"
                    f"replay: tools/fuzz.py --target {name} --replay {path}\n\n{trace}", encoding="utf-8")
                self.findings[signature] = str(path)
                print(f"FINDING {signature} -> {path}", flush=True)
                self.write_stats()
        else:
            self.outcomes[detail or outcome] += 1
        if now - self.last_write > 5.0:
            self.write_stats()

    def write_stats(self) -> None:
        self.last_write = time.monotonic()
        self.stats_path.write_text(json.dumps({
            "family": self.family.name, "inputs": self.inputs, "seconds": round(self.last_write - self.started, 1),
            "outcomes": dict(self.outcomes), "findings": self.findings,
        }, indent=2) + "\n", encoding="utf-8")


_BOOT = """
import sys, atheris
with atheris.instrument_imports(include=["pbgio"], exclude=["pbgio.testing"]):
    from pbgio.testing import guided
    guided._load(sys.argv[2])
guided._main(sys.argv[1:])
"""
"""The fuzzer process: pbgio is instrumented as it is imported, so it is imported under the hook
(pbgio.testing, the harness, is not instrumented)."""


def _load(family_name: str) -> None:
    """Import the family's reader modules and whatever its targets import lazily (under the hook)."""
    warnings.simplefilter("ignore")
    family = get_family(family_name)
    for module in family.modules:
        importlib.import_module(module)
    for name in family.targets:
        with contextlib.suppress(BaseException), tempfile.TemporaryDirectory() as tmp:
            fuzz.run_input(fuzz.get_target(name), b"", Path(tmp))


def _fuzz_main(family: Family, corpus: Path, crashes: Path, seconds: float, timeout: float, memory_mb: int,
               stats_path: Path) -> None:
    import atheris

    signal.signal(signal.SIGALRM, fuzzrun._on_alarm)
    crashes.mkdir(parents=True, exist_ok=True)
    runner = _Runner(family, crashes, time.monotonic() + seconds, timeout, stats_path)
    for path in sorted(corpus.iterdir())[:WARM_UP]:  # warm up (imports, thread pools) before the bound
        runner.run(path.read_bytes())
    runner.outcomes.clear()
    _limit_memory(memory_mb)
    args = [sys.argv[0], str(corpus), f"-artifact_prefix={crashes}/", f"-max_total_time={int(seconds) + 60}",
            "-rss_limit_mb=0", "-max_len=262144", "-print_final_stats=1"]
    # atheris.Mutate is looked up per call: Fuzz() rebinds it to libFuzzer's once it starts.
    mutator = StructureMutator(family, runner.scratch, lambda data, max_size: atheris.Mutate(data, max_size))
    atheris.Setup(args, runner, custom_mutator=mutator, enable_python_coverage=True)
    atheris.Fuzz()


def fuzz_family(family: Family, corpus: Path, crashes: Path, seconds: float, *, timeout: float = 5.0,
                memory_mb: int = 2048, log: Any = print) -> dict[str, Any]:
    """Fuzz ``family`` for ``seconds`` in a child process (seeding ``corpus`` first); return its figures:
    inputs, outcomes, findings (signature: saved input), the corpus size and libFuzzer's exit status."""
    corpus, crashes = corpus.resolve(), crashes.resolve()
    seeds = write_seeds(family, corpus)
    crashes.mkdir(parents=True, exist_ok=True)
    stats_path = crashes / "stats.json"
    stats_path.unlink(missing_ok=True)
    log(f"{family.name}: {seeds} seeds, corpus {corpus} ({sum(1 for _ in corpus.iterdir())} files), "
        f"fuzzing {seconds:.0f} s")
    cmd = [sys.executable, "-c", _BOOT, "fuzz", family.name, str(corpus), str(crashes),
           str(seconds), str(timeout), str(memory_mb), str(stats_path)]
    current = crashes / CURRENT
    current.unlink(missing_ok=True)
    hang_s = max(4 * timeout, 30.0)
    hung: bytes | None = None
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        while proc.poll() is None:
            time.sleep(1.0)
            # An input stuck in C code (where the per-input alarm cannot interrupt it) is a hang.
            with contextlib.suppress(OSError):
                if time.time() - current.stat().st_mtime > hang_s:
                    hung = current.read_bytes()
                    proc.kill()
                    proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for line in stdout.splitlines():
        if line.startswith("FINDING"):
            log(f"{family.name}: {line}")
    stats: dict[str, Any] = (json.loads(stats_path.read_text(encoding="utf-8")) if stats_path.exists()
                             else {"family": family.name, "inputs": 0, "outcomes": {}, "findings": {}})
    stats["returncode"] = proc.returncode
    stats["corpus"] = sum(1 for _ in corpus.iterdir())
    if hung is not None:
        name, payload = family_of(family, hung)
        path = crashes / f"{name}-hang-{hashlib.sha1(hung).hexdigest()[:12]}.bin"
        path.write_bytes(payload)
        stats["findings"][f"{name}:hang"] = str(path)
        log(f"{family.name}: FINDING {name}:hang (past {hang_s:.0f} s in C code) -> {path}")
    elif proc.returncode != 0:  # libFuzzer stopped the process: a crash or an abort in C code
        stats["findings"]["process"] = stderr[-4000:]
        log(f"{family.name}: the fuzzer process ended with status {proc.returncode}:\n{stderr[-2000:]}")
    return stats


# --------------------------------------------------------------------------- coverage


_COVER_BOOT = """
import json, sys, coverage
files = json.loads(sys.argv[1])
cov = coverage.Coverage(branch=True, data_file=sys.argv[2], include=files)
cov.start()
from pbgio.testing import guided
guided._cover_main(cov, files, *sys.argv[3:])
"""
"""The coverage process: measuring starts before pbgio is imported, so its module-level lines count."""


def _cover_main(cov: Any, files: list[str], family_name: str, out_path: str, timeout: str, memory_mb: str,
                *corpora: str) -> None:
    family, out = get_family(family_name), Path(out_path)
    for module in family.modules:
        importlib.import_module(module)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, fuzzrun._on_alarm)
    scratch = Path(tempfile.mkdtemp(prefix="pbgio-guided-cover-"))
    os.environ[fuzz.MARKER_ENV] = str(scratch / "PICKLE-PAYLOAD-RAN")
    replayed = 0
    for folder in map(Path, corpora):
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.is_file():
                name, payload = family_of(family, path.read_bytes())
                fuzzrun.run_bounded(fuzz.get_target(name), payload, scratch, float(timeout))
                replayed += 1
                if replayed == WARM_UP:  # imports and thread pools are in place: bound what an input adds
                    _limit_memory(int(memory_mb))
    cov.stop()
    cov.save()
    modules = _module_summaries(cov, dict(zip(family.modules, files, strict=True)), out.with_suffix(".report.json"))
    out.write_text(json.dumps({"family": family.name, "inputs": replayed, "modules": modules}, indent=2) + "\n",
                   encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)


def _module_summaries(cov: Any, files: dict[str, str], report: Path) -> dict[str, dict[str, Any]]:
    """Per module (name: its file): branches, covered branches, statements and covered lines."""
    cov.json_report(morfs=list(files.values()), outfile=str(report))
    data = json.loads(report.read_text(encoding="utf-8"))
    measured = {str(Path(k).resolve()): v["summary"] for k, v in data["files"].items()}
    modules = {}
    for module, file in files.items():
        summary = measured[str(Path(file).resolve())]
        modules[module] = {"file": os.path.relpath(file), "branches": summary["num_branches"],
                           "covered_branches": summary["covered_branches"],
                           "statements": summary["num_statements"], "covered_lines": summary["covered_lines"]}
    return modules


def measure(family: Family, corpora: list[Path], *, timeout: float = 10.0, memory_mb: int = 2048,
            data_file: Path | None = None) -> dict[str, Any]:
    """Replay ``corpora`` (folders of family inputs) under coverage.py in a child process, memory
    bounded as the fuzzer's: the inputs replayed and, per reader module, its branches, covered
    branches, statements and covered lines. ``data_file`` keeps coverage.py's data (for
    :func:`measure_together`)."""
    with tempfile.TemporaryDirectory(prefix="pbgio-guided-measure-") as tmp:
        out = Path(tmp) / "coverage.json"
        data = data_file or Path(tmp) / "coverage.data"
        cmd = [sys.executable, "-c", _COVER_BOOT, json.dumps(module_files(family)), str(data.resolve()),
               family.name, str(out), str(timeout), str(memory_mb), *[str(c.resolve()) for c in corpora]]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"coverage replay of {family.name} failed:\n{proc.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def measure_together(measured: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Per reader module, its coverage from every family's corpus together (``measured``: family
    name: the data file :func:`measure` kept). A module several families read (``pbgio.formats.h5``:
    bucket readers use one half, table readers the other) counts what any of their inputs reached."""
    import coverage

    files: dict[str, str] = {}
    for name in measured:
        files.update(zip(get_family(name).modules, module_files(get_family(name)), strict=True))
    with tempfile.TemporaryDirectory(prefix="pbgio-guided-together-") as tmp:
        combined = coverage.Coverage(data_file=str(Path(tmp) / "combined.data"), branch=True)
        combined.combine([str(p) for p in measured.values()], keep=True)
        return _module_summaries(combined, files, Path(tmp) / "report.json")


def branch_percent(entry: dict[str, Any]) -> float:
    """Covered branches of a module, in percent (100 for a module without branches)."""
    return 100.0 * entry["covered_branches"] / entry["branches"] if entry["branches"] else 100.0


def _main(argv: list[str]) -> None:
    """The fuzzer process's arguments (see :data:`_BOOT`)."""
    _mode, family, corpus, crashes, seconds, timeout, memory_mb, stats = argv
    _fuzz_main(get_family(family), Path(corpus), Path(crashes), float(seconds), float(timeout), int(memory_mb),
               Path(stats))


if __name__ == "__main__":
    _main(sys.argv[1:])
