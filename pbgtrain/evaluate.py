"""``pbgtrain eval``: evaluate a checkpoint version on edge paths.

Buckets are visited in lexicographic order (as the original's ``torchbiggraph_eval``), each
with its partitions read from the checkpoint through pbgio. Two protocols:

* **sampled** (default): each edge is ranked against the config's ``eval_num_batch_negs``
  same-batch and ``eval_num_uniform_negs`` uniform negatives, both sides, as during training
  (a featurized type's entities are ranked among same-batch bags, their uniform negatives
  skipped as in the original);
* **all entities** (``all_entities=True``, implied by filter paths): each edge is ranked against
  every entity of the corrupted side's partition. With filter paths, candidates forming a known
  edge (any of the filter paths, same bucket, same relation) are left out: the *filtered*
  protocol of the link-prediction literature. A featurized side has no table to rank against: only
  the plain sides are ranked, and the protocol names the sides left out
  (:mod:`pbgtrain.featurized_ranking`). All of it is vectorized (batched scoring, a sorted-key
  filter index), never a Python loop over edges.

Which protocol, and the batches, are the :class:`pbgtrain.ranking.EvalPlan` the held-out figures of
``fit`` use too.

Every result states its protocol when printed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from pbgio import storage
from pbgio.checkpoint import read_committed
from pbgio.checks.edges import check_bounds
from pbgio.config import ConfigSchema
from pbgio.edges import EdgeBucket, bucket_length, read_bucket
from pbgio.errors import UsageError
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.names import relation_names
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.featurized_ranking import check_table_side, keyed_filter
from pbgtrain.metrics import FilterIndex, RankingAccumulator, RankingMetrics
from pbgtrain.model import BucketEdges, ModelSpec
from pbgtrain.ranking import EvalPlan, all_entities_batch
from pbgtrain.ranking_watch import RankingWatch, RankingWork, SpokenWatch, edges_ranked, ranking_work
from pbgtrain.schedule.batching import stable_seed
from pbgtrain.schedule.buckets import Bucket, PartitionSides, all_buckets, bucket_limits
from pbgtrain.training.device import resolve_device

__all__ = ["EvalOptions", "EvalResult", "all_entities_batch", "check_featurized_evaluation",
           "evaluate_checkpoint", "trained_on", "training_paths"]

@dataclass(frozen=True)
class EvalOptions:
    edge_paths: list[AnyPath] | None = None
    filter_paths: list[AnyPath] = field(default_factory=list)
    all_entities: bool = False
    version: int | None = None
    device: str | None = None
    seed: int = 0
    interactive: bool = False
    per_relation: bool = False  # also the metrics of each relation's edges (pbgtrain eval --per-relation)
    sample: int | None = None  # rank a fixed sample of this many of the edges, drawn by ``seed`` (None: all)
    watched: bool = False  # say the ranking's cost on stderr first, and show a bar on a long one (pbgtrain eval)


@dataclass
class EvalResult:
    version: int
    edge_paths: list[str]
    metrics: RankingMetrics
    seconds: float
    per_relation: dict[str, RankingMetrics] | None = None  # by relation name, in relation id order
    sampled_from: int | None = None  # with ``EvalOptions.sample``: the edges the sample was drawn from
    sample: int | None = None  # ``EvalOptions.sample``: the edges asked for (as many as there are, or fewer)
    seed: int = 0  # ``EvalOptions.seed``: of the sample and of sampled candidates

    def summary(self) -> str:
        sample = "" if self.sample is None else \
            f", {edges_ranked(self.metrics.count, self.sampled_from)} (--sample {self.sample}, seed {self.seed})"
        return (f"checkpoint version {self.version}, {', '.join(self.edge_paths)}{sample}: {self.metrics}  "
                f"[{self.seconds:.1f} s]")

    def to_dict(self) -> dict[str, Any]:
        out = {"version": self.version, "edge_paths": self.edge_paths, "seconds": self.seconds,
               **self.metrics.to_dict()}
        if self.per_relation is not None:
            out["per_relation"] = {name: m.to_dict() for name, m in self.per_relation.items()}
        if self.sample is not None:
            out["sample"] = {"asked": self.sample, "edges": self.metrics.count,
                             "of": self.metrics.count if self.sampled_from is None else self.sampled_from,
                             "seed": self.seed}
        return out


def trained_on(opened: CheckpointVersion, edge_dirs: list[AnyPath] | None = None) -> list[str]:
    """The edge paths among ``edge_dirs`` (default: the config's, what ``evaluate_checkpoint``
    evaluates without ``edge_paths``) that the model of ``opened`` trained on: their figures are
    not held-out figures. What it trained on is the checkpoint's ``config.json`` (the config of the
    run, its ``-p`` overrides included); without one, the config's ``edge_paths``.

    >>> from pathlib import Path
    >>> from pbgio.checkpoint import CheckpointDir
    >>> from pbgio.example import example_config
    >>> from pbgio.layout import Layout
    >>> opened = CheckpointVersion(Layout(example_config(), Path("/srv/ex")), CheckpointDir("/srv/ex/ckpt"), 0)
    >>> trained_on(opened, [Path("/srv/ex/edges/test")]), trained_on(opened, [Path("/srv/ex/edges/../edges/train")])
    ([], ['/srv/ex/edges/train'])
    """
    layout = opened.layout
    trained = {storage.display(storage.absolute(p)) for p in training_paths(opened)}
    evaluated = [storage.display(storage.absolute(p)) for p in (layout.edge_paths if edge_dirs is None else edge_dirs)]
    return [p for p in evaluated if p in trained]


def training_paths(opened: CheckpointVersion) -> list[AnyPath]:
    """The edge paths the model of ``opened`` trained on: the ``edge_paths`` of the checkpoint's
    ``config.json`` (the run's, its ``-p`` overrides included); without one, the config's."""
    return [opened.layout.path(p) for p in (opened.trained_with or opened.layout.config).edge_paths]


def evaluate_checkpoint(layout: Layout | CheckpointVersion, options: EvalOptions | None = None) -> EvalResult:
    """Metrics of a checkpoint version on edge paths (default: the config's ``edge_paths``).

    The version is read as what it is (:meth:`pbgio.layout.Layout.open_checkpoint`: the settings
    it was trained with), or is one already opened. Without ``options.version``, the committed
    version, all of it even while ``pbgtrain fit`` commits newer ones: when a commit removes one of
    its files meanwhile, evaluation starts over on the new committed version
    (:func:`pbgio.checkpoint.read_committed`).
    """
    options = options or EvalOptions()
    opened = open_checkpoint(layout, version=options.version, model=True)
    with _watch(options) as watch:
        return read_committed(opened.checkpoint,
                              lambda version: _evaluate(opened.at(version), replace(options, version=version), watch),
                              options.version)


def _watch(options: EvalOptions) -> RankingWatch:
    """What is said while ranking: with ``options.watched``, the cost line on stderr and a bar."""
    if not options.watched:
        return RankingWatch()
    from pbgio.console import stderr_console

    return SpokenWatch(lambda line: stderr_console().print(line, soft_wrap=True, markup=False), options.interactive)


def _evaluate(opened: CheckpointVersion, options: EvalOptions, watch: RankingWatch) -> EvalResult:
    layout, cfg = opened.layout, opened.config
    started = time.perf_counter()
    torch.set_num_threads(cfg.workers or os.cpu_count() or 1)
    device = resolve_device(options.device, layout)
    reader = CheckpointReader(opened, device)
    edge_dirs = options.edge_paths or layout.edge_paths
    all_entities = options.all_entities or bool(options.filter_paths)
    tables = [n for (etype, _), n in reader.counts.items() if etype not in reader.model.spec.featurized]  # (features)
    plan = EvalPlan.build(reader.model.spec, cfg, tables, all_entities=all_entities,
                          filter_sources=[p.name for p in options.filter_paths])
    check_featurized_evaluation(layout, reader.model.spec, plan,
                                option="--filter" if options.filter_paths else "--all-entities")
    if options.per_relation and cfg.dynamic_relations and not plan.every_entity:
        raise UsageError("--per-relation: with dynamic relations, sampled candidates come from a batch of mixed "
                         "relations; rank against all entities (--all-entities, or --filter)")
    total = RankingAccumulator(plan.protocol, seed=options.seed)
    by_relation: dict[int, RankingAccumulator] = {}
    generator = torch.Generator(device=device).manual_seed(stable_seed("eval", options.seed))
    nl, nr = cfg.bucket_grid()
    partitions = PartitionSides.from_config(cfg)
    paths = [edge_dir / naming.bucket_file(bucket.lhs, bucket.rhs) for edge_dir in edge_dirs
             for bucket in all_buckets(nl, nr)]
    chosen, sampled_from = _sample(paths, options.sample, options.seed)
    watch.start(partial(_ranking_work, plan, cfg, reader.counts, paths, all_buckets(nl, nr), chosen, sampled_from))
    for position, (path, bucket) in enumerate(zip(paths, [b for _ in edge_dirs for b in all_buckets(nl, nr)],
                                                  strict=True)):
        edges = read_bucket(path)
        if not len(edges) or (chosen is not None and not len(chosen[position])):
            continue
        check_bounds(edges, path, first_row=0,
                     **bucket_limits(cfg, reader.counts, bucket, reader.model.spec.num_dynamic_rels))
        needed = {(r.lhs, partitions.partition_of(r.lhs, bucket, "lhs")) for r in cfg.relations} | \
                 {(r.rhs, partitions.partition_of(r.rhs, bucket, "rhs")) for r in cfg.relations}
        reader.keep_only(needed)
        filter_index = None
        if options.filter_paths:  # (a featurized side's ids: its bags' numbers, in both)
            filter_index, edges = _filter_index(reader.model.spec, edges, path, options.filter_paths, bucket)
        tensors = BucketEdges.from_bucket(edges, device, str(path))
        # (the config's relation, the relation id it counts under, its edges); with dynamic
        # relations the config's one relation: all edges at once, or each id's (--per-relation)
        if not cfg.dynamic_relations:
            groups = [(r, r, (tensors.rel == r).nonzero().squeeze(1)) for r in range(len(cfg.relations))]
        elif options.per_relation:
            groups = [(0, i, (tensors.rel == i).nonzero().squeeze(1)) for i in torch.unique(tensors.rel).tolist()]
        else:
            groups = [(0, 0, torch.arange(len(tensors), device=device))]
        if chosen is not None:  # the sample's edges of this bucket
            keep = torch.zeros(len(tensors), dtype=torch.bool, device=device)
            keep[torch.from_numpy(chosen[position]).to(device)] = True
            groups = [(r, rel_id, sel[keep[sel]]) for r, rel_id, sel in groups]
        for r, rel_id, sel in groups:
            if not len(sel):
                continue  # no edge of this relation in the bucket
            relation = cfg.relations[r]
            acc = by_relation.setdefault(rel_id, RankingAccumulator(plan.protocol, seed=options.seed)) \
                if options.per_relation else total
            lhs_t = reader.table(relation.lhs, partitions.partition_of(relation.lhs, bucket, "lhs"))
            rhs_t = reader.table(relation.rhs, partitions.partition_of(relation.rhs, bucket, "rhs"))
            watch.rank(partial(plan.rank, acc, reader.model, lhs_t, rhs_t, tensors, r=r, generator=generator,
                               filter_index=filter_index), sel, plan.edges_per_step(lhs_t, rhs_t),
                       sum(plan.candidates(r, plan.protocol.sides, lhs_t.num_entities, rhs_t.num_entities)))
    per_relation = None
    if options.per_relation:
        names = relation_names(cfg, layout.entity_path)
        for key in sorted(by_relation):
            total.merge(by_relation[key])
        per_relation = {names[key]: by_relation[key].result() for key in sorted(by_relation)}
    return EvalResult(reader.version, [str(p) for p in edge_dirs], total.result(), time.perf_counter() - started,
                      per_relation, sampled_from, options.sample, options.seed)


def _ranking_work(plan: EvalPlan, cfg: ConfigSchema, counts: dict[tuple[str, int], int], paths: list[AnyPath],
                  buckets: Iterable[Bucket], chosen: list[np.ndarray] | None, sampled_from: int | None) -> RankingWork:
    """What ranking the edges of ``paths`` (the sample ``chosen`` of them) computes: their count, and
    the candidates of each relation in each of ``buckets`` (from ``counts``, the entities of each
    partition: no table is read)."""
    edges = sum(map(len, chosen)) if chosen is not None else sum(bucket_length(path) for path in paths)
    partitions = PartitionSides.from_config(cfg)

    def entities(entity_type: str, bucket: Bucket, side: str) -> int:
        return counts[(entity_type, partitions.partition_of(entity_type, bucket, side))]

    per_side = [plan.candidates(r, plan.protocol.sides, entities(relation.lhs, b, "lhs"),
                                entities(relation.rhs, b, "rhs"))
                for b in buckets for r, relation in enumerate(cfg.relations)]
    return ranking_work(edges, sampled_from, per_side, plan.protocol.sides)


def _sample(paths: list[AnyPath], size: int | None, seed: int) -> tuple[list[np.ndarray] | None, int | None]:
    """``EvalOptions.sample``: the rows of each bucket file of ``paths`` in a uniform sample of ``size``
    of all their edges (without repeats, drawn by ``seed``: the same edges at every call), and how
    many edges there are; ``(None, None)`` without a sample, or when it would hold every edge."""
    if size is None:
        return None, None
    lengths = [bucket_length(path) for path in paths]
    total = sum(lengths)
    if size >= total:
        return None, None
    picked = np.sort(np.random.default_rng(stable_seed("eval-sample", seed)).choice(total, size, replace=False))
    starts = np.cumsum([0, *lengths])
    return [picked[(picked >= starts[k]) & (picked < starts[k + 1])] - starts[k] for k in range(len(paths))], total


def _filter_index(spec: ModelSpec, edges: EdgeBucket, path: AnyPath, filter_paths: list[AnyPath],
                  bucket: Bucket) -> tuple[FilterIndex, EdgeBucket]:
    """The known edges of ``bucket`` in the filter paths, indexed, and the evaluated ``edges`` (of
    ``path``) as the index knows them: a featurized side's entity is its bag (:func:`keyed_filter`)."""
    known = [directory / naming.bucket_file(bucket.lhs, bucket.rhs) for directory in filter_paths]
    return keyed_filter(spec, edges, [read_bucket(p) for p in known], [str(path), *map(str, known)])


def check_featurized_evaluation(layout: Layout, spec: ModelSpec, plan: EvalPlan, *,
                                option: str = "--all-entities") -> None:
    """Featurized entities have no table to rank against (docs/guides/featurized.md): a ``plan``
    ranking against all entities ranks the plain sides of their relations only (its protocol says
    which), and is refused, naming the command-line ``option`` that asked for it, when no relation
    has one (sampled evaluation is checked with the config)."""
    if plan.every_entity:
        check_table_side(layout.source, spec.featurized, plan.protocol.sides, option)
