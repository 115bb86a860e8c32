"""The operations a replayed step dispatches, counted on the CPU: each one a kernel launch on a GPU.

At a batch of 10,000 a step replayed as a CUDA graph is bound by its launches, not its arithmetic,
so the body's computing operations are counted (:func:`pbgtrain.model.op_count.count_replayed_step`:
the profiler's tree and torch's operator registry, by the rule of :mod:`pbgtrain.model.op_count`)
on the LiveJournal shape (one relation, operator none, dot, softmax, same-batch and uniform
negatives merged into one group of keys per chunk, the attention head), with the GPU's fused core.
The count does not depend on the sizes (a test shows it), so the shape is scaled down here.

Where the count stands, by module (94 with the fused core, 99 with the explicit one; 193 and 199
before issue 55), and what each group is for:

- ``counter_rng`` (30): the uniform negatives of both sides drawn at once
  (:func:`~pbgtrain.model.negative_sampling.sample_uniform_many`: a draw's key, two mixes of a
  number, and both words of every id in one mix; the facing xor-shifts of consecutive mixes
  cancelled), the same ids as one draw per side;
- ``attention`` (35 fused, 40 explicit): the operands written into kept buffers (the queries and
  their sink scores, the positives, the candidates, the padding mask: 6), the forward attention
  and its readout (3), the sampled violators (8), the loss (6), the queries' and positives'
  gradients (5), the keys' gradient (5 fused: their weights, one more forward attention, its
  readout; 4 explicit: ``Pᵀ`` times the weights), spread to the positives and candidates (2);
- ``tables`` (15): the rows gathered in one ``index_select``, the map of repeated rows (2), row
  Adagrad (12); ``lookup`` (4): the ids joined, the leaf's gradient assembled (1) and summed per
  row (2);
- ``inputs`` (3): which rows of the padded batch are edges (N3's, computed whether N3 is on or not);
- ``comparators`` (2), ``negative_scores`` (1): the positives' scores, the sides' queries stacked;
- ``gradients`` (2): the two sides' gradients of each row added; ``step`` (2): the sums.
"""

from __future__ import annotations

import pytest
import torch

from pbgtrain.model import EdgeBatch, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
from pbgtrain.model.attention import AttentionHead, ExplicitAttention, FusedAttention
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.negative_sampling import sample_uniform, sample_uniform_many
from pbgtrain.model.op_count import OpCount, computes, count_ops, count_replayed_step, has_kernel

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

BUDGET = {"counter_rng": 30, "attention": 35, "tables": 15, "lookup": 4, "inputs": 3, "comparators": 2,
          "negative_scores": 1, "gradients": 2, "step": 2}
"""The LiveJournal body's computing operations by module, with the fused core (see the module doc)."""
EXPLICIT_ATTENTION = 40
"""The attention module's with the explicit core (P written out: its softmax's passes)."""


def _livejournal_body(batch_size: int, negatives: int, entities: int, core: str) -> OpCount:
    """The LiveJournal model (d100, operator none, dot, softmax, no N3, one relation) at a batch of
    ``batch_size`` (7 rows of padding) with ``negatives`` same-batch and uniform negatives."""
    dim = 100
    negs = NegativeSampling(negatives, negatives)
    spec = ModelSpec({"entity": dim}, (RelationSpec("rel", "entity", "entity", operator="none"),), comparator="dot",
                     loss_fn="softmax", global_emb=False, lr=0.1, relation_lr=0.1, train_negatives=negs,
                     eval_negatives=negs)
    model = EmbeddingModel(spec)
    gen = torch.Generator().manual_seed(0)
    table = EntityTable(torch.randn(entities, dim, generator=gen).mul_(1e-3))
    edges = batch_size - 7
    lhs, rhs = (torch.randint(entities, (edges,), generator=gen) for _ in range(2))
    batch = EdgeBatch(lhs, rhs, 0).pad(batch_size)
    head = AttentionHead(FusedAttention() if core == "fused" else ExplicitAttention())
    return count_replayed_step(model, table, table, batch, head, make_relation_optimizer(model))


@pytest.mark.parametrize("core", ["fused", "explicit"])
def test_the_livejournal_body_dispatches_no_more_than_its_budget(core: str) -> None:
    """Each module within its budget (the module doc says what each group is for)."""
    counted = _livejournal_body(1000, 100, 5000, core)
    budget = {**BUDGET, "attention": BUDGET["attention"] if core == "fused" else EXPLICIT_ATTENTION}
    over = {module: (n, budget.get(module, 0)) for module, n in counted.by_module.items() if n > budget.get(module, 0)}
    assert over == {}, f"over budget: {over}"
    assert counted.computing <= sum(budget.values())


def test_the_count_does_not_depend_on_the_sizes() -> None:
    """A fifth of the batch, of the negatives and of the table: the same operations, module by module."""
    small, large = _livejournal_body(200, 20, 1000, "fused"), _livejournal_body(1000, 100, 5000, "fused")
    assert small.by_module == large.by_module
    assert small.by_name == large.by_name


def test_the_rule_counts_kernels_not_views_allocations_or_wrappers() -> None:
    x = torch.ones(4, 3)
    views = count_ops(lambda: x.t().view(-1, 4).unsqueeze(0).expand(2, 3, 4).select(0, 1).detach())
    assert (views.computing, views.aten > 0) == (0, True)
    assert count_ops(lambda: torch.empty(5)).computing == 0
    # to → _to_copy → copy_ is one copy; matmul → mm one product; new_zeros → zero_ → fill_ one fill
    assert count_ops(lambda: x.to(torch.float64)).by_name == {"aten::copy_": 1}
    assert count_ops(lambda: x @ x.t()).by_name == {"aten::mm": 1}
    assert count_ops(lambda: x.new_zeros(3)).computing == 1
    # a kernel's own dispatches are not counted: a reduction's fill, index_add_'s scatter_add_
    assert count_ops(lambda: x.sum()).by_name == {"aten::sum": 1}
    added = count_ops(lambda: torch.zeros(5, 3).index_add_(0, torch.tensor([1, 1, 2, 0]), x))
    assert added.by_name["aten::index_add_"] == 1 and "aten::scatter_add_" not in added.by_name
    assert (computes("aten::add_"), computes("aten::reshape"), computes("aten::result_type")) == (True, False, False)
    assert (has_kernel("aten::bmm"), has_kernel("aten::matmul")) == (True, False)


def test_a_draw_is_the_documented_hash_in_29_operations() -> None:
    """The counter generator's ids are ``((mix(k ^ 2i) << 31) | (mix(k ^ (2i + 1)) >> 1)) % high``
    with ``k = mix(seed ^ mix(draw))`` (lowbias32-style ``mix``), written out plainly here; the
    generator's fewer operations give the same numbers, one draw or several at once."""
    mask = 0xFFFFFFFF

    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & mask
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & mask
        return x ^ (x >> 16)

    def plain(seed: int, draw: int, high: int, count: int) -> list[int]:
        folded = (seed ^ (seed >> 32)) & mask
        key = mix(folded ^ mix(draw & mask))
        return [((mix(key ^ 2 * i) << 31) | (mix(key ^ (2 * i + 1)) >> 1)) % high for i in range(count)]

    generator = CounterGenerator(torch.device("cpu"))
    for seed in (0, 7, 2**40 + 5):
        generator.manual_seed(seed)
        draws = [(4_847_571, 9), (10, 5), (3, 1), (2**31 - 1, 4)]
        assert [generator.randint(high, count).tolist() for high, count in draws] == [
            plain(seed, d, high, count) for d, (high, count) in enumerate(draws)]
        generator.manual_seed(seed)
        assert [ids.tolist() for ids in generator.randints(draws)] == [
            plain(seed, d, high, count) for d, (high, count) in enumerate(draws)]

    def one() -> None:
        generator.randint(1000, 1000)

    def both() -> None:
        generator.randints([(1000, 1000), (1000, 1000)])

    one()  # the positions and offsets are made at a draw's first call and kept
    both()
    assert (count_ops(one).computing, count_ops(both).computing) == (29, 30)


def test_sampling_both_sides_at_once_draws_what_each_side_would() -> None:
    device = torch.device("cpu")
    for generator in (CounterGenerator(device), torch.Generator()):
        generator.manual_seed(3)
        draws = [(50, 6), (0, 4), (70, 6)]
        together = sample_uniform_many(draws, device=device, generator=generator)
        generator.manual_seed(3)
        apart = [sample_uniform(n, count, device=device, generator=generator) for n, count in draws]
        assert [t.tolist() for t in together] == [a.tolist() for a in apart]
