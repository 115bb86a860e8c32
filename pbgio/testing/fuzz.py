"""Fuzz targets: every pbgio reader that takes a user's file, and the contract it keeps (guide: docs/guides/fuzzing.md).

The contract every reader keeps, whatever the bytes: it returns, or raises a
:class:`~pbgio.errors.PbgioError`. No other exception, no hang, no allocation driven by a size
the file claims, and no pickled code run. A :class:`Target` pairs a reader with the name its
input file gets on disk and the kind of its bytes (which picks the structure-level mutators);
:func:`classify` names an input's outcome and :func:`run_input` runs a target on some bytes.

The seed corpus is :mod:`pbgio.testing.fuzz_seeds`, the mutators that derive a campaign's inputs
from it :mod:`pbgio.testing.fuzz_mutators`; the campaign itself (worker processes with memory and
time bounds) is :mod:`pbgio.testing.fuzzrun`, the coverage-guided one :mod:`pbgio.testing.guided`;
``tools/fuzz.py`` is their command line.

Why this module is long: it is a catalogue of targets, one per reader that takes a user's
file (some with a round-trip oracle: what the reader accepts, its writer writes and the reader
reads back equal; some placing the input in a small valid layout that the validator checks
whole); each target is short and read on its own.

>>> sorted(TARGETS)[:3]
['checkpoint-embeddings', 'checkpoint-layout-embeddings', 'checkpoint-layout-model']
>>> classify(ValueError("boom"))
('failure', 'exception')
>>> classify(MemoryError())
('failure', 'memory')
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["json", "count", "jsonl", "h5", "pickle", "text-table", "parquet", "slotted"]
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
        per_part = reader in ("read_entity_count", "read_entity_names")
        value = fn(path.parent, "user", 0) if per_part else fn(path.parent)
        # Round trip: what the reader accepts, the matching writer writes and the reader reads back equal.
        again = path.parent / "round-trip"
        write = getattr(entities, reader.replace("read_", "write_", 1))
        write(again, "user", 0, value) if per_part else write(again, value)
        back = fn(again, "user", 0) if per_part else fn(again)
        if back != value:
            raise AssertionError(f"{path}: {reader} read {value!r:.200}, wrote it and read back {back!r:.200}")
        return value
    return run


def _run_config(path: Path) -> object:
    from pbgio.config import load_config

    return load_config(path)


def _run_python_config_answer(path: Path) -> object:
    from pbgio.config import parse_config, snake_case_keys
    from pbgio.python_config import is_python_config, read_answer, rebase_paths

    source = str(path.with_name("config.py"))
    is_python_config(path)
    cfg = parse_config(snake_case_keys(read_answer(source, path.read_bytes())), source)
    # What the command line does with a .py config's answer: its relative paths, rebased onto another
    # directory, still name the same places.
    src, dst = os.path.realpath(path.parent), os.path.realpath(path.parent / "run" / "out")
    rebased, changed = rebase_paths(cfg, src, dst)
    for key, (old, new) in changed.items():
        if os.path.normpath(os.path.join(src, old)) != os.path.normpath(os.path.join(dst, new)):
            raise AssertionError(f"{path}: rebase_paths moved {key} from {old!r} to {new!r}")
    return rebased


def _run_read_bucket(path: Path) -> object:
    from pbgio.edges import bucket_length, read_bucket

    n = bucket_length(path)
    whole = read_bucket(path)
    _expect(len(whole) == n, path, f"bucket_length says {n} edges, read_bucket read {len(whole)}")
    _bucket_round_trip(path, whole)
    return len(whole)


def _run_validate(path: Path) -> object:
    from pbgio.validate import validate_path

    return validate_path(path).to_dict()


def _run_embeddings(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    ckpt = CheckpointDir(path.parent)
    state = ckpt.read_embeddings("user", 0, 1)
    metadata = ckpt.read_metadata(path)
    _embeddings_views(ckpt, path, state.embeddings)
    _checkpoint_round_trip(path, metadata, embeddings=state)
    if state.optimizer_state is not None:
        from pbgio.optimizer_state import decode_row_adagrad

        sums = decode_row_adagrad(state.optimizer_state, str(path), count=len(state.embeddings))
        _row_adagrad_round_trip(path, state.optimizer_state, sums)
    return _run_validate(path)


def _run_model(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    ckpt = CheckpointDir(path.parent)
    model = ckpt.read_model(1)
    metadata = ckpt.read_metadata(path)
    _checkpoint_round_trip(path, metadata, model=model)
    if model.optimizer_state is not None:
        from pbgio.optimizer_state import decode_adagrad, read_state

        read_state(model.optimizer_state, str(path))
        shapes = [v.shape for v in model.params.values()]
        state = decode_adagrad(model.optimizer_state, str(path), shapes)
        _adagrad_round_trip(path, state, shapes)
    return _run_validate(path)


def _run_version(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir
    from pbgio.spec.entities import format_count

    version = CheckpointDir(path.parent).read_version()
    copy = CheckpointDir(path.parent / "roundtrip")
    copy.path.mkdir()
    copy.version_path.write_text(format_count(version), encoding="utf-8")
    _expect(copy.read_version() == version, path, "the version written back reads back different")
    return version


def _run_stats(path: Path) -> object:
    from pbgio.checkpoint import CheckpointDir

    records = CheckpointDir(path.parent).read_stats()
    copy = CheckpointDir(path.parent / "roundtrip")
    _expect(copy.read_stats() == [], path, "a directory without training_stats.json has records")
    copy.append_stats(records[:1])
    copy.append_stats(records[1:])
    _expect(copy.read_stats() == records, path, "the records appended back read back different")
    return records


# --------------------------------------------------------------------------- round-trip oracles


class RoundTripMismatch(AssertionError):
    """What a reader accepted, its writer wrote and the reader read back differs (or two readers
    of one file disagree): a finding, not a clean error."""


def _expect(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise RoundTripMismatch(f"{path.name}: {what}")


def _same_array(a: Any, b: Any) -> bool:
    import numpy as np

    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _same_bucket(a: Any, b: Any) -> bool:
    from pbgio.spec.edges import SIDES

    if not all(_same_array(getattr(a, n), getattr(b, n)) for n in ("rel", "lhs", "rhs", "weight")):
        return False
    for side in SIDES:
        fa, fb = a.features(side), b.features(side)
        if (fa is None) != (fb is None) or (fa is not None and fa != fb):
            return False
    return True


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _remote_copy(path: Path) -> Iterator[Any]:
    """``path`` copied to an object store (fsspec's ``memory://``), as a path the readers take: they
    read it through ranged reads (no file descriptor, no memory map)."""
    from pbgio import storage

    remote = storage.resolve(f"memory://pbgio-fuzz-{os.getpid()}/{path.parent.name}/{path.name}")
    remote.write_bytes(path.read_bytes())
    try:
        yield remote
    finally:
        remote.unlink(missing_ok=True)


def _bucket_round_trip(path: Path, whole: Any) -> None:
    """Readers of one bucket agree (chunks, edge ranges, feature bags as lists), and what
    :class:`~pbgio.edges.BucketWriter` writes of it (appended in pieces, flushed through a
    reopened file) reads back equal."""
    from pbgio.edges import BucketWriter, EdgeBucket, FeatureLists, read_bucket
    from pbgio.spec.edges import SIDES

    n = len(whole)
    with _remote_copy(path) as remote:
        _expect(_same_bucket(read_bucket(remote, chunk=(1, 2)), read_bucket(path, chunk=(1, 2))), path,
                "chunk 1 of 2 read from an object store differs")
    chunks = [read_bucket(path, chunk=(i, 3)) for i in range(3)]
    _expect(_same_bucket(EdgeBucket.concat(chunks), whole), path, "chunks 0..2 of 3 concatenated differ from the whole")
    cut = [0, n // 3, n - n // 4, n]
    pieces = [read_bucket(path, edge_range=(cut[i], cut[i + 1])) for i in range(3)]
    _expect(_same_bucket(EdgeBucket.concat(pieces), whole), path, "edge ranges concatenated differ from the whole")
    if n <= 4096:
        for side in SIDES:
            bags = whole.features(side)
            if bags is not None:
                _expect(FeatureLists.from_lists(bags.to_lists()) == bags, path, f"{side} bags as lists differ")
    copy = path.with_name("roundtrip.h5")
    writer = BucketWriter(copy, buffer_edges=max(1, n // 2), keep_open=n % 2 == 0)
    with writer:
        for piece in pieces:
            writer.append(piece)
    _expect(writer.written == n, path, f"the writer counted {writer.written} edges for {n}")
    _expect(_same_bucket(read_bucket(copy), whole), path, "BucketWriter's copy reads back different")
    copy.unlink()
    aborted = BucketWriter(copy)
    aborted.append(whole)
    other = EdgeBucket(whole.rel, whole.lhs, whole.rhs, None if whole.weight is not None else whole.rel * 0.0,
                       whole.lhs_features, whole.rhs_features)
    try:
        aborted.append(other)
        raise RoundTripMismatch(f"{path.name}: BucketWriter appended edges of another layout")
    except ValueError:
        pass
    aborted.abort()
    _expect(not copy.exists(), path, "an aborted BucketWriter left its file")


def _embeddings_views(ckpt: Any, path: Path, table: Any) -> None:
    """The streaming, mapped and row-picking readers of a table agree with read_embeddings."""
    import numpy as np

    from pbgio.errors import MissingArtifactError
    from pbgio.formats.h5 import ROW_CHUNK_BYTES_ENV

    n = len(table)
    _expect(ckpt.embeddings_shape("user", 0, 1) == table.shape, path, "embeddings_shape differs")
    streamed = [rows for _, rows in ckpt.iter_embedding_rows("user", 0, 1)]
    _expect(_same_array(np.concatenate(streamed) if streamed else table[:0], table), path,
            "iter_embedding_rows differs from read_embeddings")
    picks = np.array([n - 1, 0, n // 2, n - 1] if n else [], dtype=np.int64)
    mapped = ckpt.map_embeddings("user", 0, 1)
    _expect(_same_array(mapped.take(picks), table[picks]), path, "map_embeddings rows differ")
    _expect(_same_array(mapped.take(picks[1:2]), table[picks[1:2]]), path, "map_embeddings row 0 differs")
    mapped.release()
    try:  # a row past the table: IndexError, never a read past the data
        mapped.take(np.array([n], dtype=np.int64))
        raise RoundTripMismatch(f"{path.name}: map_embeddings gave row {n} of a table of {n} rows")
    except IndexError:
        pass
    budget = max(1, table.nbytes // max(1, n) * 2)  # two rows at a time: the streaming reader's chunks
    with _environment(ROW_CHUNK_BYTES_ENV, str(budget)):
        streamed = [rows for _, rows in ckpt.iter_embedding_rows("user", 0, 1)]
    _expect(_same_array(np.concatenate(streamed) if streamed else table[:0], table), path,
            f"iter_embedding_rows {budget} bytes at a time differs from read_embeddings")
    try:
        ckpt.read_embeddings("user", 1, 1)
        raise RoundTripMismatch(f"{path.name}: read_embeddings read a partition that has no file")
    except MissingArtifactError:
        pass
    with _remote_copy(path) as remote:
        from pbgio.checkpoint import CheckpointDir

        far = CheckpointDir(remote.parent)
        _expect(_same_array(far.read_embeddings("user", 0, 1).embeddings, table), path,
                "the table read from an object store differs")
        _expect(_same_array(far.map_embeddings("user", 0, 1).take(picks), table[picks]), path,
                "map_embeddings rows read from an object store differ")
    _expect(_same_array(ckpt.read_embedding_rows("user", 0, 1, picks), table[picks]), path,
            "read_embedding_rows differs")
    try:  # a row past the table is the caller's mistake (ValueError), never a read past the data
        ckpt.read_embedding_rows("user", 0, 1, np.array([n], dtype=np.int64))
        raise RoundTripMismatch(f"{path.name}: read_embedding_rows gave row {n} of a table of {n} rows")
    except ValueError:
        pass


def _checkpoint_round_trip(path: Path, metadata: Any, *, embeddings: Any = None, model: Any = None) -> None:
    """What the checkpoint reader accepted, committed through write_checkpoint (versions 1 then
    2 with a snapshot, and an uncommitted 3), reads back equal; the superseded version goes."""
    from pbgio.checkpoint import CheckpointDir, read_committed, remove_uncommitted, write_checkpoint
    from pbgio.errors import ConfigError, MissingArtifactError

    out = CheckpointDir(path.parent / "roundtrip")
    _expect(out.read_version() == 0 and out.versions_on_disk() == [] and out.files_of_version(1) == [], path,
            "a checkpoint directory not yet written is not empty")
    tables = {("user", 0): embeddings} if embeddings is not None else {}
    for version in (1, 2):
        write_checkpoint(out, version, embeddings=tables, model=model, metadata=metadata, config=metadata.config_json,
                         snapshot_epoch=1 if version == 2 else None)
    _expect(out.versions_on_disk() == [2] and out.snapshot_versions() == {2}, path,
            f"versions {out.versions_on_disk()}, snapshots {out.snapshot_versions()} after committing 2")
    back_path = out.embeddings_path("user", 0, 2) if embeddings is not None else out.model_path(2)
    _expect(out.read_metadata(back_path) == metadata, path, "the metadata reads back different")
    if embeddings is not None:
        back = read_committed(out, lambda v: out.read_embeddings("user", 0, v), version=2)
        _expect(_same_array(back.embeddings, embeddings.embeddings), path, "the embeddings read back different")
        _expect(back.optimizer_state == embeddings.optimizer_state, path, "the optimizer blob reads back different")
        out.write_embeddings("user", 0, 3, embeddings)
    else:
        model_back = read_committed(out, out.read_model)
        _expect(list(model_back.params) == list(model.params), path, f"parameters {list(model_back.params)} read back")
        _expect(len(model.state_dict()) == len(model.params), path, "two parameters map to one state-dict key")
        _expect(all(_same_array(model_back.params[k], v) for k, v in model.params.items()), path,
                "the parameters read back different")
        _expect(model_back.optimizer_state == model.optimizer_state, path, "the optimizer blob reads back different")
        out.write_model(3, model)
    _expect(len(remove_uncommitted(out)) == 1 and out.versions_on_disk() == [2], path,
            "remove_uncommitted left version 3")
    if metadata.config_json is None:
        try:
            out.read_config()
            raise RoundTripMismatch(f"{path.name}: a config was read where none was written")
        except MissingArtifactError:
            pass
    else:  # the config the file carries, as the checkpoint's config.json: read back, or refused as a config
        with contextlib.suppress(ConfigError):
            out.read_config()


def _row_adagrad_round_trip(path: Path, blob: bytes, sums: Any) -> None:
    from pbgio.optimizer_state import decode_row_adagrad, encode_row_adagrad, read_state

    lr = read_state(blob, str(path)).value["param_groups"][0]["lr"]
    again = decode_row_adagrad(encode_row_adagrad(sums, lr=float(lr)), str(path), count=len(sums))
    _expect(_same_array(again, sums), path, "the RowAdagrad accumulators re-encoded read back different")


def _adagrad_round_trip(path: Path, state: Any, shapes: list[Any]) -> None:
    import numpy as np

    from pbgio.optimizer_state import decode_adagrad, encode_adagrad

    if state is None:
        return
    entries = state["state"]
    sums = [np.asarray(entries[i]["sum"], dtype=np.float32) for i in range(len(shapes))]
    blob = encode_adagrad(sums, lr=float(state["param_groups"][0]["lr"]),
                          steps=float(np.asarray(entries[0]["step"]).reshape(-1)[0]) if sums else 0.0)
    again = decode_adagrad(blob, str(path), shapes)
    _expect(again is not None and all(_same_array(np.asarray(again["state"][i]["sum"]), s)
                                      for i, s in enumerate(sums)), path,
            "the Adagrad accumulators re-encoded read back different")


# --------------------------------------------------------------------------- layout-level targets


_TEMPLATES: dict[str, Path] = {}


def _template(kind: str) -> Path:
    """A small valid layout written once per process (``edges``: no checkpoint; ``checkpoint``:
    version 1 with a snapshot), copied per input."""
    if kind not in _TEMPLATES:
        import atexit

        from pbgio.testing.layouts import small_valid_layout, write_layout

        root = Path(tempfile.mkdtemp(prefix=f"pbgio-fuzz-{kind}-layout-"))
        atexit.register(shutil.rmtree, root, True)
        layout = {"edges": lambda: small_valid_layout(checkpoint=False),
                  "edges-dynamic": lambda: small_valid_layout(checkpoint=False, dynamic=True, featurized=False),
                  "checkpoint": lambda: small_valid_layout(snapshot=True, edges_per_bucket=2)}[kind]()
        write_layout(root, layout)
        _TEMPLATES[kind] = root
    return _TEMPLATES[kind]


def remove_templates() -> None:
    """Remove this process's template layouts (a process that ends with ``os._exit`` skips atexit)."""
    while _TEMPLATES:
        shutil.rmtree(_TEMPLATES.popitem()[1], ignore_errors=True)


def _in_layout(kind: str, *members: str) -> Callable[[Path], object]:
    """Run: the input replaces ``members`` of the template layout ``kind``, then the whole layout is
    validated (a Report; only PbgioError may escape) and, for a bucket, read as a trainer reads it."""
    def run(path: Path) -> object:
        from pbgio.errors import Report
        from pbgio.validate import validate_path

        root = path.parent / "layout"
        template = _template(kind)
        shutil.copytree(template, root, symlinks=True)
        for link in root.rglob("*"):  # a snapshot's links point into the template: into the copy instead
            if link.is_symlink() and (found := Path(os.readlink(link))).is_relative_to(template):
                link.unlink()
                link.symlink_to(root / found.relative_to(template))
        for member in members:
            (root / member).unlink(missing_ok=True)
            shutil.copyfile(path, root / member)
        target = root / members[0]
        report = validate_path(root / "config.json")
        _expect(isinstance(report, Report), path, f"validate_path returned {type(report).__name__}")
        if kind.startswith("edges"):
            _read_as_trainer(root, target)
        return report.to_dict()
    return run


def _read_as_trainer(root: Path, bucket: Path) -> None:
    from pbgio.checks.edges import check_bounds, relation_limits
    from pbgio.config import load_config
    from pbgio.edges import bucket_length, iter_buckets, read_bucket
    from pbgio.entities import read_dynamic_rel_count, read_entity_count
    from pbgio.errors import PbgioError
    from pbgio.spec.edges import chunk_bounds

    cfg = load_config(root / "config.json")
    counts = {(t, p): read_entity_count(root / cfg.entity_path, t, p)
              for t, e in cfg.entities.items() for p in range(e.num_partitions)}
    found = [p for _, _, p in iter_buckets(bucket.parent)]
    _expect(bucket in found, bucket, "iter_buckets misses the bucket")
    first: PbgioError | None = None
    relations = read_dynamic_rel_count(root / cfg.entity_path) if cfg.dynamic_relations else len(cfg.relations)
    for part in range(2):  # the bucket as partition (0, 0), then as (1, 1)
        limits = {s: relation_limits(cfg, s, part, relations, counts) for s in ("lhs", "rhs")}
        for i in range(2):
            try:
                edges = read_bucket(bucket, chunk=(i, 2))
                first_row = chunk_bounds(bucket_length(bucket), 2, i)[0]
                if limits["lhs"] is not None and limits["rhs"] is not None:
                    check_bounds(edges, bucket, first_row=first_row, lhs=limits["lhs"], rhs=limits["rhs"])
            except PbgioError as exc:  # the first is raised once every reading has run
                first = first or exc
    if first is not None:
        raise first


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

    total = load_index_payload(path, meta, lambda payload: int(payload.sum()), stream)
    meta.describe()  # what pbgio index search prints: kind, rows, and the accuracy at the stored and other settings
    meta.accuracy()
    meta.accuracy({key: value + 1 for key, value in meta.params.items()}, candidates=meta.recall_candidates + 1)
    _index_round_trip(path, meta)
    return total


def _index_round_trip(path: Path, meta: Any) -> None:
    """What read_index_meta accepts, write_index_file writes (in pieces) and read_index_meta reads back equal."""
    import h5py

    from pbgio.index_file import read_index_meta, write_index_file
    from pbgio.spec.index import PAYLOAD_DATASET

    with h5py.File(path, "r") as f:
        payload = f[PAYLOAD_DATASET][...].tobytes()
    again = path.with_name("round-trip." + path.name)

    def write(sink: Callable[[bytes], object]) -> None:
        for start in range(0, len(payload), 4099):
            sink(payload[start:start + 4099])

    stamped, size = write_index_file(again, meta, write)
    back = read_index_meta(again)
    with h5py.File(again, "r") as f:
        same = f[PAYLOAD_DATASET][...].tobytes() == payload
    if back != meta or stamped != meta or size != len(payload) or not same:
        raise AssertionError(f"{path}: the index metadata {meta} wrote and read back as {back}")


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


# --------------------------------------------------------------------------- importer options


_IMPORT_DELIMITERS = ("\t", ",", ";", "|", "whitespace", " ", ",", "\t")
_IMPORT_HEADERS: tuple[bool | None, ...] = (None, True, False, True)
_IMPORT_COLUMNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("plain", {}),
    ("plain", {"rel_col": "none"}),
    ("plain", {"weight_col": "3"}),
    ("plain", {"lhs_col": "2", "rhs_col": "0", "weight_col": "3", "quote": None}),
    ("plain", {"lhs_col": "src", "rel_col": "rel", "rhs_col": "dst"}),
    ("featurized", {"weight_col": "3", "feature_separator": ";"}),
    ("featurized", {"lhs_col": "src", "rel_col": "rel", "rhs_col": "dst", "weight_col": "w"}),
    ("plain", {"quote": "'", "weight_col": "w", "lhs_col": "src", "rel_col": "rel", "rhs_col": "dst"}),
)


def import_options(first: int, parquet: bool = False) -> tuple[str, dict[str, Any]]:
    """The config and the importer's options an ``import-options`` input's first byte picks: the
    delimiter (bits 0-2), the header (bits 3-4) and the columns (as the command line gives them:
    :func:`~pbgio.importers.read.parse_column`), weights, quoting and config (bits 5-7).

    >>> import_options(0)
    ('plain', {'delimiter': '\\t', 'header': None, 'file_format': 'text'})
    >>> import_options(0b111_01_001)[1]["delimiter"], import_options(0b111_01_001)[1]["quote"]
    (',', "'")
    """
    from pbgio.importers.read import parse_column

    config, given = _IMPORT_COLUMNS[first >> 5]
    columns = {k: parse_column(v) if k.endswith("_col") and isinstance(v, str) else v for k, v in given.items()}
    delimiter = _IMPORT_DELIMITERS[first & 7]
    if columns.get("quote") == "'" and delimiter in ("whitespace", " "):
        delimiter = ","  # a quote needs a delimiter other than whitespace
    options = {"delimiter": delimiter, "header": _IMPORT_HEADERS[(first >> 3) & 3], **columns,
               "file_format": "parquet" if parquet else "text"}
    return config, options


def _run_import_options(path: Path) -> object:
    """The importer with its options picked by the first byte (:func:`import_options`) on the rest: a
    Parquet table when it starts as one, else delimited text."""
    data = path.read_bytes()
    body = data[1:]
    config, options = import_options(data[0] if data else 0, parquet=body.startswith(b"PAR1"))
    table = path.with_name("edges.parquet" if options["file_format"] == "parquet" else "edges.txt")
    table.write_bytes(body)
    return _import_run(config, **options)(table)


# --------------------------------------------------------------------------- entity, config and index files in a layout
# The fuzzed bytes replace one file inside a small valid layout (written once per worker, under its
# scratch folder, and hard-linked per input), and the validator runs over the whole layout: the rules
# across files (counts against names, a config against its files, an index against its version's
# tables) run too. The input's first byte picks the layout, the file (its *slot*) and, for entity
# files, whether to delete it instead; the rest is the file.

_LAYOUT_TEMPLATES: dict[str, dict[str, Any]] = {
    "static": {"edges_per_bucket": 4},  # with a checkpoint (version 1)
    "entities": {"checkpoint": False, "edges_per_bucket": 2},  # the entity files' rules need no checkpoint
    "entities-dynamic": {"dynamic": True, "checkpoint": False, "edges_per_bucket": 2},
}
ENTITY_SLOTS = (
    "entity_count_user_0.txt", "entity_count_user_1.txt", "entity_names_user_0.json", "entity_names_user_1.json",
    "entity_count_item_0.txt", "entity_names_item_0.json", "dynamic_rel_count.txt", "dynamic_rel_names.json",
    "entity_count_user_2.txt", "entity_count_ghost_0.txt", "entity_names_doc_0.json", "entity_count_doc_0.txt",
)
"""The entity_path files an ``entities-layout`` input writes (or deletes): the template's, and files of a
partition, a type and a featurized type's names that the config does not have."""
INDEX_SLOTS = (
    "index_user.cos.flat.v1.h5", "index_user.dot.ivf.v1.h5", "index_user.cos.hnsw.v1.h5", "index_user.v1.h5",
    "index_item.dot.flat.v1.h5", "index_doc.cos.flat.v1.h5", "index_user.cos.flat.v2.h5",
    "index_ghost.cos.flat.v1.h5",
)
"""The checkpoint_path file names an ``index-layout`` input is written under (version 1 is committed)."""


def layout_template(workdir: Path, name: str) -> Path:
    """Template ``name`` (see :data:`_LAYOUT_TEMPLATES`) under ``workdir``, written at its first use."""
    root = workdir / f"_template-{name}"
    if not (root / "config.json").exists():
        from pbgio.testing.layouts import small_valid_layout, write_layout

        shutil.rmtree(root, ignore_errors=True)
        building = workdir / f"_template-{name}.building"
        shutil.rmtree(building, ignore_errors=True)
        write_layout(building, small_valid_layout(**_LAYOUT_TEMPLATES[name]))
        building.rename(root)
    return root


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _layout_case(path: Path, name: str) -> Path:
    """A copy of template ``name`` beside the input ``path`` (files hard-linked: a target replaces a
    file by unlinking it first, so the template never changes)."""
    root = path.parent / "layout"
    shutil.copytree(layout_template(path.parent.parent, name), root, copy_function=_link_or_copy)
    return root


def _replace(file: Path, data: bytes | None) -> None:
    """``file`` now holds ``data`` (None: no file), never written through a hard link."""
    file.unlink(missing_ok=True)
    if data is not None:
        file.write_bytes(data)


def _validate_layout(root: Path) -> object:
    from pbgio.errors import Report
    from pbgio.validate import validate_path

    report = validate_path(root / "config.json")
    if not isinstance(report, Report):
        raise AssertionError(f"validate_path returned {type(report).__name__}, not a Report")
    return report.to_dict()


def entity_slot(first: int) -> tuple[str, bool, str]:
    """What an ``entities-layout`` input's first byte picks: the template, whether the file is deleted,
    and the file (bit 0, bit 1, the rest modulo the slots).

    >>> entity_slot(0), entity_slot(7)
    (('entities', False, 'entity_count_user_0.txt'), ('entities-dynamic', True, 'entity_count_user_1.txt'))
    """
    return ("entities", "entities-dynamic")[first & 1], bool(first & 2), ENTITY_SLOTS[(first >> 2) % len(ENTITY_SLOTS)]


def _run_entities_layout(path: Path) -> object:
    data = path.read_bytes()
    template, delete, slot = entity_slot(data[0] if data else 0)
    root = _layout_case(path, template)
    _replace(root / "entities" / slot, None if delete else data[1:])
    return _validate_layout(root)


def _run_config_layout(path: Path) -> object:
    """A run config in a layout: the validator's rules on it and its files; then, where it loads, its
    JSON round trip and the type a command picks by default."""
    from contextlib import suppress

    from pbgio.config import entity_type_or_only, load_config, parse_config
    from pbgio.errors import ConfigError, UsageError

    root = _layout_case(path, "static")
    _replace(root / "config.json", path.read_bytes())
    result = _validate_layout(root)
    try:
        cfg = load_config(root / "config.json")
    except ConfigError:
        return result
    back = parse_config(json.loads(cfg.to_json()), "round trip")
    if back != cfg:
        raise AssertionError(f"{path}: the config read back from its own JSON differs: {cfg.to_json()[:300]}")
    with suppress(UsageError):  # a config of several types: the command asks for --type
        entity_type_or_only(cfg, None)
    first = sorted(cfg.entities)[0]
    if entity_type_or_only(cfg, first) != first:
        raise AssertionError(f"{path}: --type {first} picked another type")
    return result


def _run_python_config_source(path: Path) -> object:
    """A config.py run as the commands run one (pbgio.python_config.run_python_config: a child process,
    stopped after a second here), then parse_config: the parent's side of the boundary (no answer, a
    timeout, printed output, an answer the file wrote over). One process per input: slower than the others."""
    from pbgio.config import parse_config
    from pbgio.python_config import run_python_config

    printed: list[str] = []
    return parse_config(run_python_config(path, timeout=1.0, echo=printed.append), str(path))


def _run_index_layout(path: Path) -> object:
    """An index file in the checkpoint of a layout (named by the first byte, see :data:`INDEX_SLOTS`): the
    validator's rules (the file name's type, version, metric and kind; stale against the tables)."""
    data = path.read_bytes()
    root = _layout_case(path, "static")
    file = root / "checkpoint" / INDEX_SLOTS[(data[0] if data else 0) % len(INDEX_SLOTS)]
    _replace(file, data[1:])
    result = _validate_layout(root)
    _index_rows_agree(root, file)
    return result


def _index_rows_agree(root: Path, file: Path) -> None:
    """The rows an index of ``file``'s metadata is built from, read a chunk at a time (as a build
    reads them), equal the whole partitions (as tools and tests compare them)."""
    import numpy as np

    from pbgio.checkpoint import CheckpointDir
    from pbgio.config import load_config
    from pbgio.index_file import TypeRows, read_index_meta

    meta = read_index_meta(file)
    cfg = load_config(root / "config.json")
    if meta.entity_type not in cfg.entities or cfg.entities[meta.entity_type].featurized:
        return
    rows = TypeRows(cfg, CheckpointDir(root / "checkpoint"), 1, meta.entity_type, add_global=meta.add_global)
    for part, count in enumerate(rows.partition_rows()):
        whole = rows.partition(part)
        chunks = [values for _first, values in rows.chunks(part)]
        joined = np.concatenate(chunks) if chunks else whole[:0]
        if len(whole) != count or not np.array_equal(joined, whole):
            raise AssertionError(f"{file}: partition {part} of {meta.entity_type!r} read whole and in chunks differs")


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
    Target("edges-layout", "edges_0_0.h5", "h5", _in_layout("edges", "edges/edges_0_0.h5"),
           "the input as bucket (0, 0) of a small valid layout: validate_path over the layout, then "
           "read as the trainer reads it (chunks, check_bounds against the entity counts)"),
    Target("edges-layout-dynamic", "edges_0_0.h5", "h5", _in_layout("edges-dynamic", "edges/edges_0_0.h5"),
           "as edges-layout, in a layout of dynamic relations between plain types (one count bounds each side)"),
    Target("checkpoint-layout-version", "checkpoint_version.txt", "count",
           _in_layout("checkpoint", "checkpoint/checkpoint_version.txt", "checkpoint/epoch_1/checkpoint_version.txt"),
           "the input as the version files of a small valid layout's checkpoint and of its snapshot (both "
           "version 1): validate_path"),
    Target("checkpoint-layout-embeddings", "embeddings_user_0.v1.h5", "h5",
           _in_layout("checkpoint", "checkpoint/embeddings_user_0.v1.h5"),
           "the input as user partition 0 of committed version 1 of a small valid layout: validate_path"),
    Target("checkpoint-layout-model", "model.v1.h5", "h5", _in_layout("checkpoint", "checkpoint/model.v1.h5"),
           "the input as the model file of committed version 1 of a small valid layout: validate_path"),
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
    Target("import-options", "import-input.bin", "slotted", _run_import_options,
           "import_edge_lists with its options picked by the first byte (delimiter, header, columns by index "
           "or name, weights, quoting, a featurized type) on the rest, delimited text or a Parquet table"),
    Target("entities-layout", "layout-input.bin", "slotted", _run_entities_layout,
           "validate_path over a small layout whose entity file the first byte picks (count, names, dynamic "
           "relation files; the config's or not) is the rest, or deleted: the rules across entity files"),
    Target("config-py-source", "config.py", "text-table", _run_python_config_source,
           "pbgio.python_config.run_python_config on a config.py (run in a child process, one per input) and "
           "parse_config"),
    Target("config-layout", "config.json", "json", _run_config_layout,
           "validate_path over a small layout whose config.json is the input; then the config's JSON round "
           "trip and entity_type_or_only"),
    Target("index-layout", "layout-input.bin", "slotted", _run_index_layout,
           "validate_path over a small layout with a checkpoint whose index file (named by the first byte) is "
           "the rest: the index rules against the file name, the config and the version's tables"),
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


