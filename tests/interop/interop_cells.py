"""The interop matrix: small synthetic graphs with planted structure, one per cell.

Every cell is a run config plus edge lists generated here (train and test TSV files): entities
fall into 4 communities and each relation links an entity to the community ``(g + shift) % 4``,
so training moves the embeddings (and a trained model ranks test edges far above chance).
Featurized entities are bags of words drawn from their community's vocabulary.

Together the cells cover (``COVERAGE`` checks it when the module is imported):

========================  ===================================================================
cell                      covers
========================  ===================================================================
static_unpart             translation + diagonal, dot, softmax, global_emb, 2 static relations,
                          unpartitioned (evaluation parity)
dynamic                   dynamic relations (5 ids), complex_diagonal, dot, softmax,
                          global_emb false, N3 regularizer (evaluation parity)
partitioned               user/item 2×2 partitions + unpartitioned tag with its own dimension
                          (8), linear, affine, none, cos, ranking, num_edge_chunks 2,
                          checkpoint_preservation_interval 1
weighted                  edge weights (integers 1–3), bias, l2, logistic, diagonal,
                          global_emb false, two entity types
init_path                 init_path (a seed checkpoint of the same side), squared_l2,
                          ranking, linear, 2 partitions
featurized_lhs            featurized type on the lhs (doc → author), translation, dot, with
                          uniform negatives (20, for the plain side only)
featurized_rhs            featurized type on the rhs (user → doc), none, cos, softmax,
                          global_emb false, same-batch negatives only
========================  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

GROUPS = 4
EPOCHS = 2
COMMON: dict[str, Any] = {
    "dimension": 16, "workers": 1, "batch_size": 100, "num_batch_negs": 20, "num_uniform_negs": 20,
    "eval_fraction": 0.05, "eval_num_batch_negs": 20, "eval_num_uniform_negs": 20, "lr": 0.05,
    "num_epochs": EPOCHS,
}


@dataclass(frozen=True)
class RelationPlan:
    """Edges of one relation name: lhs entity ``i`` links to rhs entities of community ``(i + shift) % 4``."""

    name: str
    lhs: str
    rhs: str
    shift: int = 0


@dataclass(frozen=True)
class Cell:
    name: str
    covers: str
    entities: dict[str, dict[str, Any]]
    relations: list[dict[str, Any]]
    plans: list[RelationPlan]
    counts: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)
    num_edges: int = 1200
    weighted: bool = False
    init_path: bool = False
    seed: int = 0

    # ---- facts
    @property
    def featurized(self) -> bool:
        return any(e.get("featurized") for e in self.entities.values())

    @property
    def dynamic(self) -> bool:
        return bool(self.settings.get("dynamic_relations"))

    @property
    def num_chunks(self) -> int:
        return int(self.settings.get("num_edge_chunks") or 1)

    @property
    def epochs(self) -> int:
        return int(self.settings.get("num_epochs", COMMON["num_epochs"]))

    # ---- files
    def config(self, root: Path, *, edge_paths: tuple[str, ...] = ("train",), checkpoint: str = "checkpoint",
               init: Path | None = None, **overrides: Any) -> dict[str, Any]:
        """The run config with absolute paths under ``root``."""
        config: dict[str, Any] = {
            "entities": {k: dict(v) for k, v in self.entities.items()},
            "relations": [dict(r) for r in self.relations],
            **COMMON,
            **self.settings,
            "entity_path": str(root / "data"),
            "edge_paths": [str(root / "edges" / p) for p in edge_paths],
            "checkpoint_path": str(root / checkpoint),
        }
        if init is not None:
            config["init_path"] = str(init)
        config.update(overrides)
        return config

    def write_inputs(self, root: Path) -> tuple[Path, Path]:
        """``train.tsv`` and ``test.tsv`` (85 % / 15 %): ``lhs<TAB>rel<TAB>rhs[<TAB>weight]``."""
        rng = np.random.default_rng(1000 + self.seed)
        bags = {t: self._bags(t, rng) for t, e in self.entities.items() if e.get("featurized")}
        rows = []
        for _ in range(self.num_edges):
            plan = self.plans[int(rng.integers(len(self.plans)))]
            i = int(rng.integers(self.counts[plan.lhs]))
            group = (i + plan.shift) % GROUPS
            choices = np.arange(group, self.counts[plan.rhs], GROUPS)
            j = int(choices[rng.integers(len(choices))])
            cells = [self._name(plan.lhs, i, bags), plan.name, self._name(plan.rhs, j, bags)]
            if self.weighted:
                cells.append(str(int(rng.integers(1, 4))))
            rows.append("\t".join(cells))
        cut = int(len(rows) * 0.85)
        root.mkdir(parents=True, exist_ok=True)
        train, test = root / "train.tsv", root / "test.tsv"
        train.write_text("\n".join(rows[:cut]) + "\n")
        test.write_text("\n".join(rows[cut:]) + "\n")
        return train, test

    @staticmethod
    def _bags(entity_type: str, rng: np.random.Generator) -> list[str]:
        """One bag of 2–4 words per entity, from its community's 8-word vocabulary."""
        out = []
        for i in range(200):
            words = rng.choice(8, size=int(rng.integers(2, 5)), replace=False)
            out.append(" ".join(f"{entity_type}w{i % GROUPS}x{w}" for w in sorted(words)))
        return out

    @staticmethod
    def _name(entity_type: str, i: int, bags: dict[str, list[str]]) -> str:
        return bags[entity_type][i] if entity_type in bags else f"{entity_type}{i:03d}"


@dataclass
class CellRun:
    """A cell trained (by pbgtrain or by the original): its directory, config, committed version,
    and how the original's readers saw the result (``original_driver.py inspect``)."""

    cell: Cell
    root: Path
    config: dict[str, Any]
    config_path: Path
    version: int
    inspect: dict[str, Any]


def _static(name: str, lhs: str, rhs: str, operator: str) -> dict[str, Any]:
    return {"name": name, "lhs": lhs, "rhs": rhs, "operator": operator}


CELLS: list[Cell] = [
    Cell(
        name="static_unpart",
        covers="translation + diagonal, dot, softmax, global_emb, 2 static relations, unpartitioned",
        entities={"node": {"num_partitions": 1}},
        relations=[_static("near", "node", "node", "translation"), _static("far", "node", "node", "diagonal")],
        plans=[RelationPlan("near", "node", "node", 0), RelationPlan("far", "node", "node", 2)],
        counts={"node": 80},
        settings={"comparator": "dot", "loss_fn": "softmax", "global_emb": True},
        seed=1,
    ),
    Cell(
        name="dynamic",
        covers="dynamic relations, complex_diagonal, dot, softmax, global_emb false, N3",
        entities={"ent": {"num_partitions": 1}},
        relations=[_static("all_edges", "ent", "ent", "complex_diagonal")],
        plans=[RelationPlan(f"r{k}", "ent", "ent", k) for k in range(5)],
        counts={"ent": 80},
        settings={"dynamic_relations": True, "global_emb": False, "comparator": "dot", "loss_fn": "softmax",
                  "regularization_coef": 1e-3},
        seed=2,
    ),
    Cell(
        name="partitioned",
        covers="2x2 partitions (user, item) + unpartitioned tag with dimension 8, linear, affine, none, cos, "
               "ranking, num_edge_chunks 2, checkpoint_preservation_interval 1",
        entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 2},
                  "tag": {"num_partitions": 1, "dimension": 8}},
        relations=[_static("follows", "user", "user", "linear"), _static("likes", "user", "item", "affine"),
                   _static("related", "tag", "tag", "none")],
        plans=[RelationPlan("follows", "user", "user", 1), RelationPlan("likes", "user", "item", 0),
               RelationPlan("related", "tag", "tag", 3)],
        counts={"user": 60, "item": 48, "tag": 24},
        settings={"comparator": "cos", "loss_fn": "ranking", "num_edge_chunks": 2,
                  "checkpoint_preservation_interval": 1, "global_emb": True},
        num_edges=1600,
        seed=3,
    ),
    Cell(
        name="weighted",
        covers="edge weights (1-3), bias, l2, logistic, diagonal, global_emb false",
        entities={"a": {"num_partitions": 1}, "b": {"num_partitions": 1}},
        relations=[_static("ab", "a", "b", "diagonal")],
        plans=[RelationPlan("ab", "a", "b", 1)],
        counts={"a": 60, "b": 40},
        settings={"comparator": "l2", "loss_fn": "logistic", "bias": True, "global_emb": False},
        weighted=True,
        seed=4,
    ),
    Cell(
        name="init_path",
        covers="init_path, squared_l2, ranking, linear, 2 partitions",
        entities={"node": {"num_partitions": 2}},
        relations=[_static("link", "node", "node", "linear")],
        plans=[RelationPlan("link", "node", "node", 1)],
        counts={"node": 80},
        settings={"comparator": "squared_l2", "loss_fn": "ranking"},
        init_path=True,
        seed=5,
    ),
    Cell(
        name="featurized_lhs",
        covers="featurized type on the lhs, translation, dot, ranking, uniform negatives (plain side only)",
        entities={"doc": {"num_partitions": 1, "featurized": True}, "author": {"num_partitions": 1}},
        relations=[_static("written_by", "doc", "author", "translation")],
        plans=[RelationPlan("written_by", "doc", "author", 0)],
        counts={"doc": 120, "author": 40},
        # uniform negatives too (20): the original takes them for the plain author side and
        # same-batch ones only for the featurized doc side; pbgio warns, pbgtrain does the same
        settings={"comparator": "dot", "loss_fn": "ranking"},
        seed=6,
    ),
    Cell(
        name="featurized_rhs",
        covers="featurized type on the rhs, none, cos, softmax, global_emb false",
        entities={"user": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        relations=[_static("reads", "user", "doc", "none")],
        plans=[RelationPlan("reads", "user", "doc", 2)],
        counts={"user": 40, "doc": 120},
        settings={"comparator": "cos", "loss_fn": "softmax", "global_emb": False, "num_uniform_negs": 0,
                  "eval_num_uniform_negs": 0},
        seed=7,
    ),
]

CELLS_BY_NAME = {c.name: c for c in CELLS}


def _coverage() -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {k: set() for k in ("operator", "comparator", "loss_fn", "features")}
    for cell in CELLS:
        cfg = cell.config(Path("/x"))
        seen["operator"] |= {r["operator"] for r in cfg["relations"]}
        seen["comparator"].add(cfg.get("comparator", "cos"))
        seen["loss_fn"].add(cfg.get("loss_fn", "ranking"))
        flags = {
            "dynamic" if cfg.get("dynamic_relations") else "static",
            f"global_emb={bool(cfg.get('global_emb', not cfg.get('dynamic_relations')))}",
        }
        if cfg.get("bias"):
            flags.add("bias")
        if any(e.get("dimension") for e in cfg["entities"].values()):
            flags.add("per-type dimension")
        partitioned = [t for t, e in cfg["entities"].items() if e["num_partitions"] > 1]
        if len(partitioned) >= 2:
            flags.add("several types, 2x2")
        if (cfg.get("num_edge_chunks") or 1) > 1:
            flags.add("edge chunks")
        if cfg.get("checkpoint_preservation_interval"):
            flags.add("preservation")
        if cell.init_path:
            flags.add("init_path")
        if cell.weighted:
            flags.add("weights")
        for rel in cfg["relations"]:
            for side in ("lhs", "rhs"):
                if cfg["entities"][rel[side]].get("featurized"):
                    flags.add(f"featurized {side}")
        seen["features"] |= flags
    return seen


COVERAGE = _coverage()
REQUIRED = {
    "operator": {"none", "diagonal", "translation", "linear", "affine", "complex_diagonal"},
    "comparator": {"dot", "cos", "l2", "squared_l2"},
    "loss_fn": {"ranking", "logistic", "softmax"},
    "features": {"static", "dynamic", "global_emb=True", "global_emb=False", "bias", "per-type dimension",
                 "several types, 2x2", "edge chunks", "preservation", "init_path", "weights", "featurized lhs",
                 "featurized rhs"},
}
MISSING = {k: sorted(v - COVERAGE[k]) for k, v in REQUIRED.items() if v - COVERAGE[k]}
assert not MISSING, f"the interop matrix misses {MISSING}"
