"""The softmax loss as attention (``pbgtrain.model.attention``) against the score matrices.

The attention head must give the loss and gradients of today's score-matrix head in float32 on
a CPU, for every negative layout (same-chunk and uniform negatives merged or in two groups,
per-chunk uniform negatives, uniform negatives only, every entity), with edge weights and padding
rows, one side or both, and both of its cores (the fused kernels of
``scaled_dot_product_attention`` and the explicit products). A whole step with it must leave the
tables, their Adagrad state, the relation parameters and their optimizer state where today's step
leaves them, for every operator and both comparators it takes, static and dynamic. Its violators
are counted exactly on the first edges of a batch, and the stats say so. The fused core's keys'
gradient, one more forward attention (of the keys over the queries), is the old formula's (the
kernel's backward for V) and autograd's.

Tolerances are bounds, not what a machine happened to reach: float32's unit roundoff ε = 2⁻²⁴ per
operation, carried through each computation to first order (:func:`_edge_error`: a score's error,
the exponential's, the sums' and the sink readout's), for both paths compared; the whole steps
are compared in float64, where such a bound is far below the tolerance (:data:`STEP_TOLERANCE`).
"""

from __future__ import annotations

import copy
import math
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
from pbgtrain.model.attention import (
    SINK_OFFSET,
    VIOLATOR_ROWS,
    AttentionHead,
    ExplicitAttention,
    FusedAttention,
    Operands,
    fused_kernel,
)
from pbgtrain.model.comparators import make_comparator
from pbgtrain.model.losses import make_loss
from pbgtrain.model.negative_sampling import MASKED_SCORE, NegativeMode
from pbgtrain.model.negative_scores import BlockShape, HeadGradients, negative_blocks, stack_sides, training_head

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

CORES = {"explicit": ExplicitAttention(), "fused": FusedAttention()}
EPS = 2.0**-24
"""float32's unit roundoff: the relative error of one rounded operation."""
EXP_ULPS = 4
"""The exponential's error, in ulps of float32 (2ε each): torch's vectorised ``exp`` is within 1
(Sleef's u10), the flash attention's for CPUs within 2 (``exp_u20``), CUDA's ``exp2f`` within 2;
4 is an upper bound for all of them."""


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


def _edge_error(layout: Layout, inputs: dict[str, object]) -> tuple[Tensor, Tensor, int]:
    """``(e [S, B], A [S, B], N)``: ``e`` bounds, for one head in float32, the error of each edge's
    ``LSE − pos`` (absolute) and of the log of each of its probabilities; ``A`` bounds the
    magnitude of its scores; ``N`` is the longest sum either head takes. To first order in ε:

    - a score, a dot product of ``dim`` terms plus the sink's or the mask's (the attention form),
      is within (dim + 2) ε (A + σ) (γₙ's bound, A = Σ_d |q_d| max_j |k_jd| ≥ Σ_d |q_d k_jd|), and
      its difference with the row's maximum within 2 ε (A + σ) more;
    - an exponential is within 2 :data:`EXP_ULPS` ε, and the online rescaling of a tiled kernel
      compounds one exponential and one product per tile: a sum of N terms, with its rescalings,
      is within (2 :data:`EXP_ULPS` + 3) N ε;
    - the readouts (log, the sink's share, σ + log T − pos) round five times on magnitudes below
      σ + A + log N.
    """
    q = stack_sides(inputs["queries"]).double().abs()  # type: ignore[arg-type]
    magnitude = (q * _largest_key(inputs)).sum(-1)  # A ≥ |q·k| for every key the edge sees, its positive's [S, B]
    sink = magnitude + SINK_OFFSET  # ≥ |σ| = |pos + 40|
    longest = layout.chunk + layout.num_uniform + layout.sides * layout.num_pos + 4  # keys per edge, queries per key
    dim = q.shape[-1]
    error = ((dim + 4) * EPS * (magnitude + sink) + (2 * EXP_ULPS + 3) * longest * EPS
             + 5 * EPS * (sink + magnitude + math.log(longest)))
    return error, magnitude, longest


def _largest_key(inputs: dict[str, object]) -> Tensor:
    """Each coordinate's largest magnitude over the positives and candidates [D] (float64)."""
    positives, candidates = inputs["positives"], inputs["candidates"]
    assert isinstance(positives, list) and isinstance(candidates, list)
    keys = [stack_sides(positives), *candidates]
    return torch.cat([k.reshape(-1, k.shape[-1]) for k in keys]).double().abs().amax(0)


def _assert_within(got: Tensor, want: Tensor, bound: Tensor | float, what: str) -> None:
    excess = ((got.double() - want.double()).abs() - bound).max()
    assert excess <= 0, f"{what}: over its bound by {float(excess):.3g}"


def _assert_like_the_score_matrices(got: HeadGradients, want: HeadGradients, layout: Layout,
                                    inputs: dict[str, object]) -> None:
    """Loss and gradients within the bound of both heads' float32 errors (:func:`_edge_error`):

    - loss: Σ w (2e) for the edges' terms, and the sum of 2B terms in both;
    - the queries' gradients w (Σ_j P_j k_j − p) (each coordinate): the probabilities' relative
      error 2e in each head, a sum of N terms, and (uniform negatives only) the share
      sigmoid(LSE − pos), whose slope is at most 1/4;
    - the keys' gradients Σ_i w_i P_ij q_i (the positives' and candidates' rows): bounded in sum
      over the keys, each coordinate, since Σ_j P_ij ≤ 1: Σ_i w_i |q_i| (4e + 2Nε), and the
      positives' own term −w q.
    """
    error, magnitude, longest = _edge_error(layout, inputs)
    weight = inputs["weight"]
    assert weight is None or isinstance(weight, Tensor)
    w = torch.ones(layout.num_pos, dtype=torch.float64) if weight is None else weight.double()
    uniform = layout.mode is NegativeMode.UNIFORM
    gap = magnitude + SINK_OFFSET + math.log(longest)  # ≥ |LSE − pos|
    per_edge = 2 * error + (2 * EPS * gap if uniform else 0)  # both heads (softplus rounds once more)
    loss_bound = float((w * per_edge).sum() + 4 * layout.sides * layout.num_pos * EPS * (w * (gap + 1)).sum())
    _assert_within(got.loss, want.loss, loss_bound, "loss")
    q = stack_sides(inputs["queries"]).double().abs()  # type: ignore[arg-type]
    p = stack_sides(inputs["positives"]).double().abs()  # type: ignore[arg-type]
    keys = _largest_key(inputs)
    relative = 2 * (2 * error + (longest + 3) * EPS) + (error / 2 + 2 * EPS if uniform else 0)  # [S, B]
    dq_bound = (w * relative).unsqueeze(-1) * (keys + p) + 2 * EPS * p
    _assert_within(got.d_queries, want.d_queries, dq_bound, "queries' gradients")
    per_query = (w * (4 * error + 2 * (longest + 4) * EPS + (error / 2 + 2 * EPS if uniform else 0))).unsqueeze(-1) * q
    keys_bound = per_query.sum((0, 1))  # [D]: the sum over every key of each coordinate's error
    if layout.mode is NegativeMode.ALL:
        own = inputs["own"]
        assert isinstance(own, Tensor)
        got_keys = _rows_of_own(got, own, layout.shared_candidates)
        want_keys = _rows_of_own(want, own, layout.shared_candidates)
        spread = (got_keys.double() - want_keys.double()).abs().sum((0, 1))
    else:
        spread = (got.d_positives.double() - want.d_positives.double()).abs().sum((0, 1))
        assert (got.d_candidates is None) == (want.d_candidates is None)
        if want.d_candidates is not None:
            assert got.d_candidates is not None
            spread = spread + (got.d_candidates.double() - want.d_candidates.double()).abs().sum((0, 1))
    assert bool((spread <= keys_bound).all()), f"keys' gradients: {spread.tolist()} over {keys_bound.tolist()}"


def _near_ties(layout: Layout, inputs: dict[str, object]) -> Tensor:
    """Per side, the (edge, negative) pairs of the counted rows whose score is within both heads'
    errors of the positive's (float64): their comparison may go either way ([S])."""
    queries = [q.double() for q in inputs["queries"]]  # type: ignore[attr-defined]
    positives = [p.double() for p in inputs["positives"]]  # type: ignore[attr-defined]
    candidates = [c.double() for c in inputs["candidates"]]  # type: ignore[attr-defined]
    q, p = stack_sides(queries), stack_sides(positives)
    pos = (q * p).sum(-1)
    blocks = negative_blocks(make_comparator("dot"), layout.shape(), queries, positives, candidates,
                             masked=MASKED_SCORE, own=inputs["own"], num_real=inputs["num_real"])  # type: ignore[arg-type]
    _, magnitude, _ = _edge_error(layout, inputs)
    dim = q.shape[-1]
    close = 3 * (dim + 2) * EPS * magnitude  # a score and the positive's, in each head
    rows = min(VIOLATOR_ROWS, layout.num_pos)
    real = layout.num_pos if layout.num_real is None else layout.num_real
    live = (torch.arange(rows) < real).unsqueeze(-1)
    ties = [((b[:, :rows] - pos[:, :rows].unsqueeze(-1)).abs() <= close[:, :rows].unsqueeze(-1)) & live
            & (b[:, :rows] > MASKED_SCORE / 2) for b in blocks]
    return sum((t.sum((1, 2)) for t in ties), torch.zeros(layout.sides, dtype=torch.long))


@given(layout=layouts(), seed=st.integers(0, 2**16), core=st.sampled_from(sorted(CORES)))
def test_the_attention_head_gives_the_score_matrix_heads_loss_and_gradients(layout: Layout, seed: int,
                                                                             core: str) -> None:
    inputs = _inputs(layout, seed)
    want = _run(training_head, layout, inputs)
    got = _run(AttentionHead(CORES[core]), layout, inputs)
    _assert_like_the_score_matrices(got, want, layout, inputs)
    violators, counted = _first_rows_violators(layout, inputs)
    assert ((got.violators - violators).abs() <= _near_ties(layout, inputs)).all(), (got.violators, violators)
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
    """Three steps in float64 (see :data:`STEP_TOLERANCE`)."""
    same = lhs is rhs
    model = copy.deepcopy(model).double()
    lhs = EntityTable(lhs.weights.double(), lhs.adagrad_sum.double())
    rhs = lhs if same else EntityTable(rhs.weights.double(), rhs.adagrad_sum.double())
    optimizer = make_relation_optimizer(model)
    gen = torch.Generator().manual_seed(7)
    stats = [train_step(model, lhs, rhs, b, optimizer, generator=gen, head=head) for b in batches]  # type: ignore[arg-type]
    sums = [] if optimizer is None else [optimizer.state[p]["sum"] for p in model.parameters()]
    return [stats, lhs.weights, lhs.adagrad_sum, rhs.weights, rhs.adagrad_sum, *model.parameters(), *sums]


STEP_TOLERANCE = 2.0**-26
"""Relative and absolute, for three steps in float64 (unit roundoff u = 2⁻⁵³). A step is under 2⁸
operations deep with sums of under 2⁸ terms (keys per edge, edges per key, coordinates), and its
intermediates stay within 2⁸ of its results' scale (scores of vectors of 6 draws, the sink 40
above): a first-order bound of 2²⁴ u per step. Row Adagrad divides each row's gradient by its own
norm, which turns a relative error of the gradient into an absolute one of the step, amplified by
the row's cancellation (its terms' magnitude over its gradient's); three steps: 2²⁶ u times that
amplification, up to 2¹¹ here (a row whose gradient cancels to 2⁻¹¹ of its terms would need the
bound raised) — 2⁻²⁶ in all. In float32 the same steps differ by up to 10⁻⁵ (one ulp of a weight
is 6·10⁻⁸): the heads themselves are compared in float32 by the bound of :func:`_edge_error`."""


def _assert_same_training(got: list, want: list) -> None:
    got_stats, want_stats = got[0], want[0]
    for g, w in zip(got_stats, want_stats, strict=True):
        assert g.count == w.count
        assert g.loss == pytest.approx(w.loss, rel=STEP_TOLERANCE, abs=STEP_TOLERANCE)
        assert g.reg == pytest.approx(w.reg, rel=STEP_TOLERANCE, abs=STEP_TOLERANCE)
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.detach(), w.detach(), rtol=STEP_TOLERANCE, atol=STEP_TOLERANCE)


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


def _layout_operands(q: Tensor, k: Tensor, sink: Tensor, pad: Tensor, *, shifted: bool) -> Operands:
    """The attention layout as the module doc describes it, written out here: queries [q, MASKED,
    σ, 0] (or [q, MASKED, 0, −σ] shifted) then a zero row; keys [k, pad, 0, 1] then the sink
    [0, 0, 1, 0]; values zeros but for the last row's 1 in the sink coordinate."""
    groups, rows, dim = q.shape
    num_keys = k.shape[1]
    width = -(-(dim + 3) // 8) * 8
    mask, sink_at, ones = dim, dim + 1, dim + 2
    queries = torch.zeros(groups, rows + 1, width, dtype=q.dtype)
    queries[:, :rows, :dim] = q
    queries[:, :rows, mask] = MASKED_SCORE
    queries[:, :rows, ones if shifted else sink_at] = -sink if shifted else sink
    keys = torch.zeros(groups, num_keys + 1, width, dtype=q.dtype)
    keys[:, :num_keys, :dim] = k
    keys[:, :num_keys, mask] = pad
    keys[:, :num_keys, ones] = 1.0
    keys[:, num_keys, sink_at] = 1.0
    values = torch.zeros(groups, rows + 1, width, dtype=q.dtype)
    values[:, rows, sink_at] = 1.0
    return Operands(queries, keys, values, dim)


@pytest.mark.parametrize("gap", [-5.0, 30.0, 100.0])  # the top key's score over the positive's: within the range
@pytest.mark.parametrize("seed", range(4))
def test_the_fused_keys_gradient_is_the_old_formulas_and_autograds(seed: int, gap: float) -> None:
    """``Σ_i exp(s_ij − σ_i) w_i q_i`` for every key: one forward attention of the keys over the
    queries (the fused core), the kernel's backward for V as the fused core took it before
    (``Pᵀ (w q / P_s)``), the explicit core's ``Pᵀ`` product, and autograd's gradient of
    ``Σ_ij w_i exp(s_ij − σ_i)`` in float64, some keys padding, each query's top key from 5 below
    its positive to 100 above (the range is up to 127: see the module doc). Each float32 path is within
    ``2e · Σ_i exp(s_ij − σ_i) w_i |q_i|`` of autograd's (e: a log-probability's error, as
    :func:`_edge_error` takes it, over the longest sum of either pass), and two paths within the
    sum of their bounds."""
    gen = torch.Generator().manual_seed(seed)
    groups, rows, num_keys, dim = 3, 17, 11, 6
    q = torch.randn(groups, rows, dim, generator=gen)
    k = torch.randn(groups, num_keys, dim, generator=gen)
    pad = (torch.rand(groups, num_keys, generator=gen) < 0.2).float()
    pad[:, 0] = 0.0  # every query sees a key
    top = torch.einsum("gmd,gnd->gmn", q, k).sub(pad.unsqueeze(1) * 1e9).amax(-1)
    pos = top - gap  # each query's positive, ``gap`` below its top key
    sink = pos + SINK_OFFSET
    scale = torch.rand(groups, rows, generator=gen) + 0.5

    keys64 = k.double().requires_grad_(True)
    exps = torch.exp(torch.einsum("gmd,gnd->gmn", q.double(), keys64) - sink.double().unsqueeze(-1))
    (exact,) = torch.autograd.grad((exps * (1 - pad.double()).unsqueeze(1) * scale.double().unsqueeze(-1)).sum(),
                                   keys64)

    fused = FusedAttention()
    shifted = _layout_operands(q, k, sink, pad, shifted=True)
    out, saved = fused.attend(shifted)
    new = fused.keys_grad(shifted, saved, q, scale, out[..., shifted.sink].clamp_min(1e-38))

    plain = _layout_operands(q, k, sink, pad, shifted=False)
    out, saved = ExplicitAttention().attend(plain)
    share = out[..., plain.sink].clamp_min(1e-38)
    explicit = ExplicitAttention().keys_grad(plain, saved, q, scale, share)
    v = plain.keys.clone().requires_grad_(True)
    with torch.enable_grad():
        kernel_out = torch.nn.functional.scaled_dot_product_attention(plain.rows.unsqueeze(0), plain.keys.unsqueeze(0),
                                                                      v.unsqueeze(0), scale=1.0)
        kernel_share = kernel_out.detach()[0, ..., plain.sink].clamp_min(1e-38)
        d_out = torch.zeros_like(kernel_out)
        d_out[0, :, :, :dim] = q * (scale / kernel_share).unsqueeze(-1)
        (old,) = torch.autograd.grad(kernel_out, v, d_out)
    old = old[:, :-1, :dim]

    magnitude = torch.einsum("gmn,gmd->gnd", exps.detach() * (1 - pad.double()).unsqueeze(1),
                             scale.double().unsqueeze(-1) * q.double().abs())
    products = (q.double().abs().unsqueeze(2) * k.double().abs().unsqueeze(1)).sum(-1)  # Σ_d |q_d k_d|
    largest = products.amax() + sink.double().abs().amax()
    longest = rows + num_keys + 4
    error = (dim + 4) * EPS * largest + (2 * EXP_ULPS + 3) * longest * EPS + 5 * EPS * (largest + math.log(longest))
    bound = (2 * error + 4 * EPS) * magnitude
    for name, got in (("fused", new), ("the kernel's backward", old), ("explicit", explicit)):
        _assert_within(got, exact, bound, f"{name} against autograd")
    _assert_within(new, old, 2 * bound, "fused against the kernel's backward")
    _assert_within(new, explicit, 2 * bound, "fused against explicit")


def test_the_fused_core_runs_two_forward_kernels_and_no_backward() -> None:
    """What :func:`fused_kernel` says of a CPU, seen by the profiler: the flash kernel for CPUs,
    once for the attention and once for the keys' gradient; no backward kernel."""
    from pbgtrain.model.op_count import count_ops

    layout = Layout(NegativeMode.BATCH_UNIFORM, "shared", 2, 24, 6, 5, True, 20)
    inputs = _inputs(layout, 0)
    head = AttentionHead(FusedAttention())
    counted = count_ops(lambda: _run(head, layout, inputs))
    kernels = {name: n for name, n in counted.by_name.items() if "attention" in name}
    assert kernels == {SDPA_OPS[fused_kernel("cpu", torch.float32, 6)]: 2}


SDPA_OPS = {"flash": "aten::_scaled_dot_product_flash_attention",
            "memory-efficient": "aten::_scaled_dot_product_efficient_attention",
            "cudnn": "aten::_scaled_dot_product_cudnn_attention",
            "flash (CPU)": "aten::_scaled_dot_product_flash_attention_for_cpu"}
"""The operation each kernel of :func:`~pbgtrain.model.attention.fused_kernel` is dispatched as."""


def test_the_kernel_rule_the_fused_core_relies_on() -> None:
    """On a CUDA GPU (sm80 and later): FlashAttention for half types up to width 256 (vectors of
    253 with the three appended), the memory-efficient kernel for float32 (fp32 and tf32 alike);
    past 253 the explicit core, which :func:`~pbgtrain.model.attention.attention_core` picks there."""
    from pbgtrain.model.attention import attention_core

    cuda = torch.device("cuda")
    assert [fused_kernel("cuda", dtype, 100) for dtype in (torch.float32, torch.bfloat16, torch.float16)] == [
        "memory-efficient", "flash", "flash"]
    assert [fused_kernel("cuda", torch.bfloat16, d) for d in (253, 254)] == ["flash", "explicit"]
    assert [fused_kernel("cuda", torch.float32, d) for d in (253, 254)] == ["memory-efficient", "explicit"]
    assert [type(attention_core(cuda, d)).__name__ for d in (253, 254)] == ["FusedAttention", "ExplicitAttention"]
    assert fused_kernel("cpu", torch.bfloat16, 100) == "flash (CPU)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_card_runs_the_kernel_the_rule_names(dtype: torch.dtype) -> None:
    """The fused core's two calls on the card (unmeasured until a card runs it): the kernel
    :func:`fused_kernel` names, or cuDNN's for half types where torch prefers it (sm90, sm100)."""
    from pbgtrain.model.op_count import count_ops

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 64, 100, generator=gen), torch.randn(4, 80, 100, generator=gen)
    sink, pad = (q * q).sum(-1) + SINK_OFFSET, torch.zeros(4, 80)
    operands = _layout_operands(q, k, sink, pad, shifted=True)
    cuda = Operands(operands.queries.to("cuda", dtype), operands.keys.to("cuda", dtype),
                    operands.values.to("cuda", dtype), operands.dim)
    core = FusedAttention()

    def both() -> None:
        out, saved = core.attend(cuda)
        core.keys_grad(cuda, saved, q.cuda(), torch.ones(4, 64, device="cuda"), out[..., cuda.sink].float())

    both()
    counted = count_ops(both).by_name
    named = SDPA_OPS[fused_kernel("cuda", dtype, 100)]
    allowed = {named, SDPA_OPS["cudnn"]} if dtype is torch.bfloat16 else {named}
    assert sum(n for name, n in counted.items() if name in allowed) == 2, counted
