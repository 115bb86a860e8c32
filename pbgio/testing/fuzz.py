"""Fuzz targets and mutators for every pbgio reader that takes a user's file (guide: docs/guides/fuzzing.md).

The contract every reader keeps, whatever the bytes: it returns, or raises a
:class:`~pbgio.errors.PbgioError`. No other exception, no hang, no allocation driven by a size
the file claims, and no pickled code run. A :class:`Target` pairs a reader with the name its
input file gets on disk and the kind of its bytes (which picks the structure-level mutators);
:func:`build_corpus` writes the seed corpus (valid files from :mod:`pbgio.testing`, the legacy
writer and, where present, the reference samples); :func:`generate` derives input ``i`` of a
campaign from the corpus, deterministically from ``(seed, target, i)``.

The campaign itself (worker processes with memory and time bounds) is
:mod:`pbgio.testing.fuzzrun`; ``tools/fuzz.py`` is its command line.

Why this module is long: it is a catalogue of 19 targets, one per reader that takes a user's
file, with the structure-level mutators of their file kinds (HDF5, zip, pickle, JSON, text,
Parquet); each target is short and read on its own.

>>> sorted(TARGETS)[:3]
['checkpoint-embeddings', 'checkpoint-model', 'checkpoint-version']
>>> classify(ValueError("boom"))
('failure', 'exception')
>>> classify(MemoryError())
('failure', 'memory')
"""

from __future__ import annotations

import io
import json
import lzma
import os
import pickle
import random
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["json", "count", "jsonl", "h5", "pickle", "text-table", "parquet"]
_REPO_SAMPLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "samples"
SAMPLES: Path | None = (Path(os.environ["PBG_REFERENCE_SAMPLES"]) if os.environ.get("PBG_REFERENCE_SAMPLES")
                        else _REPO_SAMPLES if _REPO_SAMPLES.is_dir() else None)
"""The original's reference samples seeding the corpus: ``$PBG_REFERENCE_SAMPLES``, else the copy in
a checkout (tests/data/samples); none in an installed package."""
MARKER_ENV = "PBGIO_FUZZ_MARKER"


class Hang(BaseException):
    """Raised by the per-input timer; a BaseException so that ``except Exception`` cannot swallow it."""


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """A reader under fuzzing: ``run(path)`` reads the file ``path`` (named ``filename``)."""

    name: str
    filename: str
    kind: Kind
    run: Callable[[Path], object]
    description: str


def _entities_run(reader: str) -> Callable[[Path], object]:
    def run(path: Path) -> object:
        from pbgio import entities

        fn = getattr(entities, reader)
        if reader in ("read_entity_count", "read_entity_names"):
            return fn(path.parent, "user", 0)
        return fn(path.parent)
    return run


def _run_config(path: Path) -> object:
    from pbgio.config import load_config

    return load_config(path)


def _run_python_config_answer(path: Path) -> object:
    from pbgio.config import parse_config, snake_case_keys
    from pbgio.python_config import is_python_config, read_answer

    source = str(path.with_name("config.py"))
    is_python_config(path)
    return parse_config(snake_case_keys(read_answer(source, path.read_bytes())), source)


def _run_read_bucket(path: Path) -> object:
    from pbgio.edges import bucket_length, read_bucket

    bucket_length(path)
    whole = read_bucket(path)
    read_bucket(path, chunk=(1, 2))
    return len(whole)


def _run_validate(path: Path) -> object:
    from pbgio.validate import validate_path

    return validate_path(path).to_dict()


def _run_embeddings(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    ckpt = CheckpointDir(path.parent)
    state = ckpt.read_embeddings("user", 0, 1)
    ckpt.read_metadata(path)
    if state.optimizer_state is not None:
        from pbgio.optimizer_state import decode_row_adagrad

        decode_row_adagrad(state.optimizer_state, str(path), count=len(state.embeddings))
    return _run_validate(path)


def _run_model(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    ckpt = CheckpointDir(path.parent)
    model = ckpt.read_model(1)
    ckpt.read_metadata(path)
    if model.optimizer_state is not None:
        from pbgio.optimizer_state import decode_adagrad, read_state

        read_state(model.optimizer_state, str(path))
        decode_adagrad(model.optimizer_state, str(path), [v.shape for v in model.params.values()])
    return _run_validate(path)


def _run_version(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    return CheckpointDir(path.parent).read_version()


def _run_stats(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    return CheckpointDir(path.parent).read_stats()


def _run_optimizer(path: Path) -> object:
    from pbgio import optimizer_state as opt
    from pbgio.checks import optimizer as checks

    blob = path.read_bytes()
    state = opt.read_state(blob, str(path))
    checks.row_adagrad_problems(state.value, None)
    checks.adagrad_problems(state.value, None)
    for where, ref in checks.accumulators(state.value):
        checks.accumulator_value_problem(state.blocks(ref), where)
    if not checks.row_adagrad_problems(state.value, None):
        opt.decode_row_adagrad(blob, str(path))
    return None


def _tensor_refs(value: Any, depth: int = 0) -> Iterator[Any]:
    from pbgio.spec.optimizer import TensorRef

    if depth > 50:
        return
    if isinstance(value, TensorRef):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensor_refs(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensor_refs(v, depth + 1)


def _run_payload(path: Path) -> object:
    from pbgio.errors import FormatError
    from pbgio.formats.torch_payload import PayloadError, read_payload
    from pbgio.spec.rules import rule

    try:
        payload = read_payload(path.read_bytes())
        for ref in _tensor_refs(payload.value):
            payload.array(ref)
            for _ in payload.blocks(ref, block_elements=1 << 12):
                pass
    except PayloadError as exc:  # the module's own error; its callers wrap it (optimizer-blob)
        raise FormatError(rule("optimizer-blob").issue(str(path), None, str(exc))) from None
    return None


def _run_index(path: Path) -> object:
    from pbgio.index_file import load_index_payload, read_index_meta

    meta = read_index_meta(path)

    def stream(read: Callable[[int], bytes]) -> int:
        total = 0
        while piece := read(1 << 12):
            total += len(piece)
        return total

    return load_index_payload(path, meta, lambda payload: int(payload.sum()), stream)


def _run_legacy(path: Path) -> object:
    from pbgio.legacy.pickles import load_pickle

    return load_pickle(path)


_IMPORT_CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {
        "entities": {"node": {"num_partitions": 2}},
        "relations": [{"name": "r", "lhs": "node", "rhs": "node", "operator": "translation"}],
        "dynamic_relations": True, "dimension": 4, "entity_path": "entities", "edge_paths": ["edges"],
        "checkpoint_path": "checkpoint", "global_emb": False,
    },
    "featurized": {
        "entities": {"node": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        "relations": [{"name": "r", "lhs": "node", "rhs": "doc", "operator": "none"}],
        "dynamic_relations": True, "dimension": 4, "entity_path": "entities", "edge_paths": ["edges"],
        "checkpoint_path": "checkpoint", "num_uniform_negs": 0, "eval_num_uniform_negs": 0, "global_emb": False,
    },
}


def _import_run(config: str, **options: Any) -> Callable[[Path], object]:
    def run(path: Path) -> object:
        from pbgio.config import parse_config
        from pbgio.importers.importer import import_edge_lists
        from pbgio.importers.read import InputOptions

        cfg = parse_config(_IMPORT_CONFIGS[config], "fuzz")
        out = path.parent / "out"
        return import_edge_lists(cfg, [path], options=InputOptions(**options), base=out, overwrite=True)
    return run


_TARGET_LIST = [
    Target("config", "config.json", "json", _run_config, "pbgio.config.load_config on a run config"),
    Target("config-py", "result.json", "json", _run_python_config_answer,
           "a config.py's boundary: pbgio.python_config.read_answer on the child's answer (which the "
           "executed file can write over), then parse_config"),
    Target("entity-count", "entity_count_user_0.txt", "count", _entities_run("read_entity_count"),
           "pbgio.entities.read_entity_count"),
    Target("entity-names", "entity_names_user_0.json", "json", _entities_run("read_entity_names"),
           "pbgio.entities.read_entity_names"),
    Target("dynamic-rel-count", "dynamic_rel_count.txt", "count", _entities_run("read_dynamic_rel_count"),
           "pbgio.entities.read_dynamic_rel_count"),
    Target("dynamic-rel-names", "dynamic_rel_names.json", "json", _entities_run("read_relation_names"),
           "pbgio.entities.read_relation_names"),
    Target("edges-read", "edges_0_0.h5", "h5", _run_read_bucket,
           "pbgio.edges.bucket_length and read_bucket (whole and a chunk)"),
    Target("edges-validate", "edges_0_0.h5", "h5", _run_validate, "pbgio.validate.validate_path on a bucket"),
    Target("checkpoint-embeddings", "embeddings_user_0.v1.h5", "h5", _run_embeddings,
           "CheckpointDir.read_embeddings/read_metadata, the RowAdagrad blob, validate_path"),
    Target("checkpoint-model", "model.v1.h5", "h5", _run_model,
           "CheckpointDir.read_model/read_metadata, the Adagrad blob, validate_path"),
    Target("checkpoint-version", "checkpoint_version.txt", "count", _run_version,
           "CheckpointDir.read_version"),
    Target("index", "index_user.cos.flat.v1.h5", "h5", _run_index,
           "pbgio.index_file.read_index_meta and load_index_payload (metadata, digest, the payload's bytes)"),
    Target("training-stats", "training_stats.json", "jsonl", _run_stats, "CheckpointDir.read_stats"),
    Target("optimizer-blob", "state_dict.bin", "pickle", _run_optimizer,
           "pbgio.optimizer_state: read_state, the rule checks, decode_row_adagrad"),
    Target("torch-payload", "payload.pt", "pickle", _run_payload,
           "pbgio.formats.torch_payload.read_payload and every tensor's data"),
    Target("legacy-pt", "entity_count_user_0.pt", "pickle", _run_legacy,
           "pbgio.legacy.pickles.load_pickle (scan, then torch's weights_only loader)"),
    Target("import-tsv", "edges.tsv", "text-table", _import_run("plain"),
           "pbgio.importers.import_edge_lists on a TSV (lhs, rel, rhs)"),
    Target("import-csv", "edges.csv", "text-table",
           _import_run("featurized", delimiter=",", header=True, lhs_col="src", rel_col="rel",
                       rhs_col="dst", weight_col="w"),
           "import_edge_lists on a CSV with a header, a weight and a featurized rhs"),
    Target("import-parquet", "edges.parquet", "parquet", _import_run("plain"),
           "import_edge_lists on a Parquet table"),
]
TARGETS: dict[str, Target] = {t.name: t for t in _TARGET_LIST}


def _selftest_raise(path: Path) -> object:
    raise ValueError("a deliberately broken reader")


def _selftest_hang(path: Path) -> object:
    while True:
        pass


def _selftest_memory(path: Path) -> object:
    import numpy as np

    return np.ones(1 << 40, dtype=np.uint8)  # what a reader trusting a claimed size does


def _selftest_crash(path: Path) -> object:
    os._exit(70)


def _selftest_pickle(path: Path) -> object:
    return pickle.loads(path.read_bytes())


SELFTEST_TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("selftest-raise", "input.json", "json", _selftest_raise, "raises ValueError"),
    Target("selftest-hang", "input.json", "json", _selftest_hang, "never returns"),
    Target("selftest-memory", "input.json", "json", _selftest_memory, "allocates a terabyte"),
    Target("selftest-crash", "input.json", "json", _selftest_crash, "kills its process"),
    Target("selftest-pickle", "input.pkl", "pickle", _selftest_pickle, "pickle.loads the input"),
]}
"""Deliberately broken readers: the harness must report each as a failure (tests use them)."""


def get_target(name: str) -> Target:
    if name in TARGETS:
        return TARGETS[name]
    if name in SELFTEST_TARGETS:
        return SELFTEST_TARGETS[name]
    raise KeyError(f"unknown fuzz target {name!r}; known: {', '.join(TARGETS)}")


# --------------------------------------------------------------------------- outcomes


def classify(exc: BaseException | None) -> tuple[str, str]:
    """``("clean", "")``, ``("error", <pbgio error class>)`` or ``("failure", <kind>)``."""
    from pbgio.errors import PbgioError

    if exc is None:
        return "clean", ""
    if isinstance(exc, PbgioError):
        return "error", type(exc).__name__
    if isinstance(exc, Hang):
        return "failure", "hang"
    if isinstance(exc, MemoryError):
        return "failure", "memory"
    if isinstance(exc, RecursionError):
        return "failure", "recursion"
    return "failure", "exception"


def run_input(target: Target, data: bytes, workdir: Path) -> Path:
    """Write ``data`` as the target's file in a fresh ``workdir/case`` and run the reader on it.

    Returns the file's path; the reader's exception (if any) propagates.
    """
    case = workdir / "case"
    if case.exists():
        shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    path = case / target.filename
    path.write_bytes(data)
    target.run(path)
    return path


# --------------------------------------------------------------------------- seed corpus


def build_corpus(dest: Path, names: list[str] | None = None, *,
                 samples: Path | None = SAMPLES) -> dict[str, list[Path]]:
    """Write the seed files of every target (or of ``names``) under ``dest/<target>/``."""
    wanted = set(names) if names is not None else set(TARGETS)
    dest.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, list[bytes]] = {name: [] for name in wanted}

    def add(name: str, data: bytes) -> None:
        if name == "config" and "config-py" in seeds:  # a config.py's answer carries the same dict
            add("config-py", b'{"config": ' + data + b"}")
        if name in seeds and data not in seeds[name]:
            seeds[name].append(data)

    if wanted & {t.name for t in _TARGET_LIST if t.kind != "text-table" and t.kind != "parquet"}:
        _layout_seeds(dest / "_layouts", add)
        if samples is not None and samples.is_dir():
            _sample_seeds(samples, add)
    for answer in _PYTHON_CONFIG_ANSWERS if "config-py" in wanted else []:
        add("config-py", json.dumps(answer).encode())
    if "index" in wanted:
        _index_seeds(dest / "_index", add)
    if wanted & {"torch-payload", "legacy-pt", "optimizer-blob"}:
        _pickle_seeds(dest / "_legacy", add, samples)
    if wanted & {"import-tsv", "import-csv", "import-parquet"}:
        _table_seeds(add, samples)
    for name in SELFTEST_TARGETS:
        if name in wanted:
            add(name, b'{"a": [1, 2, 3]}' if "pickle" not in name else pickle.dumps({"a": 1}))
    out: dict[str, list[Path]] = {}
    for name, items in seeds.items():
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        out[name] = []
        for i, data in enumerate(items):
            path = folder / f"seed-{i:03d}"
            path.write_bytes(data)
            out[name].append(path)
    return out


_PYTHON_CONFIG_ANSWERS: list[dict[str, Any]] = [  # what pbgio.python_config's runner writes
    {"error": {"kind": "syntax", "message": "invalid syntax", "line": 3}},
    {"error": {"kind": "exec", "message": "ModuleNotFoundError: No module named 'torchbiggraph'", "line": 1,
               "missing": "torchbiggraph.config"}},
    {"error": {"kind": "no-function", "message": "", "found": ["get_conf"]}},
    {"error": {"kind": "not-callable", "message": "int"}},
    {"error": {"kind": "call", "message": "ZeroDivisionError: division by zero", "line": 7}},
    {"error": {"kind": "not-dict", "message": "list"}},
    {"error": {"kind": "not-json", "message": "expected a JSON value, found set {1}", "key": "relations[0].lhs"}},
    {"error": {"kind": "unreadable", "message": "expected a readable file, found PermissionError"}},
    {"config": {"entities": {"user": {"numPartitions": 1}}, "relations": [{"name": "r", "lhs": "user", "rhs": "user"}],
                "dimension": 4, "entity_path": "e", "edge_paths": ["x"], "checkpoint_path": "c"}},
]


_LAYOUT_FILES: dict[str, Callable[[str], str | None]] = {
    "config": lambda n: "config" if n == "config.json" else None,
    "entity-count": lambda n: "entity-count" if n.startswith("entity_count_") and n.endswith(".txt") else None,
    "entity-names": lambda n: "entity-names" if n.startswith("entity_names_") and n.endswith(".json") else None,
    "dynamic-rel-count": lambda n: "dynamic-rel-count" if n == "dynamic_rel_count.txt" else None,
    "dynamic-rel-names": lambda n: "dynamic-rel-names" if n == "dynamic_rel_names.json" else None,
    "checkpoint-version": lambda n: "checkpoint-version" if n == "checkpoint_version.txt" else None,
    "training-stats": lambda n: "training-stats" if n == "training_stats.json" else None,
}


def _file_targets(path: Path) -> list[str]:
    n = path.name
    found = [name for name, match in _LAYOUT_FILES.items() if match(n)]
    if n.startswith("edges_") and n.endswith(".h5"):
        found += ["edges-read", "edges-validate"]
    if n.startswith("embeddings_") and n.endswith(".h5"):
        found.append("checkpoint-embeddings")
    if n.startswith("model.") and n.endswith(".h5"):
        found.append("checkpoint-model")
    return found


def _add_tree(root: Path, add: Callable[[str, bytes], None]) -> None:
    import h5py

    from pbgio.spec.checkpoint import OPTIMIZER_DATASET

    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.stat().st_size > 4 << 20:
            continue
        names = _file_targets(path)
        data = path.read_bytes()
        for name in names:
            add(name, data)
        if "checkpoint-embeddings" in names or "checkpoint-model" in names:
            with h5py.File(path, "r") as f:
                if OPTIMIZER_DATASET in f:
                    blob = f[OPTIMIZER_DATASET][...].tobytes()
                    add("optimizer-blob", blob)
                    add("torch-payload", blob)


def _layout_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    from pbgio.testing.layouts import small_valid_layout, write_layout

    variants = [
        {}, {"dynamic": True}, {"featurized": False, "weights": False, "partitioned": False},
        {"names": False, "empty_bucket": False, "edges_per_bucket": 40, "seed": 3},
    ]
    for i, kwargs in enumerate(variants):
        root = dest / f"layout{i}"
        shutil.rmtree(root, ignore_errors=True)
        write_layout(root, small_valid_layout(**kwargs))  # type: ignore[arg-type]
        _add_tree(root, add)
    from pbgio.example import build_example

    example = dest / "example"
    shutil.rmtree(example, ignore_errors=True)
    build_example(example, num_edges=300)
    _add_tree(example, add)


def _index_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    from pbgio.index_file import IndexMeta, write_index_file

    dest.mkdir(parents=True, exist_ok=True)
    payloads = [b"", bytes(range(256)) * 3, b"IxF2" + struct.pack("<iq", 4, 9) + bytes(64)]
    metas = [IndexMeta("user", 1, "cos", False, 4, [5, 4], "0" * 64, "faiss", "1.15.1", "flat"),
             IndexMeta("user", 3, "dot", True, 8, [7], "f" * 64, "faiss", "1.15.1", "ivf", {"nlist": 2, "nprobe": 1},
                       recall_at_10=0.9, recall_queries=10, recall_candidates=20),
             IndexMeta("user", 2, "cos", False, 2, [1, 0, 3], "a" * 64, "faiss", "1.15.1", "hnsw",
                       {"m": 8, "ef_search": 16})]
    for i, (payload, meta) in enumerate(zip(payloads, metas, strict=True)):
        path = dest / f"index_user.{meta.metric}.{meta.kind}.v{meta.version}.{i}.h5"
        write_index_file(path, meta, lambda sink, payload=payload: sink(payload))  # type: ignore[misc]
        add("index", path.read_bytes())


def _sample_seeds(samples: Path, add: Callable[[str, bytes], None]) -> None:
    for case in sorted(samples.glob("sample_current_*")):
        _add_tree(case, add)


def _pickle_seeds(dest: Path, add: Callable[[str, bytes], None], samples: Path | None) -> None:
    import numpy as np
    import torch

    from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad
    from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

    for i, spec in enumerate([LegacySpec(), LegacySpec(zip_container=True, camel=False, index_base=0,
                                                       dynamic="count", num_partitions=1)]):
        root = dest / f"legacy{i}"
        shutil.rmtree(root, ignore_errors=True)
        write_legacy_layout(root, spec)
        for path in sorted(root.rglob("*")):
            if path.is_file() and ".pt" in path.name and path.stat().st_size < 1 << 20:
                add("legacy-pt", path.read_bytes())
    if samples is not None and samples.is_dir():
        for path in sorted(samples.glob("sample_legacy_*/**/*")):
            if path.is_file() and ".pt" in path.name and path.stat().st_size < 1 << 20:
                add("legacy-pt", path.read_bytes())
    blobs = [encode_row_adagrad(np.array([0.5, 2.0, 0.0], np.float32), lr=0.1),
             encode_adagrad([np.ones((2, 3), np.float32), np.zeros(4, np.float32)], lr=0.1, steps=3)]
    for blob in blobs:
        add("optimizer-blob", blob)
        add("torch-payload", blob)
    for obj in ({"sum": torch.arange(6, dtype=torch.float32).reshape(2, 3).t()},
                {"state": {}, "param_groups": [{"lr": 0.1, "params": []}]},
                [torch.tensor([1, 2], dtype=torch.int64), torch.tensor([1.5], dtype=torch.float64)]):
        for zipped in (True, False):
            buffer = io.BytesIO()
            torch.save(obj, buffer, _use_new_zipfile_serialization=zipped)
            add("torch-payload", buffer.getvalue())
            add("optimizer-blob", buffer.getvalue())
            add("legacy-pt", buffer.getvalue())
    add("legacy-pt", pickle.dumps({"a": [1, 2.5, "x", None]}, protocol=2))
    add("legacy-pt", pickle.dumps(13, protocol=0))


def _table_seeds(add: Callable[[str, bytes], None], samples: Path | None) -> None:
    rng = random.Random(15)
    rows = [(f"n{rng.randrange(20)}", f"rel{rng.randrange(3)}", f"n{rng.randrange(20)}") for _ in range(40)]
    add("import-tsv", "".join(f"{a}\t{r}\t{b}\n" for a, r, b in rows).encode())
    add("import-tsv", b"ann\tfollows\tbob\n\nbob\tfollows\tcy\ncy\tlikes\tann")
    if samples is not None and samples.is_dir():
        for path in sorted(samples.glob("*/**/*.tsv")):
            if path.stat().st_size < 256 << 10:
                add("import-tsv", path.read_bytes())
    csv = ["src,rel,dst,w"] + [f"{a},{r},f{rng.randrange(5)} f{rng.randrange(5)},{rng.random():.3f}"
                               for a, r, _ in rows]
    add("import-csv", ("\n".join(csv) + "\n").encode())
    add("import-csv", b"w,dst,rel,src\n1,f1,r,a\n0.5,f2 f3,r,b\n")
    import polars as pl

    frames = [
        pl.DataFrame({"lhs": [a for a, _, _ in rows], "rel": [r for _, r, _ in rows], "rhs": [b for *_, b in rows]}),
        pl.DataFrame({"h": [1, 2, 3], "r": ["x", "y", "x"], "t": [3, 2, 1]}),
        pl.DataFrame({"h": ["a", "b"], "r": pl.Series(["x", "y"], dtype=pl.Categorical), "t": ["c", "a"],
                      "w": [0.5, 1.0]}),
    ]
    for frame in frames:
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        add("import-parquet", buffer.getvalue())


def load_corpus(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()]


# --------------------------------------------------------------------------- byte-level mutators


Mutator = Callable[["MutationContext", bytes], bytes]

INTERESTING = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**32, 2**40, 10**12, 2**62, 2**63 - 1, -(2**63), 2**64 - 1]


@dataclass
class MutationContext:
    """What a mutator may use: the random source, the corpus (for splicing), a scratch folder
    and the marker file an executed pickle payload would create."""

    rng: random.Random
    corpus: list[bytes]
    scratch: Path
    marker: Path
    damaged: bool = False  # a byte-level mutation was applied: HDF5 may misbehave editing the result


def _pos(ctx: MutationContext, data: bytes | bytearray) -> int:
    return ctx.rng.randrange(len(data)) if data else 0


def bit_flip(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return b"\x00"
    buf = bytearray(data)
    for _ in range(ctx.rng.choice([1, 1, 2, 4, 8])):
        i = _pos(ctx, buf)
        buf[i] ^= 1 << ctx.rng.randrange(8)
    return bytes(buf)


def byte_set(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return bytes([ctx.rng.randrange(256)])
    buf = bytearray(data)
    for _ in range(ctx.rng.choice([1, 2, 4, 16])):
        buf[_pos(ctx, buf)] = ctx.rng.choice([0, 0xFF, 0x7F, 0x80, ctx.rng.randrange(256)])
    return bytes(buf)


def byte_insert(ctx: MutationContext, data: bytes) -> bytes:
    i = _pos(ctx, data)
    n = ctx.rng.choice([1, 1, 4, 64, 1024])
    fill = bytes(ctx.rng.randrange(256) for _ in range(min(n, 64))) * max(1, n // 64)
    return data[:i] + fill[:n] + data[i:]


def byte_delete(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    i = _pos(ctx, data)
    n = ctx.rng.choice([1, 1, 4, 64, 1024])
    return data[:i] + data[i + n:]


def truncate(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    return data[:ctx.rng.choice([0, 1, 8, ctx.rng.randrange(len(data)), len(data) - 1, len(data) // 2])]


def splice(ctx: MutationContext, data: bytes) -> bytes:
    other = ctx.rng.choice(ctx.corpus)
    return data[:_pos(ctx, data)] + other[_pos(ctx, other):]


def interesting_int(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    width = ctx.rng.choice([1, 2, 4, 8])
    value = ctx.rng.choice(INTERESTING) % (1 << (8 * width))
    raw = value.to_bytes(width, ctx.rng.choice(["little", "big"]))
    i = ctx.rng.randrange(max(1, len(data) - width + 1))
    return data[:i] + raw + data[i + width:]


def duplicate_range(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    i = _pos(ctx, data)
    j = min(len(data), i + ctx.rng.choice([1, 16, 256, 4096]))
    return data[:j] + data[i:j] * ctx.rng.choice([1, 2, 8]) + data[j:]


BYTE_MUTATORS: list[Mutator] = [bit_flip, byte_set, byte_insert, byte_delete, truncate, splice,
                                interesting_int, duplicate_range]


# --------------------------------------------------------------------------- JSON and text


_RAW = "\u0000RAW{}\u0000"


def _hostile_json(ctx: MutationContext) -> tuple[Any, str | None]:
    """A hostile value, or a raw JSON text to splice in (returned as the second item)."""
    rng = ctx.rng
    choice = rng.randrange(16)
    if choice == 0:
        return None, "9" * rng.choice([20, 400, 5000, 100_000])  # huge integer literals
    if choice == 1:
        return None, "[" * rng.choice([1000, 100_000]) + "]" * rng.choice([0, 1000, 100_000])
    if choice == 2:
        return None, rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0"])
    if choice == 3:
        return None, '{"a":' * rng.choice([1000, 50_000]) + "1" + "}" * 50_000
    if choice == 4:
        return None, '"\\ud800"'
    values: list[Any] = [-1, 0, 2**63, -(2**63) - 1, 10**30, 1.5, True, False, None, "", "x" * 100_000,
                         "\u0000/..", [], {}, [1, "a", None], {"": 1}, "é" * 10]
    return rng.choice(values), None


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from _paths(v, (*prefix, i))


def _set_path(root: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return root


def json_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Replace, delete or add a node of a JSON document with a hostile value."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    paths = list(_paths(doc))
    path = rng.choice(paths)
    op = rng.randrange(5)
    raw: str | None = None
    if op == 0 and path:  # delete
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    elif op == 1 and isinstance(doc, dict):  # an unknown or camelCase key
        doc[rng.choice(["unknownKey", "numEpochs", "entities ", "dimension", "__proto__"])] = rng.choice(
            [1, "x", None, {"a": 1}])
    else:
        value, raw = _hostile_json(ctx)
        doc = _set_path(doc, path, _RAW if raw is not None else value)
    text = json.dumps(doc, allow_nan=True, ensure_ascii=rng.random() < 0.5)
    if raw is not None:
        text = text.replace(json.dumps(_RAW), raw, 1)
    return text.encode("utf-8", "surrogatepass")


def json_wrap(ctx: MutationContext, data: bytes) -> bytes:
    """The whole document as another JSON type, duplicated keys, or garbage around it."""
    text = data.decode("utf-8", "replace")
    choice = ctx.rng.randrange(6)
    if choice == 0:
        return f"[{text}]".encode()
    if choice == 1:
        return f'{{"a": {text}, "a": {text}}}'.encode()
    if choice == 2:
        return ("\ufeff" + text).encode()
    if choice == 3:
        return (text + "\n" + text).encode()
    if choice == 4:
        return json.dumps(text).encode()
    return text.encode("utf-16")


def count_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Hostile contents of a one-integer text file."""
    return ctx.rng.choice([
        b"9" * 5000, b"9" * 100_000, b"-1\n", b" 3 \n", b"3\n4\n", b"0x10", "\u0663\n".encode(),
        "\uff13".encode(), b"3.0", b"1e3", b"", b"\n", b"\x00", b"\xef\xbb\xbf3\n", b"\xff\xfe3\x00",
        b"\xc3\x28", b"+3", b"3_000", b"00000000000000000000003", b"3\r\n", b"NaN", b"18446744073709551616",
    ])


def jsonl_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """A hostile line among the lines of a JSON-lines file."""
    lines = data.split(b"\n")
    i = ctx.rng.randrange(len(lines))
    lines[i] = json_mutate(ctx, lines[i]) if ctx.rng.random() < 0.7 else ctx.rng.choice(
        [b"", b"\x00", b"{", b"\xff\xfe", b"[" * 100_000, b"9" * 5000])
    return b"\n".join(lines)


def table_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Malformed rows of a delimited text file: fields, NUL, huge fields, bad UTF-8, line ends."""
    rng = ctx.rng
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    line = lines[i]
    choice = rng.randrange(14)
    if choice == 0:
        lines[i] = line + rng.choice([b"\t", b","]) + b"extra"
    elif choice == 1:
        lines[i] = line.rsplit(rng.choice([b"\t", b","]), 1)[0]
    elif choice == 2:
        lines[i] = line[:len(line) // 2] + b"\x00" + line[len(line) // 2:]
    elif choice == 3:
        lines[i] = line + b"x" * rng.choice([1 << 16, 1 << 20])
    elif choice == 4:
        lines[i] = line + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
    elif choice == 5:
        return data.replace(b"\n", b"\r\n")
    elif choice == 6:
        return data.replace(b"\n", b"\r")
    elif choice == 7:
        return b"\xef\xbb\xbf" + data
    elif choice == 8:
        lines[i] = rng.choice([b"\t\t\t", b",,,", b'"a,b",c,d', b"\t", b" ", b"a\tb\tc\td\te\tf\tg"])
    elif choice == 9:
        lines[i] = line.replace(b",", b",nan,", 1).replace(b"\t", b"\t\t", 1)
    elif choice == 10:
        field = rng.choice([b"nan", b"inf", b"-1", b"1e999", b"-0", b"", b"0x1", b"1_0", b"\xe2\x80\x8b"])
        parts = line.split(b",")
        parts[-1] = field
        lines[i] = b",".join(parts)
    elif choice == 11:
        lines = lines * rng.choice([2, 50])
    elif choice == 12:
        return b"\n" * rng.choice([1, 1000])
    else:
        lines[i] = b"a\tb\tc" * rng.choice([1, 10_000])
    return b"\n".join(lines)


# --------------------------------------------------------------------------- pickles


def _evil_commands(marker: Path) -> list[tuple[str, str, str]]:
    """(module, name, argument): calls that would create ``marker`` if a loader ran them."""
    m = str(marker)
    return [
        ("os", "system", f"touch {m}"),
        ("posix", "system", f"touch {m}"),
        ("builtins", "exec", f"open({m!r}, 'w').close()"),
        ("builtins", "eval", f"open({m!r}, 'w').close()"),
        ("__builtin__", "eval", f"open({m!r}, 'w').close()"),
        ("subprocess", "getoutput", f"touch {m}"),
        ("pathlib", "Path.touch", m),
        ("torch.serialization", "os.system", f"touch {m}"),
        ("collections", "OrderedDict.__class__.__subclasses__", m),
    ]


def evil_pickle(ctx: MutationContext) -> bytes:
    """A pickle that creates the marker file when unpickled by a loader that trusts it."""
    rng = ctx.rng
    module, name, arg = rng.choice(_evil_commands(ctx.marker))
    style = rng.randrange(5)
    if style == 0:  # protocol 0: GLOBAL + REDUCE
        return f"c{module}\n{name}\n(V{arg}\ntR.".encode()
    if style == 1:  # INST
        return f"(V{arg}\ni{module}\n{name}\n.".encode()
    if style == 2:  # protocol 4: STACK_GLOBAL
        return pickle.dumps(None, protocol=4)[:2] + _stack_global(module, name) + _unicode(arg) + \
            b"\x85R."  # TUPLE1, REDUCE, STOP
    if style == 3:  # STACK_GLOBAL with memoized names that a naive scanner reads as an allowed global
        return (b"\x80\x04" + _unicode(module) + b"\x94" + _unicode(name) + b"\x94" + b"00"  # memo 0, 1
                + _unicode("collections") + _unicode("OrderedDict") + b"00"
                + b"h\x00h\x01\x93" + _unicode(arg) + b"\x85R.")
    # a dict with an evil value inside: the state dict shape, with a payload as one leaf
    inner = f"c{module}\n{name}\n(V{arg}\ntR".encode()
    return b"(dp0\nVstate\np1\n" + inner + b"s."


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def _stack_global(module: str, name: str) -> bytes:
    return _unicode(module) + _unicode(name) + b"\x93"


def pickle_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Put an evil pickle where the loader will read one: bare, inside a zip payload (data.pkl)
    or in place of the legacy container's object pickle."""
    evil = evil_pickle(ctx)
    where = ctx.rng.randrange(3)
    if where == 1 and data.startswith(b"PK\x03\x04"):
        try:
            return _zip_replace(data, evil)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError,
                zlib.error, lzma.LZMAError):
            return evil
    if where == 2 and data.startswith(b"\x80\x02\x8a\x0al"):
        return _legacy_replace(data, evil, ctx.rng)
    return evil


def _zip_replace(data: bytes, evil: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            body = evil if info.filename.endswith("data.pkl") else source.read(info)
            target.writestr(info.filename, body)
    return out.getvalue()


def _legacy_replace(data: bytes, evil: bytes, rng: random.Random) -> bytes:
    """Replace one of the legacy container's five pickles (found by parsing them)."""
    import pickletools

    stream = io.BytesIO(data)
    bounds = []
    try:
        for _ in range(5):
            start = stream.tell()
            for _op in pickletools.genops(stream):
                pass
            bounds.append((start, stream.tell()))
    except (ValueError, EOFError):
        return evil
    start, end = bounds[rng.choice([0, 3, 3, 4])]
    return data[:start] + evil + data[end:]


def payload_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Rewrite a torch.save zip payload's structure: member sizes, storage shapes, extra members."""
    if not data.startswith(b"PK\x03\x04"):
        return pickle_mutate(ctx, data)
    try:
        source = zipfile.ZipFile(io.BytesIO(data))
        members = {info.filename: source.read(info) for info in source.infolist()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, OverflowError, RuntimeError):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    names = list(members)
    name = rng.choice(names)
    choice = rng.randrange(5)
    if choice == 0:
        members[name] = members[name][: rng.randrange(len(members[name]) + 1)]
    elif choice == 1:
        del members[name]
    elif choice == 2:
        members[name.rsplit("/", 1)[0] + "/data.pkl" if "/" in name else "data.pkl"] = evil_pickle(ctx)
    elif choice == 3:
        pkl = next((n for n in names if n.endswith("data.pkl")), None)
        if pkl is not None:  # bump the sizes the pickle claims: long ints and shape tuples
            members[pkl] = _bump_ints(members[pkl], rng)
    else:
        members[f"{name}.extra"] = b"\x00" * rng.choice([0, 8, 1 << 16])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for member, body in members.items():
            target.writestr(member, body)
    return out.getvalue()


def _bump_ints(pkl: bytes, rng: random.Random) -> bytes:
    """Change BININT1/BININT/LONG1 arguments of a pickle (shapes, strides, offsets, sizes)."""
    buf = bytearray(pkl)
    spots = [i for i, b in enumerate(buf[:-1]) if b in (0x4B, 0x4A)]  # BININT1 K, BININT J
    for i in rng.sample(spots, min(len(spots), rng.choice([1, 2, 4]))):
        if buf[i] == 0x4B:
            buf[i + 1] = rng.choice([0, 1, 255, rng.randrange(256)])
        elif i + 5 <= len(buf):
            buf[i + 1:i + 5] = struct.pack("<i", rng.choice([-1, 0, 2**31 - 1, -(2**31), 10**9]))
    return bytes(buf)


# --------------------------------------------------------------------------- HDF5


_HUGE = [10**12, 2**40, 2**31, 2**33 + 1, 10**9]


def _h5_edit(ctx: MutationContext, data: bytes, edit: Callable[[random.Random, Any], None]) -> bytes:
    """``edit`` applied to the file through h5py, in a forked child: HDF5 editing a file that an
    earlier byte mutation damaged may crash, loop or corrupt its own memory, which must not be
    blamed on (or carried into) the reader that runs next in the same process."""
    import h5py

    path = ctx.scratch / "mutate.h5"
    path.write_bytes(data)
    edit_rng = random.Random(ctx.rng.getrandbits(64))

    def work() -> None:
        with h5py.File(path, "r+") as f:
            edit(edit_rng, f)

    try:
        if not ctx.damaged:  # a file HDF5 itself wrote: edited in this process (no fork to pay)
            try:
                work()
                return path.read_bytes()
            except Exception:
                pass
        elif _in_child(work):
            return path.read_bytes()
        ctx.damaged = True
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)  # a file h5py cannot edit: fall back to bytes
    finally:
        path.unlink(missing_ok=True)


def _in_child(work: Callable[[], None], timeout: float = 10.0) -> bool:
    """Whether ``work()`` returned in a forked child within ``timeout`` seconds."""
    import signal
    import time

    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.0005)


def _datasets(f: Any) -> list[str]:
    import h5py

    found: list[str] = []
    f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
    return found


def _known_names(f: Any) -> list[str]:
    names = ["rel", "lhs", "rhs", "weight", "lhs_offsets", "lhsd_data", "rhs_offsets", "rhsd_data",
             "embeddings", "optimizer/state_dict", "model/relations/0/operator/rhs/translation"]
    try:
        from pbgio.spec.edges import SIDES, data_name, offsets_name

        names += [offsets_name(s) for s in SIDES] + [data_name(s) for s in SIDES]
    except ImportError:
        pass
    return names


def _pick(rng: random.Random, f: Any, existing: float = 0.8) -> str:
    present = _datasets(f)
    if present and rng.random() < existing:
        return rng.choice(present)
    return rng.choice(_known_names(f))


def _delete(f: Any, name: str) -> None:
    if name in f:
        del f[name]


MAX_EDIT_ELEMENTS = 1 << 20


def _values(f: Any, name: str) -> Any:
    """All of dataset ``name``, or None when it claims more elements than an edit reads whole (an
    earlier :func:`h5_huge` made it claim 10^12 rows)."""
    if getattr(f[name], "size", 0) > MAX_EDIT_ELEMENTS:
        return None
    return f[name][...]


def h5_huge(rng: random.Random, f: Any) -> None:
    """A dataset claiming a huge size with (almost) nothing written."""
    import numpy as np

    name = _pick(rng, f)
    old = f[name] if name in f and hasattr(f[name], "dtype") else None
    dtype = old.dtype if old is not None and rng.random() < 0.7 else rng.choice(
        [np.int64, np.float32, np.dtype("V1"), np.int32, np.float64])
    _delete(f, name)
    ndim = old.ndim if old is not None and old.ndim else 1
    huge = rng.choice(_HUGE)
    shape = (huge,) if ndim == 1 else (huge // 1000 or 1, 1000)
    chunks = (1 << 16,) if ndim == 1 else (64, 1000)
    if rng.random() < 0.8:
        ds = f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks,
                              maxshape=(None,) * len(shape))
        if rng.random() < 0.5 and ndim == 1:  # the first chunk written, the rest never
            ds[: 1 << 10] = np.ones(1 << 10, dtype=dtype) if dtype != np.dtype("V1") else np.zeros(
                1 << 10, dtype)
    else:
        f.create_dataset(name, shape=shape, dtype=dtype)  # contiguous, never allocated


def h5_dtype(rng: random.Random, f: Any) -> None:
    """A dataset rewritten with another dtype (same values where they convert)."""
    import numpy as np

    name = _pick(rng, f, existing=1.0)
    if name not in f:
        return
    values = _values(f, name)
    if values is None:
        return
    dtype: Any = rng.choice([np.int32, np.uint64, np.float32, np.float64, np.bool_, ">i8", ">f4", np.int8,
                        "S8", np.dtype([("a", np.int64), ("b", np.float32)]), np.complex64, np.float16])
    _delete(f, name)
    try:
        f.create_dataset(name, data=values.astype(dtype) if np.dtype(dtype).names is None
                         else np.zeros(values.shape, dtype))
    except (TypeError, ValueError):
        f.create_dataset(name, data=np.zeros(values.shape, dtype))


def h5_shape(rng: random.Random, f: Any) -> None:
    """A dataset reshaped: scalar, 2-D, empty, one element more or less."""
    import numpy as np

    name = _pick(rng, f, existing=1.0)
    if name not in f:
        return
    values = _values(f, name)
    if values is None:
        return
    flat = values.reshape(-1)
    choice = rng.randrange(6)
    new: Any
    if choice == 0:
        new = flat[:1].reshape(()) if flat.size else np.zeros((), values.dtype)
    elif choice == 1:
        new = flat.reshape(1, -1) if flat.size else np.zeros((0, 3), values.dtype)
    elif choice == 2:
        new = flat[:0]
    elif choice == 3:
        new = flat[:-1]
    elif choice == 4:
        new = np.concatenate([flat, flat[:1]]) if flat.size else np.zeros(1, values.dtype)
    else:
        new = np.zeros((2, 2, 2), values.dtype)
    _delete(f, name)
    f.create_dataset(name, data=new)


def h5_values(rng: random.Random, f: Any) -> None:
    """Hostile values in a dataset: negative, huge, NaN, unsorted offsets."""
    import numpy as np

    name = _pick(rng, f, existing=1.0)
    if name not in f:
        return
    ds = f[name]
    if not ds.shape or ds.size == 0 or ds.dtype.kind not in "iuf":
        return
    values = _values(f, name)
    if values is None:
        return
    flat = values.reshape(-1)
    i = rng.randrange(flat.size)
    if ds.dtype.kind == "f":
        flat[i] = rng.choice([np.nan, np.inf, -np.inf, -1.0, 3.4e38])
    elif rng.random() < 0.3:
        flat[:] = flat[::-1]
    else:
        info = np.iinfo(ds.dtype)
        flat[i] = rng.choice([info.min, info.max, -1, 10**12 % info.max, 0])
    ds[...] = values


def h5_attrs(rng: random.Random, f: Any) -> None:
    """Root attributes: format_version, config/json and iteration/* of wrong types and values."""
    import numpy as np

    from pbgio.spec import FORMAT_VERSION_ATTR
    from pbgio.spec.checkpoint import CONFIG_JSON_ATTR, ITERATION_ATTRS

    key = rng.choice([FORMAT_VERSION_ATTR, FORMAT_VERSION_ATTR, CONFIG_JSON_ATTR, *ITERATION_ATTRS])
    value = rng.choice([
        None, "1", np.int64(2), np.int64(-1), np.float64(1.0), np.array([1, 1]), np.array([], np.int64),
        b"\xff\xfe", "{" * 10_000, "9" * 5000, np.int64(2**62), np.bool_(True), np.array([[1]]),
        '{"entities": 1}', "", np.uint64(1), np.int8(1),
    ])
    if value is None:
        if key in f.attrs:
            del f.attrs[key]
    else:
        f.attrs[key] = value


def h5_links(rng: random.Random, f: Any) -> None:
    """Datasets replaced by groups, soft links (dangling or cyclic) or external links."""
    import h5py

    name = _pick(rng, f)
    _delete(f, name)
    choice = rng.randrange(4)
    if choice == 0:
        f.create_group(name)
    elif choice == 1:
        f[name] = h5py.SoftLink("/no/such/thing")
    elif choice == 2:
        f[name] = h5py.ExternalLink(rng.choice(["/etc/passwd", "missing.h5", "/dev/zero"]), "/x")
    else:
        f[name] = h5py.SoftLink("/" + name)


def h5_filters(rng: random.Random, f: Any) -> None:
    """A dataset rewritten compressed, checksummed, or with a corrupt-prone layout."""
    name = _pick(rng, f, existing=1.0)
    if name not in f or not f[name].shape:
        return
    values = _values(f, name)
    if values is None:
        return
    _delete(f, name)
    choice = rng.randrange(4)
    chunks = tuple(max(1, min(8, n)) for n in values.shape) if values.size else None
    if choice == 0:
        f.create_dataset(name, data=values, compression="gzip", chunks=chunks)
    elif choice == 1:
        f.create_dataset(name, data=values, fletcher32=True, chunks=chunks)
    elif choice == 2:
        f.create_dataset(name, data=values, shuffle=True, compression="lzf", chunks=chunks)
    else:
        f.create_dataset(name, data=values, scaleoffset=0 if values.dtype.kind in "iu" else None,
                         chunks=chunks)


def h5_extra(rng: random.Random, f: Any) -> None:
    """Unknown datasets, groups, and a model group holding odd names."""
    import numpy as np

    name = rng.choice(["extra", "model/entities/user/global_embedding", "model/relations/9/operator/x/y",
                       "model/a.b", "model/relations/-1/operator/rhs/diagonal", "optimizer", "lhs_offsets"])
    _delete(f, name)
    f.create_dataset(name, data=np.zeros(rng.choice([0, 3, 5]), rng.choice([np.float32, np.int64])))


def h5_evil_blob(rng: random.Random, f: Any) -> None:
    """The optimizer blob replaced by an evil pickle (bare or in a zip payload)."""
    import numpy as np

    from pbgio.spec.checkpoint import OPTIMIZER_DATASET

    ctx = MutationContext(rng, [], Path("."),
                          Path(os.environ.get(MARKER_ENV) or Path(tempfile.gettempdir()) / "pbgio-fuzz-marker"))
    found = _values(f, OPTIMIZER_DATASET) if OPTIMIZER_DATASET in f else None
    old = found.tobytes() if found is not None else b""
    evil = pickle_mutate(ctx, old) if rng.random() < 0.7 else payload_mutate(ctx, old)
    _delete(f, OPTIMIZER_DATASET)
    f.create_dataset(OPTIMIZER_DATASET, data=np.frombuffer(evil, dtype=np.dtype("V1")))


H5_EDITS: list[Callable[[random.Random, Any], None]] = [
    h5_huge, h5_huge, h5_dtype, h5_shape, h5_values, h5_attrs, h5_links, h5_filters, h5_extra, h5_evil_blob,
]


def h5_mutate(ctx: MutationContext, data: bytes) -> bytes:
    return _h5_edit(ctx, data, ctx.rng.choice(H5_EDITS))


# --------------------------------------------------------------------------- Parquet


def parquet_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """A table rewritten with wrong column types, nulls, lists, or no rows."""
    import polars as pl

    from pbgio.importers.parquet_check import check_parquet

    try:  # polars aborts the worker on some false claims (the reader checks them the same way)
        check_parquet(io.BytesIO(data), "input")
        frame = pl.read_parquet(io.BytesIO(data))
    except (Exception, pl.exceptions.PanicException):  # a panic is a BaseException
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    column = rng.choice(frame.columns) if frame.columns else "x"
    n = frame.height
    choice = rng.randrange(9)
    try:
        if choice == 0:
            frame = frame.with_columns(pl.Series(column, [rng.random() for _ in range(n)]))
        elif choice == 1:
            frame = frame.with_columns(pl.Series(column, [rng.random() < 0.5 for _ in range(n)]))
        elif choice == 2:
            frame = frame.with_columns(pl.Series(column, [None] * n, dtype=pl.String))
        elif choice == 3:
            frame = frame.with_columns(pl.Series(column, [[["a"]]] * n))
        elif choice == 4:
            frame = frame.with_columns(pl.Series(column, [b"\xff\x00"] * n, dtype=pl.Binary))
        elif choice == 5:
            frame = frame.with_columns(pl.Series(column, [{"a": 1}] * n))
        elif choice == 6:
            frame = frame.head(0)
        elif choice == 7:
            frame = frame.with_columns(pl.Series(column, [["x", None, ""]] * n))
        else:
            frame = frame.select(frame.columns[:rng.randrange(len(frame.columns) + 1)])
    except (Exception, pl.exceptions.PanicException):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    out = io.BytesIO()
    try:
        frame.write_parquet(out, row_group_size=rng.choice([1, 7, 1000]))
    except (Exception, pl.exceptions.PanicException):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    return out.getvalue()


# --------------------------------------------------------------------------- generation


STRUCTURE_MUTATORS: dict[str, list[Mutator]] = {
    "json": [json_mutate, json_mutate, json_wrap],
    "count": [count_mutate],
    "jsonl": [jsonl_mutate],
    "h5": [h5_mutate],
    "pickle": [pickle_mutate, payload_mutate],
    "text-table": [table_mutate],
    "parquet": [parquet_mutate],
}


def generate(target: Target, corpus: list[bytes], seed: int, index: int, scratch: Path,
             marker: Path) -> bytes:
    """Input ``index`` of a campaign: the seeds themselves first, then stacked mutations of them."""
    if index < len(corpus):
        return corpus[index]
    rng = random.Random(f"{seed}/{target.name}/{index}")
    ctx = MutationContext(rng, corpus, scratch, marker)
    data = rng.choice(corpus)
    structural = STRUCTURE_MUTATORS.get(target.kind, [])
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if structural and rng.random() < 0.55:
            data = rng.choice(structural)(ctx, data)
        else:
            data = rng.choice(BYTE_MUTATORS)(ctx, data)
            ctx.damaged = True
    return data[: 8 << 20]
