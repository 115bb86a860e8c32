"""The softmax loss as attention (``pbgtrain.model.attention``) against the score matrices.

The attention head must give the loss and gradients of today's score-matrix head in float32 on
a CPU, for every negative layout (same-chunk and uniform negatives merged or in two groups,
per-chunk uniform negatives, uniform negatives only, every entity), with edge weights and padding
rows, one side or both, and both of its cores (the fused kernels of
``scaled_dot_product_attention`` and the explicit products). A whole step with it must leave the
tables, their Adagrad state, the relation parameters and their optimizer state where today's step
leaves them, for every operator and both comparators it takes, static and dynamic. Its violators
are counted exactly on the first edges of a batch, and the stats say so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from pbgio.spec.checkpoint import OPERATORS
from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    make_relation_optimizer,
    train_step,
)
from pbgtrain.model.attention import VIOLATOR_ROWS, AttentionHead, ExplicitAttention, FusedAttention
from pbgtrain.model.comparators import make_comparator
from pbgtrain.model.losses import make_loss
from pbgtrain.model.negative_sampling import MASKED_SCORE, NegativeMode
from pbgtrain.model.negative_scores import BlockShape, HeadGradients, negative_blocks, stack_sides, training_head

CORES = {"explicit": ExplicitAttention(), "fused": FusedAttention()}
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}


@dataclass(frozen=True)
class Layout:
    mode: NegativeMode
    uniform: str  # none, shared, per_chunk, all
    sides: int
    num_pos: int
    chunk: int
    num_uniform: int
    weighted: bool
    num_real: int | None  # padding past it
    shared_candidates: bool = False  # every entity: one tensor for both sides

    def shape(self) -> BlockShape:
        return BlockShape(self.mode, self.chunk, self.num_pos, self.uniform)  # type: ignore[arg-type]


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    mode = draw(st.sampled_from([NegativeMode.BATCH_UNIFORM, NegativeMode.UNIFORM, NegativeMode.ALL]))
    sides = draw(st.integers(1, 2))
    num_pos = draw(st.integers(1, 24))
    num_real = draw(st.one_of(st.none(), st.integers(1, num_pos)))
    weighted = draw(st.booleans())
    if mode is NegativeMode.ALL:
        return Layout(mode, "all", sides, num_pos, num_pos, draw(st.integers(num_pos, 40)), weighted, num_real,
                      sides == 2 and draw(st.booleans()))
    uniform = draw(st.sampled_from(["none", "shared", "per_chunk"] if mode is NegativeMode.BATCH_UNIFORM
                                   else ["shared", "per_chunk"]))
    num_uniform = 0 if uniform == "none" else draw(st.integers(1, 12))
    chunk = draw(st.integers(1, num_pos)) if mode is NegativeMode.BATCH_UNIFORM else min(num_uniform, num_pos)
    return Layout(mode, uniform, sides, num_pos, chunk, num_uniform, weighted, num_real)


def _inputs(layout: Layout, seed: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    dim = 6

    def rows(n: int) -> Tensor:
        return torch.randn(n, dim, generator=gen)

    queries = [rows(layout.num_pos) for _ in range(layout.sides)]
    own = None
    chunks = -(-layout.num_pos // layout.chunk)
    if layout.mode is NegativeMode.ALL:
        candidates = [rows(layout.num_uniform) for _ in range(1 if layout.shared_candidates else layout.sides)]
        own = torch.randint(layout.num_uniform, (layout.sides, layout.num_pos), generator=gen)
        positives = [candidates[0 if layout.shared_candidates else s][own[s]] for s in range(layout.sides)]
    else:
        count = layout.num_uniform * (chunks if layout.uniform == "per_chunk" else 1)
        candidates = [rows(count) for _ in range(layout.sides)] if count else []
        positives = [rows(layout.num_pos) for _ in range(layout.sides)]
    weight = torch.rand(layout.num_pos, generator=gen) + 0.5 if layout.weighted else None
    num_real = None
    if layout.num_real is not None:
        weight = torch.ones(layout.num_pos) if weight is None else weight
        weight[layout.num_real:] = 0.0
        num_real = torch.tensor(layout.num_real)
    return {"queries": queries, "positives": positives, "candidates": candidates, "weight": weight, "own": own,
            "num_real": num_real}


def _rows_of_own(out: HeadGradients, own: Tensor, shared: bool) -> Tensor:
    """Every-entity negatives: the gradient of each entity's row, its positives' included (a head
    may put the gradient of a positive that is also a candidate on either tensor)."""
    assert out.d_candidates is not None
    rows = out.d_candidates.clone()
    for side in range(own.shape[0]):
        rows[0 if shared else side].index_add_(0, own[side], out.d_positives[side])
    return rows


def _run(head: object, layout: Layout, inputs: dict[str, object]) -> HeadGradients:
    kwargs = {k: inputs[k] for k in ("weight", "own", "num_real")}
    return head(make_comparator("dot"), layout.shape(), make_loss("softmax"),  # type: ignore[operator]
                inputs["queries"], inputs["positives"], inputs["candidates"], **kwargs)


def _first_rows_violators(layout: Layout, inputs: dict[str, object]) -> tuple[Tensor, int]:
    """The violators of each side's first rows, from the score blocks written out."""
    q, p = stack_sides(inputs["queries"]), stack_sides(inputs["positives"])  # type: ignore[arg-type]
    pos = (q * p).sum(-1)
    blocks = negative_blocks(make_comparator("dot"), layout.shape(), inputs["queries"], inputs["positives"],  # type: ignore[arg-type]
                             inputs["candidates"], masked=MASKED_SCORE, own=inputs["own"],  # type: ignore[arg-type]
                             num_real=inputs["num_real"])  # type: ignore[arg-type]
    chunked = layout.mode is not NegativeMode.ALL and not (layout.uniform == "shared" and (
        layout.mode is NegativeMode.UNIFORM))
    rows = min(VIOLATOR_ROWS, layout.chunk if chunked else layout.num_pos, layout.num_pos)
    real = layout.num_pos if layout.num_real is None else layout.num_real
    counts = sum((b[:, :rows] > pos[:, :rows].unsqueeze(-1)).sum(-1) for b in blocks)
    live = torch.arange(rows) < real
    return (counts * live).sum(-1), min(rows, real)


@given(layout=layouts(), seed=st.integers(0, 2**16), core=st.sampled_from(sorted(CORES)))
def test_the_attention_head_gives_the_score_matrix_heads_loss_and_gradients(layout: Layout, seed: int,
                                                                             core: str) -> None:
    inputs = _inputs(layout, seed)
    want = _run(training_head, layout, inputs)
    got = _run(AttentionHead(CORES[core]), layout, inputs)
    torch.testing.assert_close(got.loss, want.loss, **TOLERANCE)
    torch.testing.assert_close(got.d_queries, want.d_queries, **TOLERANCE)
    if layout.mode is NegativeMode.ALL:
        own = inputs["own"]
        assert isinstance(own, Tensor)
        torch.testing.assert_close(_rows_of_own(got, own, layout.shared_candidates),
                                   _rows_of_own(want, own, layout.shared_candidates), **TOLERANCE)
    else:
        torch.testing.assert_close(got.d_positives, want.d_positives, **TOLERANCE)
        assert (got.d_candidates is None) == (want.d_candidates is None)
        if want.d_candidates is not None:
            torch.testing.assert_close(got.d_candidates, want.d_candidates, **TOLERANCE)
    violators, counted = _first_rows_violators(layout, inputs)
    assert got.violators.tolist() == violators.tolist()
    assert int(got.violators_counted_on) == counted


NEGATIVES = {  # name: (batch negs, uniform negs, all_negs)
    "batch+uniform": (4, 3, False),  # merged into one group: the uniform ones are no more than a chunk
    "batch+wide-uniform": (3, 7, False),  # two groups: a chunk's rows, and the uniform ones of the batch
    "uniform-only": (0, 5, False),
    "every-entity": (0, 0, True),
}


def _step_setup(operator: str, dynamic: bool, comparator: str, negatives: str, *, reg: float = 0.01,
                global_emb: bool = True, weight: float = 1.0, seed: int = 0,
                entities: int = 17, dim: int = 6) -> tuple[EmbeddingModel, EntityTable, EntityTable]:
    batch_negs, uniform_negs, all_negs = NEGATIVES[negatives]
    negs = NegativeSampling(batch_negs, uniform_negs)
    spec = ModelSpec({"a": dim, "b": dim} if not dynamic else {"a": dim},
                     (RelationSpec("r", "a", "a" if dynamic else "b", weight=weight, operator=operator,
                                   all_negs=all_negs),),
                     num_dynamic_rels=3 if dynamic else None, comparator=comparator, loss_fn="softmax",
                     regularization_coef=reg, global_emb=global_emb and not dynamic, lr=0.3, relation_lr=0.2,
                     train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec)
    gen = torch.Generator().manual_seed(seed)
    model.draw_operators(0.5, seed)
    with torch.no_grad():
        for emb in model.global_embs.values():
            emb.copy_(torch.randn(emb.shape, generator=gen) * 0.1)
    lhs = EntityTable(torch.randn(entities, dim, generator=gen) * 0.5)
    rhs = lhs if dynamic else EntityTable(torch.randn(entities + 3, dim, generator=gen) * 0.5)
    return model, lhs, rhs


def _batches(model: EmbeddingModel, lhs: EntityTable, rhs: EntityTable, *, pad: int | None, seed: int,
             sizes: tuple[int, ...] = (9, 9, 5)) -> list[EdgeBatch]:
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for n in sizes:
        rel: int | Tensor = torch.randint(3, (n,), generator=gen) if model.dynamic else 0
        batch = EdgeBatch(torch.randint(lhs.num_entities, (n,), generator=gen),
                          torch.randint(rhs.num_entities, (n,), generator=gen), rel,
                          torch.rand(n, generator=gen) + 0.5)
        out.append(batch.pad(pad) if pad else batch)
    return out


def _train(model: EmbeddingModel, lhs: EntityTable, rhs: EntityTable, batches: list[EdgeBatch], head: object) -> list:
    model, (lhs, rhs) = copy.deepcopy(model), copy.deepcopy((lhs, rhs))
    if lhs.num_entities == rhs.num_entities and lhs.weights.data_ptr() == rhs.weights.data_ptr():
        rhs = lhs
    optimizer = make_relation_optimizer(model)
    gen = torch.Generator().manual_seed(7)
    stats = [train_step(model, lhs, rhs, b, optimizer, generator=gen, head=head) for b in batches]  # type: ignore[arg-type]
    sums = [] if optimizer is None else [optimizer.state[p]["sum"] for p in model.parameters()]
    return [stats, lhs.weights, lhs.adagrad_sum, rhs.weights, rhs.adagrad_sum, *model.parameters(), *sums]


def _assert_same_training(got: list, want: list) -> None:
    got_stats, want_stats = got[0], want[0]
    for g, w in zip(got_stats, want_stats, strict=True):
        assert g.count == w.count
        assert g.loss == pytest.approx(w.loss, rel=1e-4, abs=1e-5)
        assert g.reg == pytest.approx(w.reg, rel=1e-4, abs=1e-6)
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.detach(), w.detach(), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("negatives", sorted(NEGATIVES))
@pytest.mark.parametrize("comparator", ["dot", "cos"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_a_step_with_the_attention_head_trains_as_todays_step(operator: str, dynamic: bool, comparator: str,
                                                                negatives: str) -> None:
    """Three steps (weighted edges, the last batch padded, N3, global embeddings on static
    relations): the same tables, Adagrad state, relation parameters and optimizer state."""
    model, lhs, rhs = _step_setup(operator, dynamic, comparator, negatives)
    batches = _batches(model, lhs, rhs, pad=None, seed=3)
    batches[-1] = batches[-1].pad(9)
    want = _train(model, lhs, rhs, batches, training_head)
    _assert_same_training(_train(model, lhs, rhs, batches, AttentionHead(ExplicitAttention())), want)


@given(operator=st.sampled_from(sorted(OPERATORS)), dynamic=st.booleans(), comparator=st.sampled_from(["dot", "cos"]),
       negatives=st.sampled_from(sorted(NEGATIVES)), seed=st.integers(0, 1000), reg=st.sampled_from([0.0, 0.05]),
       weight=st.sampled_from([1.0, 0.5]), global_emb=st.booleans(), core=st.sampled_from(sorted(CORES)),
       sizes=st.lists(st.integers(1, 12), min_size=1, max_size=3), padded=st.booleans())
def test_the_attention_step_trains_as_todays_step_for_any_shape(operator: str, dynamic: bool, comparator: str,
                                                                 negatives: str, seed: int, reg: float, weight: float,
                                                                 global_emb: bool, core: str, sizes: list[int],
                                                                 padded: bool) -> None:
    model, lhs, rhs = _step_setup(operator, dynamic, comparator, negatives, reg=reg, global_emb=global_emb,
                                  weight=weight, seed=seed)
    batches = _batches(model, lhs, rhs, pad=12 if padded else None, seed=seed, sizes=tuple(sizes))
    _assert_same_training(_train(model, lhs, rhs, batches, AttentionHead(CORES[core])),
                          _train(model, lhs, rhs, batches, training_head))
