"""Static shapes: a batch padded to the run's batch size trains as the batch itself.

The padding rows (entity 0, weight 0) are masked wherever they would count: as batch negatives
of the real edges, in N3, in the violators and the edge count; their zero gradient leaves row 0
as it was. Compared here step by step on the model, and as a whole run on the example graph
(every committed array, and the stats).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pbgio.checkpoint import CheckpointDir
from pbgio.example import build_example
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
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
from pbgtrain.train import FitOptions, fit

ENTITIES = 200  # enough that a negative is seldom the positive's own entity (see _ties)
CASES = {  # name: (operator, dynamic, loss, comparator, batch negs, uniform negs, all_negs, reg)
    "livejournal": ("none", False, "softmax", "dot", 4, 5, False, 0.0),
    "complex-n3": ("complex_diagonal", True, "softmax", "dot", 3, 6, False, 1e-2),
    "ranking-cos": ("translation", False, "ranking", "cos", 4, 2, False, 0.0),
    "l2-affine": ("affine", False, "softmax", "l2", 2, 3, False, 1e-2),
    "one-vs-all": ("complex_diagonal", True, "softmax", "dot", 0, 0, True, 1e-2),
    "uniform-only": ("diagonal", False, "softmax", "squared_l2", 0, 4, False, 0.0),
    "batch-only": ("none", False, "softmax", "dot", 4, 0, False, 0.0),
}


def _model(case: str) -> tuple[EmbeddingModel, torch.optim.Optimizer | None]:
    operator, dynamic, loss, comparator, batch_negs, uniform_negs, all_negs, reg = CASES[case]
    negs = NegativeSampling(batch_negs, uniform_negs)
    spec = ModelSpec({"e": 6}, (RelationSpec("r", "e", "e", operator=operator, all_negs=all_negs),),
                     num_dynamic_rels=3 if dynamic else None, comparator=comparator, loss_fn=loss,
                     regularization_coef=reg, global_emb=not dynamic, lr=0.2, relation_lr=0.1,
                     train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    return model, make_relation_optimizer(model)


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_steps_equal_the_steps_on_the_real_edges(case: str) -> None:
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(ENTITIES, 6, generator=gen, dtype=torch.float64)
    sizes = [9, 9, 5, 1, 9, 3]  # full batches, then the short ones a bucket ends with
    batches = []
    for size in sizes:
        rel = torch.randint(3, (size,), generator=gen) if CASES[case][1] else 0
        batches.append(EdgeBatch(torch.randint(ENTITIES, (size,), generator=gen),
                                 torch.randint(ENTITIES, (size,), generator=gen),
                                 rel))
    results = {}
    for padded in (False, True):
        model, optimizer = _model(case)
        table = EntityTable(start.clone())
        stats = [train_step(model, table, table, b.pad(9) if padded else b, optimizer,
                            generator=torch.Generator().manual_seed(k)) for k, b in enumerate(batches)]
        results[padded] = (table, model, stats)
    (plain, plain_model, plain_stats), (pad, pad_model, pad_stats) = results[False], results[True]
    torch.testing.assert_close(pad.weights, plain.weights)
    torch.testing.assert_close(pad.adagrad_sum, plain.adagrad_sum)
    for (key, value), other in zip(plain_model.state_dict().items(), pad_model.state_dict().values(), strict=True):
        torch.testing.assert_close(other, value, msg=key)
    for k, (a, b, batch) in enumerate(zip(plain_stats, pad_stats, batches, strict=True)):
        assert b.count == a.count
        ties = _ties(case, batch, k)  # a negative of the positive's own entity: its side of the positive is rounding
        assert abs(b.violators_lhs - a.violators_lhs) <= ties[0] and abs(b.violators_rhs - a.violators_rhs) <= ties[1]
        assert b.loss == pytest.approx(a.loss, rel=1e-9) and b.reg == pytest.approx(a.reg, rel=1e-9, abs=1e-12)


def _ties(case: str, batch: EdgeBatch, seed: int) -> tuple[int, int]:
    """Per side, the negatives of a step that are the positive's own entity (same entity, same
    score up to rounding: whether such a negative counts as a violator is the arithmetic's
    rounding, which may differ between a batch and its padded copy): uniform candidates (drawn
    as the step draws them) and same-chunk positives."""
    _, _, _, _, batch_negs, uniform_negs, all_negs, _ = CASES[case]
    if all_negs:
        return 0, 0  # the own entity is masked
    gen = torch.Generator().manual_seed(seed)
    uniform = [torch.randint(ENTITIES, (uniform_negs,), generator=gen) for _ in range(2)] if uniform_negs else []
    chunk = max(min(batch_negs, len(batch)), 1)
    out = []
    for side, ids in enumerate((batch.lhs, batch.rhs)):
        count = sum(int((u == i).sum()) for u in uniform[side:side + 1] for i in ids)
        if batch_negs:
            for start in range(0, len(ids), chunk):
                block = ids[start:start + chunk]
                count += int((block.unsqueeze(0) == block.unsqueeze(1)).sum()) - len(block)
        out.append(count)
    return out[0], out[1]


def test_padding_rows_leave_row_zero_untouched() -> None:
    model, optimizer = _model("batch-only")  # no uniform negative can draw row 0
    table = EntityTable(torch.randn(20, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    before = table.weights.clone()
    batch = EdgeBatch(torch.tensor([3, 4]), torch.tensor([5, 6]), 0).pad(7)
    stats = train_step(model, table, table, batch, optimizer, generator=torch.Generator().manual_seed(0))
    assert stats.count == 2
    assert torch.equal(table.weights[0], before[0]) and table.adagrad_sum[0] == 0


def test_a_batch_cannot_shrink() -> None:
    with pytest.raises(ValueError, match="cannot pad a batch of 3 edges to 2"):
        EdgeBatch(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), 0).pad(2)


def _arrays(directory: Path) -> dict[str, np.ndarray]:
    import h5py

    out = {}
    for path in sorted(directory.glob("*.h5")):
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj, p=path: out.__setitem__(f"{p.name}/{name}", obj[()])
                         if isinstance(obj, h5py.Dataset) else None)
    return out


def test_a_run_with_static_shapes_commits_the_same_embeddings(tmp_path: Path) -> None:
    """The example graph (two partitions, two static relations with operators, global embeddings,
    batch 120 with a short last batch per relation) trained with and without --static-shapes."""
    arrays, stats = {}, {}
    for static in (False, True):
        config = build_example(tmp_path / str(static), num_edges=2000)
        overrides = ["num_epochs=2", "batch_size=120", "num_batch_negs=40"]
        fit(load_run_config(config, overrides), FitOptions(seed=3, static_shapes=static))
        assert validate_path(config.parent).ok
        arrays[static] = _arrays(config.parent / "checkpoint")
        stats[static] = [line["stats"] for line in CheckpointDir(config.parent / "checkpoint").read_stats()
                         if "stats" in line]
    assert arrays[False].keys() == arrays[True].keys() and arrays[False]
    for name, value in arrays[False].items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(arrays[True][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
        elif value.dtype.kind in "iub":  # the optimizer's pickled state (bytes of floats) is compared above, by step
            np.testing.assert_array_equal(arrays[True][name], value, err_msg=name)
    for a, b in zip(stats[False], stats[True], strict=True):
        assert a["count"] == b["count"]
        # near the start every score is about 0 and thousands of negatives tie with their positive to a
        # few ulps: the embeddings' last bits (a short batch's sums taken in another order) tip some
        for key, value in a["metrics"].items():
            assert b["metrics"][key] == pytest.approx(value, rel=5e-2 if "violators" in key else 1e-4, abs=1e-9), key
