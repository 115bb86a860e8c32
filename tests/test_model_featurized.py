"""Featurized entities in the model: bag means, their gradients against a dense reference, the
row updates of the features, and the negative-sampling rules of docs/guides/featurized.md."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    FeatureBags,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    batch_loss,
    forward_batch,
    gather_rows,
    score_candidates,
    train_step,
)
from pbgtrain.model.lookup import bag_means
from tests.profiles import examples

SAME_BATCH = NegativeSampling(num_batch_negs=4, num_uniform_negs=0)


def _spec(operator: str = "diagonal", *, reg: float = 0.0, global_emb: bool = True, lhs_featurized: bool = False,
          comparator: str = "dot", loss_fn: str = "softmax") -> ModelSpec:
    featurized = frozenset({"doc", "author"} if lhs_featurized else {"doc"})
    return ModelSpec({"author": 6, "doc": 6}, (RelationSpec("reads", "author", "doc", operator=operator),),
                     comparator=comparator, loss_fn=loss_fn, regularization_coef=reg, global_emb=global_emb,
                     lr=0.1, relation_lr=0.1, train_negatives=SAME_BATCH, eval_negatives=SAME_BATCH,
                     featurized=featurized)


def _model(spec: ModelSpec) -> EmbeddingModel:
    model = EmbeddingModel(spec)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 1.0)
    return model


BAGS = [[0, 3, 3], [1], [], [2, 4, 5, 0], [7, 6], [5]]  # a repeated feature, an empty bag


def _batch(lhs_bags: FeatureBags | None = None) -> EdgeBatch:
    n = len(BAGS)
    return EdgeBatch(torch.tensor([0, 1, 2, 3, 1, 0]) if lhs_bags is None else torch.full((n,), -1),
                     torch.full((n,), -1), 0, lhs_bags=lhs_bags, rhs_bags=FeatureBags.of(BAGS))


@pytest.mark.parametrize(("comparator", "loss_fn", "operator", "reg"), [
    ("dot", "softmax", "diagonal", 0.0), ("cos", "ranking", "translation", 0.0),
    ("l2", "logistic", "complex_diagonal", 1e-2), ("dot", "softmax", "linear", 1e-2),
])
def test_bag_mean_gradients_match_a_dense_reference(comparator: str, loss_fn: str, operator: str,
                                                    reg: float) -> None:
    """The featurized path (gathered features, embedding_bag means) gives every feature row the
    gradient that autograd gives a dense table whose docs are explicit means of its rows."""
    spec = _spec(operator, reg=reg, comparator=comparator, loss_fn=loss_fn)
    model = _model(spec)
    gen = torch.Generator().manual_seed(0)
    authors = EntityTable.random(4, 6, init_scale=0.3, generator=gen)
    features = EntityTable.random(8, 6, init_scale=0.3, generator=gen)
    batch = _batch()

    fwd = forward_batch(model, authors, features, batch, SAME_BATCH, requires_grad=True)
    loss = batch_loss(model, fwd.scores, batch) + (fwd.reg if fwd.reg is not None else 0)
    loss.backward()
    got = torch.zeros(8, 6)
    for g in fwd.gathered:
        if g.table is features:
            got.index_add_(0, g.ids, g.leaf.grad)

    dense = features.weights.clone().requires_grad_(True)
    docs = torch.stack([dense[bag].mean(0) if bag else torch.zeros(6) for bag in BAGS])  # reference means
    doc_table = EntityTable(docs)  # one row per edge: a plain table derived from the features
    plain = EdgeBatch(batch.lhs, torch.arange(len(BAGS)), 0)
    ref_model = EmbeddingModel(dataclasses.replace(spec, featurized=frozenset()))  # same parameters, plain docs
    ref_model.load_state_dict(model.state_dict())
    ref = forward_batch(ref_model, authors, doc_table, plain, SAME_BATCH, requires_grad=True)
    ref_loss = batch_loss(ref_model, ref.scores, plain) + (ref.reg if ref.reg is not None else 0)
    (expected,) = torch.autograd.grad(ref_loss, dense)

    torch.testing.assert_close(loss.detach(), ref_loss.detach())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_bag_means_finite_difference_gradcheck() -> None:
    rows = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 2, 2, 4, 1])
    offsets = torch.tensor([0, 3, 3, 5])
    assert torch.autograd.gradcheck(lambda r: bag_means(r, index, offsets), (rows,))
    out = bag_means(rows, index, offsets)
    torch.testing.assert_close(out[0], rows[[0, 2, 2]].mean(0))
    assert out[1].abs().sum() == 0  # an empty bag embeds to zeros


def test_train_step_updates_exactly_the_bags_features_with_row_adagrad() -> None:
    spec = _spec()
    model = _model(spec)
    gen = torch.Generator().manual_seed(0)
    authors = EntityTable.random(4, 6, init_scale=0.3, generator=gen)
    features = EntityTable.random(10, 6, init_scale=0.3, generator=gen)
    before = features.weights.clone()
    batch = _batch()
    fwd = forward_batch(model, authors, features, batch, SAME_BATCH, requires_grad=True)
    batch_loss(model, fwd.scores, batch).backward()
    grad = torch.zeros(10, 6)
    for g in fwd.gathered:
        if g.table is features:
            grad.index_add_(0, g.ids, g.leaf.grad)

    train_step(model, authors, features, batch, None)
    touched = sorted({f for bag in BAGS for f in bag})
    assert torch.equal(features.weights[[8, 9]], before[[8, 9]])  # features in no bag are untouched
    g2 = grad[touched].square().mean(1)
    torch.testing.assert_close(features.adagrad_sum[touched], g2)
    expected = before[touched] - 0.1 * grad[touched] / (g2 + 1e-10).sqrt().unsqueeze(1)
    torch.testing.assert_close(features.weights[touched], expected)


def test_both_sides_featurized_sharing_one_table() -> None:
    spec = ModelSpec({"doc": 4}, (RelationSpec("cites", "doc", "doc"),), comparator="dot", loss_fn="softmax",
                     global_emb=False, train_negatives=SAME_BATCH, eval_negatives=SAME_BATCH,
                     featurized=frozenset({"doc"}))
    model = EmbeddingModel(spec)
    table = EntityTable.random(8, 4, init_scale=0.3, generator=torch.Generator().manual_seed(0))
    bags = FeatureBags.of(BAGS)
    batch = EdgeBatch(torch.full((6,), -1), torch.full((6,), -1), 0, lhs_bags=bags,
                      rhs_bags=bags.take(torch.tensor([5, 4, 3, 2, 1, 0])))
    stats = train_step(model, table, table, batch, None)
    assert stats.count == 6 and stats.loss > 0


@pytest.mark.parametrize(("negatives", "relation", "match"), [
    (NegativeSampling(0, 10), RelationSpec("reads", "author", "doc"), "num_batch_negs"),
    (SAME_BATCH, RelationSpec("reads", "author", "doc", all_negs=True), "all_negs"),
])
def test_featurized_types_refuse_what_the_original_cannot_run(negatives: NegativeSampling, relation: RelationSpec,
                                                              match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EmbeddingModel(ModelSpec({"author": 4, "doc": 4}, (relation,), train_negatives=negatives,
                                 featurized=frozenset({"doc"})))
    # with the featurized side's negatives disabled, nothing is sampled there: the original runs it
    disabled = dataclasses.replace(negatives, disable_rhs_negs=True)
    EmbeddingModel(ModelSpec({"author": 4, "doc": 4}, (relation,), train_negatives=disabled,
                             featurized=frozenset({"doc"})))


@pytest.mark.parametrize("share", [True, False])
def test_uniform_negatives_are_skipped_on_the_featurized_side_only(share: bool) -> None:
    """As the original's BATCH_UNIFORM mode: the plain lhs gets batch + uniform negatives, the
    featurized rhs its same-batch bags only; the loss trains on both."""
    negatives = NegativeSampling(num_batch_negs=3, num_uniform_negs=5, share_uniform_negs=share)
    spec = dataclasses.replace(_spec(), train_negatives=negatives, eval_negatives=negatives)
    model = _model(spec)
    authors, features = EntityTable.random(4, 6, init_scale=0.3), EntityTable.random(8, 6, init_scale=0.3)
    result = forward_batch(model, authors, features, _batch(), negatives, generator=torch.Generator().manual_seed(0))
    assert result.scores.lhs_neg.shape == (6, 3 + 5)  # chunk of 3 batch negatives + 5 uniform
    assert result.scores.rhs_neg.shape == (6, 3)  # the other bags of the chunk only
    stats = train_step(model, authors, features, _batch(), None)
    assert stats.count == 6 and stats.loss > 0


def test_score_candidates_ranks_plain_entities_for_a_bag_and_refuses_ranking_bags() -> None:
    model = _model(_spec())
    authors, features = EntityTable.random(4, 6, init_scale=0.3), EntityTable.random(8, 6, init_scale=0.3)
    batch = _batch()
    pos, cand = score_candidates(model, authors, features, batch.lhs, 0, batch.rhs, "lhs",
                                 rhs_bags=batch.rhs_bags)
    assert cand.shape == (6, 4)
    torch.testing.assert_close(cand[torch.arange(6), batch.lhs], pos)
    with pytest.raises(ValueError, match="featurized"):
        score_candidates(model, authors, features, batch.lhs, 0, batch.rhs, "rhs", rhs_bags=batch.rhs_bags)


def test_featurized_lhs_and_rhs_train_and_learn_a_bag_pairing() -> None:
    """Docs on both sides: each lhs bag is paired with the rhs bag of the same topic words."""
    spec = _spec("none", global_emb=False, lhs_featurized=True)
    spec = ModelSpec({"author": 8, "doc": 8}, spec.relations, comparator="dot", loss_fn="softmax",
                     global_emb=False, lr=0.2, relation_lr=0.2, train_negatives=NegativeSampling(16, 0),
                     eval_negatives=NegativeSampling(16, 0), featurized=frozenset({"author", "doc"}))
    model = EmbeddingModel(spec)
    gen = torch.Generator().manual_seed(0)
    authors = EntityTable.random(16, 8, init_scale=0.1, generator=gen)
    docs = EntityTable.random(48, 8, init_scale=0.1, generator=gen)
    topics = torch.arange(16)
    for _ in range(300):
        perm = topics[torch.randperm(16, generator=gen)]
        lhs = FeatureBags.of([[int(t)] for t in perm])
        rhs = FeatureBags.of([[int(t) * 3 + int(k) for k in torch.randint(3, (2,), generator=gen)] for t in perm])
        batch = EdgeBatch(torch.full((16,), -1), torch.full((16,), -1), 0, lhs_bags=lhs, rhs_bags=rhs)
        stats = train_step(model, authors, docs, batch, None)
    assert stats.violators_rhs == 0 and stats.violators_lhs == 0


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=5), min_size=1, max_size=12), st.data())
def test_take_selects_bags_in_order(bags: list[list[int]], data: st.DataObject) -> None:
    idx = data.draw(st.lists(st.integers(0, len(bags) - 1), max_size=20))
    got = FeatureBags.of(bags).take(torch.tensor(idx, dtype=torch.long))
    assert got.to_lists() == [bags[i] for i in idx]
    assert got.offsets[0] == 0 and len(got) == len(idx)


def test_gather_rows_mixes_plain_groups_and_bags() -> None:
    table = EntityTable(torch.arange(12.0).view(6, 2))
    _, (plain, means) = gather_rows(table, [torch.tensor([5, 0]), FeatureBags.of([[0, 2], [], [4]])],
                                    max_norm=None, requires_grad=False)
    assert plain.tolist() == [[10.0, 11.0], [0.0, 1.0]]
    assert means.tolist() == [[2.0, 3.0], [0.0, 0.0], [8.0, 9.0]]


def test_bags_must_match_the_featurized_types_of_the_spec() -> None:
    model = _model(_spec())
    tables = (EntityTable.random(4, 6), EntityTable.random(8, 6))
    batch = _batch()
    with pytest.raises(ValueError, match="rhs type 'doc' is featurized: expected the batch's rhs_bags"):
        forward_batch(model, *tables, EdgeBatch(batch.lhs, batch.rhs.clamp(min=0), 0), SAME_BATCH)
    with pytest.raises(ValueError, match="lhs type 'author' is not featurized"):
        forward_batch(model, *tables, _batch(lhs_bags=FeatureBags.of([[0]] * 6)), SAME_BATCH)
