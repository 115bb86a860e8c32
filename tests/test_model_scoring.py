"""Scoring, negatives and a whole training step against a loop-by-loop reference of the original's semantics.

The reference below re-derives every score from the definitions (operator formulas, comparator
formulas, chunks of ``min(num_batch_negs, B)``, masks) for each edge separately, then takes the
dense gradient of the reference loss and applies row-wise Adagrad / Adagrad by hand; the
implementation must produce the same scores, loss, regularizer and updated parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from pbgtrain.model import (
    MASKED_SCORE,
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationAdagrad,
    RelationSpec,
    forward_batch,
    make_loss,
    make_relation_optimizer,
    score_candidates,
    train_step,
)
from tests.profiles import examples

OPERATOR_NAMES = ["none", "diagonal", "translation", "linear", "affine", "complex_diagonal"]

# --- reference -------------------------------------------------------------------------------


def ref_operator(name: str, p: dict[str, Tensor], x: Tensor) -> Tensor:
    d = x.shape[0]
    if name == "none":
        return x
    if name == "diagonal":
        return p["diagonal"] * x
    if name == "translation":
        return x + p["translation"]
    if name == "complex_diagonal":
        h = d // 2
        return torch.cat([x[:h] * p["real"] - x[h:] * p["imag"], x[:h] * p["imag"] + x[h:] * p["real"]])
    out = torch.stack([sum(p["linear_transformation"][i, j] * x[j] for j in range(d)) for i in range(d)])
    return out + p["translation"] if name == "affine" else out


def ref_prepare(comparator: str, bias: bool, x: Tensor) -> Tensor:
    if comparator != "cos":
        return x
    s = 1 if bias else 0
    return torch.cat([x[:s], x[s:] / torch.sqrt((x[s:] ** 2).sum())])


def ref_compare(comparator: str, bias: bool, a: Tensor, b: Tensor) -> Tensor:
    s = 1 if bias else 0
    if comparator in ("dot", "cos"):
        score = (a[s:] * b[s:]).sum()
    elif comparator == "l2":
        score = -torch.sqrt(torch.clamp(((a[s:] - b[s:]) ** 2).sum(), min=1e-30))
    else:
        score = -((a[s:] - b[s:]) ** 2).sum()
    return score + a[0] + b[0] if bias else score


@dataclass
class RefResult:
    lhs_pos: Tensor
    lhs_neg: Tensor
    rhs_pos: Tensor
    rhs_neg: Tensor
    reg: Tensor


def ref_forward(model: EmbeddingModel, params: dict[str, Tensor], w_lhs: Tensor, w_rhs: Tensor, batch: EdgeBatch,
                negs: NegativeSampling, uniform: dict[str, Tensor]) -> RefResult:
    """Scores of each edge from the definitions (``params`` by state-dict key, ``uniform`` the sampled ids)."""
    spec = model.spec
    cmp, bias = spec.comparator, spec.bias
    dynamic = spec.dynamic
    rel_idx = batch.rel if isinstance(batch.rel, int) else 0
    relation = spec.relations[rel_idx]
    op_name = relation.operator
    num = len(batch)
    if relation.all_negs:
        chunk = num
    elif negs.num_batch_negs == 0:
        chunk = max(1, min(negs.num_uniform_negs, num))
    else:
        chunk = min(negs.num_batch_negs, num)

    def op_params(side: str, b: int) -> dict[str, Tensor]:
        prefix = f"{side}_operators.{0 if dynamic else rel_idx}."
        out = {}
        for key, value in params.items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                static_name = {"diagonals": "diagonal", "translations": "translation",
                               "linear_transformations": "linear_transformation"}.get(name, name)
                out[static_name] = value[int(batch.rel[b])] if isinstance(batch.rel, Tensor) else value
        return out

    def glob(etype: str) -> Tensor | int:
        return params.get(f"global_embs.emb_{etype}", 0)

    def adj_lhs(x: Tensor) -> Tensor:  # static lhs side (no operator)
        return ref_prepare(cmp, bias, x + glob(relation.lhs))

    def adj_rhs(x: Tensor) -> Tensor:  # static rhs side (operator)
        return ref_prepare(cmp, bias, ref_operator(op_name, op_params("rhs", 0), x + glob(relation.rhs)))

    tables = {"lhs": w_lhs, "rhs": w_rhs}
    ids = {"lhs": batch.lhs, "rhs": batch.rhs}
    pos: dict[str, list[Tensor]] = {"lhs": [], "rhs": []}
    neg: dict[str, list[Tensor]] = {"lhs": [], "rhs": []}
    for i in range(num):
        u, v = w_lhs[int(batch.lhs[i])], w_rhs[int(batch.rhs[i])]
        for side in ("lhs", "rhs"):
            other = "rhs" if side == "lhs" else "lhs"
            if dynamic:
                query_raw = v if side == "lhs" else u
                query = ref_prepare(cmp, bias, ref_operator(op_name, op_params(other, i), query_raw))

                def adjust(x: Tensor) -> Tensor:
                    return ref_prepare(cmp, bias, x)
            else:
                query = adj_rhs(v) if side == "lhs" else adj_lhs(u)
                adjust = adj_lhs if side == "lhs" else adj_rhs
            own = adjust(u if side == "lhs" else v)
            pos[side].append(ref_compare(cmp, bias, own, query))
            disabled = negs.disable_lhs_negs if side == "lhs" else negs.disable_rhs_negs
            scores: list[Tensor] = []
            if disabled:
                pass
            elif relation.all_negs:
                for e in range(tables[side].shape[0]):
                    s = ref_compare(cmp, bias, adjust(tables[side][e]), query)
                    scores.append(s.new_tensor(MASKED_SCORE) if e == int(ids[side][i]) else s)
            else:
                c = i // chunk
                if negs.num_batch_negs > 0:
                    for j in range(c * chunk, (c + 1) * chunk):
                        if j == i or j >= num:
                            scores.append(query.new_tensor(MASKED_SCORE))
                        else:
                            cand = adjust(tables[side][int(ids[side][j])])
                            scores.append(ref_compare(cmp, bias, cand, query))
                sampled = uniform.get(side, torch.zeros(0, dtype=torch.long))
                per = negs.num_uniform_negs
                mine = sampled if negs.share_uniform_negs else sampled[c * per:(c + 1) * per]
                for e in mine:
                    scores.append(ref_compare(cmp, bias, adjust(tables[side][int(e)]), query))
            neg[side].append(torch.stack(scores) if scores else query.new_zeros(0))
    # N3 over the raw positive embeddings and the operator parameters of each edge
    reg = w_lhs.new_zeros(())
    if spec.regularization_coef > 0:
        complex_valued = op_name == "complex_diagonal"

        def cubes(x: Tensor) -> Tensor:
            if complex_valued:
                h = x.shape[-1] // 2
                return ((x[..., :h] ** 2 + x[..., h:] ** 2) ** 1.5).sum()
            return (x.abs() ** 3).sum()

        embs = cubes(w_lhs[batch.lhs]) + cubes(w_rhs[batch.rhs])
        reg = reg + (2 if dynamic else 1) * embs
        for side in ("lhs", "rhs") if dynamic else ("rhs",):
            for b in range(num):
                p = op_params(side, b)
                if complex_valued:
                    reg = reg + cubes(torch.cat([p["real"], p["imag"]]))
                else:
                    reg = reg + sum((cubes(t) for t in p.values()), w_lhs.new_zeros(()))
        reg = spec.regularization_coef * reg
    return RefResult(torch.stack(pos["lhs"]), torch.stack(neg["lhs"]), torch.stack(pos["rhs"]),
                     torch.stack(neg["rhs"]), reg)


# --- the property ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    dynamic: bool
    operator: str
    comparator: str
    bias: bool
    loss: str
    half: int
    num: int
    num_lhs: int
    num_rhs: int
    shared_table: bool
    batch_negs: int
    uniform_negs: int
    share_uniform: bool
    all_negs: bool
    disable: str | None
    global_emb: bool
    reg: float
    weighted: bool
    rel_weight: float
    seed: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    dynamic = draw(st.booleans())
    return Scenario(
        dynamic=dynamic,
        operator=draw(st.sampled_from(OPERATOR_NAMES)),
        comparator=draw(st.sampled_from(["dot", "cos", "l2", "squared_l2"])),
        bias=draw(st.booleans()),
        loss=draw(st.sampled_from(["ranking", "logistic", "softmax"])),
        half=draw(st.integers(1, 2)),
        num=draw(st.integers(1, 7)),
        num_lhs=draw(st.integers(1, 6)),
        num_rhs=draw(st.integers(1, 6)),
        shared_table=draw(st.booleans()),
        batch_negs=draw(st.integers(0, 4)),
        uniform_negs=draw(st.integers(0, 3)),
        share_uniform=draw(st.booleans()),
        all_negs=draw(st.booleans()) and draw(st.booleans()),
        disable=draw(st.sampled_from([None, "lhs", "rhs"])),
        global_emb=(not dynamic) and draw(st.booleans()),
        reg=draw(st.sampled_from([0.0, 0.05])),
        weighted=draw(st.booleans()),
        rel_weight=draw(st.sampled_from([1.0, 2.5])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _build(sc: Scenario) -> tuple[EmbeddingModel, EntityTable, EntityTable, EdgeBatch]:
    gen = torch.Generator().manual_seed(sc.seed)
    dim, num, num_rels = 2 * sc.half, sc.num, 3
    lhs_type, rhs_type = ("e", "e") if sc.shared_table else ("a", "b")
    negs = NegativeSampling(sc.batch_negs, sc.uniform_negs, sc.disable == "lhs", sc.disable == "rhs",
                            sc.share_uniform)
    relations = (RelationSpec("r0", lhs_type, rhs_type, sc.rel_weight, sc.operator, sc.all_negs),)
    if not sc.dynamic:
        relations = (RelationSpec("other", lhs_type, rhs_type, 1.0, "translation"), *relations)
    spec = ModelSpec({lhs_type: dim, rhs_type: dim}, relations, num_dynamic_rels=num_rels if sc.dynamic else None,
                     comparator=sc.comparator, bias=sc.bias, loss_fn=sc.loss, margin=0.4,
                     regularization_coef=sc.reg, global_emb=sc.global_emb,
                     lr=0.3, relation_lr=0.2, train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    n_lhs = sc.num_lhs
    n_rhs = n_lhs if sc.shared_table else sc.num_rhs
    # nonzero Adagrad sums, so that rounding noise in a zero gradient cannot make a full-size step
    lhs_table = EntityTable(torch.randn(n_lhs, dim, generator=gen, dtype=torch.float64),
                            torch.rand(n_lhs, generator=gen, dtype=torch.float64) + 0.1)
    rhs_table = lhs_table if sc.shared_table else EntityTable(
        torch.randn(n_rhs, dim, generator=gen, dtype=torch.float64),
        torch.rand(n_rhs, generator=gen, dtype=torch.float64) + 0.1)
    rel: int | Tensor = torch.randint(num_rels, (num,), generator=gen) if sc.dynamic else 1
    weight = torch.rand(num, generator=gen, dtype=torch.float64) + 0.5 if sc.weighted else None
    batch = EdgeBatch(torch.randint(n_lhs, (num,), generator=gen), torch.randint(n_rhs, (num,), generator=gen),
                      rel, weight)
    return model, lhs_table, rhs_table, batch


def _uniform_ids(model: EmbeddingModel, lhs: EntityTable, rhs: EntityTable, batch: EdgeBatch,
                 seed: int) -> dict[str, Tensor]:
    """The ids forward_batch draws: lhs side first, then rhs, each torch.randint(N, (count,))."""
    negs = model.spec.train_negatives
    relation = model.relation(batch.rel)
    gen = torch.Generator().manual_seed(seed)
    num = len(batch)
    if relation.all_negs:
        return {}
    chunk = max(1, min(negs.num_batch_negs or negs.num_uniform_negs, num))
    chunks = math.ceil(num / chunk)
    out = {}
    for side, table, disabled in (("lhs", lhs, negs.disable_lhs_negs), ("rhs", rhs, negs.disable_rhs_negs)):
        count = negs.num_uniform_negs * (1 if negs.share_uniform_negs else chunks)
        if not disabled and count:
            out[side] = torch.randint(table.num_entities, (count,), generator=gen)
    return out


@settings(max_examples=examples(120))
@given(sc=scenarios())
def test_train_step_matches_reference(sc: Scenario) -> None:
    model, lhs_table, rhs_table, batch = _build(sc)
    sample_seed = sc.seed + 1
    shared = lhs_table is rhs_table
    # reference inputs: dense leaves copied before the step
    w_lhs = lhs_table.weights.clone().requires_grad_(True)
    w_rhs = w_lhs if shared else rhs_table.weights.clone().requires_grad_(True)
    sums = {"lhs": lhs_table.adagrad_sum.clone(), "rhs": rhs_table.adagrad_sum.clone()}
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.state_dict().items()}
    uniform = _uniform_ids(model, lhs_table, rhs_table, batch, sample_seed)
    ref = ref_forward(model, params, w_lhs, w_rhs, batch, model.spec.train_negatives, uniform)

    fwd = forward_batch(model, lhs_table, rhs_table, batch, model.spec.train_negatives,
                        generator=torch.Generator().manual_seed(sample_seed), requires_grad=False)
    torch.testing.assert_close(fwd.scores.lhs_pos, ref.lhs_pos)
    torch.testing.assert_close(fwd.scores.rhs_pos, ref.rhs_pos)
    torch.testing.assert_close(fwd.scores.lhs_neg, ref.lhs_neg)
    torch.testing.assert_close(fwd.scores.rhs_neg, ref.rhs_neg)

    loss_fn = make_loss(model.spec.loss_fn, model.spec.margin)
    rel_weight = model.relation(batch.rel).weight
    ref_loss = rel_weight * (loss_fn(ref.lhs_pos, ref.lhs_neg, batch.weight)
                             + loss_fn(ref.rhs_pos, ref.rhs_neg, batch.weight))
    total = ref_loss + ref.reg
    leaves = [w_lhs] + ([] if shared else [w_rhs]) + list(params.values())
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    grad_of = {id(t): (torch.zeros_like(t) if g is None else g) for t, g in zip(leaves, grads, strict=True)}

    trainable = list(model.parameters())
    optimizer = (torch.optim.Adagrad(trainable, lr=0.2, eps=1e-10, initial_accumulator_value=1.0)
                 if trainable else None)
    stats = train_step(model, lhs_table, rhs_table, batch, optimizer,
                       generator=torch.Generator().manual_seed(sample_seed))
    assert stats.count == len(batch)
    # float32 sums in another order (the scores match within assert_close's float32 tolerance)
    assert stats.loss == pytest.approx(ref_loss.item(), rel=1e-6, abs=1e-9)
    assert stats.reg == pytest.approx(ref.reg.item(), rel=1e-6, abs=1e-12)
    s = fwd.scores  # equal to the reference's; counted on these to avoid rounding-dependent ties
    assert stats.violators_lhs == int((s.lhs_neg > s.lhs_pos.unsqueeze(1)).sum())
    assert stats.violators_rhs == int((s.rhs_neg > s.rhs_pos.unsqueeze(1)).sum())

    # row-wise Adagrad by hand on the dense gradient (rows without gradient stay as they were)
    for side, table, w in (("lhs", lhs_table, w_lhs), ("rhs", rhs_table, w_rhs)):
        g = grad_of[id(w)]
        new_sum = sums[side] + (g ** 2).mean(1)
        expected = w.detach() - 0.3 * g / torch.sqrt(new_sum + 1e-10).unsqueeze(1)
        torch.testing.assert_close(table.adagrad_sum, new_sum)
        torch.testing.assert_close(table.weights, expected)
    # Adagrad by hand on the relation parameters
    for key, value in model.state_dict().items():
        g = grad_of[id(params[key])]
        expected = params[key].detach() - 0.2 * g / (torch.sqrt(1.0 + g ** 2) + 1e-10)
        torch.testing.assert_close(value, expected, msg=key)


def test_relation_optimizer_is_adagrad_at_relation_lr() -> None:
    spec = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e", operator="diagonal"),), lr=0.5, relation_lr=0.25)
    model = EmbeddingModel(spec)
    optimizer = make_relation_optimizer(model)
    assert isinstance(optimizer, RelationAdagrad)  # torch.optim.Adagrad's state and update
    assert optimizer.param_groups[0]["lr"] == 0.25
    p = model.rhs_operators[0].diagonal
    p.grad = torch.tensor([2.0, 0.0])
    optimizer.step()  # p -= lr · g / (sqrt(g²) + eps) on the first step
    torch.testing.assert_close(p.detach(), torch.tensor([1.0 - 0.25, 1.0]))
    no_params = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e"),), global_emb=False)
    assert make_relation_optimizer(EmbeddingModel(no_params)) is None


# --- masks and plans -------------------------------------------------------------------------


def batch_negatives_mask(num_pos: int, chunk: int, chunks: int) -> Tensor:
    """The reference mask [chunks, chunk, chunk]: positive i of a chunk meets batch negative j
    that is itself (i == j) or no positive (past ``num_pos``)."""
    mask = torch.zeros(chunks, chunk, chunk, dtype=torch.bool)
    for c in range(chunks):
        for i in range(chunk):
            for j in range(chunk):
                mask[c, i, j] = i == j or c * chunk + j >= num_pos
    return mask


def _tiny(negs: NegativeSampling, all_negs: bool = False,
          num: int = 5) -> tuple[EmbeddingModel, EntityTable, EdgeBatch]:
    spec = ModelSpec({"e": 3}, (RelationSpec("r", "e", "e", all_negs=all_negs),), comparator="dot",
                     train_negatives=negs)
    table = EntityTable.random(9, 3, init_scale=1.0, generator=torch.Generator().manual_seed(0))
    batch = EdgeBatch(torch.arange(num), torch.arange(num) + 4, 0)
    return EmbeddingModel(spec), table, batch


def test_negative_layout_batch_then_uniform_with_masks() -> None:
    model, table, batch = _tiny(NegativeSampling(2, 3))
    fwd = forward_batch(model, table, table, batch, model.spec.train_negatives, requires_grad=False)
    assert fwd.negs.chunk_size == 2 and fwd.negs.num_chunks == 3
    for neg in (fwd.scores.lhs_neg, fwd.scores.rhs_neg):
        assert neg.shape == (5, 2 + 3)
        batch_part = neg[:, :2]
        assert (batch_part[[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]] == MASKED_SCORE).all()  # self pairs
        assert batch_part[4, 1] == MASKED_SCORE  # padding of the last chunk
        assert (batch_part[[0, 1, 2, 3], [1, 0, 1, 0]] != MASKED_SCORE).all()
        assert (neg[:, 2:] != MASKED_SCORE).all()


def test_uniform_only_and_disabled_side() -> None:
    model, table, batch = _tiny(NegativeSampling(0, 4, disable_lhs_negs=True))
    fwd = forward_batch(model, table, table, batch, model.spec.train_negatives, requires_grad=False)
    assert fwd.negs.chunk_size == 4
    assert fwd.scores.lhs_neg.shape == (5, 0)
    assert fwd.scores.rhs_neg.shape == (5, 4)


def test_all_negs_scores_every_entity_with_positive_masked() -> None:
    model, table, batch = _tiny(NegativeSampling(2, 3), all_negs=True)
    fwd = forward_batch(model, table, table, batch, model.spec.train_negatives, requires_grad=False)
    assert fwd.scores.lhs_neg.shape == (5, 9) and fwd.scores.rhs_neg.shape == (5, 9)
    masked = (fwd.scores.rhs_neg == MASKED_SCORE).nonzero().tolist()
    assert masked == [[i, i + 4] for i in range(5)]
    _, all_scores = score_candidates(model, table, table, batch.lhs, 0, batch.rhs, "rhs")
    keep = fwd.scores.rhs_neg != MASKED_SCORE
    torch.testing.assert_close(fwd.scores.rhs_neg[keep], all_scores[keep])


def test_per_chunk_uniform_negatives_differ_between_chunks() -> None:
    model, table, batch = _tiny(NegativeSampling(1, 200, share_uniform_negs=False), num=2)
    table = EntityTable.random(1000, 3, init_scale=1.0, generator=torch.Generator().manual_seed(0))
    fwd = forward_batch(model, table, table, batch, model.spec.train_negatives, requires_grad=False,
                        generator=torch.Generator().manual_seed(3))
    # with one positive per chunk and a shared query per row, per-chunk samples give different columns
    u0 = fwd.scores.rhs_neg[0, 1:] / table.weights[0].norm()
    u1 = fwd.scores.rhs_neg[1, 1:] / table.weights[1].norm()
    assert not torch.allclose(u0.sort().values, u1.sort().values)


# --- candidates ------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_score_candidates_agrees_with_itself_and_the_positive(dynamic: bool, side: str) -> None:
    gen = torch.Generator().manual_seed(5)
    spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e", operator="complex_diagonal"),),
                     num_dynamic_rels=3 if dynamic else None, comparator="cos", bias=True,
                     global_emb=not dynamic)
    model = EmbeddingModel(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    table = EntityTable.random(7, 4, init_scale=1.0, generator=gen)
    lhs, rhs = torch.tensor([0, 3, 6]), torch.tensor([1, 1, 2])
    rel: int | Tensor = torch.tensor([2, 0, 1]) if dynamic else 0
    pos, every = score_candidates(model, table, table, lhs, rel, rhs, side)
    assert pos.shape == (3,) and every.shape == (3, 7)
    truth = lhs if side == "lhs" else rhs
    torch.testing.assert_close(every[torch.arange(3), truth], pos)
    shared = torch.tensor([5, 0, 2])
    _, some = score_candidates(model, table, table, lhs, rel, rhs, side, shared)
    torch.testing.assert_close(some, every[:, shared])
    per_edge = torch.tensor([[1, 2], [3, 4], [6, 0]])
    _, mine = score_candidates(model, table, table, lhs, rel, rhs, side, per_edge)
    torch.testing.assert_close(mine, every.gather(1, per_edge))


def test_max_norm_renormalises_looked_up_rows_in_place() -> None:
    spec = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e"),), comparator="dot", max_norm=1.0,
                     train_negatives=NegativeSampling(1, 0))
    weights = torch.tensor([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])
    table = EntityTable(weights.clone())
    forward_batch(EmbeddingModel(spec), table, table, EdgeBatch(torch.tensor([0]), torch.tensor([1]), 0),
                  spec.train_negatives, requires_grad=False)
    torch.testing.assert_close(table.weights[0], torch.tensor([0.6, 0.8]), atol=1e-6, rtol=0)
    torch.testing.assert_close(table.weights[1:], weights[1:])  # in norm, and not looked up


@pytest.mark.parametrize("layout", ["shared", "per_chunk"])
@pytest.mark.parametrize("comparator", ["dot", "l2"])
@pytest.mark.parametrize(("num_pos", "chunk", "real"), [(12, 4, 12), (10, 4, 10), (7, 7, 7), (5, 3, 5), (1, 1, 1),
                                                        (10, 4, 6), (12, 4, 3)])
def test_negative_blocks_match_masked_fill_of_the_chunked_products(comparator: str, num_pos: int, chunk: int,
                                                                   real: int, layout: str) -> None:
    """Both sides' batch and uniform negatives, scored stacked, give masked_fill's scores of the
    chunked products and their gradients: the masked entries (own positive, padding past the batch
    or past ``real``) score MASKED_SCORE and pass no gradient. The uniform columns follow the batch
    columns, in their own block or in one block with them (:meth:`BlockShape.merges`)."""
    from pbgtrain.model.comparators import make_comparator
    from pbgtrain.model.negative_sampling import NegativeMode
    from pbgtrain.model.negative_scores import BlockShape, negative_blocks

    cmp = make_comparator(comparator)
    gen = torch.Generator().manual_seed(num_pos)
    chunks = -(-num_pos // chunk)
    per_chunk = layout == "per_chunk"
    q, p, c = (torch.randn(2, n, 5, generator=gen, dtype=torch.float64, requires_grad=True)
               for n in (num_pos, num_pos, 3 * chunks if per_chunk else 3))
    shape = BlockShape(NegativeMode.BATCH_UNIFORM, chunk, num_pos, layout)  # type: ignore[arg-type]
    blocks = negative_blocks(cmp, shape, list(q), list(p), list(c), masked=MASKED_SCORE,
                             num_real=torch.tensor(real) if real < num_pos else None)
    assert len(blocks) == (1 if shape.merges(3) else 2)
    pad = (0, 0, 0, chunks * chunk - num_pos)
    mask = batch_negatives_mask(real, chunk, chunks)
    expected = []
    for s in range(2):
        qc = F.pad(q[s], pad).view(chunks, chunk, 5)
        batch = cmp.all_pairs(qc, F.pad(p[s], pad).view(chunks, chunk, 5))
        uniform = cmp.all_pairs(qc, c[s].view(chunks, 3, 5)).view(-1, 3)[:num_pos] if per_chunk \
            else cmp.all_pairs(q[s], c[s])
        expected.append(torch.cat((batch.masked_fill(mask, MASKED_SCORE).view(-1, chunk)[:num_pos], uniform), 1))
    got_scores, want_scores = torch.cat(blocks, -1), torch.stack(expected)
    torch.testing.assert_close(got_scores, want_scores)
    upstream = torch.randn(want_scores.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((want_scores * upstream).sum(), (q, p, c))
    got = torch.autograd.grad((got_scores * upstream).sum(), (q, p, c))
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)
