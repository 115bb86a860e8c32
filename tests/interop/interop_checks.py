"""Comparisons of what the original read (the driver's ``inspect`` result) with what pbgio reads.

Each function returns a list of problems (empty when everything holds), so one test can report
every difference at once instead of stopping at the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pbgio.checkpoint import CheckpointDir
from pbgio.config import parse_config
from pbgio.edges import read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count, read_entity_names, read_relation_names
from pbgio.spec.checkpoint import public_to_private


def _failed(entry: dict[str, Any]) -> str:
    where = f" at {entry['where']}" if entry.get("where") else ""
    return f"{entry.get('error')}{where}"


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def check_partitions(inspect: dict[str, Any], config: dict[str, Any], version: int | None = None) -> list[str]:
    """Every (type, part) the original read is bit for bit what pbgio reads, shaped (count, dim)."""
    problems = []
    cfg = parse_config(config)
    ckpt = CheckpointDir(Path(config["checkpoint_path"]))
    for etype, entity in cfg.entities.items():
        for part in range(entity.num_partitions):
            key = f"{etype}/{part}"
            got = inspect["partitions"].get(key)
            if got is None or not got["ok"]:
                problems.append(f"{key}: the original's CheckpointManager.read failed: {_failed(got or {})}")
                continue
            ours = ckpt.read_embeddings(etype, part, version).embeddings
            theirs = np.load(got["npy"])
            count = read_entity_count(Path(config["entity_path"]), etype, part)
            if theirs.shape != (count, cfg.entity_dimension(etype)):
                problems.append(f"{key}: the original read shape {theirs.shape}, expected "
                                f"({count}, {cfg.entity_dimension(etype)})")
            if theirs.dtype != np.float32 or theirs.shape != ours.shape or not np.array_equal(bits(theirs), bits(ours)):
                problems.append(f"{key}: embeddings differ (original {theirs.dtype}{theirs.shape}, pbgio "
                                f"{ours.dtype}{ours.shape})")
    return problems


def check_embedding_optimizers(inspect: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Each partition's RowAdagrad state loads into the original's RowAdagrad and steps."""
    problems = []
    for key, got in inspect["partitions"].items():
        if not got["ok"]:
            problems.append(f"{key}: could not be read: {_failed(got)}")
            continue
        opt = got["optimizer"]
        if not opt["present"]:
            problems.append(f"{key}: no optimizer/state_dict (the original always writes RowAdagrad's state)")
        rows = got["shape"][0]
        if opt.get("sum_shape") not in (None, [rows]):
            problems.append(f"{key}: RowAdagrad 'sum' has shape {opt.get('sum_shape')}, expected [{rows}]")
        step = opt.get("step", {})
        if not step.get("ok"):
            problems.append(f"{key}: RowAdagrad.load_state_dict + step() failed: {_failed(step)}; "
                            f"state structure {opt.get('structure')}")
    return problems


def check_model(inspect: dict[str, Any], config: dict[str, Any], version: int | None = None) -> list[str]:
    """read_model + make_model(config).load_state_dict(strict=False): no missing or unexpected keys,
    the same values pbgio reads."""
    problems = []
    model = inspect["model"]
    for stage in ("read", "make_model", "load_state_dict"):
        if stage in model and not model[stage].get("ok"):
            return [f"the original's {stage} failed: {_failed(model[stage])}"]
    if "load_state_dict" not in model:
        return ["the original did not get to load_state_dict"]
    loaded = model["load_state_dict"]
    if loaded["missing"] or loaded["unexpected"]:
        problems.append(f"load_state_dict(strict=False): missing keys {loaded['missing']}, unexpected keys "
                        f"{loaded['unexpected']}")
    params = CheckpointDir(Path(config["checkpoint_path"])).read_model(version).params
    ours = {public_to_private(k) or k: v for k, v in params.items()}
    theirs = dict(np.load(model["npz"])) if model.get("npz") else {}
    if sorted(ours) != sorted(theirs):
        problems.append(f"model parameters: pbgio reads {sorted(ours)}, the original {sorted(theirs)}")
    for name in sorted(set(ours) & set(theirs)):
        if not np.array_equal(bits(ours[name]), bits(theirs[name])) or ours[name].shape != theirs[name].shape:
            problems.append(f"model parameter {name} differs between pbgio and the original")
    shapes = dict((n, s) for n, s in model["named_parameters"])
    for name, value in ours.items():
        if name in shapes and list(value.shape) != shapes[name]:
            problems.append(f"{name}: shape {list(value.shape)} in the file, the original's model has {shapes[name]}")
    return problems


def check_model_optimizer(inspect: dict[str, Any], our_param_order: list[str]) -> list[str]:
    """The model optimizer state loads into the original's AsyncAdagrad and steps; its per-parameter
    state lines up with the original's parameters (the state is matched by position)."""
    model = inspect["model"]
    if "optimizer" not in model:
        return [f"the original could not build the model: {model}"]
    opt = model["optimizer"]
    problems = []
    theirs_order = [n for n, _ in model["named_parameters"]]
    if theirs_order and not opt["present"]:
        problems.append("model file has no optimizer/state_dict although the model has parameters "
                        f"{theirs_order} (the original writes AsyncAdagrad's state)")
    if not opt.get("step", {}).get("ok"):
        problems.append(f"{opt.get('optimizer')}.load_state_dict + step() failed: {_failed(opt.get('step', {}))}; "
                        f"state structure {opt.get('structure')}")
    shapes = dict((n, s) for n, s in model["named_parameters"])
    for name, shape in opt.get("state_shapes", []):
        if shape is not None and shape != shapes[name]:
            problems.append(f"after loading, the optimizer state of {name} has shape {shape}, the parameter "
                            f"{shapes[name]}")
    if our_param_order != theirs_order:
        problems.append(f"parameter order differs (optimizer states are matched by position): pbgtrain "
                        f"{our_param_order}, the original {theirs_order}")
    return problems


def check_stats(inspect: dict[str, Any]) -> list[str]:
    stats = inspect["stats"]
    if stats["ok"] and stats["lines"] > 0:
        return []
    if stats["ok"]:
        return ["training_stats.json has no line"]
    shown = "; ".join(f"line {e.get('line')}: {e.get('error')} at {e.get('where')}" for e in stats["errors"])
    return [f"{stats.get('failed_lines', '?')} of {stats['lines']} training_stats.json lines are refused by "
            f"Stats.from_dict (as TrainingCoordinator.train replays them): {shown}"]


def check_buckets_and_entities(inspect: dict[str, Any], config: dict[str, Any], edge_paths: list[str],
                               num_chunks: int) -> list[str]:
    """Every chunk of every bucket, and the counts and names, read the same by both."""
    problems = []
    cfg = parse_config(config)
    nl, nr = cfg.bucket_grid()
    for p_idx, edge_path in enumerate(edge_paths):
        for lhs in range(nl):
            for rhs in range(nr):
                key = f"{p_idx}:{lhs}_{rhs}"
                got = inspect["buckets"].get(key)
                name = f"{Path(edge_path).name}/edges_{lhs}_{rhs}.h5"
                if got is None or not got["ok"]:
                    problems.append(f"{name}: the original's load_chunk_of_edges failed: {_failed(got or {})}")
                    continue
                arrays = np.load(got["npz"])
                path = Path(edge_path) / f"edges_{lhs}_{rhs}.h5"
                for i in range(num_chunks):
                    ours = read_bucket(path, chunk=(i, num_chunks))
                    for field in ("lhs", "rhs", "rel"):
                        if not np.array_equal(arrays[f"{i}/{field}"], getattr(ours, field)):
                            problems.append(f"{name} chunk {i}/{num_chunks}: {field} differs")
                    if (ours.weight is None) != (f"{i}/weight" not in arrays):
                        problems.append(f"{name} chunk {i}: weight present for "
                                        f"{'pbgio' if ours.weight is not None else 'the original'} only")
                    elif ours.weight is not None and not np.array_equal(arrays[f"{i}/weight"], ours.weight):
                        problems.append(f"{name} chunk {i}: weights differ: the original reads "
                                        f"{arrays[f'{i}/weight'][:5].tolist()}…, pbgio {ours.weight[:5].tolist()}…")
                    for side in ("lhs", "rhs"):
                        feats = ours.features(side)
                        if feats is None:
                            continue
                        if not (np.array_equal(arrays[f"{i}/{side}d_offsets"], feats.offsets)
                                and np.array_equal(arrays[f"{i}/{side}d_data"], feats.data)):
                            problems.append(f"{name} chunk {i}: {side} feature lists differ")
    entity_path = Path(config["entity_path"])
    for etype, entity in cfg.entities.items():
        for part in range(entity.num_partitions):
            key = f"{etype}/{part}"
            got = inspect["entities"]["types"].get(key, {})
            if not got.get("ok"):
                problems.append(f"entity {key}: the original could not read it: {_failed(got)}")
                continue
            if got["count"] != read_entity_count(entity_path, etype, part):
                problems.append(f"entity {key}: count {got['count']} (original) != "
                                f"{read_entity_count(entity_path, etype, part)} (pbgio)")
            if "names" in got and got["names"] != read_entity_names(entity_path, etype, part):
                problems.append(f"entity {key}: names differ")
    rel = inspect["entities"]["relation_types"]
    if cfg.dynamic_relations:
        if rel.get("count") != read_dynamic_rel_count(entity_path):
            problems.append(f"dynamic_rel_count: original {rel.get('count')} != pbgio "
                            f"{read_dynamic_rel_count(entity_path)}")
    if "names" in rel and rel["names"] != read_relation_names(entity_path):
        problems.append("dynamic_rel_names.json read differently")
    return problems


def check_carried_over(source: Path, target: Path, config: dict[str, Any]) -> list[str]:
    """The first version of the checkpoint ``target`` holds, bit for bit, the embeddings and model
    parameters of the newest version of ``source`` (its ``init_path``; nothing trained)."""
    src, dst = CheckpointDir(source), CheckpointDir(target)
    problems = [] if dst.read_version() == 1 else [f"{target.name}: version {dst.read_version()}, expected 1"]
    cfg = parse_config(config)
    for etype, entity in cfg.entities.items():
        for part in range(entity.num_partitions):
            if not np.array_equal(bits(src.read_embeddings(etype, part).embeddings),
                                  bits(dst.read_embeddings(etype, part).embeddings)):
                problems.append(f"{etype}/{part}: not carried over from init_path")
    a_params, b_params = src.read_model().params, dst.read_model().params
    if a_params.keys() != b_params.keys():
        problems.append(f"model parameters {sorted(a_params)} became {sorted(b_params)}")
    for name in sorted(a_params.keys() & b_params.keys()):
        if not np.array_equal(bits(a_params[name]), bits(b_params[name])):
            problems.append(f"{name}: not carried over from init_path")
    return problems
