"""``pbgtrain predict`` (pbgtrain.predict): top-k, triple ranks and triple scores by name, checked
against the model's scoring recomputed here in float64 numpy from the checkpoint files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import ConfigSchema, load_config, parse_config
from pbgio.edges import read_bucket
from pbgio.entities import read_entity_count, read_entity_names, read_relation_names
from pbgio.errors import UnknownNameError
from pbgio.example import TEST_EDGE_PATH, build_example
from pbgio.names import relation_names
from pbgio.spec import naming
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.testing import small_valid_layout, write_layout
from pbgio.testing.layouts import CheckpointContents, checkpoint_metadata, expected_params
from pbgtrain import predict
from pbgtrain.cli import app
from pbgtrain.predict import PredictError, Ranking, parse_triples, rank_triple, score_triples, top_k

Floats = NDArray[np.float64]
NameTriple = tuple[str, str, str]


# --------------------------------------------------------------------------- layouts


def model_layout(root: Path, *, operators: tuple[str, str] = ("translation", "diagonal"), comparator: str = "cos",
                 bias: bool = False, global_emb: bool = True, max_norm: float | None = None, dynamic: bool = False,
                 seed: int = 0) -> Path:
    """The small valid layout (user: 2 partitions; item: 1) with these model settings and a random
    checkpoint (version 1). Static: follows (user→user), likes (item→item); dynamic: interacts
    (user→item) with relation ids buys, views, rates."""
    layout = small_valid_layout(featurized=False, dynamic=dynamic, seed=seed)
    raw = layout.config.to_dict()
    for relation, operator in zip(raw["relations"], operators, strict=False):
        relation["operator"] = operator
    raw.update(comparator=comparator, bias=bias, global_emb=global_emb and not dynamic, max_norm=max_norm)
    cfg = parse_config(raw, "test")
    assert layout.checkpoint is not None
    rng = np.random.default_rng(seed + 1)
    params = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in expected_params(cfg, layout.dynamic_rel_count).items()}
    layout.config = cfg
    layout.checkpoint = CheckpointContents(1, layout.checkpoint.embeddings, ModelState(params),
                                         checkpoint_metadata(cfg, 1))
    return write_layout(root, layout)


def random_checkpoint(config_path: Path, seed: int = 0) -> None:
    """Commit version 1 with random embeddings and parameters for a layout without a checkpoint."""
    cfg = load_config(config_path)
    root = config_path.parent
    rng = np.random.default_rng(seed)
    embeddings = {(t, p): EmbeddingsState(rng.standard_normal(
        (read_entity_count(root / cfg.entity_path, t, p), cfg.entity_dimension(t))).astype(np.float32))
        for t, e in cfg.entities.items() for p in range(e.num_partitions)}
    params = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in expected_params(cfg, None).items()}
    write_checkpoint(CheckpointDir(root / cfg.checkpoint_path), 1, embeddings=embeddings, model=ModelState(params),
                     config=cfg)


@pytest.fixture(scope="module")
def static_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model (translation, diagonal; cos; global embeddings) on the small layout."""
    return model_layout(tmp_path_factory.mktemp("static"))


# --------------------------------------------------------------------------- the reference


def apply_operator(name: str, params: dict[str, Floats], x: Floats) -> Floats:
    if name == "none":
        return x
    if name == "diagonal":
        return x * params["diagonal"]
    if name == "translation":
        return x + params["translation"]
    if name == "linear":
        return x @ params["linear_transformation"].T
    if name == "affine":
        return x @ params["linear_transformation"].T + params["translation"]
    assert name == "complex_diagonal"
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    r, i = params["real"], params["imag"]
    return np.concatenate([a * r - b * i, a * i + b * r], axis=-1)


def compare(name: str, bias: bool, query: Floats, candidates: Floats) -> Floats:
    """The comparator of one query [D] with candidates [N, D]."""
    if bias:
        return compare(name, False, query[1:], candidates[:, 1:]) + query[0] + candidates[:, 0]
    if name == "dot":
        return candidates @ query
    if name == "cos":
        q = query / max(np.linalg.norm(query), 1e-30)
        c = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-30)
        return c @ q
    squared = ((candidates - query) ** 2).sum(1)
    return -np.sqrt(np.maximum(squared, 1e-30)) if name == "l2" else -squared


@dataclass
class Reference:
    """The model's scores, recomputed from the files of a layout (float64)."""

    cfg: ConfigSchema
    root: Path
    params: dict[str, Floats]
    names: dict[str, list[str]]  # type -> names, partition 0 first
    rows: dict[str, Floats]  # type -> raw rows in the same order
    parts: dict[tuple[str, int], list[str]]
    rel_names: list[str]

    @classmethod
    def load(cls, config_path: Path) -> Reference:
        cfg = load_config(config_path)
        root = config_path.parent
        ckpt = CheckpointDir(root / cfg.checkpoint_path)
        entity_path = root / cfg.entity_path
        names: dict[str, list[str]] = {}
        rows: dict[str, Floats] = {}
        parts: dict[tuple[str, int], list[str]] = {}
        for etype, entity in cfg.entities.items():
            chunks = []
            names[etype] = []
            for part in range(entity.num_partitions):
                parts[(etype, part)] = read_entity_names(entity_path, etype, part)
                names[etype] += parts[(etype, part)]
                chunks.append(ckpt.read_embeddings(etype, part).embeddings.astype(np.float64))
            rows[etype] = np.concatenate(chunks)
        params = {k: v.astype(np.float64) for k, v in ckpt.read_model().params.items()}
        return cls(cfg, root, params, names, rows, parts, relation_names(cfg, entity_path))

    def vectors(self, etype: str) -> Floats:
        """Rows as the model scores them before the operator: max_norm applied, global embedding added."""
        x = self.rows[etype]
        if self.cfg.max_norm is not None:
            norms = np.linalg.norm(x, axis=1, keepdims=True)
            x = x * np.where(norms > self.cfg.max_norm, self.cfg.max_norm / (norms + 1e-7), 1.0)
        key = global_embedding_name(etype)
        return x + self.params[key] if self.cfg.global_emb else x

    def operator(self, rel: str, side: str) -> tuple[str, dict[str, Floats]]:
        rel_id = self.rel_names.index(rel)
        if self.cfg.dynamic_relations:
            prefix = f"relations/0/operator/{side}/"  # parameters [R, ...], named in the plural
            singular = {"diagonals": "diagonal", "translations": "translation",
                        "linear_transformations": "linear_transformation"}
            return self.cfg.relations[0].operator, {singular.get(k[len(prefix):], k[len(prefix):]): v[rel_id]
                                                    for k, v in self.params.items() if k.startswith(prefix)}
        prefix = f"relations/{rel_id}/operator/rhs/"
        return self.cfg.relations[rel_id].operator, {k[len(prefix):]: v for k, v in self.params.items()
                                                     if k.startswith(prefix)}

    def types(self, rel: str) -> tuple[str, str]:
        schema = self.cfg.relations[0 if self.cfg.dynamic_relations else self.rel_names.index(rel)]
        return schema.lhs, schema.rhs

    def scores(self, rel: str, side: str, query: str) -> tuple[list[str], Floats]:
        """Every candidate of ``side`` (names, scores) for the query entity on the other side."""
        lhs_t, rhs_t = self.types(rel)
        query_t, cand_t = (lhs_t, rhs_t) if side == "rhs" else (rhs_t, lhs_t)
        q = self.vectors(query_t)[self.names[query_t].index(query)][None]
        c = self.vectors(cand_t)
        if self.cfg.dynamic_relations:  # rank rhs: c(g(u), v'); rank lhs: c(u', h(v))
            name, params = self.operator(rel, "lhs" if side == "rhs" else "rhs")
            q = apply_operator(name, params, q)
        else:  # the operator goes on the rhs
            name, params = self.operator(rel, "rhs")
            if side == "rhs":
                c = apply_operator(name, params, c)
            else:
                q = apply_operator(name, params, q)
        return self.names[cand_t], compare(self.cfg.comparator, self.cfg.bias, q[0], c)

    def triple_score(self, triple: NameTriple, side: str = "rhs") -> float:
        lhs, rel, rhs = triple
        names, scores = self.scores(rel, side, lhs if side == "rhs" else rhs)
        return float(scores[names.index(rhs if side == "rhs" else lhs)])

    def known(self, edge_dirs: list[Path]) -> set[NameTriple]:
        """Every edge of these edge directories, by names."""
        out = set()
        nl, nr = self.cfg.bucket_grid()
        for directory in edge_dirs:
            for bl in range(nl):
                for br in range(nr):
                    edges = read_bucket(directory / naming.bucket_file(bl, br))
                    for rel, lhs, rhs in zip(edges.rel, edges.lhs, edges.rhs, strict=True):
                        lhs_t, rhs_t = self.types(self.rel_names[rel])
                        lp = bl if self.cfg.num_partitions(lhs_t) > 1 else 0
                        rp = br if self.cfg.num_partitions(rhs_t) > 1 else 0
                        out.add((self.parts[(lhs_t, lp)][lhs], self.rel_names[rel], self.parts[(rhs_t, rp)][rhs]))
        return out


def check_ranking(ranking: Ranking, ref: Reference, rel: str, side: str, query: str, k: int,
                  known: AbstractSet[NameTriple] = frozenset()) -> None:
    """``ranking`` is the brute-force top k: every candidate scored, the known edges left out."""
    names, scores = ref.scores(rel, side, query)

    def triple(candidate: str) -> NameTriple:
        return (query, rel, candidate) if side == "rhs" else (candidate, rel, query)

    kept = [i for i, name in enumerate(names) if triple(name) not in known]
    order = sorted(kept, key=lambda i: (-scores[i], i))[:k]  # ties: lower (partition, row) first
    got = ranking.predictions
    assert [p.name for p in got] == [names[i] for i in order], (rel, side, query)
    assert [p.rank for p in got] == list(range(1, len(order) + 1))
    np.testing.assert_allclose([p.score for p in got], scores[order], rtol=1e-4, atol=1e-5)
    assert ranking.candidates == len(kept)
    assert ranking.excluded == len(names) - len(kept)
    lhs_t, rhs_t = ref.types(rel)
    assert ranking.entity_type == (rhs_t if side == "rhs" else lhs_t)


# --------------------------------------------------------------------------- top k


COMBOS = [  # (follows' operator, likes' operator, comparator, bias, global_emb, max_norm)
    ("translation", "diagonal", "cos", False, True, None),
    ("diagonal", "complex_diagonal", "dot", False, True, None),
    ("complex_diagonal", "linear", "l2", False, True, 1.0),
    ("affine", "none", "squared_l2", True, True, None),
    ("linear", "translation", "dot", True, False, None),
]


@pytest.mark.parametrize(("op_follows", "op_likes", "comparator", "bias", "global_emb", "max_norm"), COMBOS)
def test_top_k_is_the_brute_force_ranking(tmp_path: Path, op_follows: str, op_likes: str, comparator: str,
                                          bias: bool, global_emb: bool, max_norm: float | None) -> None:
    config = model_layout(tmp_path, operators=(op_follows, op_likes), comparator=comparator, bias=bias,
                          global_emb=global_emb, max_norm=max_norm)
    ref = Reference.load(config)
    for rel, etype in (("follows", "user"), ("likes", "item")):
        for query in ref.names[etype]:  # user: both partitions
            check_ranking(top_k(config, lhs=query, rel=rel, k=3), ref, rel, "rhs", query, 3)
            check_ranking(top_k(config, rhs=query, rel=rel, k=3), ref, rel, "lhs", query, 3)
    everything = top_k(config, lhs="user-1-2", rel="follows", k=100)  # more than there are: all 5 + 4 users
    check_ranking(everything, ref, "follows", "rhs", "user-1-2", 100)
    assert len(everything.predictions) == 9
    assert {p.partition for p in everything.predictions} == {0, 1}


@pytest.mark.parametrize("operator", ["affine", "complex_diagonal", "translation"])
def test_top_k_with_dynamic_relations(tmp_path: Path, operator: str) -> None:
    config = model_layout(tmp_path, operators=(operator, operator), comparator="dot", dynamic=True)
    ref = Reference.load(config)
    for rel in ("buys", "views", "rates"):
        for user in ref.names["user"]:  # rank items for a user (g_r on the user)
            check_ranking(top_k(config, lhs=user, rel=rel, k=4), ref, rel, "rhs", user, 4)
        for item in ref.names["item"]:  # rank users of both partitions for an item (h_r on the item)
            check_ranking(top_k(config, rhs=item, rel=rel, k=4), ref, rel, "lhs", item, 4)
    a = top_k(config, lhs="user-0-0", rel="buys", k=7)
    b = top_k(config, lhs="user-0-0", rel="views", k=7)
    assert [p.score for p in a.predictions] != [p.score for p in b.predictions]  # each relation id its operator


def test_scores_do_not_depend_on_the_block_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = model_layout(tmp_path, operators=("complex_diagonal", "affine"), comparator="cos")
    whole = [top_k(config, lhs=u, rel="follows", k=6) for u in ("user-0-3", "user-1-0")]
    monkeypatch.setattr(predict.scan, "MAX_BLOCK_ROWS", 2)  # a partition of 5 users in blocks of 2, 2, 1
    blocked = [top_k(config, lhs=u, rel="follows", k=6) for u in ("user-0-3", "user-1-0")]
    for a, b in zip(whole, blocked, strict=True):  # the same rows; scores up to BLAS rounding of other shapes
        assert [(p.name, p.partition, p.offset) for p in a.predictions] == \
            [(p.name, p.partition, p.offset) for p in b.predictions]
        np.testing.assert_allclose([p.score for p in a.predictions], [p.score for p in b.predictions], rtol=1e-6)


def test_relative_filter_paths_follow_the_layouts_path_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library resolves ``filter_paths`` as every command resolves ``--filter``: relative to the
    config's folder (not the current directory), ``./PATH`` to the current directory."""
    config = model_layout(tmp_path, operators=("diagonal", "translation"), comparator="dot")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    user = Reference.load(config).names["user"][0]
    ranking = top_k(config, rel="follows", lhs=user, k=5, filter_paths=["edges"])
    assert ranking.filter_paths == [str(tmp_path / "edges")]
    triple = rank_triple(config, user, "follows", user, filter_paths=["edges"])
    assert triple.filter_paths == [str(tmp_path / "edges")]
    shutil.copytree(tmp_path / "edges", elsewhere / "edges")
    here = top_k(config, rel="follows", lhs=user, k=5, filter_paths=["./edges"])
    assert here.filter_paths == [str(elsewhere / "edges")]
    assert here.excluded == ranking.excluded


def test_filtered_top_k_leaves_known_edges_out(tmp_path: Path) -> None:
    config = model_layout(tmp_path, operators=("diagonal", "translation"), comparator="dot")
    ref = Reference.load(config)
    edges = tmp_path / "edges"
    known = ref.known([edges])
    assert any(t[1] == "follows" for t in known) and any(t[1] == "likes" for t in known)
    left_out = 0
    for rel, etype in (("follows", "user"), ("likes", "item")):
        for query in ref.names[etype]:
            for side, arg in (("rhs", "lhs"), ("lhs", "rhs")):
                ranking = top_k(config, rel=rel, k=5, filter_paths=[edges], **{arg: query})
                check_ranking(ranking, ref, rel, side, query, 5, known)
                assert ranking.filter_paths == [str(edges)]
                left_out += ranking.excluded
    assert left_out > 0  # the filter did something: every known edge is left out once per side
    assert left_out == 2 * len(known)


def test_exclude_self_leaves_the_query_entity_out(tmp_path: Path) -> None:
    """``--exclude-self``: for a relation between entities of one type the query is no candidate
    (the ranking otherwise the brute force one, known edges as before); across types nothing changes."""
    config = model_layout(tmp_path, operators=("diagonal", "translation"), comparator="dot")
    ref = Reference.load(config)
    edges = tmp_path / "edges"
    known = ref.known([edges])
    for query in ref.names["user"]:
        for side, arg in (("rhs", "lhs"), ("lhs", "rhs")):
            plain = top_k(config, rel="follows", k=20, filter_paths=[edges], **{arg: query})
            ranking = top_k(config, rel="follows", k=20, filter_paths=[edges], exclude_self=True, **{arg: query})
            self_loop = (query, "follows", query) in known
            check_ranking(replace(ranking, excluded=ranking.excluded + (not self_loop)), ref,  # excluded: known edges
                          "follows", side, query, 20, known | {(query, "follows", query)})
            assert query not in [p.name for p in ranking.predictions] and ranking.self_excluded
            assert ranking.excluded == plain.excluded and ranking.candidates == plain.candidates - (not self_loop)
            assert f"{query} itself left out" in ranking.describe()
    between = model_layout(tmp_path / "dynamic", operators=("diagonal", "diagonal"), comparator="dot", dynamic=True)
    across = top_k(between, rel="buys", lhs="user-0-0", k=3, exclude_self=True)  # users → items: no self
    assert not across.self_excluded and across == top_k(between, rel="buys", lhs="user-0-0", k=3)


def test_filter_reads_every_bucket_of_an_unpartitioned_type(tmp_path: Path) -> None:
    """In the bundled example, items (one partition) sit in the rhs buckets of both user partitions."""
    config = build_example(tmp_path / "example", num_edges=600)
    random_checkpoint(config)
    ref = Reference.load(config)
    edge_dirs = [config.parent / "edges" / "train", config.parent / TEST_EDGE_PATH]
    known = ref.known(edge_dirs)
    buckets = {bucket: read_bucket(edge_dirs[0] / naming.bucket_file(*bucket)) for bucket in ((0, 0), (0, 1))}
    assert all(int((b.rel == 1).sum()) > 0 for b in buckets.values())  # likes edges in both rhs buckets
    for user in ("user000", "user001", "user035", "user059"):
        ranking = top_k(config, lhs=user, rel="likes", k=40, filter_paths=edge_dirs)
        check_ranking(ranking, ref, "likes", "rhs", user, 40, known)
        assert ranking.excluded == len({t for t in known if t[0] == user and t[1] == "likes"}) > 0
    for item in ("item000", "item017"):
        ranking = top_k(config, rhs=item, rel="likes", k=60, filter_paths=edge_dirs)
        check_ranking(ranking, ref, "likes", "lhs", item, 60, known)


@pytest.mark.gpu
def test_cuda_ranks_as_the_cpu(static_layout: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for query in ("user-0-0", "user-1-3"):
        cpu = top_k(static_layout, lhs=query, rel="follows", k=5)
        gpu = top_k(static_layout, lhs=query, rel="follows", k=5, device="cuda")
        assert [p.name for p in gpu.predictions] == [p.name for p in cpu.predictions]
        np.testing.assert_allclose([p.score for p in gpu.predictions], [p.score for p in cpu.predictions], rtol=1e-5)
    cpu_scores = score_triples(static_layout, [("user-0-0", "follows", "user-1-1")]).scores[0]
    gpu_scores = score_triples(static_layout, [("user-0-0", "follows", "user-1-1")], device="cuda").scores[0]
    assert gpu_scores.score == pytest.approx(cpu_scores.score, rel=1e-5)


# --------------------------------------------------------------------------- a triple's rank, triples' scores


def brute_rank(ref: Reference, triple: NameTriple, side: str, known: AbstractSet[NameTriple]) -> tuple[int, int]:
    lhs, rel, rhs = triple
    names, scores = ref.scores(rel, side, lhs if side == "rhs" else rhs)
    own = rhs if side == "rhs" else lhs
    positive = ref.triple_score(triple, side)
    others = [s for name, s in zip(names, scores, strict=True) if name != own
              and ((lhs, rel, name) if side == "rhs" else (name, rel, rhs)) not in known]
    return 1 + sum(s >= positive for s in others), len(others) + 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_rank_triple_is_the_brute_force_rank(tmp_path: Path, dynamic: bool) -> None:
    config = model_layout(tmp_path, operators=("complex_diagonal", "diagonal"), comparator="cos", dynamic=dynamic)
    ref = Reference.load(config)
    known = ref.known([tmp_path / "edges"])
    rels = ["buys", "rates"] if dynamic else ["follows"]
    lhs_t, rhs_t = ref.types(rels[0])
    checked = 0
    for rel in rels:
        for lhs in ref.names[lhs_t][::2]:
            for rhs in ref.names[rhs_t][::3]:
                triple = (lhs, rel, rhs)
                for filters, against in (([], set()), ([tmp_path / "edges"], known)):
                    got = rank_triple(config, *triple, filter_paths=filters)
                    assert (got.rhs_rank, got.rhs_out_of) == brute_rank(ref, triple, "rhs", against)
                    assert (got.lhs_rank, got.lhs_out_of) == brute_rank(ref, triple, "lhs", against)
                    assert got.score == pytest.approx(ref.triple_score(triple, "rhs"), rel=1e-4, abs=1e-5)
                    assert got.lhs_side_score == pytest.approx(ref.triple_score(triple, "lhs"), rel=1e-4, abs=1e-5)
                    checked += 1
    assert checked >= 12


@pytest.mark.parametrize("filtered", [False, True])
def test_rank_triple_agrees_with_pbgtrain_eval(tmp_path: Path, filtered: bool) -> None:
    """One partition per type: ``pbgtrain eval --all-entities`` ranks against the same candidates."""
    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

    layout = small_valid_layout(featurized=False, partitioned=False, edges_per_bucket=20)
    config = write_layout(tmp_path, layout)
    edges = tmp_path / "edges"
    ref = Reference.load(config)
    triples = [(ref.parts[(ref.types(ref.rel_names[r])[0], 0)][lhs], ref.rel_names[r],
                ref.parts[(ref.types(ref.rel_names[r])[1], 0)][rhs])
               for r, lhs, rhs in zip(*(getattr(read_bucket(edges / naming.bucket_file(0, 0)), c)
                                        for c in ("rel", "lhs", "rhs")), strict=True)]
    filters = [edges] if filtered else []
    ranks = [rank_triple(config, *t, filter_paths=filters) for t in triples]
    metrics = evaluate_checkpoint(load_run_config(config), EvalOptions(all_entities=True, filter_paths=filters)).metrics
    assert metrics.count == len(triples) == 20
    assert metrics.per_side["rhs"].mrr == pytest.approx(np.mean([1 / r.rhs_rank for r in ranks]), rel=1e-12)
    assert metrics.per_side["lhs"].mrr == pytest.approx(np.mean([1 / r.lhs_rank for r in ranks]), rel=1e-12)
    assert metrics.per_side["rhs"].mr == pytest.approx(np.mean([r.rhs_rank for r in ranks]), rel=1e-12)


def test_eval_per_relation_is_each_relations_ranks(tmp_path: Path) -> None:
    """``pbgtrain eval --per-relation``: each relation's figures are its edges' ranks (rank_triple,
    brute force against the same candidates), and the total is ``eval``'s without it."""
    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

    layout = small_valid_layout(featurized=False, partitioned=False, edges_per_bucket=20)
    config = write_layout(tmp_path, layout)
    edges = tmp_path / "edges"
    ref = Reference.load(config)
    bucket = read_bucket(edges / naming.bucket_file(0, 0))
    by_name: dict[str, list[Ranking]] = {}
    for r, lhs, rhs in zip(bucket.rel, bucket.lhs, bucket.rhs, strict=True):
        name = ref.rel_names[r]
        lhs_type, rhs_type = ref.types(name)
        by_name.setdefault(name, []).append(rank_triple(config, ref.parts[(lhs_type, 0)][lhs], name,
                                                        ref.parts[(rhs_type, 0)][rhs], filter_paths=[edges]))
    options = EvalOptions(all_entities=True, filter_paths=[edges])
    plain = evaluate_checkpoint(load_run_config(config), options).metrics
    result = evaluate_checkpoint(load_run_config(config), replace(options, per_relation=True))
    assert result.per_relation is not None and set(result.per_relation) == set(by_name)
    for name, metrics in result.per_relation.items():
        ranks = by_name[name]
        assert metrics.count == len(ranks)
        assert metrics.per_side["rhs"].mrr == pytest.approx(np.mean([1 / r.rhs_rank for r in ranks]), rel=1e-12)
        assert metrics.per_side["lhs"].mr == pytest.approx(np.mean([r.lhs_rank for r in ranks]), rel=1e-12)
    assert (result.metrics.mrr, result.metrics.mr, result.metrics.hits) == (plain.mrr, plain.mr, plain.hits)
    as_json = result.to_dict()["per_relation"]
    assert set(as_json) == set(by_name) and all("mrr" in v["metrics"] for v in as_json.values())


def test_eval_per_relation_with_dynamic_relations_needs_all_entities(tmp_path: Path) -> None:
    from pbgio.errors import UsageError
    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

    config = model_layout(tmp_path, operators=("complex_diagonal", "complex_diagonal"), comparator="dot",
                          global_emb=False, dynamic=True)
    sampled = ["eval_num_batch_negs=2", "eval_num_uniform_negs=2"]  # fewer candidates than entities: sampled
    with pytest.raises(UsageError, match="--per-relation: with dynamic relations"):
        evaluate_checkpoint(load_run_config(config, sampled), EvalOptions(per_relation=True))
    result = evaluate_checkpoint(load_run_config(config), EvalOptions(per_relation=True, all_entities=True))
    plain = evaluate_checkpoint(load_run_config(config), EvalOptions(all_entities=True))
    assert result.per_relation is not None
    assert set(result.per_relation) <= set(read_relation_names(config.parent / "entities"))
    assert sum(m.count for m in result.per_relation.values()) == plain.metrics.count
    assert result.metrics.mrr == pytest.approx(plain.metrics.mrr, rel=1e-12)


@pytest.mark.parametrize("dynamic", [False, True])
def test_score_triples_matches_the_reference_in_order(tmp_path: Path, dynamic: bool) -> None:
    config = model_layout(tmp_path, operators=("affine", "complex_diagonal"), comparator="l2", bias=True,
                          dynamic=dynamic)
    ref = Reference.load(config)
    triples = sorted(ref.known([tmp_path / "edges"]))[::-1]  # mixed relations and partitions
    triples += [(rhs, rel, lhs) for lhs, rel, rhs in triples if ref.types(rel)[0] == ref.types(rel)[1]][:5]
    result = score_triples(config, triples)
    assert result.version == 1 and result.dynamic == dynamic
    assert [(s.lhs, s.rel, s.rhs) for s in result.scores] == triples
    for scored, triple in zip(result.scores, triples, strict=True):
        assert scored.score == pytest.approx(ref.triple_score(triple, "rhs"), rel=1e-4, abs=1e-5)
        assert scored.lhs_side_score == pytest.approx(ref.triple_score(triple, "lhs"), rel=1e-4, abs=1e-5)
    sides_differ = any(abs(s.score - s.lhs_side_score) > 1e-3 for s in result.scores)
    assert sides_differ == dynamic  # static relations score a triple one way
    one = score_triples(config, [triples[3]]).scores[0]  # batching does not change a score
    assert one.score == pytest.approx(result.scores[3].score, rel=1e-6)


def test_parse_triples_locates_problems() -> None:
    assert parse_triples("a\tr\tb\n\n  \nc\tr\td") == [("a", "r", "b", "<triples>:1"), ("c", "r", "d", "<triples>:4")]
    from pbgio.errors import InputError

    with pytest.raises(InputError, match=r"t\.tsv:2: expected 3 non-empty fields .* found 2 field"):
        parse_triples("a\tr\tb\na\tr\n", "t.tsv")
    with pytest.raises(InputError, match=r"t\.tsv:1: expected 3 non-empty"):
        parse_triples("a\t\tb", "t.tsv")


# --------------------------------------------------------------------------- errors


def test_unknown_names_are_named_with_their_dictionary(static_layout: Path) -> None:
    entities = static_layout.parent / "entities"
    with pytest.raises(UnknownNameError) as info:
        top_k(static_layout, lhs="nobody", rel="follows")
    assert info.value.names == ["nobody"]
    assert str(info.value) == (f"no 'user' entity named 'nobody' in {entities / 'entity_names_user_0.json'}, "
                               "entity_names_user_1.json")
    with pytest.raises(UnknownNameError, match="no 'user' entity named 'item-0-1'"):  # an item is not a user
        top_k(static_layout, lhs="item-0-1", rel="follows")
    with pytest.raises(UnknownNameError, match=r"no relation named 'folows' in the config's relations "
                                               r"\(follows, likes\); did you mean 'follows'\?"):
        top_k(static_layout, rhs="user-0-1", rel="folows")
    with pytest.raises(UnknownNameError, match="no 'item' entity named 'item-9-9'"):
        rank_triple(static_layout, "item-0-1", "likes", "item-9-9")
    triples = parse_triples("user-0-1\tfollows\tuser-1-1\nuser-0-1\tfollows\tghost\n", "t.tsv")
    with pytest.raises(UnknownNameError, match=r"^t\.tsv:2: no 'user' entity named 'ghost' in .*entity_names_user_0"):
        score_triples(static_layout, triples)
    with pytest.raises(UnknownNameError, match=r"^triple 2: no relation named 'hates'"):
        score_triples(static_layout, [("user-0-1", "follows", "user-1-1"), ("user-0-1", "hates", "user-1-1")])


def test_dynamic_relation_names_come_from_their_file(tmp_path: Path) -> None:
    config = model_layout(tmp_path, dynamic=True)
    with pytest.raises(UnknownNameError, match=r"no relation named 'interacts' in .*dynamic_rel_names\.json") as info:
        top_k(config, lhs="user-0-0", rel="interacts")
    known = read_relation_names(config.parent / "entities")
    assert str(info.value).endswith("; the relations are " + ", ".join(repr(n) for n in known[:10])
                                    + (f", … ({len(known):,} in all)" if len(known) > 10 else ""))


def test_refusals(static_layout: Path, tmp_path: Path) -> None:
    with pytest.raises(PredictError, match="exactly one of lhs and rhs"):
        top_k(static_layout, lhs="user-0-0", rhs="user-0-1", rel="follows")
    with pytest.raises(PredictError, match="exactly one of lhs and rhs"):
        top_k(static_layout, rel="follows")
    with pytest.raises(PredictError, match="k >= 1"):
        top_k(static_layout, lhs="user-0-0", rel="follows", k=0)
    featurized = write_layout(tmp_path / "feat", small_valid_layout())
    with pytest.raises(PredictError, match="'describes': its lhs type 'doc' is featurized"):
        top_k(featurized, rhs="item-0-0", rel="describes")
    untrained = write_layout(tmp_path / "untrained", small_valid_layout(featurized=False, checkpoint=False))
    from pbgio.errors import MissingArtifactError

    with pytest.raises(MissingArtifactError, match="train first"):
        top_k(untrained, lhs="user-0-0", rel="follows")


# --------------------------------------------------------------------------- the command line


def test_cli_top_k_both_directions(static_layout: Path) -> None:
    runner = CliRunner()
    config = str(static_layout)
    done = runner.invoke(app, ["predict", config, "--lhs", "user-0-1", "--rel", "follows", "-k", "3"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    expected = top_k(static_layout, lhs="user-0-1", rel="follows", k=3)
    assert lines[0].split() == ["rank", "name", "score"]
    assert [line.split()[1] for line in lines[1:]] == [p.name for p in expected.predictions]
    assert "top 3 rhs candidates for (user-0-1, follows, ?) among 9 'user' entities" in done.stderr
    done = runner.invoke(app, ["predict", config, "--rhs", "user-1-0", "--rel", "follows", "--json",
                               "--filter", str(static_layout.parent / "edges")])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    expected = top_k(static_layout, rhs="user-1-0", rel="follows", filter_paths=[static_layout.parent / "edges"])
    assert data["side"] == "lhs" and data["query"] == {"rel": "follows", "rhs": "user-1-0"}
    assert [p["name"] for p in data["predictions"]] == [p.name for p in expected.predictions]
    assert data["excluded"] == expected.excluded and data["candidates"] + data["excluded"] == 9


def test_cli_triple_rank_and_triples_file(static_layout: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    config = str(static_layout)
    done = runner.invoke(app, ["predict", config, "--lhs", "user-0-1", "--rel", "follows", "--rhs", "user-1-3",
                               "--json"])
    assert done.exit_code == 0, done.output
    expected = rank_triple(static_layout, "user-0-1", "follows", "user-1-3")
    assert json.loads(done.stdout) == json.loads(json.dumps(expected.to_dict()))
    done = runner.invoke(app, ["predict", config, "--lhs", "user-0-1", "--rel", "follows", "--rhs", "user-1-3"])
    assert done.exit_code == 0 and done.stdout.splitlines()[1].split()[:3] == [
        "rhs", str(expected.rhs_rank), str(expected.rhs_out_of)]
    triples = tmp_path / "t.tsv"
    triples.write_text("user-0-1\tfollows\tuser-1-3\nitem-0-2\tlikes\titem-0-5\n", encoding="utf-8")
    done = runner.invoke(app, ["predict", config, "--triples", str(triples)])
    assert done.exit_code == 0, done.output
    header, *rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert header == ["lhs", "rel", "rhs", "score"] and "score: the model's score of the triple" in done.stderr
    assert [r[:3] for r in rows] == [["user-0-1", "follows", "user-1-3"], ["item-0-2", "likes", "item-0-5"]]
    assert float(rows[0][3]) == pytest.approx(expected.score, rel=1e-6)
    done = runner.invoke(app, ["predict", config, "--triples", "-", "--json"], input=triples.read_text())
    assert done.exit_code == 0, done.output
    assert [t["rhs"] for t in json.loads(done.stdout)["triples"]] == ["user-1-3", "item-0-5"]


def test_cli_errors_and_exit_codes(static_layout: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    config = str(static_layout)
    done = runner.invoke(app, ["predict", config, "--lhs", "nobody", "--rel", "follows"])
    assert done.exit_code == 1
    assert "error: no 'user' entity named 'nobody' in" in done.stderr and "entity_names_user_0.json" in done.stderr
    bad = tmp_path / "bad.tsv"
    bad.write_text("user-0-1\tfollows\n", encoding="utf-8")
    done = runner.invoke(app, ["predict", config, "--triples", str(bad)])
    assert done.exit_code == 1 and "bad.tsv:1: expected 3 non-empty fields" in done.stderr
    for args in (["--lhs", "user-0-1"], ["--rel", "follows"], ["--triples", str(bad), "--lhs", "user-0-1"],
                 ["--triples", str(tmp_path / "missing.tsv")], ["--lhs", "user-0-1", "--rel", "follows", "-k", "0"]):
        done = runner.invoke(app, ["predict", config, *args])
        assert done.exit_code == 2, (args, done.output)


def test_the_command_line_starts_without_torch() -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom pbgtrain.cli import app\n"
            "done = CliRunner().invoke(app, ['predict', '--help'])\nassert done.exit_code == 0, done.output\n"
            "assert 'torch' not in sys.modules, 'pbgtrain predict --help must not import torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
