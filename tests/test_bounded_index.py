"""Every stage of the index and the exact scans in bounded memory (issue 45): the index build
streams a partition's rows a chunk at a time and its payload into the file; a search maps the
index instead of loading it; neighbours and predictions stream their candidates. Each gives
what the whole-table code gave: the same payload bytes, the same answers, whatever the chunk size."""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import pbgio.index.library as library
import pbgio.index_file as index_file
from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import parse_config
from pbgio.edges import EdgeBucket, write_bucket
from pbgio.entities import write_entity_count, write_entity_names
from pbgio.errors import FormatError
from pbgio.formats.h5 import ROW_CHUNK_BYTES_ENV
from pbgio.index import build_index, open_index
from pbgio.index_file import IndexMeta, PayloadSizeError, write_index_file
from pbgio.neighbors import indexed_neighbors, nearest_neighbors
from pbgio.spec import naming
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.spec.index import PAYLOAD_DATASET
from pbgtrain import predict
from pbgtrain.predict import Predictor, rank_triple, score_triples, top_k
from tests.test_index import _clustered_layout
from tests.test_predict import model_layout

faiss = pytest.importorskip("faiss")

DIM = 4
SIZES = [7, 1, 6]  # rows of each partition of 'item'


def _integer_layout(root: Path, *, global_emb: bool, seed: int = 0) -> tuple[Path, np.ndarray]:
    """One type 'item' of small integer rows in partitions of :data:`SIZES` (dot products are exact
    integers, so equal scores are planted, not rounded into being), and the table as exported
    (global embedding added)."""
    cfg = parse_config({"entities": {"item": {"num_partitions": len(SIZES)}},
                        "relations": [{"name": "r", "lhs": "item", "rhs": "item"}], "dimension": DIM,
                        "global_emb": global_emb, "comparator": "dot", "entity_path": "data",
                        "edge_paths": ["data/edges"], "checkpoint_path": "model"})
    (root / "data").mkdir(parents=True)
    (root / "config.json").write_text(cfg.to_json())
    rng = np.random.default_rng(seed)
    table = rng.integers(-2, 3, (sum(SIZES), DIM)).astype(np.float32)
    table[5] = table[7] = table[12] = table[2]  # the same row in three partitions, across chunk boundaries
    shift = rng.integers(-1, 2, DIM).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    embeddings = {}
    for part, size in enumerate(SIZES):
        write_entity_count(root / "data", "item", part, size)
        write_entity_names(root / "data", "item", part, [f"item-{i}" for i in range(starts[part], starts[part + 1])])
        embeddings[("item", part)] = EmbeddingsState(table[starts[part]:starts[part + 1]].copy(), None)
        for rhs in range(len(SIZES)):
            empty = np.zeros(0, np.int64)
            write_bucket(root / "data" / "edges" / naming.bucket_file(part, rhs), EdgeBucket(empty, empty, empty))
    params = {global_embedding_name("item"): shift} if global_emb else {}
    write_checkpoint(CheckpointDir(root / "model"), 1, embeddings=embeddings, model=ModelState(params, None),
                     config=cfg)
    return root / "config.json", table + shift if global_emb else table


def _brute_force(table: np.ndarray, query: int, k: int) -> list[tuple[str, int, int, float]]:
    """The top ``k`` of the whole table by dot, the query left out: equal scores by (partition, row)."""
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    parts = np.searchsorted(starts, np.arange(len(table)), side="right") - 1
    offsets = np.arange(len(table)) - starts[parts]
    scores = table @ table[query]
    order = [i for i in np.lexsort((offsets, parts, -scores)) if i != query][:k]
    return [(f"item-{i}", int(parts[i]), int(offsets[i]), float(scores[i])) for i in order]


def _answers(config: Path, names: list[str], k: int) -> list[list[tuple[str, int, int, float]]]:
    return [[(n.name, n.partition, n.offset, n.score) for n in found.neighbors]
            for found in nearest_neighbors(config, "item", names, k=k, metric="dot")]


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a read the stage must not make: {args[1:]}")


@pytest.fixture
def no_whole_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a whole partition fails: what runs under it streams or reads rows alone."""
    monkeypatch.setattr(CheckpointDir, "read_embeddings", _refuse)


def _spy(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, seen: list[Any],
         note: Callable[..., Any]) -> None:
    """``owner.name`` made to append ``note(*args)`` to ``seen`` at each call, then do its work."""
    real = getattr(owner, name)

    def spy(*args: Any) -> Any:
        seen.append(note(*args))
        return real(*args)

    monkeypatch.setattr(owner, name, spy)


def _chunk_rows(monkeypatch: pytest.MonkeyPatch, rows: int | None) -> None:
    """Chunks of ``rows`` rows of :data:`DIM` float32 (None: the default, every table in one)."""
    if rows is None:
        monkeypatch.delenv(ROW_CHUNK_BYTES_ENV, raising=False)
    else:
        monkeypatch.setenv(ROW_CHUNK_BYTES_ENV, str(rows * DIM * 4))


# --------------------------------------------------------------------------- the build and its payload


@pytest.mark.parametrize(("kind", "hash_block"), [("flat", 1 << 24), ("ivf", 1000), ("hnsw", 7)])
def test_the_payload_is_the_bytes_faiss_serializes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                                                   hash_block: int, no_whole_partition: None) -> None:
    """Streamed into the file in blocks of any size, the payload is ``faiss.serialize_index`` of
    the built index, stored contiguous (mappable), with its digest recorded."""
    config = _clustered_layout(tmp_path, rows=3000, dim=8, parts=2)
    built: list[Any] = []
    _spy(monkeypatch, library, "write", built, lambda index, sink: index)
    monkeypatch.setattr(index_file, "HASH_BLOCK", hash_block)
    _chunk_rows(monkeypatch, 100)
    result = build_index(config, "item", kind=kind, nlist=16)
    expected = faiss.serialize_index(built[0]).tobytes()
    with h5py.File(result.path, "r") as f:
        ds = f[PAYLOAD_DATASET]
        assert ds.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
        assert ds[()].tobytes() == expected
    assert result.bytes == len(expected)
    assert result.meta.payload_sha256 == hashlib.sha256(expected).hexdigest()


def test_the_build_reads_no_partition_whole_and_indexes_what_whole_partitions_gave(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_whole_partition: None) -> None:
    """Chunks of 1 or 3 rows or one chunk per table: the same IVF index, byte for byte (the sample
    gathered from chunks, the rows added chunk by chunk, the global embedding added to each)."""
    config, _ = _integer_layout(tmp_path, global_emb=True)
    digests = []
    for rows in (None, 3, 1):
        _chunk_rows(monkeypatch, rows)
        digests.append(build_index(config, "item", kind="ivf", metric="dot", nlist=2).meta.payload_sha256)
    assert len(set(digests)) == 1


def test_ivf_lists_sized_first_hold_what_adding_directly_gives() -> None:
    """Rows assigned to their lists in a first pass, lists allocated at their size, then added with
    those assignments: the index that adding each chunk directly builds, byte for byte."""
    rng = np.random.default_rng(0)
    chunks = [library.prepare(rng.standard_normal((n, 8)).astype(np.float32), "cos") for n in (700, 1, 300)]
    built = []
    for add in ("rows", "directly"):
        index = library.new_index("ivf", 8, {"nlist": 16})
        library.train(index, np.concatenate(chunks))
        if add == "rows":
            library.add_rows(index, "ivf", lambda what: iter(chunks))
        else:
            for values in chunks:
                index.add(values)
        built.append(faiss.serialize_index(index).tobytes())
    assert built[0] == built[1]


def test_a_payload_serialized_differently_twice_is_not_written(tmp_path: Path) -> None:
    """The payload is serialized twice (counted, then written): a writer that gives other bytes
    the second time leaves no file."""
    meta = IndexMeta(entity_type="item", version=1, metric="cos", add_global=False, dimension=2,
                     partition_rows=[1], fingerprint="", library="faiss", library_version="", kind="flat")
    path = tmp_path / naming.index_file("item", 1, "cos", "flat")
    for sizes, found in (([10, 12], "at least 12"), ([12, 10], "10")):
        calls = iter(sizes)

        def write(sink: Callable[[bytes], object], calls: Iterator[int] = calls) -> None:
            sink(bytes(next(calls)))

        with pytest.raises(PayloadSizeError, match=f"{path}: the index serialized to {sizes[0]} bytes, then to "
                                                   f"{found}; nothing was written"):
            write_index_file(path, meta, write)
        assert not path.exists() and not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- a search maps the index


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_a_mapped_index_answers_as_one_loaded_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    kind: str) -> None:
    if not hasattr(library.faiss_module(), "ZeroCopyIOReader"):
        pytest.skip("FAISS before 1.9 has no zero-copy reader: an index is read whole (the declared floor is 1.8)")
    config = _clustered_layout(tmp_path, rows=3000, dim=8, parts=2)
    build_index(config, "item", kind=kind, nlist=16)
    used: list[str] = []
    for name in ("view", "read"):
        _spy(monkeypatch, library, name, used, lambda *args, name=name: name)
    queries = np.random.default_rng(3).standard_normal((20, 8)).astype(np.float32)
    with open_index(config, "item") as mapped:
        held = mapped._index.referenced_objects[0]  # the payload's bytes, kept alive with the index
        while isinstance(held, np.ndarray):
            held = held.base
        assert isinstance(getattr(held, "obj", held), mmap.mmap)  # (through a memoryview)
        mapped_answer = mapped.top_k(queries, k=10, candidates=30)
        proposed = mapped.propose(queries, 30)
    with monkeypatch.context() as patched:
        patched.setattr(index_file, "mapped_rows", lambda ds, path: None)  # as for a remote or chunked payload
        with open_index(config, "item") as loaded:
            assert loaded.top_k(queries, k=10, candidates=30) == mapped_answer
            np.testing.assert_array_equal(np.stack(loaded.propose(queries, 30)), np.stack(proposed))
    assert used == ["view", "read"]


def test_a_damaged_mapped_payload_is_refused(tmp_path: Path) -> None:
    """The digest is checked before the payload is mapped."""
    config = _clustered_layout(tmp_path, rows=500, dim=8, parts=1)
    path = build_index(config, "item", kind="ivf", nlist=4).path
    with h5py.File(path, "r+") as f:
        f[PAYLOAD_DATASET][-3] = f[PAYLOAD_DATASET][-3] ^ 0xFF
    with pytest.raises(FormatError, match="index-damaged"):
        open_index(config, "item")


def test_an_indexed_search_reads_only_the_rows_it_reranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         no_whole_partition: None) -> None:
    config = _clustered_layout(tmp_path, rows=3000, dim=8, parts=2)
    build_index(config, "item", kind="ivf", nlist=16)
    names = ["item-1", "item-2000"]
    with open_index(config, "item") as index:
        read: list[int] = []
        _spy(monkeypatch, CheckpointDir, "read_embedding_rows", read, lambda *args: len(args[-1]))
        monkeypatch.setattr(CheckpointDir, "iter_embedding_rows", _refuse)
        found = indexed_neighbors(index, names, k=3, candidates=10)
    assert [len(f.neighbors) for f in found] == [3, 3]
    assert 0 < sum(read) <= len(names) * (1 + 11)  # the queries' rows, then at most their candidates


# --------------------------------------------------------------------------- exact scans, chunk by chunk


@pytest.mark.parametrize("global_emb", [False, True])
def test_neighbours_stream_partitions_and_rank_as_the_whole_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  global_emb: bool,
                                                                  no_whole_partition: None) -> None:
    """Chunks of 1 or 3 rows, blocks of 4 (a block spans chunks and partitions' ends): the same
    answer as one chunk per table, and as a brute force over the whole table, ties (a row
    planted in three partitions, integer scores) ranked by (partition, row)."""
    import pbgio.neighbors as neighbors

    config, table = _integer_layout(tmp_path, global_emb=global_emb)
    monkeypatch.setattr(neighbors, "MAX_BLOCK_ROWS", 4)
    queries = [2, 5, 8, 13]
    expected = [_brute_force(table, q, k=9) for q in queries]
    assert any(a[3] == b[3] for answer in expected for a, b in itertools.pairwise(answer))  # ties
    for rows in (None, 3, 1):
        _chunk_rows(monkeypatch, rows)
        assert _answers(config, [f"item-{q}" for q in queries], k=9) == expected


def test_indexed_neighbours_read_no_partition_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    no_whole_partition: None) -> None:
    config, table = _integer_layout(tmp_path, global_emb=True)
    _chunk_rows(monkeypatch, 2)
    build_index(config, "item", kind="flat", metric="dot")
    found = nearest_neighbors(config, "item", ["item-2", "item-8"], k=13, metric="dot", index=True)
    assert [[(n.name, n.partition, n.offset, n.score) for n in f.neighbors] for f in found] == \
        [_brute_force(table, q, k=13) for q in (2, 8)]


def _predictions(config: Path) -> list[Any]:
    """Top k of both sides, triple ranks and scores on the small model layout."""
    answers: list[Any] = []
    for user in ("user-0-3", "user-1-0"):
        answers.append(top_k(config, lhs=user, rel="follows", k=6, filter_paths=[config.parent / "edges"]))
        answers.append(top_k(config, rhs=user, rel="follows", k=6))
    answers.append(top_k(config, lhs="item-0-1", rel="likes", k=4))
    answers.append(rank_triple(config, "user-0-1", "follows", "user-1-2"))
    answers.append(score_triples(config, [("user-0-1", "follows", "user-1-2"), ("item-0-1", "likes", "item-0-5")]))
    return answers


def test_predictions_stream_partitions_and_answer_as_whole_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                no_whole_partition: None) -> None:
    """The exact scans of top k and triple ranks, in blocks of 2 rows, from chunks of 1 or 3 rows
    or one chunk per table: the same rankings, scores and ranks."""
    config = model_layout(tmp_path, operators=("complex_diagonal", "affine"), comparator="cos")
    monkeypatch.setattr(predict.scan, "MAX_BLOCK_ROWS", 2)
    answers = []
    for rows in (None, 3, 1):
        _chunk_rows(monkeypatch, rows)
        answers.append(_predictions(config))
    assert answers[0] == answers[1] == answers[2]


def test_indexed_predictions_read_only_the_rows_they_score(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          no_whole_partition: None) -> None:
    config = model_layout(tmp_path, operators=("translation", "translation"), comparator="dot", global_emb=True)
    for entity_type in ("user", "item"):
        build_index(config, entity_type, metric="dot")
    with Predictor(config) as exact:
        expected = [exact.top_k(rel="follows", lhs="user-0-3", k=3), exact.top_k(rel="likes", rhs="item-0-2", k=3)]
    monkeypatch.setattr(CheckpointDir, "iter_embedding_rows", _refuse)  # no scan: the index answers
    with Predictor(config, index=True, candidates=5) as indexed:
        found = [indexed.top_k(rel="follows", lhs="user-0-3", k=3), indexed.top_k(rel="likes", rhs="item-0-2", k=3)]
    for a, b in zip(expected, found, strict=True):
        assert b.searched.startswith("index_")
        assert [p.name for p in b.predictions] == [p.name for p in a.predictions]
        assert [p.score for p in b.predictions] == pytest.approx([p.score for p in a.predictions], rel=1e-6, abs=1e-5)


def test_the_cli_answers_the_same_with_tiny_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   no_whole_partition: None) -> None:
    from typer.testing import CliRunner

    from pbgio.cli import app as pbgio_app
    from pbgtrain.cli import app as pbgtrain_app

    config, _ = _integer_layout(tmp_path, global_emb=True)
    outputs = []
    for rows in (None, 1):
        _chunk_rows(monkeypatch, rows)
        found = CliRunner().invoke(pbgio_app, ["neighbors", str(config), "item-2", "--type", "item", "--metric",
                                               "dot", "-k", "5", "--json"])
        ranked = CliRunner().invoke(pbgtrain_app, ["predict", str(config), "--lhs", "item-2", "--rel", "r", "-k", "5",
                                                   "--json"])
        assert found.exit_code == 0 and ranked.exit_code == 0, found.output + ranked.output
        outputs.append((json.loads(found.stdout), json.loads(ranked.stdout)))
    assert outputs[0] == outputs[1]
