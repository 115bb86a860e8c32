"""Files pbgio writes satisfy the original PBG's reading rules (FORMAT-NOTES §1).

The functions below restate, independently of pbgio, how the original reads each
file: its format_version check, its dataset names and dtypes, its regex mapping of
model dataset names to state-dict keys, and torch.load of the optimizer blob.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from pbgio.checkpoint import (
    CheckpointDir,
    EmbeddingsState,
    FileMetadata,
    IterationInfo,
    ModelState,
    write_checkpoint,
)
from pbgio.config import load_config
from pbgio.edges import BucketWriter, EdgeBucket, FeatureLists
from pbgio.example import build_example
from pbgio.spec.checkpoint import expected_model_params

torch = pytest.importorskip("torch")


def original_read_count(path: Path) -> int:
    with path.open("rt") as tf:
        return int(tf.read().strip())


def original_check_version(hf: h5py.File) -> None:
    if hf.attrs.get("format_version") != 1:
        raise RuntimeError("Version mismatch")


def original_read_edges(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as hf:
        original_check_version(hf)
        out = {}
        n = hf["rel"].len()
        for name in ("lhs", "rhs", "rel"):
            ds = hf[name]
            assert ds.len() == n
            buf = np.empty(n, dtype=np.int64)
            ds.read_direct(buf)
            out[name] = buf
        for side in ("lhs", "rhs"):
            if f"{side}d_offsets" in hf:
                offsets = np.empty(n + 1, dtype=np.int64)
                hf[f"{side}d_offsets"].read_direct(offsets)
                data = np.empty(offsets[-1] - offsets[0], dtype=np.int64)
                if len(data):
                    hf[f"{side}d_data"].read_direct(data, np.s_[offsets[0]:offsets[-1]])
                out[f"{side}d_offsets"], out[f"{side}d_data"] = offsets, data
        return out


_NAME_MAP = [
    (re.compile(r"^relations/(?P<idx>[^./]+)/operator/(?P<side>[^./]+)/(?P<param>[^./]+)$"),
     "{side}_operators.{idx}.{param}"),
    (re.compile(r"^entities/(?P<type>[^./]+)/global_embedding$"), "global_embs.emb_{type}"),
]


def original_load_model(path: Path) -> tuple[dict[str, torch.Tensor], object]:
    with h5py.File(path, "r") as hf:
        original_check_version(hf)
        state = {}

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                for pattern, template in _NAME_MAP:
                    m = pattern.match(name)
                    if m:
                        state[template.format(**m.groupdict())] = torch.from_numpy(obj[...])
                        assert obj.attrs["state_dict_key"] == template.format(**m.groupdict())
                        return
                raise RuntimeError(f"unmapped {name}")

        hf["model"].visititems(visit)
        optimizer = None
        if "optimizer/state_dict" in hf:
            optimizer = torch.load(io.BytesIO(hf["optimizer/state_dict"][...].tobytes()), weights_only=True)
        return state, optimizer


def original_load_embeddings(path: Path) -> tuple[torch.Tensor, object]:
    with h5py.File(path, "r") as hf:
        original_check_version(hf)
        ds = hf["embeddings"]
        out = torch.empty(ds.shape, dtype=torch.float32)
        ds.read_direct(out.numpy())
        optimizer = torch.load(io.BytesIO(hf["optimizer/state_dict"][...].tobytes()), weights_only=True)
        return out, optimizer


def torch_blob(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_written_layout_reads_with_original_rules(tmp_path: Path) -> None:
    config_path = build_example(tmp_path, num_edges=300)
    cfg = load_config(config_path)
    assert original_read_count(tmp_path / "entities/entity_count_user_1.txt") == 30
    assert json.loads((tmp_path / "entities/entity_names_user_1.json").read_text())[0] == "user030"
    edges = original_read_edges(tmp_path / "edges/train/edges_0_1.h5")
    assert len(edges["rel"]) > 0 and edges["rel"].max() <= 1

    ckpt = CheckpointDir(tmp_path / "checkpoint")
    row_adagrad = {"state": {0: {"sum": torch.zeros(30)}},
                   "param_groups": [{"lr": 0.1, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
    emb = np.arange(30 * 16, dtype=np.float32).reshape(30, 16)
    params = {n: np.ones(s, np.float32) for n, s in expected_model_params(cfg, None).items() if s}
    meta = FileMetadata(cfg.to_json(), IterationInfo(10, 0, 1, 0, "edges/train", 1, 0))
    write_checkpoint(
        ckpt, 1, config=cfg, metadata=meta,
        embeddings={("user", 0): EmbeddingsState(emb, torch_blob(row_adagrad))},
        model=ModelState(params, torch_blob({"state": {}, "param_groups": []})),
    )
    assert original_read_count(ckpt.path / "checkpoint_version.txt") == 1
    loaded, opt = original_load_embeddings(ckpt.path / "embeddings_user_0.v1.h5")
    assert torch.equal(loaded, torch.from_numpy(emb))
    assert torch.equal(opt["state"][0]["sum"], torch.zeros(30))
    state, model_opt = original_load_model(ckpt.path / "model.v1.h5")
    assert set(state) == {"rhs_operators.0.translation", "rhs_operators.1.diagonal",
                          "global_embs.emb_user", "global_embs.emb_item"}
    assert model_opt == {"state": {}, "param_groups": []}
    with h5py.File(ckpt.path / "model.v1.h5", "r") as hf:
        assert hf.attrs["format_version"].dtype == np.int64
        assert json.loads(hf.attrs["config/json"]) == json.loads((ckpt.path / "config.json").read_text())
        assert hf.attrs["iteration/edge_path"] == "edges/train"
        assert hf.attrs["iteration/num_epochs"].dtype == np.int64
        assert hf["optimizer/state_dict"].dtype == np.dtype("V1")
        assert list(hf["model"].keys()) == ["relations", "entities"]


def test_featurized_streamed_bucket_reads_with_original_rules(tmp_path: Path) -> None:
    path = tmp_path / "edges_0_0.h5"
    rng = np.random.default_rng(1)
    parts = []
    with BucketWriter(path, buffer_edges=7) as writer:
        for _ in range(5):
            bags = [list(rng.integers(0, 20, rng.integers(0, 4))) for _ in range(5)]
            part = EdgeBucket(rel=np.zeros(5), lhs=rng.integers(0, 9, 5), rhs=np.full(5, -1),
                              rhs_features=FeatureLists.from_lists(bags))
            parts.append(part)
            writer.append(part)
    whole = EdgeBucket.concat(parts)
    edges = original_read_edges(path)
    assert np.array_equal(edges["lhs"], whole.lhs)
    assert whole.rhs_features is not None
    assert np.array_equal(edges["rhsd_offsets"], whole.rhs_features.offsets)
    assert np.array_equal(edges["rhsd_data"], whole.rhs_features.data)
