"""Issue 56, point 4: link prediction for featurized entity types, through the real CLIs.

Layouts are the featurized example (``pbgio example --featurized``: authors read documents that
are bags of words) made into a user's own graphs: the document on the lhs (``doc read_by author``,
a static relation with the ``affine`` operator), and on the rhs with dynamic relations (``reads``
and ``skims``, the ``diagonal`` operator). Each is imported and trained for two epochs.

Every answer is recomputed by hand, as the featurized guide tells a user to: ``pbgio embed`` for
the bag, ``pbgio export`` for the candidates and ``--relations-output`` for the operator,
applied in float64 numpy. The scores differ only by float32 rounding, bounded per score by the
standard first-order bound of floating-point sums (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1: a sum of n products is off by at most n·ε times the sum of their magnitudes,
ε = 2⁻²⁴), taken through the bag's mean (m features), the operator and the comparator's dot
product (dimension D); see :func:`bag_bound` and the bounds of each test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.cli import pbgio, pbgtrain

EPS = 2.0 ** -24
"""Unit roundoff of float32."""
K = 10
MARGIN = 1.01
"""The first-order bounds times this: room for the second-order terms they leave out."""


@dataclass(frozen=True)
class Graph:
    config: Path
    relation: str  # the relation the queries ask
    bag_side: str  # the featurized side of the relation
    test_bags: list[list[str]]  # the bags of test.tsv, in order
    test_authors: list[str]


def build(root: Path, *, lhs_featurized: bool, dynamic: bool, operator: str) -> Graph:
    """The featurized example at ``root`` as a graph of one's own, imported and trained."""
    made = pbgio("example", "--featurized", str(root), "--edges", "1000", "--seed", "3")
    assert made.returncode == 0, made.stderr
    config = Path(made.stdout.strip())
    raw = json.loads(config.read_text())
    name = "skims" if dynamic else ("read_by" if lhs_featurized else "reads")
    lhs, rhs = ("doc", "author") if lhs_featurized else ("author", "doc")
    raw["relations"] = [{"name": "all" if dynamic else name, "lhs": lhs, "rhs": rhs, "operator": operator}]
    raw.update(dynamic_relations=dynamic, global_emb=not dynamic, num_epochs=2)
    config.write_text(json.dumps(raw))
    bags, authors = [], []
    for split in ("train", "test"):
        lines = []
        for i, line in enumerate((root / f"{split}.tsv").read_text().splitlines()):
            author, _, words = line.split("\t")
            relation = ("reads", "skims")[i % 2] if dynamic else name
            lines.append(f"{words}\t{relation}\t{author}" if lhs_featurized else f"{author}\t{relation}\t{words}")
            if split == "test":
                bags.append(words.split())
                authors.append(author)
        if split == "test":  # twenty bags read again, their words reversed, by another author
            for j in range(0, 40, 2):
                shuffled = " ".join(reversed(bags[j]))
                other = authors[j + 1]
                lines.append(f"{shuffled}\t{name}\t{other}" if lhs_featurized else f"{other}\t{name}\t{shuffled}")
                bags.append(list(reversed(bags[j])))
                authors.append(other)
        (root / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    done = pbgio("import", str(config), str(root / "train.tsv"), str(root / "test.tsv"), "--no-progress")
    assert done.returncode == 0, done.stderr
    trained = pbgtrain("fit", str(config), "-p", "edge_paths=data/train", "--no-progress")
    assert trained.returncode == 0, trained.stderr
    return Graph(config, name, "lhs" if lhs_featurized else "rhs", bags, authors)


@pytest.fixture(scope="module")
def doc_first(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """``doc read_by author``: a static relation, its featurized type on the lhs, the affine operator."""
    return build(tmp_path_factory.mktemp("doc_first"), lhs_featurized=True, dynamic=False, operator="affine")


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """``author reads|skims doc``: dynamic relations, the featurized type on the rhs, the diagonal operator."""
    return build(tmp_path_factory.mktemp("dynamic"), lhs_featurized=False, dynamic=True, operator="diagonal")


# --------------------------------------------------------------------------- by hand


@dataclass(frozen=True)
class ByHand:
    """What a user gets from pbgio alone: bag vectors, the author table, the operators, the
    features' rows without and with the global embedding (for the bounds)."""

    bags: np.ndarray  # [B, D] pbgio embed
    authors: np.ndarray  # [N, D] pbgio export (global embedding added)
    names: list[str]
    relations: dict[str, dict[str, dict[str, np.ndarray]]]  # name -> side -> param -> values
    magnitudes: np.ndarray  # [B, D]: per bag, mean of |feature row| plus |global embedding|
    counts: np.ndarray  # [B]: features per bag


def by_hand(graph: Graph, bags: Sequence[Sequence[str]], out: Path) -> ByHand:
    config = str(graph.config)
    out.mkdir(exist_ok=True)
    (out / "bags.txt").write_text("".join(" ".join(bag) + "\n" for bag in bags))
    embedded = pbgio("embed", config, "--type", "doc", str(out / "bags.txt"), "-o", str(out / "bags.tsv"),
                     "--overwrite")
    assert embedded.returncode == 0, embedded.stderr
    vectors = np.loadtxt(out / "bags.tsv", delimiter="\t", dtype=np.float64, ndmin=2)[:, 1:]
    exported = pbgio("export", config, "-f", "npy", "-o", str(out / "with_global"), "--relations-output",
                     str(out / "relations.json"), "--relations-format", "json", "--overwrite")
    assert exported.returncode == 0, exported.stderr
    bare = pbgio("export", config, "-f", "npy", "-t", "doc", "--no-global", "-o", str(out / "bare"), "--overwrite")
    assert bare.returncode == 0, bare.stderr
    relations = {r["name"]: {side: {p: np.array(v["values"], dtype=np.float64) for p, v in params.items()}
                             for side, params in r["parameters"].items()}
                 for r in json.loads((out / "relations.json").read_text())["relations"]}
    features = json.loads((out / "with_global" / "doc.names.json").read_text())
    row = {name: i for i, name in enumerate(features)}
    plain = np.load(out / "bare" / "doc.npy").astype(np.float64)
    global_emb = np.abs(np.load(out / "with_global" / "doc.npy").astype(np.float64) - plain).max(0)
    magnitudes = np.stack([np.abs(plain[[row[f] for f in bag]]).mean(0) + global_emb for bag in bags])
    return ByHand(vectors, np.load(out / "with_global" / "author.npy").astype(np.float64),
                  json.loads((out / "with_global" / "author.names.json").read_text()), relations, magnitudes,
                  np.array([len(bag) for bag in bags]))


def bag_bound(hand: ByHand) -> np.ndarray:
    """[B, D]: how far the model's float32 bag mean (m - 1 additions, a division, the global
    embedding added) and pbgio embed's (float64, rounded once) can be apart, per component."""
    return (hand.counts[:, None] + 2) * EPS * hand.magnitudes


def affine_candidates(hand: ByHand, relation: str) -> tuple[np.ndarray, np.ndarray]:
    """The static relation's rhs operator applied to every author (its candidates): A·c + t, and
    a bound of its float32 error (D + 1 roundings of |A|·|c| + |t|)."""
    params = hand.relations[relation]["rhs"]
    matrix, shift = params["linear_transformation"], params["translation"]
    applied = hand.authors @ matrix.T + shift
    dimension = matrix.shape[0]
    return applied, (dimension + 1) * EPS * (np.abs(hand.authors) @ np.abs(matrix).T + np.abs(shift))


def predicted(graph: Graph, *args: str) -> dict:
    done = pbgtrain("predict", str(graph.config), "--rel", graph.relation, "-k", str(K), "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_same_top_k(answer: dict, names: list[str], scores: np.ndarray, bounds: np.ndarray) -> None:
    """The answer's top k are the by-hand top k, in order, each score within its bound; the by-hand
    order is decided beyond the bounds (else equal answers would not show the same ranking)."""
    order = np.argsort(-scores, kind="stable")[:K + 1]
    gaps = scores[order[:-1]] - scores[order[1:]]
    assert (gaps > bounds[order[:-1]] + bounds[order[1:]]).all(), "near ties: the by-hand order is not decided"
    assert [p["name"] for p in answer["predictions"]] == [names[i] for i in order[:K]]
    got = np.array([p["score"] for p in answer["predictions"]])
    assert (np.abs(got - scores[order[:K]]) <= bounds[order[:K]]).all(), (got, scores[order[:K]], bounds[order[:K]])


# --------------------------------------------------------------------------- predict


def test_lhs_features_rank_as_embed_export_and_the_rhs_operator_on_each_candidate(doc_first: Graph,
                                                                                  tmp_path: Path) -> None:
    """Static relation, bag on the lhs: score(u, v') = u · f(v'), the exported ``rhs`` operator applied
    to every candidate, not to the bag."""
    bag = doc_first.test_bags[0]
    answer = predicted(doc_first, "--lhs-features", " ".join(bag))
    hand = by_hand(doc_first, [bag], tmp_path)
    candidates, candidate_bound = affine_candidates(hand, doc_first.relation)
    u, du = hand.bags[0], bag_bound(hand)[0]
    scores = candidates @ u
    dimension = len(u)
    bounds = MARGIN * (dimension * EPS * np.abs(candidates) @ np.abs(u) + candidate_bound @ np.abs(u)
                       + np.abs(candidates) @ du)
    assert answer["side"] == "rhs" and answer["entity_type"] == "author" and answer["candidates"] == 200
    assert answer["bag"] == {"side": "lhs", "entity_type": "doc", "features": bag, "skipped": []}
    assert_same_top_k(answer, hand.names, scores, bounds)
    wrong_side = hand.authors @ u  # the operator left out: another answer, beyond the bounds
    assert np.abs(wrong_side - scores).max() > bounds.max()


def test_rhs_features_with_dynamic_relations_take_the_relations_rhs_operator_on_the_bag(dynamic: Graph,
                                                                                        tmp_path: Path) -> None:
    """Dynamic relations, bag on the rhs: score(u', v) = u' · h_r(v), the ``rhs`` record of relation
    r (its row of ``diagonals``) applied to the bag; the ``lhs`` record gives other scores."""
    bag = dynamic.test_bags[1]
    answer = predicted(dynamic, "--rhs-features", " ".join(bag))
    hand = by_hand(dynamic, [bag], tmp_path)
    own = hand.relations["skims"]["rhs"]["diagonals"]
    u, du = hand.bags[0], bag_bound(hand)[0]
    query = own * u
    dquery = np.abs(own) * du + EPS * np.abs(own * u)
    scores = hand.authors @ query
    bounds = MARGIN * (len(u) * EPS * np.abs(hand.authors) @ np.abs(query) + np.abs(hand.authors) @ dquery)
    assert answer["side"] == "lhs" and answer["query"] == {"rel": "skims", "rhs": " ".join(bag)}
    assert_same_top_k(answer, hand.names, scores, bounds)
    for other in (hand.relations["skims"]["lhs"]["diagonals"], hand.relations["reads"]["rhs"]["diagonals"]):
        assert np.abs(hand.authors @ (other * u) - scores).max() > bounds.max()


def test_queries_file_holds_one_bag_a_line_answered_as_lhs_features(doc_first: Graph, tmp_path: Path) -> None:
    bags = doc_first.test_bags[:3]
    queries = tmp_path / "queries.tsv"
    queries.write_text("".join(f"{'  '.join(bag)}\t{doc_first.relation}\t\n" for bag in bags))
    batch = pbgtrain("predict", str(doc_first.config), "--queries", str(queries), "-k", str(K), "--json")
    assert batch.returncode == 0, batch.stderr
    answers = json.loads(batch.stdout)
    assert [a["bag"]["features"] for a in answers] == bags
    for bag, answer in zip(bags, answers, strict=True):
        assert answer == predicted(doc_first, "--lhs-features", " ".join(bag))
    table = pbgtrain("predict", str(doc_first.config), "--queries", str(queries), "-k", "2")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "lhs\trel\trhs\trank\tname\tscore"
    assert lines[1].split("\t")[:4] == [" ".join(bags[0]), doc_first.relation, "", "1"]
    assert len(lines) == 1 + 2 * len(bags)
    pipes = tmp_path / "pipes.csv"  # another delimiter, another feature separator
    pipes.write_text(f"{'|'.join(bags[0])},{doc_first.relation},\n")
    piped = pbgtrain("predict", str(doc_first.config), "--queries", str(pipes), "--delimiter", "comma",
                     "--feature-separator", "|", "-k", str(K), "--json")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)[0]["predictions"] == answers[0]["predictions"]
    named = tmp_path / "named.tsv"  # the featurized side cannot be ranked
    named.write_text(f"\t{doc_first.relation}\t{doc_first.test_authors[0]}\n")
    refused = pbgtrain("predict", str(doc_first.config), "--queries", str(named))
    assert refused.returncode == 1
    assert "its lhs type 'doc' is featurized" in refused.stderr and "Traceback" not in refused.stderr


def test_unknown_features_are_an_error_naming_them_or_skipped_and_said(doc_first: Graph, tmp_path: Path) -> None:
    bag = doc_first.test_bags[2]
    config = str(doc_first.config)
    failed = pbgtrain("predict", config, "--rel", doc_first.relation, "--lhs-features", " ".join([*bag, "blockchain"]))
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: --lhs-features: no 'doc' feature named 'blockchain' in ")
    assert "--unknown ignore" in failed.stderr
    lines = tmp_path / "q.tsv"
    lines.write_text(f"{' '.join(bag)}\t{doc_first.relation}\t\nqubit {bag[0]} blockchain\t{doc_first.relation}\t\n")
    in_file = pbgtrain("predict", config, "--queries", str(lines))
    assert in_file.returncode == 1
    assert f"{lines}:2: no 'doc' feature named 'qubit' in " in in_file.stderr
    assert "(2 unknown names: 'qubit', 'blockchain')" in in_file.stderr
    skipped = predicted(doc_first, "--lhs-features", " ".join([*bag, "blockchain"]), "--unknown", "ignore")
    assert skipped["bag"] == {"side": "lhs", "entity_type": "doc", "features": bag, "skipped": ["blockchain"]}
    assert skipped["predictions"] == predicted(doc_first, "--lhs-features", " ".join(bag))["predictions"]
    said = pbgtrain("predict", config, "--rel", doc_first.relation, "--lhs-features", f"{bag[0]} blockchain",
                    "--unknown", "ignore")
    assert said.returncode == 0
    assert "lhs: a bag of 1 'doc' features; unknown features skipped: 'blockchain'" in said.stderr
    nothing = pbgtrain("predict", config, "--rel", doc_first.relation, "--lhs-features", "blockchain qubit",
                       "--unknown", "ignore")
    assert nothing.returncode == 1
    assert "--lhs-features: expected at least one feature of 'doc', found none after skipping the unknown ones: " \
           "'blockchain', 'qubit'" in nothing.stderr


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--lhs-features", ""], 2, "--lhs-features: expected at least one feature, found none"),
    (["--lhs-features", "w0001", "--rhs-features", "w0002"], 2, "give one of --lhs-features and --rhs-features"),
    (["--lhs-features", "w0001", "--rhs", "author_001"], 2, "--lhs-features is the query of a top-k: give it "
                                                            "without --rhs"),
    (["--rhs-features", "w0001"], 1, "relation 'read_by': its rhs type 'author' is not featurized: give its entity "
                                     "by name (--rhs)"),
    (["--rhs", "author_001"], 1, "relation 'read_by': its lhs type 'doc' is featurized: its entities are bags of "
                                 "features, with no names to look up and no table to rank; to rank the rhs "
                                 "candidates of a bag, give the bag (--lhs-features)"),
    (["--lhs", "w0001"], 1, "to rank the rhs candidates of a bag, give the bag (--lhs-features)"),
    (["--rhs", "author_001", "--unknown", "ignore"], 2, "--unknown and --feature-separator apply to bags of "
                                                        "features"),
])
def test_bag_options_refused_with_the_options_given(doc_first: Graph, args: list[str], code: int,
                                                    message: str) -> None:
    done = pbgtrain("predict", str(doc_first.config), "--rel", doc_first.relation, *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_lhs_features_without_rel_names_the_option(doc_first: Graph) -> None:
    done = pbgtrain("predict", str(doc_first.config), "--lhs-features", "w0001")
    assert done.returncode == 2
    assert "--lhs-features: give the relation with --rel" in done.stderr


# --------------------------------------------------------------------------- eval --filter


def test_eval_filter_ranks_the_authors_of_each_bag_filtered_by_bag(doc_first: Graph, tmp_path: Path) -> None:
    """``eval --filter`` ranks the table side (authors) for each test bag, says that it ranked that
    side only and why, and leaves out the authors known to read the same bag (the same words, in
    any order): its MRR lies within the by-hand MRR's bounds, filtered and raw."""
    hand = by_hand(doc_first, doc_first.test_bags, tmp_path)
    candidates, candidate_bound = affine_candidates(hand, doc_first.relation)
    scores = hand.bags @ candidates.T  # [edges, authors]
    bounds = MARGIN * (len(candidates[0]) * EPS * np.abs(hand.bags) @ np.abs(candidates).T
                       + np.abs(hand.bags) @ candidate_bound.T + bag_bound(hand) @ np.abs(candidates).T)
    author = np.array([hand.names.index(a) for a in doc_first.test_authors])
    edges = np.arange(len(author))
    positive, slack = scores[edges, author], bounds[edges, author]
    same_bag = {}
    for i, bag in enumerate(doc_first.test_bags):
        same_bag.setdefault(tuple(sorted(bag)), set()).add(int(author[i]))
    known = np.zeros_like(scores, dtype=bool)
    for i, bag in enumerate(doc_first.test_bags):
        known[i, sorted(same_bag[tuple(sorted(bag))])] = True
    known[edges, author] = True  # (the positive's own slot)

    def mrr_range(left_out: np.ndarray) -> tuple[float, float]:
        above = (scores - positive[:, None]) > bounds + slack[:, None]
        maybe = (scores - positive[:, None]) >= -(bounds + slack[:, None])
        best, worst = 1 + (above & ~left_out).sum(1), 1 + (maybe & ~left_out).sum(1)
        return float(np.mean(1 / worst)), float(np.mean(1 / best))

    own_slot = np.zeros_like(known)
    own_slot[edges, author] = True
    filtered, raw = mrr_range(known), mrr_range(own_slot)
    assert filtered[0] > raw[1], "the planted bags read twice do not change the ranks: the test shows nothing"
    config = str(doc_first.config)
    for flags, (low, high) in ((["--filter", "data/test"], filtered), (["--all-entities"], raw)):
        done = pbgtrain("eval", config, "--edges", "data/test", *flags, "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert low - 1e-12 <= result["metrics"]["mrr"] <= high + 1e-12, (flags, low, result["metrics"]["mrr"], high)
        assert list(result["per_side"]) == ["rhs"] and result["sides_ranked"] == ["rhs"]
        assert result["not_ranked"] == [{"relation": "read_by", "side": "lhs", "entity_type": "doc",
                                         "why": "featurized"}]
        assert result["count"] == len(author)
    line = pbgtrain("eval", config, "--edges", "data/test", "--filter", "data/test")
    assert line.returncode == 0, line.stderr
    assert ("(filtered (against test), all 200 entities as candidates, rhs side only; not ranked: the lhs side of "
            f"'read_by' ('doc' is featurized: its bags have no table to rank against); {len(author)} edges)"
            ) in line.stdout


def test_eval_filter_with_dynamic_relations_ranks_the_plain_side_or_refuses_naming_the_option(dynamic: Graph) -> None:
    config = str(dynamic.config)
    done = pbgtrain("eval", config, "--edges", "data/test", "--filter", "data/train", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result["per_side"]) == ["lhs"] and result["count"] == len(dynamic.test_bags)
    assert result["not_ranked"] == [{"relation": None, "side": "rhs", "entity_type": "doc", "why": "featurized"}]
    assert "lhs side only; not ranked: the rhs side of every relation ('doc' is featurized" in result["protocol"]
    refused = pbgtrain("eval", config, "--edges", "data/test", "--filter", "data/train", "-p", "disable_lhs_negs=true")
    assert refused.returncode == 1
    assert ("--filter: expected a relation with a plain side to rank against all entities, found every side that "
            "takes negatives featurized (entity types ['doc']") in refused.stderr
    assert "[config-featurized-all-negs]" in refused.stderr and "--all-entities" not in refused.stderr
