"""Devices and precisions of ``pbgtrain fit``: the GPU path (marked ``gpu``; skipped without CUDA),
bf16/tf32 with float32 master state, the one-line error where CUDA is asked for and missing, and
bad ids stopped (a pbgio error naming file and row) before any kernel indexes with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pbgio.checkpoint import CheckpointDir
from pbgio.edges import read_bucket, write_bucket
from pbgio.errors import FormatError
from pbgio.testing.planted import TEST_EDGE_PATH, planted_graph
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, all_entities_batch, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit
from tests.cli import pbgtrain

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PLANTED = {"num_nodes": 600, "num_edges": 20_000, "num_epochs": 4, "num_edge_chunks": 1, "num_communities": 30}


def _planted(tmp_path: Path, partitions: int = 2, **overrides: object) -> Path:
    return planted_graph(tmp_path / "graph", num_partitions=partitions, **{**PLANTED, **overrides})


def _filtered_mrr(config: Path, device: str = "cpu") -> float:
    layout = config.parent
    options = EvalOptions(edge_paths=[layout / TEST_EDGE_PATH], device=device,
                          filter_paths=[layout / "edges/train", layout / TEST_EDGE_PATH])
    return evaluate_checkpoint(load_run_config(config), options).metrics.mrr


def _fit(config: Path, **options: object) -> None:
    fit(load_run_config(config, ["workers=1"]), FitOptions(**options))  # type: ignore[arg-type]


def _corrupt(config: Path, bucket: str, row: int, value: int) -> Path:
    path = config.parent / "edges/train" / bucket
    edges = read_bucket(path)
    edges.rhs[row] = value
    write_bucket(path, edges)
    return path


# --------------------------------------------------------------------------- every machine

def test_bf16_trains_as_well_as_fp32_with_float32_state(tmp_path: Path) -> None:
    """bf16 matrix products (CPU autocast here), float32 tables and Adagrad state: the filtered MRR
    stays within 0.03 of fp32, which is far above chance (~0.01 against 300 nodes)."""
    mrr = {}
    for precision in ("fp32", "bf16"):
        config = _planted(tmp_path / precision)
        _fit(config, precision=precision)
        state = CheckpointDir(config.parent / "checkpoint").read_embeddings("node", 0, 4)
        assert state.embeddings.dtype == np.float32 and state.optimizer_state is not None
        mrr[precision] = _filtered_mrr(config)
    assert mrr["fp32"] > 0.3, mrr
    assert abs(mrr["bf16"] - mrr["fp32"]) < 0.03, mrr


def test_half_precision_in_the_config_selects_bf16_on_a_gpu(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1, half_precision=True)
    from pbgtrain.training.device import resolve_precision

    cfg = load_run_config(config).config
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_precision(None, cfg, cuda)[0] == "bf16" and resolve_precision("fp32", cfg, cuda)[0] == "fp32"
    assert resolve_precision(None, cfg, cpu)[0] == "fp32"  # as the original, which uses it on CUDA only
    assert resolve_precision("bf16", cfg, cpu)[0] == "bf16"


@pytest.mark.parametrize(("amx", "avx512_bf16", "want"), [(False, False, "fp32"), (False, True, "bf16"),
                                                          (True, False, "bf16")])
def test_precision_auto_takes_bf16_where_the_cpu_computes_it_and_bf16_elsewhere_is_warned_of(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool, want: str) -> None:
    """``auto``: bf16 on a CPU with AMX or AVX-512 BF16, else fp32, said on the run's line; an
    explicit bf16 on a CPU without either runs, with a warning of its measured cost."""
    from pbgtrain.training.device import resolve_precision

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    cfg = load_run_config(_planted(tmp_path, num_epochs=1)).config
    cpu = torch.device("cpu")
    precision, line = resolve_precision("auto", cfg, cpu)
    assert precision == want and line.startswith(f"precision {want} (--precision auto: ")
    assert ("AMX" if amx else "AVX-512 BF16" if avx512_bf16 else "no native bf16") in line
    precision, line = resolve_precision("bf16", cfg, cpu)
    assert precision == "bf16"
    assert line.startswith("warning: --precision bf16: ") == (want == "fp32"), line
    assert resolve_precision("fp32", cfg, cpu) == ("fp32", "precision fp32")


def test_the_run_says_its_checkpoint_memory_then_its_device_and_precision_first(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1)
    result = pbgtrain("fit", str(config), "--precision", "auto", "--no-progress", "-p", "workers=1")
    assert result.returncode == 0, result.stderr
    where, memory, first = result.stderr.splitlines()[:3]  # what the run reports goes to stderr, its summary to stdout
    assert where == f"checkpoint: {(config.parent / 'checkpoint').resolve()} (new)", where  # links resolved
    assert memory.startswith("memory: training holds ≈ ") and "partition" in memory, memory
    assert first.startswith("training on cpu (1 thread), precision ") and "--precision auto" in first, first


def test_an_out_of_range_id_is_a_pbgio_error_naming_file_and_row_even_unvalidated(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1)
    path = _corrupt(config, "edges_0_1.h5", row=7, value=10**6)
    assert not validate_path(config).ok
    with pytest.raises(FormatError) as info:
        _fit(config, check_layout=False)
    issue = info.value.issue
    assert (issue.rule, issue.file, issue.dataset, issue.rows) == ("edge-rhs-range", str(path), "rhs", (7,))
    assert "found 1000000" in str(info.value)


def test_bounds_cover_plain_ids_and_feature_ids_of_a_bucket_with_feature_bags() -> None:
    """A bucket holding lhsd_* bags (a featurized relation) also holds plain edges: both kinds of id
    are checked, each against its own table (the validator's limits)."""
    from pbgio.checks.edges import check_bounds, relation_limits
    from pbgio.config import parse_config
    from pbgio.edges import EdgeBucket, FeatureLists

    cfg = parse_config({"entities": {"doc": {"num_partitions": 1, "featurized": True},
                                     "item": {"num_partitions": 1}},
                        "relations": [{"name": "about", "lhs": "doc", "rhs": "item"},
                                      {"name": "near", "lhs": "item", "rhs": "item"}],
                        "dimension": 4, "entity_path": "e", "edge_paths": ["x"], "checkpoint_path": "c"}, "test")
    limits = {s: relation_limits(cfg, s, 0, 2, {("doc", 0): 50, ("item", 0): 4}) for s in ("lhs", "rhs")}

    def bucket(plain_lhs: int, feature: int) -> EdgeBucket:
        return EdgeBucket(rel=np.array([0, 1]), lhs=np.array([0, plain_lhs]), rhs=np.array([1, 2]),
                          lhs_features=FeatureLists.from_lists([[3, feature], []]))

    check_bounds(bucket(3, 49), Path("b.h5"), first_row=0, **limits)
    with pytest.raises(FormatError, match=r"lhs: row 1: expected 0 <= lhs < 4 .* found 4 \[edge-lhs-range\]"):
        check_bounds(bucket(4, 49), Path("b.h5"), first_row=0, **limits)
    with pytest.raises(FormatError, match=r"lhsd_data: row 0: .* found 50 in the features of edge row 0"):
        check_bounds(bucket(3, 50), Path("b.h5"), first_row=0, **limits)


def test_an_out_of_range_id_stops_evaluation_too(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1)
    _fit(config)
    test_bucket = config.parent / TEST_EDGE_PATH / "edges_1_1.h5"
    edges = read_bucket(test_bucket)
    edges.lhs[0] = -1
    write_bucket(test_bucket, edges)
    with pytest.raises(FormatError, match=r"edges_1_1.h5: lhs: row 0: .* found -1 \[edge-lhs-range\]"):
        _filtered_mrr(config)


def test_all_entities_evaluation_is_batched_to_bounded_memory() -> None:
    assert all_entities_batch(1_000) == 500
    assert all_entities_batch(4_800_000) * 4_800_000 <= 1 << 25
    assert all_entities_batch(10**10) == 1


def test_the_automatic_gpu_budget_leaves_room_for_a_bucket(tmp_path: Path) -> None:
    """What a bucket holds besides the parked partitions (its largest lhs and rhs partitions, and
    the unpartitioned tables) is reserved from the GPU's share before anything is parked."""
    from pbgtrain.schedule.buckets import PartitionSides
    from pbgtrain.train import resolve_fit
    from pbgtrain.training.residency import bucket_bytes
    from pbgtrain.training.trainer import Trainer

    config = _planted(tmp_path, partitions=3, num_nodes=601, num_epochs=1)
    run = load_run_config(config)
    trainer = Trainer(resolve_fit(run, FitOptions()))
    try:
        dim = run.config.entity_dimension("node")
        reserved = bucket_bytes(run.config, PartitionSides.from_config(run.config), trainer.counts)
        assert reserved == 2 * 201 * (dim + 1) * 4  # node on both sides; 601 = 201 + 200 + 200
        assert trainer.partitions.cache.budget_bytes == 0  # a CPU keeps the original's bound
    finally:
        trainer.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1)
    done = pbgtrain("fit", str(config), "--device", "cuda", "--no-progress")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr  # a usage error
    assert "--device cuda" in lines[0] and "no CUDA device" in lines[0] and "--device cpu" in lines[0]
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_cuda_training_matches_cpu_quality(tmp_path: Path, precision: str) -> None:
    """Same config, same files: on the GPU (each precision) the filtered MRR is within 0.03 of
    the CPU's, and the checkpoint validates."""
    cpu = _planted(tmp_path / "cpu")
    _fit(cpu)
    gpu = _planted(tmp_path / "gpu")
    _fit(gpu, device="cuda", precision=precision)
    assert validate_path(gpu.parent).ok
    assert abs(_filtered_mrr(gpu, "cuda") - _filtered_mrr(cpu)) < 0.03


@pytest.mark.gpu
@CUDA
def test_cuda_evaluation_equals_cpu_evaluation(tmp_path: Path) -> None:
    config = _planted(tmp_path, num_epochs=1)
    _fit(config)
    assert _filtered_mrr(config, "cuda") == pytest.approx(_filtered_mrr(config, "cpu"), abs=1e-4)


@pytest.mark.gpu
@CUDA
def test_a_bad_id_never_reaches_a_cuda_kernel(tmp_path: Path) -> None:
    """On the GPU a bad id would be a device-side assert that poisons the process; it is a pbgio error."""
    config = _planted(tmp_path, num_epochs=1)
    _corrupt(config, "edges_1_0.h5", row=3, value=-5)
    with pytest.raises(FormatError, match=r"row 3: .* found -5 \[edge-rhs-range\]"):
        _fit(config, check_layout=False, device="cuda")
    torch.cuda.synchronize()  # the context is healthy: no kernel asserted
