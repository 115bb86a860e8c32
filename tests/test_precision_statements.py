"""What docs/guides/gpu.md's "Precision" says of ``--precision bf16``, held to the code on a CPU.

Autocast treats a matrix product the same way on a CPU as on CUDA (both lists put ``mm``, ``bmm``
and ``matmul`` among the ops cast to the lower precision): the inputs are rounded to bfloat16, the
product accumulates in float32 inside the kernel, and its result is returned in bfloat16. So under
bf16 a score that comes out of a matrix product is rounded twice, its inputs and itself, before
pbgtrain widens it to float32 (``full_precision``); a positive's own score (an elementwise product
and a sum) is no matrix product and stays float32.

Bounds: bfloat16 keeps 8 significant bits, so rounding a value to it moves it by at most 2⁻⁸ of
itself; two float32 sums of the same d products, in whatever order, differ by at most
2·d·2⁻²⁴·Σ|aᵢbᵢ| (each is within d·2⁻²⁴·Σ|aᵢbᵢ| of the exact sum).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pbgtrain.model import (
    AttentionHead,
    EmbeddingModel,
    EntityTable,
    ExplicitAttention,
    FusedAttention,
    ModelSpec,
    RelationSpec,
    make_comparator,
    make_loss,
)
from pbgtrain.model.negative_sampling import NegativeMode
from pbgtrain.model.negative_scores import BlockShape, training_head
from pbgtrain.model.precision import precision_scope
from pbgtrain.model.scoring import score_candidates

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

CPU = torch.device("cpu")
DIM = 64


def _bf16_valued(x: torch.Tensor) -> bool:
    """Whether every element of float32 ``x`` is a bfloat16 number (rounding it changes nothing)."""
    return torch.equal(x, x.bfloat16().float())


@pytest.mark.parametrize("comparator", ["dot", "cos"])
def test_under_bf16_the_score_products_and_their_adjoints_come_out_in_bf16(comparator: str) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 8, DIM, generator=g), torch.randn(3, 12, DIM, generator=g)
    cmp = make_comparator(comparator)
    with precision_scope("bf16", CPU):
        qa, kb = cmp.prepare(a), cmp.prepare(b)
        scores = cmp.all_pairs(qa, kb)
        da, db = cmp.all_pairs_grad(qa, kb, scores, torch.randn(3, 8, 12, generator=g))
    assert (scores.dtype, da.dtype, db.dtype) == (torch.bfloat16,) * 3
    with precision_scope("fp32", CPU):
        assert cmp.all_pairs(qa, kb).dtype == torch.float32


class _Products(TorchDispatchMode):
    """Records the result dtype of every matrix product and attention kernel run under it (below
    autocast, so what the kernels return)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("mm", "bmm", "addmm", "baddbmm") or "scaled_dot_product" in name:
            self.seen.append((name, (out[0] if isinstance(out, tuple) else out).dtype))
        return out


@pytest.mark.parametrize("head", ["scores", "attention (explicit)", "attention (fused)"])
def test_under_bf16_every_product_of_a_training_head_comes_out_in_bf16(head: str) -> None:
    """Both heads of the step, both attention cores (the fused one runs torch's CPU kernel here):
    each product's result, and each attention kernel's output (the sink's share and the keys'
    mass the attention loss is read from), is bfloat16 under bf16."""
    g = torch.Generator().manual_seed(1)
    q, p = torch.randn(12, DIM, generator=g), torch.randn(12, DIM, generator=g)
    shape = BlockShape(NegativeMode.BATCH_UNIFORM, chunk=4, num_pos=12, uniform="none")
    run = {"scores": training_head, "attention (explicit)": AttentionHead(ExplicitAttention()),
           "attention (fused)": AttentionHead(FusedAttention())}[head]
    products = _Products()
    with precision_scope("bf16", CPU), products:
        out = run(make_comparator("dot"), shape, make_loss("softmax"), [q], [p], [])
    assert products.seen
    assert {dtype for _, dtype in products.seen} == {torch.bfloat16}, products.seen
    assert out.loss.dtype == out.d_queries.dtype == torch.float32  # widened after


def test_the_candidates_scores_carry_the_products_rounding_not_only_their_inputs() -> None:
    """``score_candidates`` (the scores ranking uses, "scored exactly as the training negatives"):
    under bf16 every candidate's score is a bfloat16 number widened to float32, which the float32
    product of the bf16-rounded inputs is not; the two differ by the result's rounding and no
    more; the positives' scores stay float32 numbers."""
    g = torch.Generator().manual_seed(2)
    spec = ModelSpec({"e": DIM}, (RelationSpec("r", "e", "e", operator="none"),), comparator="dot",
                     loss_fn="softmax", global_emb=False)
    model = EmbeddingModel(spec)
    table = EntityTable.random(300, DIM, init_scale=1.0, generator=g)
    lhs, rhs = torch.arange(32), torch.arange(32, 64)
    with precision_scope("bf16", CPU):
        pos, cand = score_candidates(model, table, table, lhs, 0, rhs, "rhs")
    assert cand.dtype == pos.dtype == torch.float32
    assert _bf16_valued(cand)
    assert not _bf16_valued(pos)  # no matrix product: float32 arithmetic on the float32 rows

    rounded = EntityTable(table.weights.bfloat16().float())  # what autocast gives the product as inputs
    _, inputs_only = score_candidates(model, rounded, rounded, lhs, 0, rhs, "rhs")
    assert not _bf16_valued(inputs_only)
    accumulation = 2 * DIM * 2.0**-24 * (rounded.weights[lhs].abs() @ rounded.weights.abs().T)
    bound = 2.0**-8 * (inputs_only.abs() + accumulation) + accumulation
    assert bool(((cand - inputs_only).abs() <= bound).all())
    assert bool((cand != inputs_only).any())
