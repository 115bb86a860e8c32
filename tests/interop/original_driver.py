"""Driver run by the ORIGINAL PyTorch-BigGraph's interpreter (the side virtual environment).

Never imported by our environment (``tests/interop/conftest.py`` keeps pytest away from it):
it imports ``torchbiggraph``, which only the side environment has. Each subcommand reads what
it is told to, through the original's own readers and entry points, and writes a JSON result
(``--result FILE``) plus, for arrays, ``.npy``/``.npz`` files the tests compare bit for bit.

Subcommands:

``inspect --config C.json --out DIR``
    How the original sees a layout and its checkpoint: ``ConfigSchema.from_dict``; every
    ``(type, part)`` through ``CheckpointManager.read`` (embeddings saved as ``.npy``, the
    optimizer state's structure, and a ``RowAdagrad`` built as ``train_cpu.make_optimizer``
    builds it, loaded with that state and stepped with a sparse fake gradient);
    ``read_model`` + ``make_model(config).load_state_dict(strict=False)`` (missing and
    unexpected keys) and the model optimizer (``AsyncAdagrad``) loaded and stepped;
    ``maybe_read_stats`` with every line through ``Stats.from_dict`` as
    ``TrainingCoordinator.train`` does; every bucket chunk through
    ``EDGE_STORAGES.make_instance(path).load_chunk_of_edges``; counts and names through
    ``ENTITY_STORAGES`` and ``RELATION_TYPE_STORAGES``.

``eval --config-py CFG.py [-p key=value ...]``
    ``torchbiggraph_eval``'s code path (``ConfigFileLoader`` with overrides, then
    ``do_eval_and_report_stats``), reporting the final stats at full precision.

``configs --cases CASES.json --workdir DIR``
    For each case: ``ConfigSchema.from_dict``, then, on a tiny synthetic layout written here,
    ``make_model`` and one epoch of ``torchbiggraph.train.train`` (HOGWILD pool replaced by a
    synchronous in-process one: same batches, same code, no process start-up). A case "runs"
    when all of that succeeds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame inside torchbiggraph (or the last frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "torchbiggraph" in f.filename]
    frame = (inside or frames or [None])[-1]
    if frame is None:
        return ""
    name = frame.filename
    marker = "site-packages/"
    if marker in name:
        name = name.split(marker, 1)[1]
    return f"{name}:{frame.lineno}"


def _fail(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": _error(exc), "where": _where(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]}


def describe(value: Any) -> Any:
    """A JSON-able description of an optimizer state (structure, dtypes, shapes; scalars as is)."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# --------------------------------------------------------------------------- inspect


def _embedding_optimizer_check(config: Any, embs: Any, optim_state: Any) -> dict[str, Any]:
    """Load the state into RowAdagrad (as ``TrainingCoordinator._load_embeddings``) and step it."""
    import torch
    from torchbiggraph.train_cpu import make_optimizer

    result: dict[str, Any] = {"present": optim_state is not None}
    if optim_state is not None:
        result["structure"] = describe(optim_state)
    try:
        param = torch.nn.Parameter(embs.clone())
        optimizer = make_optimizer(config, [param], True)
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)
        state = optimizer.state[param]
        result["sum_shape"] = list(state["sum"].shape)
        before = param.detach().clone()
        rows = sorted({0, max(0, param.shape[0] - 1)})
        index = torch.tensor([rows], dtype=torch.long)
        values = torch.full((len(rows), param.shape[1]), 0.05)
        param.grad = torch.sparse_coo_tensor(index, values, size=param.shape)
        optimizer.step()
        changed = bool((param.detach() != before).any()) if config.lr > 0 else True
        result["step"] = {"ok": changed, "error": None if changed else "step left the embeddings unchanged"}
    except Exception as exc:  # reported, not raised: every check runs
        result["step"] = _fail(exc)
    return result


def _model_check(config: Any, cm: Any, out_dir: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from torchbiggraph.model import make_model
    from torchbiggraph.train_cpu import make_optimizer

    out: dict[str, Any] = {}
    try:
        state_dict, optim_state = cm.read_model()
    except Exception as exc:
        out["read"] = _fail(exc)
        return out
    out["read"] = {"ok": True}
    out["keys"] = sorted(state_dict) if state_dict is not None else None
    out["shapes"] = {k: list(v.shape) for k, v in (state_dict or {}).items()}
    if state_dict is not None:
        path = out_dir / "model_state.npz"
        np.savez(path, **{k: v.numpy() for k, v in state_dict.items()})
        out["npz"] = str(path)
    try:
        model = make_model(config)
    except Exception as exc:
        out["make_model"] = _fail(exc)
        return out
    out["make_model"] = {"ok": True}
    out["named_parameters"] = [[name, list(p.shape)] for name, p in model.named_parameters()]
    if state_dict is not None:
        try:
            loaded = model.load_state_dict(state_dict, strict=False)
            out["load_state_dict"] = {"ok": True, "missing": sorted(loaded.missing_keys),
                                      "unexpected": sorted(loaded.unexpected_keys)}
        except Exception as exc:
            out["load_state_dict"] = _fail(exc)
    else:
        out["load_state_dict"] = {"ok": True, "missing": sorted(model.state_dict()), "unexpected": []}
    opt: dict[str, Any] = {"present": optim_state is not None}
    if optim_state is not None:
        opt["structure"] = describe(optim_state)
    try:
        params = list(model.parameters())
        optimizer = make_optimizer(config, params, False)
        opt["optimizer"] = type(optimizer).__name__
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)
        opt["state_shapes"] = [
            [name, list(optimizer.state[p]["sum"].shape) if "sum" in optimizer.state.get(p, {}) else None]
            for name, p in model.named_parameters()]
        before = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.full_like(p, 0.01)
        optimizer.step()
        lr = config.lr if config.relation_lr is None else config.relation_lr
        changed = all(bool((p.detach() != b).any()) for p, b in zip(params, before, strict=True)) if lr > 0 else True
        opt["step"] = {"ok": changed, "error": None if changed else "step left some parameter unchanged"}
    except Exception as exc:
        opt["step"] = _fail(exc)
    out["optimizer"] = opt
    return out


def _stats_check(cm: Any) -> dict[str, Any]:
    """Every stats line through ``Stats.from_dict`` exactly as ``TrainingCoordinator.train``."""
    from torchbiggraph.stats import Stats

    errors = []
    lines = 0
    try:
        for i, stats_dict in enumerate(cm.maybe_read_stats()):
            lines += 1
            try:
                _ = stats_dict["index"]
                for key in ("stats", "eval_stats_before", "eval_stats_after", "eval_stats_chunk_avg"):
                    if key in stats_dict:
                        Stats.from_dict(stats_dict[key])
            except Exception as exc:
                if len(errors) < 5:
                    errors.append({"line": i + 1, "error": _error(exc), "where": _where(exc)})
                else:
                    errors.append({"line": i + 1})
    except Exception as exc:
        return {"ok": False, "lines": lines, "errors": [_fail(exc)]}
    return {"ok": not errors, "lines": lines, "failed_lines": len(errors), "errors": errors[:5]}


def _buckets_check(config: Any, edge_paths: list[str], num_chunks: int, out_dir: Path) -> dict[str, Any]:
    import numpy as np
    from torchbiggraph.graph_storages import EDGE_STORAGES
    from torchbiggraph.util import EmbeddingHolder

    holder = EmbeddingHolder(config)
    result: dict[str, Any] = {}
    for p_idx, edge_path in enumerate(edge_paths):
        storage = EDGE_STORAGES.make_instance(edge_path)
        for lhs in range(holder.nparts_lhs):
            for rhs in range(holder.nparts_rhs):
                key = f"{p_idx}:{lhs}_{rhs}"
                try:
                    arrays: dict[str, Any] = {}
                    total = storage.get_number_of_edges(lhs, rhs)
                    for i in range(num_chunks):
                        edges = storage.load_chunk_of_edges(lhs, rhs, i, num_chunks)
                        arrays[f"{i}/lhs"] = edges.lhs.tensor.numpy()
                        arrays[f"{i}/rhs"] = edges.rhs.tensor.numpy()
                        arrays[f"{i}/rel"] = edges.rel.numpy()
                        if edges.weight is not None:
                            arrays[f"{i}/weight"] = edges.weight.numpy()
                        for side, ents in (("lhs", edges.lhs), ("rhs", edges.rhs)):
                            tl = ents.tensor_list
                            arrays[f"{i}/{side}d_offsets"] = tl.offsets.numpy().copy()
                            arrays[f"{i}/{side}d_data"] = tl.data.numpy().copy()
                    path = out_dir / f"bucket_{p_idx}_{lhs}_{rhs}.npz"
                    np.savez(path, **arrays)
                    result[key] = {"ok": True, "count": int(total), "npz": str(path), "edge_path": edge_path}
                except Exception as exc:
                    result[key] = {**_fail(exc), "edge_path": edge_path}
    return result


def _entities_check(config: Any) -> dict[str, Any]:
    from torchbiggraph.graph_storages import ENTITY_STORAGES, RELATION_TYPE_STORAGES

    storage = ENTITY_STORAGES.make_instance(config.entity_path)
    out: dict[str, Any] = {}
    for etype, econf in config.entities.items():
        for part in range(econf.num_partitions):
            key = f"{etype}/{part}"
            try:
                entry: dict[str, Any] = {"ok": True, "count": storage.load_count(etype, part)}
                if storage.has_names(etype, part):
                    entry["names"] = storage.load_names(etype, part)
                out[key] = entry
            except Exception as exc:
                out[key] = _fail(exc)
    rel_storage = RELATION_TYPE_STORAGES.make_instance(config.entity_path)
    rel: dict[str, Any] = {}
    try:
        if rel_storage.has_count():
            rel["count"] = rel_storage.load_count()
        if rel_storage.has_names():
            rel["names"] = rel_storage.load_names()
        rel["ok"] = True
    except Exception as exc:
        rel = _fail(exc)
    return {"types": out, "relation_types": rel}


def cmd_inspect(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from torchbiggraph.checkpoint_manager import CheckpointManager
    from torchbiggraph.config import ConfigSchema

    raw = json.loads(Path(args.config).read_text())
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"extra_configs": {}}
    for path in args.extra_config or []:
        try:
            extra = ConfigSchema.from_dict(json.loads(Path(path).read_text()))
            result["extra_configs"][path] = {"ok": True, "to_dict": extra.to_dict()}
        except BaseException as exc:
            result["extra_configs"][path] = _fail(exc)
    try:
        config = ConfigSchema.from_dict(raw)
    except Exception as exc:
        result["config"] = _fail(exc)
        return result
    result["config"] = {"ok": True, "to_dict": config.to_dict()}
    checkpoint = args.checkpoint or config.checkpoint_path
    cm = CheckpointManager(checkpoint)
    result["version"] = cm.checkpoint_version
    parts: dict[str, Any] = {}
    for etype, econf in config.entities.items():
        for part in range(econf.num_partitions):
            key = f"{etype}/{part}"
            try:
                embs, optim_state = cm.read(etype, part)
            except Exception as exc:
                parts[key] = _fail(exc)
                continue
            array = embs.numpy()
            path = out_dir / f"emb_{len(parts)}.npy"
            np.save(path, array)
            parts[key] = {"ok": True, "shape": list(array.shape), "dtype": str(array.dtype), "npy": str(path),
                          "sha256": hashlib.sha256(np.ascontiguousarray(array, np.float32).tobytes()).hexdigest(),
                          "optimizer": _embedding_optimizer_check(config, embs, optim_state)}
    result["partitions"] = parts
    result["model"] = _model_check(config, cm, out_dir)
    result["stats"] = _stats_check(cm)
    if not args.no_edges:
        num_chunks = args.chunks or config.num_edge_chunks or 1
        edge_paths = args.edge_path or list(config.edge_paths)
        result["buckets"] = _buckets_check(config, edge_paths, num_chunks, out_dir)
        result["num_chunks"] = num_chunks
    result["entities"] = _entities_check(config)
    return result


# --------------------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> dict[str, Any]:
    from torchbiggraph.config import ConfigFileLoader, add_to_sys_path
    from torchbiggraph.eval import do_eval_and_report_stats
    from torchbiggraph.util import SubprocessInitializer, setup_logging

    setup_logging()
    loader = ConfigFileLoader()
    config = loader.load_config(args.config_py, [args.param] if args.param else None)
    init = SubprocessInitializer()
    init.register(add_to_sys_path, loader.config_dir.name)
    buckets = []
    final = None
    for edge_path_idx, bucket, stats in do_eval_and_report_stats(config, subprocess_init=init):
        entry = {"edge_path_idx": edge_path_idx, "bucket": None if bucket is None else [bucket.lhs, bucket.rhs],
                 "count": stats.count, "metrics": dict(stats.metrics)}
        if edge_path_idx is None:
            final = entry
        else:
            buckets.append(entry)
    return {"final": final, "buckets": buckets,
            "relations": [{"name": r.name, "all_negs": r.all_negs} for r in config.relations],
            "num_uniform_negs": config.num_uniform_negs}


# --------------------------------------------------------------------------- configs


class _SyncResult:
    def __init__(self, value: Any = None, exc: BaseException | None = None) -> None:
        self.value, self.exc = value, exc

    def get(self, timeout: float | None = None) -> Any:
        if self.exc is not None:
            raise self.exc
        return self.value


class _SyncPool:
    """Stands in for the HOGWILD ``spawn`` pool: the same calls, run in this process."""

    def __init__(self) -> None:
        self._pool: list[Any] = []  # no worker process: get_async_result has none to watch

    def map_async(self, func: Any, iterable: Any) -> _SyncResult:
        try:
            return _SyncResult([func(x) for x in iterable])
        except BaseException as exc:
            return _SyncResult(exc=exc)

    def close(self) -> None:
        pass

    def join(self) -> None:
        pass

    def terminate(self) -> None:
        pass


def _tiny_layout(config: Any, root: Path, seed: int) -> None:
    """Counts, names, dynamic relation count and every bucket, written with h5py as the original's
    format says (format_version 1, int64 datasets, *d_offsets/*d_data for featurized sides)."""
    import h5py
    import numpy as np
    from torchbiggraph.graph_storages import ENTITY_STORAGES, RELATION_TYPE_STORAGES
    from torchbiggraph.util import EmbeddingHolder

    rng = np.random.default_rng(seed)
    count = 12
    storage = ENTITY_STORAGES.make_instance(config.entity_path)
    storage.prepare()
    for etype, econf in config.entities.items():
        for part in range(econf.num_partitions):
            storage.save_count(etype, part, count)
            storage.save_names(etype, part, [f"{etype}_{part}_{i}" for i in range(count)])
    num_rels = 3 if config.dynamic_relations else len(config.relations)
    rel_storage = RELATION_TYPE_STORAGES.make_instance(config.entity_path)
    rel_storage.prepare()
    rel_storage.save_count(num_rels)
    rel_storage.save_names([f"rel{i}" for i in range(num_rels)] if config.dynamic_relations
                           else [r.name for r in config.relations])
    holder = EmbeddingHolder(config)
    featurized_side = {
        side: any(config.entities[getattr(r, side)].featurized for r in config.relations) for side in ("lhs", "rhs")}
    for edge_path in config.edge_paths:
        Path(edge_path).mkdir(parents=True, exist_ok=True)
        for lp in range(holder.nparts_lhs):
            for rp in range(holder.nparts_rhs):
                cols: dict[str, list[Any]] = {"lhs": [], "rhs": [], "rel": []}
                bags: dict[str, list[list[int]]] = {"lhs": [], "rhs": []}
                for r_idx, rel in enumerate(config.relations):
                    parts = {"lhs": (rel.lhs, lp), "rhs": (rel.rhs, rp)}
                    if any(config.entities[t].num_partitions == 1 and p != 0 for t, p in parts.values()):
                        continue
                    for _ in range(24):
                        rel_id = int(rng.integers(num_rels)) if config.dynamic_relations else r_idx
                        cols["rel"].append(rel_id)
                        for side, (etype, _p) in parts.items():
                            if config.entities[etype].featurized:
                                cols[side].append(-1)
                                bags[side].append(rng.integers(count, size=int(rng.integers(1, 4))).tolist())
                            else:
                                cols[side].append(int(rng.integers(count)))
                                bags[side].append([])
                path = Path(edge_path) / f"edges_{lp}_{rp}.h5"
                with h5py.File(path, "w") as hf:
                    hf.attrs["format_version"] = np.int64(1)
                    for name, values in cols.items():
                        hf.create_dataset(name, data=np.asarray(values, dtype=np.int64))
                    for side in ("lhs", "rhs"):
                        if featurized_side[side]:
                            lengths = [len(b) for b in bags[side]]
                            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
                            np.cumsum(lengths, out=offsets[1:])
                            data = np.asarray([x for b in bags[side] for x in b], dtype=np.int64)
                            hf.create_dataset(f"{side}d_offsets", data=offsets)
                            hf.create_dataset(f"{side}d_data", data=data)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _with_paths(raw: Any, root: Path) -> Any:
    """The case's config with its paths pointing into ``root`` (a list of edge paths keeps its length)."""
    from torchbiggraph.schema import mixed_case_to_lowercase  # the original's own key conversion

    data = copy.deepcopy(raw)
    if not isinstance(data, dict):
        return data
    for key in list(data):
        norm = mixed_case_to_lowercase(key)
        if norm == "entity_path":
            data[key] = str(root / "data")
        elif norm == "checkpoint_path":
            data[key] = str(root / "model")
        elif norm == "init_path" and isinstance(data[key], str):
            data[key] = str(root / "init")
        elif norm == "edge_paths" and isinstance(data[key], list):
            data[key] = [str(root / f"edges{i}") for i in range(len(data[key]))]
    return data


def cmd_configs(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torchbiggraph.train_cpu as train_cpu
    from torchbiggraph.config import ConfigSchema
    from torchbiggraph.model import make_model
    from torchbiggraph.train import train

    train_cpu.create_pool = lambda *a, **k: _SyncPool()
    handler = _Collect()
    logging.getLogger("torchbiggraph").addHandler(handler)
    logging.getLogger("torchbiggraph").setLevel(logging.WARNING)
    cases = json.loads(Path(args.cases).read_text())
    workdir = Path(args.workdir)
    results = {}
    for n, case in enumerate(cases):
        handler.messages = []
        root = workdir / f"case{n}"
        root.mkdir(parents=True, exist_ok=True)
        entry: dict[str, Any] = {}
        raw = _with_paths(case["config"], root)
        try:
            config = ConfigSchema.from_dict(raw)
        except BaseException as exc:
            entry["from_dict"] = _fail(exc)
            entry["runs"] = False
            entry["stage"] = "ConfigSchema.from_dict"
            results[case["id"]] = entry
            continue
        entry["from_dict"] = {"ok": True}
        stage = "tiny layout"
        try:
            _tiny_layout(config, root, n)
            stage = "make_model"
            make_model(config)
            stage = "train (one pass of torchbiggraph.train.train)"
            torch.manual_seed(n)
            with contextlib.redirect_stdout(sys.stderr):
                train(config)
            entry["runs"] = True
        except BaseException as exc:
            entry["runs"] = False
            entry["stage"] = stage
            entry["failure"] = _fail(exc)
        entry["warnings"] = sorted(set(handler.messages))
        results[case["id"]] = entry
    return results


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect")
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--edge-path", action="append")
    p.add_argument("--chunks", type=int)
    p.add_argument("--no-edges", action="store_true")
    p.add_argument("--extra-config", action="append")
    p.add_argument("--result", required=True)
    p = sub.add_parser("eval")
    p.add_argument("--config-py", required=True)
    p.add_argument("-p", "--param", action="append")
    p.add_argument("--result", required=True)
    p = sub.add_parser("configs")
    p.add_argument("--cases", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--result", required=True)
    args = parser.parse_args()
    handler = {"inspect": cmd_inspect, "eval": cmd_eval, "configs": cmd_configs}[args.cmd]
    result = handler(args)
    Path(args.result).write_text(json.dumps(result, indent=1, default=repr))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
