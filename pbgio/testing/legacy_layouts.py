"""A legacy-layout writer for tests: random .pt-era layouts plus what migrating them must give.

This module writes files the way the 2019 code did (``torch.save`` pickles,
1-based or 0-based names, camelCase or snake_case configs, ``rotation`` for the
old affine operator); nothing in the migration (:mod:`pbgio.legacy`) uses it. :class:`LegacyTruth`
holds the expected migrated values, computed here independently of :mod:`pbgio.legacy.spec`.
It needs torch, imported when a layout is written.

>>> import tempfile, pathlib
>>> truth = write_legacy_layout(pathlib.Path(tempfile.mkdtemp()), LegacySpec(seed=3))
>>> sorted(truth.counts)[:2]
[('item', 0), ('user', 0)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
from numpy.typing import NDArray

from pbgio.edges import EdgeBucket, FeatureLists

LegacyOperator = Literal["none", "diagonal", "translation", "linear", "affine", "complex_diagonal"]

_CAMEL = {
    "entity_path": "entityPath", "edge_paths": "edgePaths", "checkpoint_path": "outdir",
    "init_path": "loadPath", "comparator": "metric", "loss_fn": "lossFn", "global_emb": "globalEmb",
    "max_norm": "maxNorm", "init_scale": "initScale", "batch_size": "batchSize", "num_epochs": "numEpochs",
    "num_edge_chunks": "numEdgeChunks", "num_uniform_negs": "numUniformNegs",
    "num_batch_negs": "numBatchNegs", "bucket_order": "partitionOrder", "eval_fraction": "evalFraction",
    "eval_num_uniform_negs": "evalNumUniformNegs", "eval_num_batch_negs": "evalNumBatchNegs",
    "num_machines": "numMachines", "num_partition_servers": "numPartitionServers",
    "distributed_init_method": "distributedInitMethod",
    "distributed_tree_init_order": "distributedTreeInitOrder",
}
_STATIC_PARAMS: dict[str, list[tuple[str, str]]] = {
    "none": [], "diagonal": [("diagonal", "d")], "translation": [("translation", "d")],
    "linear": [("linear_transformation", "dd")],
    "affine": [("linear_transformation", "dd"), ("translation", "d")],
    "complex_diagonal": [("real", "h"), ("imag", "h")],
}
_DYNAMIC_NAMES = {"diagonal": "diagonals", "translation": "translations",
                  "linear_transformation": "linear_transformations", "real": "real", "imag": "imag"}


@dataclass(frozen=True)
class LegacySpec:
    """What kind of legacy layout to write."""

    seed: int = 0
    index_base: Literal[0, 1] = 1
    camel: bool = True
    zip_container: bool = False
    version: int = 1  # 0: an init/loadPath layout (no suffixes)
    version_file: bool = True
    # "count": the int numDynamicRels / num_dynamic_rels; "bool": dynamic_relations (snake_case only)
    dynamic: Literal["none", "count", "bool"] = "none"
    num_partitions: int = 2
    num_users: int = 9
    num_items: int = 5
    featurized: bool = False
    num_features: int = 6
    dimension: int = 4
    edges_per_bucket: int = 12
    operators: tuple[LegacyOperator, ...] = ("translation", "affine")
    rotation: bool = True  # the affine/linear matrix is stored as `rotation` (x @ R)
    global_emb: bool = True
    dictionary: bool = True
    optimizer: bool = True
    absolute_paths: bool = False
    chained_symmetric_pairs: bool = False
    shuffle_state_dict: bool = True
    num_edge_chunks: int = 1
    init_dir: bool = False  # also a loadPath directory "init": {type}_{part}.pt without suffix


@dataclass
class LegacyTruth:
    """The 0-based, renamed values a migration of the written layout must produce."""

    config: dict[str, Any]
    counts: dict[tuple[str, int], int]
    names: dict[tuple[str, int], list[str | None]]
    relation_names: list[str] | None
    dynamic_rel_count: int | None
    edges: dict[tuple[int, int], EdgeBucket]
    version: int
    embeddings: dict[tuple[str, int], NDArray[np.float32]]
    embedding_sums: dict[tuple[str, int], NDArray[np.float32] | None]
    model: dict[str, NDArray[np.float32]]  # public name -> value, in today's order
    model_sums: dict[str, NDArray[np.float32]] | None  # public name -> Adagrad sum
    init_embeddings: dict[tuple[str, int], NDArray[np.float32]] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


def _save(obj: Any, path: Path, spec: LegacySpec) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path, _use_new_zipfile_serialization=spec.zip_container)


def _tensor(a: NDArray[Any]) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def write_legacy_layout(root: Path, spec: LegacySpec) -> LegacyTruth:
    """Write ``root/data/entities``, ``root/data/train_partitioned`` and ``root/checkpoint``."""
    import torch

    rng = np.random.default_rng(spec.seed)
    base = spec.index_base
    dim = spec.dimension
    dynamic = spec.dynamic != "none"
    parts = spec.num_partitions
    types: dict[str, dict[str, Any]] = {"user": {"num_partitions": parts, "featurized": False},
                                        "item": {"num_partitions": 1, "featurized": False}}
    if spec.featurized:
        types["tag"] = {"num_partitions": 1, "featurized": True}
    relations: list[dict[str, Any]]
    if dynamic:
        relations = [{"name": "all", "lhs": "user", "rhs": "item" if not spec.featurized else "tag",
                      "weight": 1.0, "operator": spec.operators[0], "all_negs": False}]
        num_rel_ids = 3
    else:
        sides = [("user", "user"), ("user", "item"), ("item", "user")]
        if spec.featurized:
            sides[1] = ("user", "tag")
        relations = [{"name": f"r{i}", "lhs": sides[i % 3][0], "rhs": sides[i % 3][1], "weight": 1.0,
                      "operator": op, "all_negs": bool(i % 2)} for i, op in enumerate(spec.operators)]
        num_rel_ids = len(relations)
    global_emb = spec.global_emb and not dynamic

    # --- counts and names (the legacy converter gives every partition ceil(N/P) rows)
    totals = {"user": spec.num_users, "item": spec.num_items, "tag": spec.num_features}
    counts: dict[tuple[str, int], int] = {}
    names: dict[tuple[str, int], list[str | None]] = {}
    tables: dict[str, dict[int, str]] = {}
    for t, schema in types.items():
        n, p = totals[t], schema["num_partitions"]
        size = math.ceil(n / p)
        order = rng.permutation(n)
        tables[t] = {int(ix): f"{t}{int(k):03d}" for ix, k in enumerate(order)}
        for part in range(p):
            counts[(t, part)] = size
            names[(t, part)] = [tables[t].get(part * size + i) for i in range(size)]
    entity_dir = root / "data" / "entities"
    files: list[Path] = []
    for (t, part), c in counts.items():
        files.append(entity_dir / f"entity_count_{t}_{part + base}.pt")
        _save(c, files[-1], spec)
    rel_names = ([str(r["name"]) for r in relations] if not dynamic
                 else [f"dyn{i}" for i in range(num_rel_ids)])
    if spec.dictionary:
        entity_dicts = {t: {"freq": 1, "dict_type": "ENTITY", "entity_type": t, "npart": s["num_partitions"],
                            "ix_to_word": tables[t]} for t, s in types.items() if not s["featurized"]}
        rel_dict = {"freq": 1, "dict_type": "RELATION", "entity_type": "RELATION", "npart": 1,
                    "ix_to_word": dict(enumerate(rel_names))}
        files.append(entity_dir / "dict.pt")
        _save((entity_dicts, rel_dict), files[-1], spec)
    if dynamic:
        files.append(entity_dir / "dynamic_rel_count.pt")
        _save(num_rel_ids, files[-1], spec)

    # --- edges
    def side_parts(side: str) -> int:
        return max(int(types[r[side]]["num_partitions"]) for r in relations)

    edge_dir = root / "data" / "train_partitioned"
    edge_dir.mkdir(parents=True, exist_ok=True)
    edges: dict[tuple[int, int], EdgeBucket] = {}
    for lhs_part in range(side_parts("lhs")):
        for rhs_part in range(side_parts("rhs")):
            n = spec.edges_per_bucket
            rel = rng.integers(0, num_rel_ids, n).astype(np.int64)
            which = np.zeros(n, dtype=np.int64) if dynamic else rel

            def sizes(side: str, part: int, which: NDArray[np.int64]) -> NDArray[np.int64]:
                return np.array([counts[(r[side], part if types[r[side]]["num_partitions"] > 1 else 0)]
                                 for r in relations], dtype=np.int64)[which]

            lhs = (rng.random(n) * sizes("lhs", lhs_part, which)).astype(np.int64)
            rhs = (rng.random(n) * sizes("rhs", rhs_part, which)).astype(np.int64)
            feats = None
            if spec.featurized and any(r["rhs"] == "tag" for r in relations):  # else: edge-features-unused
                tagged = np.array([r["rhs"] == "tag" for r in relations])[which]
                bags = [[int(x) for x in rng.integers(0, spec.num_features, rng.integers(1, 4))] if t else []
                        for t in tagged]
                feats = FeatureLists.from_lists(bags)
                rhs = np.where(tagged, -1, rhs)
            edges[(lhs_part, rhs_part)] = EdgeBucket(rel, lhs, rhs, rhs_features=feats)
            path = edge_dir / f"edges_{lhs_part + base}_{rhs_part + base}.h5"
            files.append(path)
            with h5py.File(path, "w") as f:
                f["rel"], f["lhs"], f["rhs"] = rel + base, lhs + base, rhs + base
                if feats is not None:
                    f["rhsd_offsets"] = feats.offsets  # positions: never shifted
                    f["rhsd_data"] = feats.data + base

    # --- model (legacy keys) and expected model (today's keys, today's order)
    legacy_state: dict[str, NDArray[np.float32]] = {}
    expected: dict[str, NDArray[np.float32]] = {}

    def shape(kind: str, lead: tuple[int, ...]) -> tuple[int, ...]:
        return lead + {"d": (dim,), "dd": (dim, dim), "h": (dim // 2,)}[kind]

    op_sides = ("lhs", "rhs") if dynamic else ("rhs",)
    for side in op_sides:
        for idx, r in enumerate(relations):
            for pname, kind in _STATIC_PARAMS[r["operator"]]:
                name = _DYNAMIC_NAMES[pname] if dynamic else pname
                value = rng.normal(size=shape(kind, (num_rel_ids,) if dynamic else ())).astype(np.float32)
                public = f"relations/{idx}/operator/{side}/{name}"
                if kind == "dd" and spec.rotation:
                    legacy_name = "rotations" if dynamic else "rotation"
                    legacy_state[f"{side}_operators.{idx}.{legacy_name}"] = value
                    expected[public] = np.ascontiguousarray(np.swapaxes(value, -1, -2))
                else:
                    legacy_state[f"{side}_operators.{idx}.{name}"] = value
                    expected[public] = value
    if global_emb:
        for t in types:
            value = rng.normal(size=(dim,)).astype(np.float32)
            legacy_state[f"global_embs.emb_{t}"] = value
            expected[f"entities/{t}/global_embedding"] = value
    keys = list(legacy_state)
    if spec.shuffle_state_dict:
        keys = [keys[i] for i in rng.permutation(len(keys))]
    legacy_keys = keys
    sums = {k: rng.random(size=legacy_state[k].shape).astype(np.float32) for k in legacy_keys}
    model_optimizer = None
    model_sums = None
    if spec.optimizer:
        model_optimizer = {
            "state": {i: {"step": torch.tensor(float(i + 1)), "sum": _tensor(sums[k])}
                      for i, k in enumerate(legacy_keys)},
            "param_groups": [{"lr": 0.01, "lr_decay": 0, "eps": 1e-10, "weight_decay": 0,
                              "initial_accumulator_value": 0, "params": list(range(len(legacy_keys)))}],
        }
        model_sums = {}
        for k in legacy_keys:
            public = _public(k, dynamic)
            rotated = "rotation" in k
            model_sums[public] = np.ascontiguousarray(np.swapaxes(sums[k], -1, -2)) if rotated else sums[k]

    # --- config
    stored_paths = {"entity_path": "data/entities", "edge_paths": ["data/train_partitioned"],
                    "checkpoint_path": "checkpoint"}
    if spec.absolute_paths:
        stored_paths = {"entity_path": "/home/someone/run/data/entities",
                        "edge_paths": ["/home/someone/run/data/train_partitioned"],
                        "checkpoint_path": "/home/someone/run/checkpoint"}
    current: dict[str, Any] = {
        "entities": {t: dict(s) for t, s in types.items()}, "relations": [dict(r) for r in relations],
        "dimension": dim, "init_scale": 0.001, "max_norm": None, "global_emb": global_emb,
        "comparator": "dot", "bias": False, "loss_fn": "ranking", "margin": 0.1,
        **stored_paths,
        "init_path": None if not spec.init_dir else (
            "/home/someone/run/init" if spec.absolute_paths else "init"),
        "num_epochs": 3, "num_edge_chunks": spec.num_edge_chunks,
        "bucket_order": "affinity" if spec.chained_symmetric_pairs else "inside_out",
        "workers": 2, "batch_size": 30, "num_batch_negs": 5, "num_uniform_negs": 5, "lr": 0.01,
        "eval_fraction": 0.0, "eval_num_batch_negs": 1000, "eval_num_uniform_negs": 1000,
        "background_io": False, "verbose": 1, "hogwild_delay": 0.0, "dynamic_relations": dynamic,
        "num_machines": 1, "num_partition_servers": -1, "distributed_init_method": None,
        "distributed_tree_init_order": True,
    }
    legacy_config = _legacy_config(current, spec, num_rel_ids)
    expected_config = dict(current, entity_path="data/entities", edge_paths=["data/train_partitioned"],
                           checkpoint_path="checkpoint", init_path="init" if spec.init_dir else None)
    if spec.featurized:  # the legacy trainer refused all_negs on a featurized side (uniform negatives stay)
        expected_config.update(relations=[
            dict(r, all_negs=r["all_negs"] and "tag" not in (r["lhs"], r["rhs"])) for r in relations])

    # --- checkpoint
    ckpt = root / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    version = spec.version
    suffix = f".{version}" if version > 0 else ""
    if spec.version_file:
        files.append(ckpt / "CHECKPOINT_VERSION")
        files[-1].write_text(str(version))
    chunks = spec.num_edge_chunks
    for v in range(1 if version > 0 else 0, version + 1):
        index = v - 1
        state = {k: _tensor(legacy_state[k] if v == version else legacy_state[k] * 0) for k in legacy_keys}
        meta = (legacy_config, index // chunks if v else 0, index % chunks if v else -1, state,
                model_optimizer if v == version else None)
        files.append(ckpt / (f"METADATA_{base}.pt" + (f".{v}" if v else "")))
        _save(meta, files[-1], spec)
    embeddings: dict[tuple[str, int], NDArray[np.float32]] = {}
    embedding_sums: dict[tuple[str, int], NDArray[np.float32] | None] = {}
    for (t, part), c in counts.items():
        emb = rng.normal(size=(c, dim)).astype(np.float32)
        embeddings[(t, part)] = emb
        weights = torch.nn.Parameter(_tensor(emb)) if spec.camel else _tensor(emb)
        optim = None
        embedding_sums[(t, part)] = None
        if spec.optimizer:
            s = rng.random(c).astype(np.float32)
            embedding_sums[(t, part)] = s
            optim = {"state": {0: {"step": int(rng.integers(0, 100)), "sum": _tensor(s)}},
                     "param_groups": [{"lr": 0.01, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
        files.append(ckpt / f"{t}_{part + base}.pt{suffix}")
        _save((weights, optim), files[-1], spec)

    init_embeddings: dict[tuple[str, int], NDArray[np.float32]] = {}
    if spec.init_dir:
        for (t, part), c in counts.items():
            init_embeddings[(t, part)] = rng.normal(size=(c, dim)).astype(np.float32)
            files.append(root / "init" / f"{t}_{part + base}.pt")
            _save((_tensor(init_embeddings[(t, part)]), None), files[-1], spec)

    return LegacyTruth(
        config=expected_config, counts=counts,
        names={k: v for k, v in names.items() if not types[k[0]]["featurized"]} if spec.dictionary else {},
        relation_names=rel_names if spec.dictionary else None,
        dynamic_rel_count=num_rel_ids if dynamic else None, edges=edges, version=version,
        embeddings=embeddings, embedding_sums=embedding_sums,
        model=_today_order(expected, relations, types, dynamic), model_sums=model_sums, files=files,
        init_embeddings=init_embeddings)


def _public(key: str, dynamic: bool) -> str:
    key = key.replace(".rotations", ".linear_transformations").replace(".rotation", ".linear_transformation")
    if key.startswith("global_embs.emb_"):
        return f"entities/{key[len('global_embs.emb_'):]}/global_embedding"
    side, idx, param = key.split(".")
    return f"relations/{idx}/operator/{side.split('_')[0]}/{param}"


def _today_order(params: dict[str, NDArray[np.float32]], relations: list[dict[str, Any]],
                 types: dict[str, Any], dynamic: bool) -> dict[str, NDArray[np.float32]]:
    order: list[str] = []
    for side in ("lhs", "rhs"):
        for idx, r in enumerate(relations):
            for pname, _ in _STATIC_PARAMS[r["operator"]]:
                order.append(f"relations/{idx}/operator/{side}/{_DYNAMIC_NAMES[pname] if dynamic else pname}")
    order += [f"entities/{t}/global_embedding" for t in types]
    return {k: params[k] for k in order if k in params}


def _legacy_config(current: dict[str, Any], spec: LegacySpec, num_rel_ids: int) -> dict[str, Any]:
    """The config dict as the legacy code stored it (camelCase: ints for bools, old names)."""
    out: dict[str, Any] = {}
    if spec.camel:
        out["model"] = "f2_model"
    for key, value in current.items():
        if key == "dynamic_relations":
            if spec.dynamic == "bool" and not spec.camel:
                out["dynamic_relations"] = value
            else:
                out["numDynamicRels" if spec.camel else "num_dynamic_rels"] = num_rel_ids if value else 0
            continue
        if key == "relations":
            value = [_legacy_relation(r, spec) for r in value]
        elif key == "entities":
            value = {t: ({"numPartitions": s["num_partitions"], "featurized": int(s["featurized"])}
                         if spec.camel else dict(s)) for t, s in value.items()}
        elif key == "bucket_order" and spec.chained_symmetric_pairs:
            value = "chained_symmetric_pairs"
        elif (isinstance(value, bool) and spec.camel) or (key == "hogwild_delay" and spec.camel):
            value = int(value)
        out[_CAMEL.get(key, key) if spec.camel else key] = value
    return out


def _legacy_relation(rel: dict[str, Any], spec: LegacySpec) -> dict[str, Any]:
    out = dict(rel)
    if spec.camel:
        out["all_rhs_negs"] = int(out.pop("all_negs"))
        if out["operator"] == "affine":
            out["operator"] = "affine_rhs"
    return out
