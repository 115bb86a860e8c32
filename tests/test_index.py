"""Nearest-neighbour indexes: built beside their version, refused when stale, searched exactly
re-ranked, used by ``pbgio neighbors --index`` and ``pbgtrain predict --index``, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, write_checkpoint
from pbgio.cli import app as pbgio_app
from pbgio.config import load_config
from pbgio.errors import FormatError, MissingArtifactError, StaleIndexError
from pbgio.index import build_index, open_index
from pbgio.names import names_at
from pbgio.neighbors import nearest_neighbors
from pbgio.spec import naming
from pbgio.spec.index import META_ATTR
from pbgio.testing import small_valid_layout, write_layout
from pbgio.validate import validate_path
from tests.profiles import examples
from tests.test_predict import model_layout

pytest.importorskip("faiss")

REPO = Path(__file__).resolve().parents[1]


def _clustered_layout(root: Path, rows: int = 6000, dim: int = 16, parts: int = 3, metric: str = "cos",
                      sizes: list[int] | None = None, seed: int = 0) -> Path:
    """A checkpoint of one type 'item' with planted clusters, named item-{i}, in ``parts`` partitions
    (of ``sizes`` rows when given)."""
    from pbgio.checkpoint import ModelState
    from pbgio.config import parse_config
    from pbgio.edges import EdgeBucket, write_bucket
    from pbgio.entities import write_entity_count, write_entity_names

    cfg = parse_config({"entities": {"item": {"num_partitions": parts}},
                        "relations": [{"name": "r", "lhs": "item", "rhs": "item"}], "dimension": dim,
                        "global_emb": False, "comparator": metric, "entity_path": "data", "edge_paths": ["data/edges"],
                        "checkpoint_path": "model"})
    (root / "data").mkdir(parents=True)
    (root / "config.json").write_text(cfg.to_json())
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(rows // 50, 1), dim)).astype(np.float32)
    table = centres[rng.integers(0, len(centres), rows)] + 0.5 * rng.standard_normal((rows, dim)).astype(np.float32)
    bounds = np.linspace(0, rows, parts + 1).astype(int) if sizes is None else np.concatenate([[0], np.cumsum(sizes)])
    embeddings = {}
    for p in range(parts):
        write_entity_count(root / "data", "item", p, int(bounds[p + 1] - bounds[p]))
        write_entity_names(root / "data", "item", p, [f"item-{i}" for i in range(bounds[p], bounds[p + 1])])
        embeddings[("item", p)] = EmbeddingsState(np.ascontiguousarray(table[bounds[p]:bounds[p + 1]]), None)
    write_checkpoint(CheckpointDir(root / "model"), 1, embeddings=embeddings, model=ModelState({}, None), config=cfg)
    empty = np.zeros(0, np.int64)
    for lhs in range(parts):
        for rhs in range(parts):
            write_bucket(root / "data" / "edges" / naming.bucket_file(lhs, rhs), EdgeBucket(empty, empty, empty))
    return root / "config.json"


def _overlap(a: list, b: list) -> float:
    return sum(len({n.name for n in x.neighbors} & {n.name for n in y.neighbors}) for x, y in zip(a, b, strict=True)) \
        / sum(len(x.neighbors) for x in a)


def test_a_flat_index_answers_exactly_what_the_exact_scan_answers(tmp_path: Path) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    built = build_index(config, "user")
    assert built.path.name == naming.index_file("user", 1, "cos", "flat") == "index_user.cos.flat.v1.h5"
    assert built.meta.kind == "flat"
    names = ["user-0-0", "user-0-3", "user-1-1"]
    exact = nearest_neighbors(config, "user", names, k=4)
    indexed = nearest_neighbors(config, "user", names, k=4, index=True)
    assert [[(n.name, n.score, n.partition, n.offset) for n in r.neighbors] for r in indexed] == \
        [[(n.name, n.score, n.partition, n.offset) for n in r.neighbors] for r in exact]
    assert indexed[0].searched == "index_user.cos.flat.v1.h5, faiss flat, exact" and exact[0].searched == "exact"
    assert validate_path(config).ok


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_indexes_find_the_exact_neighbours_with_exact_scores(tmp_path: Path, kind: str) -> None:
    config = _clustered_layout(tmp_path)
    build_index(config, "item", kind=kind, nlist=40 if kind == "ivf" else None)
    names = [f"item-{i}" for i in range(0, 6000, 150)]
    exact = nearest_neighbors(config, "item", names, k=10)
    indexed = nearest_neighbors(config, "item", names, k=10, index=True)
    assert _overlap(indexed, exact) >= 0.95
    exact_scores = {(r.query, n.name): n.score for r in exact for n in r.neighbors}
    shared = [(r.query, n) for r in indexed for n in r.neighbors if (r.query, n.name) in exact_scores]
    # re-ranked exactly: the same float32 products (a GEMM of another shape may round the last bit apart)
    assert shared and all(n.score == pytest.approx(exact_scores[(q, n.name)], rel=1e-6, abs=1e-7) for q, n in shared)
    assert all(r.query not in [n.name for n in r.neighbors] for r in indexed)


def test_a_loaded_index_serves_many_searches_and_a_batch_equals_single_queries(tmp_path: Path) -> None:
    config = _clustered_layout(tmp_path)
    build_index(config, "item", kind="ivf", nlist=40, nprobe=8)
    with open_index(config, "item") as index:
        assert index.params["nprobe"] == 8 and index.meta.rows == 6000
        queries = index.rows(np.array([0, 1, 2]), np.array([5, 6, 7]))
        batch = index.top_k(queries, 5)
        single = [index.top_k(queries[i:i + 1], 5)[0] for i in range(3)]
        assert [[(p, o) for _, p, o in b] for b in batch] == [[(p, o) for _, p, o in b] for b in single]
        assert [s for b in batch for s, _, _ in b] == pytest.approx([s for b in single for s, _, _ in b], rel=1e-6)
    with pytest.raises(Exception, match="closed"):
        index.top_k(queries, 5)


def test_an_index_of_another_version_is_refused_and_removed_with_its_version(tmp_path: Path) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    built = build_index(config, "user")
    ckpt = CheckpointDir(tmp_path / "checkpoint")
    cfg = load_config(config)
    embeddings = {(t, p): ckpt.read_embeddings(t, p, 1) for t, e in cfg.entities.items()
                  for p in range(e.num_partitions)}
    from pbgio.checkpoint import commit_steps

    for step in commit_steps(ckpt, 2, embeddings=embeddings, model=ckpt.read_model(1), config=cfg):
        step.run()
    assert not built.path.exists()  # superseded with version 1's files
    with pytest.raises(MissingArtifactError, match=r"version 2 .*pbgio index build"):
        open_index(config, "user")
    build_index(config, "user", version=2)
    shutil.copyfile(ckpt.path / naming.index_file("user", 2, "cos", "flat"),
                    ckpt.path / naming.index_file("user", 3, "cos", "flat"))
    with pytest.raises(FormatError, match="index-version-mismatch"):
        open_index(config, "user", version=3)


def test_a_stale_index_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    build_index(config, "user")
    path = tmp_path / "checkpoint" / naming.embeddings_file("user", 0, 1)
    with h5py.File(path, "r+") as f:  # the table rewritten in place after the build
        f["embeddings"][0] = f["embeddings"][0] * 2
    stale = r"tables changed after the index was built.*rebuild it with pbgio index build --type user \[index-stale\]"
    with pytest.raises(StaleIndexError, match=stale):
        open_index(config, "user")
    with pytest.raises(StaleIndexError):
        nearest_neighbors(config, "user", ["user-0-1"], index=True)
    assert validate_path(config).rule_ids() == {"index-stale"}
    build_index(config, "user")
    assert validate_path(config).ok and open_index(config, "user").meta.rows == 9


def test_a_damaged_or_foreign_index_is_refused(tmp_path: Path) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    path = build_index(config, "user").path
    with h5py.File(path, "r+") as f:
        f["index"][10] = f["index"][10] ^ 0xFF
    with pytest.raises(FormatError, match="index-damaged"):
        open_index(config, "user")
    with h5py.File(path, "r+") as f:  # bytes that are not an index, with their own digest recorded
        meta = json.loads(f.attrs[META_ATTR])
        del f["index"]
        f["index"] = np.frombuffer(b"not a faiss index at all", np.uint8)
        meta["payload_sha256"] = hashlib.sha256(b"not a faiss index at all").hexdigest()
        f.attrs[META_ATTR] = json.dumps(meta)
    with pytest.raises(FormatError, match=r"expected a FAISS index type pbg builds.*found 'not '.*\[index-damaged\]"):
        open_index(config, "user")
    with h5py.File(path, "r+") as f:
        f.attrs[META_ATTR] = json.dumps({"entity_type": "user"})
    with pytest.raises(FormatError, match="index-foreign"):
        open_index(config, "user")


def test_wrong_metric_and_bad_arguments_are_refused(tmp_path: Path) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    build_index(config, "user", metric="dot")
    from pbgio.neighbors import NeighborsError

    with pytest.raises(MissingArtifactError, match=r"a cos index of 'user'.*found index_user.dot.flat.v1.h5 "
                                                   r"\(flat by dot.*build one: pbgio index build CONFIG --type user "
                                                   r"--metric cos"):
        nearest_neighbors(config, "user", ["user-0-0"], metric="cos", index=True)

    with pytest.raises(NeighborsError, match="metric"):
        nearest_neighbors(config, "user", ["user-0-0"], metric="l1", index=True)  # type: ignore[arg-type]
    from pbgio.index import IndexBuildError

    with pytest.raises(IndexBuildError, match="featurized"):
        build_index(write_layout(tmp_path / "f", small_valid_layout()), _featurized_type(tmp_path))
    with pytest.raises(IndexBuildError, match="kind"):
        build_index(config, "user", kind="lsh")


def _featurized_type(tmp_path: Path) -> str:
    cfg = load_config(tmp_path / "f" / "config.json")
    return next(t for t, e in cfg.entities.items() if e.featurized)


def test_the_cli_builds_and_searches(tmp_path: Path) -> None:
    config = _clustered_layout(tmp_path)
    runner = CliRunner()
    built = runner.invoke(pbgio_app, ["index", "build", str(config), "--type", "item", "--kind", "ivf", "--nlist",
                                      "30", "--json"])
    assert built.exit_code == 0, built.output
    (tmp_path / "names.txt").write_text("item-1\nitem-2\n\nitem-3\n")
    found = runner.invoke(pbgio_app, ["neighbors", str(config), "--type", "item", "--names-file",
                                      str(tmp_path / "names.txt"), "--index", "--nprobe", "4", "-k", "3", "--json"])
    assert found.exit_code == 0, found.output
    result = json.loads(found.stdout)
    assert [r["query"] for r in result] == ["item-1", "item-2", "item-3"]
    built_nprobe = json.loads(built.stdout)["meta"]["params"]["nprobe"]
    assert result[0]["searched"].startswith("index_item.cos.ivf.v1.h5, faiss ivf (nlist 30, nprobe 4), approximate "
                                            "(recall@10 ≈ ")
    assert result[0]["searched"].endswith(f" measured at build with nprobe {built_nprobe} and 100 candidates; not at "
                                          "nprobe 4)")
    assert len(result[0]["neighbors"]) == 3
    assert runner.invoke(pbgio_app, ["neighbors", str(config), "item-1", "--type", "item", "--nprobe", "3"]
                         ).exit_code == 2


def test_kill_9_during_a_build_leaves_no_index(tmp_path: Path) -> None:
    """A build killed while it writes leaves no index file (the previous one, if any, intact)."""
    config = _clustered_layout(tmp_path, rows=60000, dim=32, parts=2)
    target = tmp_path / "model" / naming.index_file("item", 1, "cos", "flat")
    code = textwrap.dedent(f"""
        import pbgio.index_file as f
        from pbgio.index import build_index
        real = f.write_format_version
        def slow(handle):
            real(handle)
            print("writing", flush=True)
            import time; time.sleep(60)
        f.write_format_version = slow
        build_index({str(config)!r}, "item", kind="flat")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"  # inside the write of the file
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not target.exists()
    assert validate_path(config).ok
    build_index(config, "item", kind="flat")  # a later build succeeds over the leftover temp file
    assert target.exists() and open_index(config, "item").meta.rows == 60000
    assert not [p for p in (tmp_path / "model").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(("operator", "dynamic"), [("complex_diagonal", True), ("affine", False),
                                                   ("translation", False)])
def test_predict_with_an_index_returns_the_exact_top_k(tmp_path: Path, operator: str, dynamic: bool) -> None:
    """The query moved through the relation's operator (dot comparator): the index's top k,
    re-ranked by the model, is the exact scan's, with the exact scores, on both sides."""
    from pbgtrain.predict import Predictor

    config = model_layout(tmp_path, operators=(operator, operator), comparator="dot", dynamic=dynamic,
                          global_emb=True)
    cfg = load_config(config)
    for entity_type in cfg.entities:
        build_index(config, entity_type, metric="dot")
    rels = ["buys", "views"] if dynamic else [r.name for r in cfg.relations]
    with Predictor(config) as exact, Predictor(config, index=True, candidates=5) as indexed:
        for rel in rels:
            relation = cfg.relations[0] if dynamic else next(r for r in cfg.relations if r.name == rel)
            for side, etype in (("lhs", relation.lhs), ("rhs", relation.rhs)):
                for name in names_at(config.parent / cfg.entity_path, etype, 0, [0, 1]):
                    a = exact.top_k(rel=rel, k=3, **{side: name})  # type: ignore[arg-type]
                    b = indexed.top_k(rel=rel, k=3, **{side: name})  # type: ignore[arg-type]
                    candidates = relation.rhs if side == "lhs" else relation.lhs
                    assert b.searched.startswith(f"index_{candidates}.dot.flat.v1.h5, faiss flat"), b.searched
                    assert [p.name for p in b.predictions] == [p.name for p in a.predictions]
                    # scored exactly both ways, by products of other shapes: float32 rounding of the
                    # operands (norms near 1), not of the score (an affine score can cancel to 0.02)
                    assert [p.score for p in b.predictions] == pytest.approx([p.score for p in a.predictions],
                                                                             rel=1e-6, abs=1e-5)


@pytest.mark.parametrize(("comparator", "operators", "why"), [
    ("l2", ("none", "none"), "the l2 comparator ranks by a distance"),
    ("cos", ("diagonal", "diagonal"), "the cos comparator with the diagonal operator on the rhs side"),
])
def test_predict_falls_back_to_the_exact_scan_and_says_why(tmp_path: Path, comparator: str,
                                                            operators: tuple[str, str], why: str) -> None:
    from pbgtrain.predict import top_k

    config = model_layout(tmp_path, operators=operators, comparator=comparator)
    cfg = load_config(config)
    build_index(config, cfg.relations[0].rhs, metric="cos")
    name = names_at(config.parent / cfg.entity_path, cfg.relations[0].lhs, 0, [0])[0]
    exact = top_k(config, rel=cfg.relations[0].name, lhs=name)
    ranking = top_k(config, rel=cfg.relations[0].name, lhs=name, index=True)
    assert ranking.searched.startswith(f"exact ({why}")
    assert ranking.predictions == exact.predictions


def test_predict_cos_without_a_candidate_operator_uses_the_index(tmp_path: Path) -> None:
    """cos ranks lhs candidates of a static relation by cos(u' + g, f(v)): the index over the rows
    with the global embedding added answers it."""
    from pbgtrain.predict import top_k

    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="cos")
    cfg = load_config(config)
    relation = cfg.relations[0]
    build_index(config, relation.lhs, metric="cos")
    name = names_at(config.parent / cfg.entity_path, relation.rhs, 0, [1])[0]
    exact = top_k(config, rel=relation.name, rhs=name, k=4)
    ranking = top_k(config, rel=relation.name, rhs=name, k=4, index=True, candidates=4)
    assert ranking.searched.startswith(f"index_{relation.lhs}.cos.flat.v1.h5, faiss flat")
    assert [p.name for p in ranking.predictions] == [p.name for p in exact.predictions]
    assert [p.score for p in ranking.predictions] == pytest.approx([p.score for p in exact.predictions], rel=1e-6,
                                                                   abs=1e-7)


def test_predict_queries_file_answers_every_query_with_a_header(tmp_path: Path) -> None:
    from pbgtrain.cli import app as pbgtrain_app

    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="dot")
    cfg = load_config(config)
    relation = cfg.relations[0]
    build_index(config, relation.rhs, metric="dot")
    build_index(config, relation.lhs, metric="dot")
    lhs = names_at(config.parent / cfg.entity_path, relation.lhs, 0, [0])[0]
    rhs = names_at(config.parent / cfg.entity_path, relation.rhs, 0, [0])[0]
    (tmp_path / "q.tsv").write_text(f"{lhs}\t{relation.name}\t\n\t{relation.name}\t{rhs}\n")
    result = CliRunner().invoke(pbgtrain_app, ["predict", str(config), "--queries", str(tmp_path / "q.tsv"),
                                               "--index", "-k", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().split("\n")
    assert lines[0] == "lhs\trel\trhs\trank\tname\tscore" and len(lines) == 5
    assert lines[1].startswith(f"{lhs}\t{relation.name}\t\t1\t")
    assert lines[3].startswith(f"\t{relation.name}\t{rhs}\t1\t")
    bad = CliRunner().invoke(pbgtrain_app, ["predict", str(config), "--lhs", lhs, "--rhs", rhs, "--rel",
                                            relation.name, "--index"])
    assert bad.exit_code == 2


def test_an_index_is_built_and_searched_on_remote_storage(tmp_path: Path) -> None:
    """Like every artifact, the index is written to and read from an fsspec URL (memory://)."""
    fsspec = pytest.importorskip("fsspec")
    import uuid

    write_layout(tmp_path / "local", small_valid_layout(featurized=False))
    bucket = f"pbg-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").put(str(tmp_path / "local"), f"/{bucket}/run", recursive=True)
    config = f"memory://{bucket}/run/config.json"
    built = build_index(config, "user")
    assert str(built.path).startswith("memory://") and built.path.name == naming.index_file("user", 1, "cos", "flat")
    names = ["user-0-0", "user-1-3"]
    exact = nearest_neighbors(config, "user", names, k=3)
    indexed = nearest_neighbors(config, "user", names, k=3, index=True)
    assert [[(n.name, n.score) for n in r.neighbors] for r in indexed] == \
        [[(n.name, n.score) for n in r.neighbors] for r in exact]
    report = validate_path(config)
    assert report.ok and report.checked.get("index files") == 1


@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=3).filter(lambda s: sum(s) > 1),
       dim=st.integers(1, 6), metric=st.sampled_from(["cos", "dot"]), seed=st.integers(0, 2**16))
@settings(max_examples=examples(30), suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_round_trip_a_flat_index_answers_as_the_exact_scan(tmp_path_factory: pytest.TempPathFactory,
                                                           sizes: list[int], dim: int, metric: str, seed: int) -> None:
    """Any table of up to 90 rows (empty partitions, one dimension, where cos ties every row): build,
    validate, open, and the index's top k (positions and scores) is the exact scan's. (The index
    proposes 100 rows; ties beyond them are the index's to break.)"""
    from pbgio.topk import VectorScorer, scan_partitions

    root = tmp_path_factory.mktemp("prop")
    rows = sum(sizes)
    config = _clustered_layout(root, rows=rows, dim=dim, parts=len(sizes), metric=metric, sizes=sizes, seed=seed)
    build_index(config, "item", kind="flat", metric=metric)
    assert validate_path(config).ok
    with open_index(config, "item") as index:
        queries = index.rows(np.zeros(2, np.int64) + next(p for p, n in enumerate(sizes) if n), np.array([0, 0]))
        found = index.top_k(queries, k=min(5, rows))
        scorer = VectorScorer(queries, metric, "cpu")  # type: ignore[arg-type]

        def open_partition(part: int) -> tuple[int, object]:
            table = index.rows_source.partition(part)
            return len(table), lambda s, e: scorer(table[s:e])

        scan = scan_partitions(range(len(sizes)), open_partition, k=min(5, rows), block_rows=7, queries=2)
    for got, top in zip(found, scan.tops, strict=True):
        assert [(p, o) for _, p, o in got] == [(p, o) for _, p, o in top.items()]
        assert [s for s, _, _ in got] == pytest.approx([s for s, _, _ in top.items()], rel=1e-5, abs=1e-6)


def test_without_faiss_the_build_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_layout(tmp_path, small_valid_layout(featurized=False))
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
    done = CliRunner().invoke(pbgio_app, ["index", "build", str(config), "--type", "user"])
    assert done.exit_code == 2
    assert "not installed" in done.stderr and "pip install 'pbg[ann]'" in done.stderr
    assert not list((tmp_path / "checkpoint").glob("index_*"))
    assert validate_path(config).ok  # a checkpoint without an index is complete
