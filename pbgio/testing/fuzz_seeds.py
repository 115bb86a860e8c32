"""The fuzz campaigns' seed corpus (guide: docs/guides/fuzzing.md).

:func:`build_corpus` writes the seed files of the targets of :mod:`pbgio.testing.fuzz`: valid
files from :mod:`pbgio.testing`, the legacy writer and, where present, the reference samples
(:data:`SAMPLES`), plus near misses of each file kind (a config per rule, an entity or index file
per slot of a layout, a table per importer option byte); :func:`load_corpus` reads a corpus folder
back. The mutators of :mod:`pbgio.testing.fuzz_mutators` derive a campaign's inputs from it.

Why this module is long: it is the catalogue of seed files of all 29 targets (valid files of
every variant, and a near miss per rule); each seed writer is short and read on its own.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbgio.testing.fuzz import ENTITY_SLOTS, SELFTEST_TARGETS, TARGETS, import_options, layout_template

_REPO_SAMPLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "samples"
SAMPLES: Path | None = (Path(os.environ["PBG_REFERENCE_SAMPLES"]) if os.environ.get("PBG_REFERENCE_SAMPLES")
                        else _REPO_SAMPLES if _REPO_SAMPLES.is_dir() else None)
"""The original's reference samples seeding the corpus: ``$PBG_REFERENCE_SAMPLES``, else the copy in
a checkout (tests/data/samples); none in an installed package."""


def build_corpus(dest: Path, names: list[str] | None = None, *,
                 samples: Path | None = SAMPLES) -> dict[str, list[Path]]:
    """Write the seed files of every target (or of ``names``) under ``dest/<target>/``."""
    wanted = set(names) if names is not None else set(TARGETS)
    dest.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, list[bytes]] = {name: [] for name in wanted}

    def add(name: str, data: bytes) -> None:
        if name == "config" and "config-py" in seeds:  # a config.py's answer carries the same dict
            add("config-py", b'{"config": ' + data + b"}")
        if name == "config" and "config-layout" in seeds:  # the same configs, in a layout
            add("config-layout", data)
        if name == "index" and "index-layout" in seeds:  # the same files, in a checkpoint
            add("index-layout", b"\x00" + data)
        if name in seeds and data not in seeds[name]:
            seeds[name].append(data)

    if wanted & {t.name for t in TARGETS.values() if t.kind not in ("text-table", "parquet")} - {"import-options"}:
        _layout_seeds(dest / "_layouts", add)
        if samples is not None and samples.is_dir():
            _sample_seeds(samples, add)
    for answer in _PYTHON_CONFIG_ANSWERS if "config-py" in wanted else []:
        add("config-py", json.dumps(answer).encode())
    for source in _PYTHON_CONFIG_SOURCES if "config-py-source" in wanted else []:
        add("config-py-source", source.encode())
    if "index" in wanted:
        _index_seeds(dest / "_index", add)
    if wanted & {"torch-payload", "legacy-pt", "optimizer-blob"}:
        _pickle_seeds(dest / "_legacy", add, samples)
    if wanted & {"import-tsv", "import-csv", "import-parquet"}:
        _table_seeds(add, samples)
    if wanted & {"entities-layout", "config-layout", "index-layout", "import-options", "config", "config-py",
                 "entity-names", "dynamic-rel-names", "entity-count", "dynamic-rel-count"}:
        _slot_seeds(dest / "_slots", add, wanted)
    for name in SELFTEST_TARGETS:
        if name in wanted:
            add(name, b'{"a": [1, 2, 3]}' if "pickle" not in name else pickle.dumps({"a": 1}))
    out: dict[str, list[Path]] = {}
    for name, items in seeds.items():
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        out[name] = []
        for i, data in enumerate(items):
            path = folder / f"seed-{i:03d}"
            path.write_bytes(data)
            out[name].append(path)
    return out


_PYTHON_CONFIG_SOURCES = [  # config.py files: what each answer above is the runner's reply to, and more
    "def get_torchbiggraph_config():\n    return {'entities': {'user': {'num_partitions': 1}}, 'relations': "
    "[{'name': 'r', 'lhs': 'user', 'rhs': 'user'}], 'dimension': 4, 'entity_path': 'e', 'edge_paths': ['x', "
    "'/abs/x'], 'checkpoint_path': 'c', 'numEpochs': 2}\n",
    "import os\nprint('hello')\ndef get_torchbiggraph_config():\n    return dict(entities={}, relations=[])\n",
    "def get_torchbiggraph_config(:\n",
    "from torchbiggraph.config import ConfigSchema\n",
    "import numpy_that_is_not_here\n",
    "def get_conf():\n    return {}\n",
    "get_torchbiggraph_config = 3\n",
    "def get_torchbiggraph_config():\n    return 1 / 0\n",
    "def get_torchbiggraph_config():\n    return [1]\n",
    "def get_torchbiggraph_config():\n    return {'entities': {1, 2}}\n",
    "import os\nos._exit(3)\n",
    "import sys\nopen(sys.argv[2], 'w').write('[1, 2]')\nsys.exit(0)\n",
    "import sys\nsys.stderr.write('x' * 100)\nraise SystemExit(2)\n",
]


_PYTHON_CONFIG_ANSWERS: list[dict[str, Any]] = [  # what pbgio.python_config's runner writes
    {"error": {"kind": "syntax", "message": "invalid syntax", "line": 3}},
    {"error": {"kind": "exec", "message": "ModuleNotFoundError: No module named 'torchbiggraph'", "line": 1,
               "missing": "torchbiggraph.config"}},
    {"error": {"kind": "no-function", "message": "", "found": ["get_conf"]}},
    {"error": {"kind": "not-callable", "message": "int"}},
    {"error": {"kind": "call", "message": "ZeroDivisionError: division by zero", "line": 7}},
    {"error": {"kind": "not-dict", "message": "list"}},
    {"error": {"kind": "not-json", "message": "expected a JSON value, found set {1}", "key": "relations[0].lhs"}},
    {"error": {"kind": "unreadable", "message": "expected a readable file, found PermissionError"}},
    {"error": {"kind": "exec", "message": "ModuleNotFoundError: No module named 'numpy'", "missing": "numpy"}},
    {"error": {"kind": "exec", "message": 3}},
    {"error": {"kind": "not-json", "message": "a set"}},
    {"error": {"kind": "no-function", "message": "", "found": [1]}},
    {"error": {"kind": "other", "message": "m"}, "config": {}},
    {"config": {"entities": {"user": {"num_partitions": 1}}, "relations": [{"name": "r", "lhs": "user", "rhs": "user"}],
                "dimension": 4, "entity_path": "/abs/e", "edge_paths": ["s3://b/x", "../../../../../../../../y"],
                "checkpoint_path": "c/./d/", "init_path": "i"}},
    {"config": {"entities": {"user": {"numPartitions": 1}}, "relations": [{"name": "r", "lhs": "user", "rhs": "user"}],
                "dimension": 4, "entity_path": "e", "edge_paths": ["x"], "checkpoint_path": "c"}},
]


_LAYOUT_FILES: dict[str, Callable[[str], str | None]] = {
    "config": lambda n: "config" if n == "config.json" else None,
    "entity-count": lambda n: "entity-count" if n.startswith("entity_count_") and n.endswith(".txt") else None,
    "entity-names": lambda n: "entity-names" if n.startswith("entity_names_") and n.endswith(".json") else None,
    "dynamic-rel-count": lambda n: "dynamic-rel-count" if n == "dynamic_rel_count.txt" else None,
    "dynamic-rel-names": lambda n: "dynamic-rel-names" if n == "dynamic_rel_names.json" else None,
    "checkpoint-version": lambda n: "checkpoint-version" if n == "checkpoint_version.txt" else None,
    "checkpoint-layout-version": lambda n: "checkpoint-layout-version" if n == "checkpoint_version.txt" else None,
    "training-stats": lambda n: "training-stats" if n == "training_stats.json" else None,
}


def _file_targets(path: Path) -> list[str]:
    n = path.name
    found = [name for name, match in _LAYOUT_FILES.items() if match(n)]
    if n.startswith("edges_") and n.endswith(".h5"):
        found += ["edges-read", "edges-validate", "edges-layout", "edges-layout-dynamic"]
    if n.startswith("embeddings_") and n.endswith(".h5"):
        found += ["checkpoint-embeddings", "checkpoint-layout-embeddings"]
    if n.startswith("model.") and n.endswith(".h5"):
        found += ["checkpoint-model", "checkpoint-layout-model"]
    return found


def _add_tree(root: Path, add: Callable[[str, bytes], None]) -> None:
    import h5py

    from pbgio.spec.checkpoint import OPTIMIZER_DATASET

    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.stat().st_size > 4 << 20:
            continue
        names = _file_targets(path)
        data = path.read_bytes()
        for name in names:
            add(name, data)
        if "checkpoint-embeddings" in names or "checkpoint-model" in names:
            with h5py.File(path, "r") as f:
                if OPTIMIZER_DATASET in f:
                    blob = f[OPTIMIZER_DATASET][...].tobytes()
                    add("optimizer-blob", blob)
                    add("torch-payload", blob)


def _layout_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    from pbgio.testing.layouts import small_valid_layout, write_layout

    variants = [
        {}, {"dynamic": True}, {"featurized": False, "weights": False, "partitioned": False},
        {"names": False, "empty_bucket": False, "edges_per_bucket": 40, "seed": 3},
        {"dynamic": True, "featurized": False, "checkpoint": False, "seed": 5},
    ]
    for i, kwargs in enumerate(variants):
        root = dest / f"layout{i}"
        shutil.rmtree(root, ignore_errors=True)
        write_layout(root, small_valid_layout(**kwargs))  # type: ignore[arg-type]
        _add_tree(root, add)
    from pbgio.example import build_example

    example = dest / "example"
    shutil.rmtree(example, ignore_errors=True)
    build_example(example, num_edges=300)
    _add_tree(example, add)
    for version in (b"0\n", b"2\n", b"3"):  # no files of it, or version 1's left stale beside it
        add("checkpoint-layout-version", version)


def _index_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    from pbgio.index_file import IndexMeta, write_index_file

    dest.mkdir(parents=True, exist_ok=True)
    flat_header = b"IxFI" + struct.pack("<iqqqBi", 4, 9, 1 << 20, 1 << 20, 1, 0)  # d 4, 9 rows, inner product
    payloads = [b"", bytes(range(256)) * 3, b"IxF2" + struct.pack("<iq", 4, 9) + bytes(64),
                flat_header + struct.pack("<Q", 36) + bytes(144)]  # a header pbg builds: past its claims check
    metas = [IndexMeta("user", 1, "cos", False, 4, [5, 4], "0" * 64, "faiss", "1.15.1", "flat"),
             IndexMeta("user", 3, "dot", True, 8, [7], "f" * 64, "faiss", "1.15.1", "ivf", {"nlist": 2, "nprobe": 1},
                       recall_at_10=0.9, recall_queries=10, recall_candidates=20),
             IndexMeta("user", 2, "cos", False, 2, [1, 0, 3], "a" * 64, "faiss", "1.15.1", "hnsw",
                       {"m": 8, "ef_search": 16}),
             IndexMeta("user", 1, "cos", False, 4, [5, 4], "0" * 64, "faiss", "1.15.1", "flat")]
    for i, (payload, meta) in enumerate(zip(payloads, metas, strict=True)):
        path = dest / f"index_user.{meta.metric}.{meta.kind}.v{meta.version}.{i}.h5"
        write_index_file(path, meta, lambda sink, payload=payload: sink(payload))  # type: ignore[misc]
        add("index", path.read_bytes())
    _index_foreign_seeds(dest, add, metas[1])


def _index_foreign_seeds(dest: Path, add: Callable[[str, bytes], None], meta: Any) -> None:
    """Index files that are not quite index files: each way the metadata attribute or the payload
    dataset can be wrong (pbgio.checks.index), and a payload stored in chunks (read as a stream)."""
    import hashlib

    import h5py
    import numpy as np

    from pbgio.formats.h5 import write_format_version
    from pbgio.spec.index import META_ATTR, PAYLOAD_DATASET

    good = json.loads(meta.to_json())
    texts: list[str | None] = [None, "{not json", "[1, 2]", json.dumps({"entity_type": "user"}),
                               json.dumps({**good, "version": "1"}), json.dumps({**good, "metric": "l3"}),
                               json.dumps({**good, "recall_at_10": 2}), json.dumps({**good, "partition_rows": [-1]}),
                               json.dumps({k: v for k, v in good.items() if k != "recall_queries"})]
    payloads: list[Any] = [np.zeros((2, 2), np.uint8), np.zeros(4, np.float32), "group"]
    cases = [(text, None) for text in texts] + [(json.dumps(good), payload) for payload in payloads]
    cases.append((json.dumps({**good, "payload_sha256": hashlib.sha256(bytes(100)).hexdigest()}), "chunked"))
    for i, (text, payload) in enumerate(cases):
        path = dest / f"foreign-{i}.h5"
        with h5py.File(path, "w") as f:
            write_format_version(f)
            if payload is None:
                f.create_dataset(PAYLOAD_DATASET, data=np.arange(8, dtype=np.uint8))
            elif isinstance(payload, str) and payload == "group":
                f.create_group(PAYLOAD_DATASET)
            elif isinstance(payload, str):
                f.create_dataset(PAYLOAD_DATASET, data=np.zeros(100, np.uint8), chunks=(16,), compression="gzip")
            else:
                f.create_dataset(PAYLOAD_DATASET, data=payload)
            if text is not None:
                f.attrs[META_ATTR] = text
        add("index", path.read_bytes())


def _sample_seeds(samples: Path, add: Callable[[str, bytes], None]) -> None:
    for case in sorted(samples.glob("sample_current_*")):
        _add_tree(case, add)


def _pickle_seeds(dest: Path, add: Callable[[str, bytes], None], samples: Path | None) -> None:
    import numpy as np
    import torch

    from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad, encode_state_dict
    from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

    for i, spec in enumerate([LegacySpec(), LegacySpec(zip_container=True, camel=False, index_base=0,
                                                       dynamic="count", num_partitions=1)]):
        root = dest / f"legacy{i}"
        shutil.rmtree(root, ignore_errors=True)
        write_legacy_layout(root, spec)
        for path in sorted(root.rglob("*")):
            if path.is_file() and ".pt" in path.name and path.stat().st_size < 1 << 20:
                add("legacy-pt", path.read_bytes())
    if samples is not None and samples.is_dir():
        for path in sorted(samples.glob("sample_legacy_*/**/*")):
            if path.is_file() and ".pt" in path.name and path.stat().st_size < 1 << 20:
                add("legacy-pt", path.read_bytes())
    blobs = [encode_row_adagrad(np.array([0.5, 2.0, 0.0], np.float32), lr=0.1),
             encode_adagrad([np.ones((2, 3), np.float32), np.zeros(4, np.float32)], lr=0.1, steps=3)]
    for blob in blobs:
        add("optimizer-blob", blob)
        add("torch-payload", blob)
    for state in _near_miss_states(torch):  # valid payloads, each state dict one rule away from the original's
        add("optimizer-blob", encode_state_dict(state))
    for obj in ({"sum": torch.arange(6, dtype=torch.float32).reshape(2, 3).t()},
                {"state": {}, "param_groups": [{"lr": 0.1, "params": []}]},
                [torch.tensor([1, 2], dtype=torch.int64), torch.tensor([1.5], dtype=torch.float64)]):
        for zipped in (True, False):
            buffer = io.BytesIO()
            torch.save(obj, buffer, _use_new_zipfile_serialization=zipped)
            add("torch-payload", buffer.getvalue())
            add("optimizer-blob", buffer.getvalue())
            add("legacy-pt", buffer.getvalue())
    add("legacy-pt", pickle.dumps({"a": [1, 2.5, "x", None]}, protocol=2))
    add("legacy-pt", pickle.dumps(13, protocol=0))


def _near_miss_states(torch: Any) -> list[Any]:
    """Optimizer state dicts that torch loads but the original would not resume from, one rule each:
    seeds the structure checks of :mod:`pbgio.checks.optimizer` past what byte mutations reach."""
    row = {"lr": 0.1, "lr_decay": 0, "weight_decay": 0, "params": [0]}
    full = {"lr": 0.1, "lr_decay": 0, "weight_decay": 0, "eps": 1e-10, "params": [0, 1]}
    sums = torch.ones(3)
    entry = {"step": torch.tensor(2.0), "sum": torch.ones(2, 3)}
    return [
        {"state": {0: {"sum": sums.double()}}, "param_groups": [row]},  # dtype
        {"state": {0: {"sum": torch.ones(3, 2)}}, "param_groups": [row]},  # dimensions
        {"state": {0: {"step": 1}}, "param_groups": [row]},  # no sum
        {"state": {0: {"sum": 5}}, "param_groups": [row]},  # a number for a tensor
        {"state": {0: {"sum": sums}, 1: {"sum": sums}}, "param_groups": [row]},  # an extra entry
        {"state": {0: {"sum": sums}}, "param_groups": [row, row]},  # two groups
        {"state": {0: {"sum": sums}}, "param_groups": [{**row, "lr": "fast"}]},  # a group key's value
        {"state": {0: {"sum": sums}}, "param_groups": [{k: v for k, v in row.items() if k != "lr"}]},
        {"state": {0: {"sum": sums}}, "param_groups": [{**row, "params": list(range(10))}]},
        {"state": {0: entry, 1: {**entry, "step": "x"}}, "param_groups": [full]},  # a step that is no number
        {"state": {0: entry}, "param_groups": [full]},  # a parameter without state
        {"state": {0: entry, 1: entry, 7: entry}, "param_groups": [full]},  # an entry past the parameters
        {"state": {0: entry, 1: 3}, "param_groups": [full]},  # an entry that is no dict
        [sums],  # no state dict at all
    ]


def _table_seeds(add: Callable[[str, bytes], None], samples: Path | None) -> None:
    rng = random.Random(15)
    rows = [(f"n{rng.randrange(20)}", f"rel{rng.randrange(3)}", f"n{rng.randrange(20)}") for _ in range(40)]
    add("import-tsv", "".join(f"{a}\t{r}\t{b}\n" for a, r, b in rows).encode())
    add("import-tsv", b"ann\tfollows\tbob\n\nbob\tfollows\tcy\ncy\tlikes\tann")
    if samples is not None and samples.is_dir():
        for path in sorted(samples.glob("*/**/*.tsv")):
            if path.stat().st_size < 256 << 10:
                add("import-tsv", path.read_bytes())
    csv = ["src,rel,dst,w"] + [f"{a},{r},f{rng.randrange(5)} f{rng.randrange(5)},{rng.random():.3f}"
                               for a, r, _ in rows]
    add("import-csv", ("\n".join(csv) + "\n").encode())
    add("import-csv", b"w,dst,rel,src\n1,f1,r,a\n0.5,f2 f3,r,b\n")
    import polars as pl

    frames = [
        pl.DataFrame({"lhs": [a for a, _, _ in rows], "rel": [r for _, r, _ in rows], "rhs": [b for *_, b in rows]}),
        pl.DataFrame({"h": [1, 2, 3], "r": ["x", "y", "x"], "t": [3, 2, 1]}),
        pl.DataFrame({"h": ["a", "b"], "r": pl.Series(["x", "y"], dtype=pl.Categorical), "t": ["c", "a"],
                      "w": [0.5, 1.0]}),
    ]
    for frame in frames:
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        add("import-parquet", buffer.getvalue())


def _config_variants(base: dict[str, Any]) -> list[dict[str, Any]]:
    """Configs around ``base`` (the static template's): every operator, comparator, loss and bucket
    order, dynamic relations, featurized types, and one config per rule (errors and warnings) of
    :mod:`pbgio.checks.config`, mixedCase and unknown keys, values the schema refuses."""
    import copy

    def edit(**changes: Any) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        for key, value in changes.items():
            if value is None:
                doc.pop(key, None)
            else:
                doc[key] = value
        return doc

    rels, ents = base["relations"], base["entities"]
    out = [edit(relations=[{**rels[0], "operator": op}, *rels[1:]])
           for op in ("none", "diagonal", "translation", "linear", "affine", "complex_diagonal")]
    out += [edit(comparator=c) for c in ("dot", "cos", "l2", "squared_l2")]
    out += [edit(loss_fn=loss, margin=0.2) for loss in ("ranking", "logistic", "softmax")]
    out += [edit(bucket_order=order) for order in ("random", "affinity", "inside_out", "outside_in")]
    out += [
        edit(dynamic_relations=True, global_emb=False, relations=rels[:1]),
        edit(dynamic_relations=True, global_emb=True),  # errors: relation count, global_emb
        edit(relations=[*rels, {"name": "x", "lhs": "user", "rhs": "ghost"}]),
        edit(relations=[*rels, {"name": "x", "lhs": "user", "rhs": "item"}]),  # dimensions differ
        edit(entities={**ents, "item": {**ents["item"], "dimension": 5}},
             relations=[{**rels[1], "operator": "complex_diagonal"}]),
        edit(batch_size=1000, num_batch_negs=30),
        edit(num_batch_negs=0, num_uniform_negs=0),
        edit(entities={**ents, "item": {"num_partitions": 3}}),
        edit(entities={**ents, "a/b": {"num_partitions": 1}}),
        edit(entities={**ents, "Con": {"num_partitions": 1}, "user ": {"num_partitions": 1}}),
        edit(num_machines=2, entities={k: {**v, "num_partitions": 1} for k, v in ents.items()}),
        edit(checkpoint_preservation_interval=0),
        edit(checkpoint_preservation_interval=-3),
        edit(regularization_coef=-1.0),
        edit(regularization_coef=0.0, regularizer="L2"),
        edit(regularization_coef=0.5, regularizer="L2"),
        edit(num_partition_servers=-2),
        edit(loss_fn="logistic", comparator="cos"),
        edit(eval_fraction=0.1, eval_num_uniform_negs=5, num_uniform_negs=5),
        edit(eval_fraction=0.1, eval_num_batch_negs=0, num_batch_negs=0, disable_lhs_negs=True),
        edit(disable_lhs_negs=True, disable_rhs_negs=True),
        edit(eval_num_batch_negs=0),
        edit(init_path="init", num_epochs=0),
        edit(dimension=0, edge_paths=[], relations=[{**rels[0], "operator": "rotate"}]),
        edit(entity_path=None, dimensoin=4),
        edit(entities={**ents, "user": {"numPartitions": 2, "featurized": "yes"}}),
    ]
    camel = edit()
    camel["numEpochs"] = camel.pop("num_epochs", 3)
    camel["edgePaths"] = camel.pop("edge_paths")
    out.append(camel)
    return out


def _slot_seeds(dest: Path, add: Callable[[str, bytes], None], wanted: set[str]) -> None:
    """Seeds of the layout-level targets, built on the templates they run in."""
    if wanted & {"config-layout", "config", "config-py"}:
        base = json.loads((layout_template(dest, "static") / "config.json").read_text(encoding="utf-8"))
        for variant in _config_variants(base):
            add("config", json.dumps(variant, indent=2).encode())
        for raw in (b"[1, 2]", b'{"entities": ', b"[" * 50_000 + b"]" * 50_000, b"\xff\xfe{}", b"9" * 5000):
            add("config", raw)
    names = [b'["a","b", "c"]', b"[]", b"[\n]\n", b' ["a"] x', b'["a",]', b'["a" "b"]', b"[1]", b'{"a": 1}',
             b'["\\ud800", "a\\"b", "\\u00e9"]', b'["abc', b'[\r\n  "a",\r\n  "b"\r\n]', b'[\n"a"\n,\n"b"\n]',
             b'[\n"a",\n"b",\n]', b'[\n"a"\n"b"\n]', b"\xef\xbb\xbf[]", b'["\xff"]', b"",
             b"[\n" + b'"x",\n' * 300 + b'"y"]']
    for name in ("entity-names", "dynamic-rel-names"):
        for text in names if name in wanted else []:
            add(name, text)
    for name in ("entity-count", "dynamic-rel-count"):
        for text in (b" 12\n", b"0", b"-1", b"1e3", b"\xff", b"") if name in wanted else []:
            add(name, text)
    if "entities-layout" in wanted:
        _entity_slot_seeds(dest, add)
    if "index-layout" in wanted:
        _index_slot_seeds(dest, add)
    if "import-options" in wanted:
        _import_option_seeds(add)


def _entity_slot_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    for bit, template in enumerate(("entities", "entities-dynamic")):
        entity_path = layout_template(dest, template) / "entities"
        for slot, name in enumerate(ENTITY_SLOTS):
            first = slot << 2 | bit
            file = entity_path / name
            if file.exists():
                add("entities-layout", bytes([first]) + file.read_bytes())
                add("entities-layout", bytes([first | 2]))  # deleted
    at = {name: i << 2 for i, name in enumerate(ENTITY_SLOTS)}
    user0 = [f"user-0-{i}" for i in range(5)]
    for first, text in [
        (at["entity_names_user_1.json"], json.dumps(user0[:4], indent=4)),  # user-0's names in user-1
        (at["entity_names_user_0.json"], json.dumps(user0[:3] + user0[:2])),  # repeated within
        (at["entity_names_user_0.json"], json.dumps(user0[:3])),  # fewer than the count
        (at["entity_names_user_0.json"], '["a", "b",\n 3, "c"]'),
        (at["entity_names_user_0.json"], '[\n"a",\n"b"\n]\n]'),
        (at["entity_count_user_0.txt"], "7\n"),
        (at["entity_count_user_0.txt"], "seven\n"),
        (at["entity_count_user_2.txt"], "3\n"),
        (at["entity_count_ghost_0.txt"], "3\n"),
        (at["dynamic_rel_names.json"], json.dumps(["likes", "follows", "describes"])),
        (at["dynamic_rel_names.json"], json.dumps(["follows", "likes", "describes", "x"])),
        (at["dynamic_rel_count.txt"], "2\n"),
        (at["dynamic_rel_names.json"] | 1, json.dumps(["buys", "views"])),
        (at["dynamic_rel_count.txt"] | 1, "5\n"),
        (at["dynamic_rel_count.txt"] | 1 | 2, ""),  # dynamic, the count deleted
        (at["entity_names_doc_0.json"], json.dumps([f"doc-{i}" for i in range(9)])),
    ]:
        add("entities-layout", bytes([first]) + text.encode())


def _index_slot_seeds(dest: Path, add: Callable[[str, bytes], None]) -> None:
    from dataclasses import replace

    from pbgio.checkpoint import CheckpointDir
    from pbgio.config import load_config
    from pbgio.index_file import IndexMeta, TypeRows, write_index_file

    root = layout_template(dest, "static")
    cfg, ckpt = load_config(root / "config.json"), CheckpointDir(root / "checkpoint")
    work = dest / "_index-layout"
    work.mkdir(parents=True, exist_ok=True)
    specs = [("user", 1, "cos", "flat", False, {}), ("user", 1, "dot", "ivf", True, {"nlist": 2, "nprobe": 1}),
             ("user", 1, "cos", "hnsw", False, {"m": 8, "ef_search": 16}), ("user", 1, "dot", "flat", True, {}),
             ("item", 1, "dot", "flat", False, {}), ("doc", 1, "cos", "flat", False, {}),
             ("user", 2, "cos", "flat", False, {}), ("ghost", 1, "cos", "flat", False, {})]
    for slot, (etype, version, metric, kind, add_global, params) in enumerate(specs):
        try:
            rows = TypeRows(cfg, ckpt, 1, etype, add_global=add_global)
            shape: tuple[int, list[int], str] = (rows.dimension, rows.partition_rows(), rows.fingerprint())
        except (KeyError, ValueError, LookupError, OSError):
            shape = (4, [3], "0" * 64)
        meta = IndexMeta(etype, version, metric, add_global, shape[0], shape[1], shape[2], "faiss", "1.8.0", kind,
                         params, recall_at_10=None if kind == "flat" else 0.95, recall_queries=0 if kind == "flat"
                         else 20, recall_candidates=0 if kind == "flat" else 40)
        variants = [meta]
        if slot == 0:  # stale three ways, and named for another kind
            variants += [replace(meta, partition_rows=[5, 5]), replace(meta, dimension=6),
                         replace(meta, fingerprint="0" * 64), replace(meta, kind="ivf", params={"nlist": 1})]
        for i, variant in enumerate(variants):
            path = work / f"{slot}-{i}.h5"
            write_index_file(path, variant, _write_64_bytes)
            add("index-layout", bytes([slot]) + path.read_bytes())


def _write_64_bytes(sink: Callable[[bytes], object]) -> None:
    sink(bytes(range(64)))


def _import_option_seeds(add: Callable[[str, bytes], None]) -> None:
    """A table for each option set, written as its options say (columns, header, delimiter, quoting)."""
    import polars as pl

    rng = random.Random(16)
    for variant in range(8):
        for delimiter in range(8):
            named = variant in (4, 6, 7)
            header = 1 if named else (0, 2, 1)[delimiter % 3]
            first = variant << 5 | header << 3 | delimiter
            config, options = import_options(first)
            sep = {"whitespace": "  "}.get(options["delimiter"], options["delimiter"])
            features = options.get("feature_separator", " ")
            roles = {"lhs": options.get("lhs_col", 0), "rel": options.get("rel_col", 1),
                     "rhs": options.get("rhs_col", 2), "weight": options.get("weight_col")}
            names = {"lhs": "src", "rel": "rel", "rhs": "dst", "weight": "w"}
            order = sorted((ref if isinstance(ref, int) else ["src", "rel", "dst", "w"].index(ref), role)
                           for role, ref in roles.items() if ref is not None)
            lines = [sep.join(names[role] for _, role in order)] if options["header"] else []
            for _ in range(12):
                cells = {"lhs": f"n{rng.randrange(9)}", "rel": f"r{rng.randrange(2)}",
                         "rhs": (features.join(f"f{rng.randrange(5)}" for _ in range(2)) if config == "featurized"
                                 else f"n{rng.randrange(9)}"), "weight": f"{rng.random():.2f}"}
                if options.get("quote") == "'" and sep not in (" ", "  "):
                    cells["lhs"] = f"'a{sep}{cells['lhs']}'"
                lines.append(sep.join(cells[role] for _, role in order))
            add("import-options", bytes([first]) + ("\n".join(lines) + "\n").encode())
        frame = pl.DataFrame({"src": [f"n{i % 5}" for i in range(10)], "rel": ["r0", "r1"] * 5,
                              "dst": ([[f"f{i % 3}", "f4"] for i in range(10)] if variant in (5, 6)
                                      else [f"n{i % 7}" for i in range(10)]),
                              "w": [0.5 + i for i in range(10)]})
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        add("import-options", bytes([variant << 5 | 1 << 3]) + buffer.getvalue())


def load_corpus(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()]
