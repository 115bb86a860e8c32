"""Hypothesis strategies for every current-layout artifact, valid by construction.

Configs satisfy every rule of :func:`pbgio.config.semantic_issues` (warnings included);
buckets respect the config, the entity counts and the partition grid (featurized sides with
offsets, weights, empty buckets); checkpoints hold exactly the parameters the config implies;
:func:`layouts` combines them into a :class:`~pbgio.testing.layouts.LayoutContents` that
:func:`~pbgio.testing.layouts.write_layout` writes and ``pbgio validate`` accepts without a
single issue. Sizes stay small so that property tests run fast.

Why this module is long: it is a catalogue, one strategy per artifact and per variant
(featurized sides, weights, dynamic relations, checkpoints), each short and read on its own.

>>> from hypothesis import given
>>> @given(configs())
... def check(cfg):
...     assert not semantic_issues(cfg)
>>> check()

This module needs hypothesis (the ``test`` extra); nothing else in pbgio imports it.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from pbgio.checkpoint import EmbeddingsState, FileMetadata, IterationInfo, ModelState
from pbgio.config import ConfigSchema, parse_config, semantic_issues
from pbgio.edges import EdgeBucket, FeatureLists
from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad
from pbgio.spec.checkpoint import (
    BUCKET_ORDERS,
    COMPARATORS,
    LOSSES,
    OPERATORS,
    TORCH_LEGACY_MAGIC,
    TORCH_ZIP_MAGIC,
    global_embedding_name,
    operator_param_name,
)
from pbgio.spec.naming import entity_type_name_portability, entity_type_name_problem
from pbgio.spec.stats import STATS_KEYS
from pbgio.testing.layouts import (
    BucketKey,
    CheckpointContents,
    LayoutContents,
    Part,
    all_parts,
    checkpoint_metadata,
    expected_params,
    grid,
    relation_types,
    side_part,
)

Draw = st.DrawFn

# Characters some platform forbids in file names, path separators, and "." (a type name with
# a dot cannot name a global embedding: the original's parameter names split on dots).
_UNSAFE = '<>:"|?*/\\.'
MAX_EDGES = 8
MAX_COUNT = 6
MAX_DIM = 8

# --------------------------------------------------------------------------- names


def _fold(name: str) -> str:
    """Names equal under this are one file name on case-insensitive or normalizing systems."""
    return unicodedata.normalize("NFC", name).casefold()


def entity_type_names(max_size: int = 12) -> st.SearchStrategy[str]:
    """Entity type names usable in file names everywhere: plain identifiers and odd but portable
    unicode (neither rule ``entity-type-name-unsafe`` nor ``entity-type-name-unportable``)."""
    plain = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
    odd = st.text(
        st.characters(categories=("L", "M", "N", "Pc", "Pd", "Ps", "Pe", "Po", "S", "Zs"),
                      exclude_characters=_UNSAFE),
        min_size=1, max_size=max_size,
    )
    return st.one_of(plain, odd).filter(
        lambda s: entity_type_name_problem(s) is None and entity_type_name_portability(s) is None)


def relation_names() -> st.SearchStrategy[str]:
    """Relation names: any non-empty text (they only live in JSON)."""
    return st.text(min_size=1, max_size=10)


def _finite(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _positive(hi: float = 10.0) -> st.SearchStrategy[float]:
    return st.floats(0.0, hi, exclude_min=True, allow_nan=False, allow_infinity=False)


# --------------------------------------------------------------------------- config


@st.composite
def configs(
    draw: Draw,
    *,
    dynamic: bool | None = None,
    featurized: bool | None = None,
    max_types: int = 3,
    max_relations: int = 3,
    max_partitions: int = 3,
    max_edge_paths: int = 2,
) -> ConfigSchema:
    """Valid run configs with relative paths ``entities``, ``edges[_i]`` and ``checkpoint``."""
    types = draw(st.lists(entity_type_names(), min_size=1, max_size=max_types, unique_by=_fold))
    partitions = draw(st.integers(1, max_partitions))
    dimension = draw(st.integers(1, MAX_DIM))
    ents: dict[str, dict[str, Any]] = {}
    for etype in types:
        entity: dict[str, Any] = {"num_partitions": draw(st.sampled_from([1, partitions]))}
        if featurized is None and draw(st.booleans()):
            entity["featurized"] = True
        elif featurized:
            entity["featurized"] = draw(st.booleans())
        dim = draw(st.none() | st.integers(1, MAX_DIM))
        if dim is not None:
            entity["dimension"] = dim
        ents[etype] = entity
    if featurized and not any(e.get("featurized") for e in ents.values()):
        ents[types[0]]["featurized"] = True
    is_dynamic = draw(st.booleans()) if dynamic is None else dynamic
    rels: list[dict[str, Any]] = []
    for _ in range(1 if is_dynamic else draw(st.integers(1, max_relations))):
        lhs, rhs = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        rel: dict[str, Any] = {
            "name": draw(relation_names()),
            "lhs": lhs,
            "rhs": rhs,
            "operator": draw(st.sampled_from(sorted(OPERATORS))),
            "weight": draw(_positive(5.0)),
        }
        if not (ents[lhs].get("featurized") or ents[rhs].get("featurized")):
            rel["all_negs"] = draw(st.booleans())
        rels.append(rel)
    # A relation joins types of one dimension (even for complex_diagonal): the types a chain of
    # relations connects share the largest dimension among them.
    group = {t: {t} for t in types}
    for rel in rels:
        merged = group[rel["lhs"]] | group[rel["rhs"]]
        for etype in merged:
            group[etype] = merged
    for members in {id(g): g for g in group.values()}.values():
        dim = max(ents[t].get("dimension") or dimension for t in members)
        if any(r["operator"] == "complex_diagonal" and r["lhs"] in members for r in rels) and dim % 2:
            dim += 1
        for etype in members:
            if (ents[etype].get("dimension") or dimension) != dim:
                ents[etype]["dimension"] = dim
    loss = draw(st.sampled_from(LOSSES))
    comparators = [c for c in COMPARATORS if not (loss == "logistic" and c == "cos")]
    any_featurized = any(e.get("featurized") for e in ents.values())
    # featurized types: same-batch negatives only (docs/guides/featurized.md)
    batch_negs = draw(st.sampled_from([1, 2, 5, 50] if any_featurized else [0, 1, 2, 5, 50]))
    batch_size = (batch_negs * draw(st.integers(1, 40)) if batch_negs
                  else draw(st.integers(1, 5000)))
    disabled = draw(st.sampled_from([(False, False), (True, False), (False, True)]))
    partitioned = any(e["num_partitions"] > 1 for e in ents.values())
    num_paths = draw(st.integers(1, max_edge_paths))
    eval_fraction = draw(_finite(0.0, 1.0))
    data: dict[str, Any] = {
        "entities": ents,
        "relations": rels,
        "dimension": dimension,
        "init_scale": draw(_positive(1.0)),
        "max_norm": draw(st.none() | _positive(100.0)),
        "global_emb": False if is_dynamic else draw(st.booleans()),
        "comparator": draw(st.sampled_from(comparators)),
        "bias": draw(st.booleans()),
        "loss_fn": loss,
        "margin": draw(_finite(-1.0, 1.0)),
        "regularization_coef": draw(_finite(0.0, 1.0)),
        "entity_path": "entities",
        "edge_paths": ["edges"] + [f"edges_{i}" for i in range(1, num_paths)],
        "checkpoint_path": "checkpoint",
        "checkpoint_preservation_interval": draw(st.none() | st.integers(1, 5)),
        "num_epochs": draw(st.integers(0, 5)),
        "num_edge_chunks": draw(st.none() | st.integers(1, 4)),
        "bucket_order": draw(st.sampled_from(BUCKET_ORDERS)),
        "workers": draw(st.none() | st.integers(1, 8)),
        "batch_size": batch_size,
        "num_batch_negs": batch_negs,
        "num_uniform_negs": 0 if any_featurized else draw(st.integers(0 if batch_negs else 1, 100)),
        "disable_lhs_negs": disabled[0],
        "disable_rhs_negs": disabled[1],
        "lr": draw(_finite(0.0, 1.0)),
        "relation_lr": draw(st.none() | _finite(0.0, 1.0)),
        "eval_fraction": eval_fraction,
        "eval_num_batch_negs": draw(st.integers(1, 2000)),  # the original fails on 0 or null
        "eval_num_uniform_negs": 0 if any_featurized else draw(st.none() | st.integers(0, 2000)),
        "dynamic_relations": is_dynamic,
        "num_machines": draw(st.integers(1, 4)) if partitioned else 1,
        "verbose": draw(st.integers(0, 3)),
    }
    cfg = parse_config(data)
    assert not semantic_issues(cfg), semantic_issues(cfg)
    return cfg


# --------------------------------------------------------------------------- entities


@st.composite
def entity_counts(draw: Draw, config: ConfigSchema, max_count: int = MAX_COUNT) -> dict[Part, int]:
    """A count per (type, part) of the config (features for featurized types)."""
    return {part: draw(st.integers(0, max_count)) for part in all_parts(config)}


def entity_name_lists(count: int) -> st.SearchStrategy[list[str]]:
    """``count`` distinct entity names."""
    return st.lists(st.text(max_size=8), min_size=count, max_size=count, unique=True)


@st.composite
def entity_names(draw: Draw, config: ConfigSchema, counts: dict[Part, int]) -> dict[Part, list[str]]:
    """Names files for some plain (type, part)s; a name belongs to one partition of its type."""
    names: dict[Part, list[str]] = {}
    for etype, entity in config.entities.items():
        parts = [p for p in range(entity.num_partitions) if not entity.featurized and draw(st.booleans())]
        drawn = draw(entity_name_lists(sum(counts[(etype, p)] for p in parts)))
        for p in parts:
            names[(etype, p)], drawn = drawn[:counts[(etype, p)]], drawn[counts[(etype, p)]:]
    return names


# --------------------------------------------------------------------------- edges


def fitting_relations(config: ConfigSchema, counts: dict[Part, int], num_relations: int,
                      key: BucketKey) -> list[int]:
    """Relation ids that may have edges in bucket ``key`` (plain sides need entities)."""
    out = []
    for rel_id in range(num_relations):
        ok = True
        for s, etype in enumerate(relation_types(config, rel_id)):
            part = side_part(config, etype, key[s])
            if part is None or (not config.entities[etype].featurized and counts[(etype, part)] == 0):
                ok = False
        if ok:
            out.append(rel_id)
    return out


def _ints(n: int, lo: int, hi: int) -> st.SearchStrategy[np.ndarray[Any, np.dtype[np.int64]]]:
    return hnp.arrays(np.int64, n, elements=st.integers(lo, hi))


def weights(n: int) -> st.SearchStrategy[np.ndarray[Any, np.dtype[np.float32]]]:
    """Finite non-negative float32 edge weights."""
    return hnp.arrays(np.float32, n, elements=st.floats(0.0, 1e6, width=32))


@st.composite
def edge_buckets(
    draw: Draw,
    config: ConfigSchema,
    counts: dict[Part, int],
    key: BucketKey,
    *,
    num_relations: int | None = None,
    max_edges: int = MAX_EDGES,
) -> EdgeBucket:
    """A valid bucket ``key`` for ``config`` and ``counts`` (possibly empty).

    Plain sides index entities of the bucket's partition; featurized sides get bags of
    feature ids below the partition's feature count and a poisoned (ignored) index; plain
    rows in a featurized side get empty bags. A side without featurized edges in this bucket
    may still carry (empty) feature datasets when some relation has a featurized type on that
    side (otherwise they would be ``edge-features-unused``).
    """
    if num_relations is None:
        num_relations = len(config.relations)
    fitting = fitting_relations(config, counts, num_relations, key)
    n = draw(st.integers(0, max_edges)) if fitting else 0
    rel = draw(hnp.arrays(np.int64, n, elements=st.sampled_from(fitting or [0])))
    index: dict[int, np.ndarray[Any, np.dtype[np.int64]]] = {}
    feats: dict[int, FeatureLists | None] = {}
    for s in (0, 1):
        types = [relation_types(config, int(r))[s] for r in rel]
        limit = np.zeros(n, dtype=np.int64)
        featurized = np.zeros(n, dtype=bool)
        for i, etype in enumerate(types):
            part = side_part(config, etype, key[s])
            assert part is not None
            limit[i] = counts[(etype, part)]
            featurized[i] = config.entities[etype].featurized
        raw = draw(_ints(n, 0, 2**40))
        poison = draw(st.sampled_from([-1, 0, 2**40]))
        index[s] = np.where(featurized, poison, raw % np.maximum(limit, 1))
        side_has_featurized = any(config.entities[getattr(r, ("lhs", "rhs")[s])].featurized
                                  for r in config.relations)
        if bool(featurized.any()) or (side_has_featurized and draw(st.booleans())):
            lengths = draw(_ints(n, 0, 3))
            lengths[~featurized | (limit == 0)] = 0
            row_limit = np.repeat(limit, lengths)
            ids = draw(_ints(int(lengths.sum()), 0, 2**40)) % np.maximum(row_limit, 1)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            feats[s] = FeatureLists(offsets, ids.astype(np.int64))
        else:
            feats[s] = None
    return EdgeBucket(
        rel=rel,
        lhs=index[0],
        rhs=index[1],
        weight=draw(st.none() | weights(n)),
        lhs_features=feats[0],
        rhs_features=feats[1],
    )


@st.composite
def feature_lists(draw: Draw, n: int, max_bag: int = 4) -> FeatureLists:
    """``n`` bags of arbitrary int64 feature ids."""
    lengths = draw(_ints(n, 0, max_bag))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = draw(hnp.arrays(np.int64, int(offsets[-1])))
    return FeatureLists(offsets, data)


@st.composite
def raw_edge_buckets(draw: Draw, max_edges: int = 30) -> EdgeBucket:
    """Buckets of arbitrary int64 values (no config): for read/write round trips."""
    n = draw(st.integers(0, max_edges))
    return EdgeBucket(
        rel=draw(hnp.arrays(np.int64, n)),
        lhs=draw(hnp.arrays(np.int64, n)),
        rhs=draw(hnp.arrays(np.int64, n)),
        weight=draw(st.none() | hnp.arrays(np.float32, n, elements=st.floats(
            width=32, allow_nan=False))),
        lhs_features=draw(st.none() | feature_lists(n)),
        rhs_features=draw(st.none() | feature_lists(n)),
    )


# --------------------------------------------------------------------------- checkpoint


def float32_arrays(shape: tuple[int, ...], *, finite: bool = True
                   ) -> st.SearchStrategy[np.ndarray[Any, np.dtype[np.float32]]]:
    return hnp.arrays(np.float32, shape, elements=st.floats(
        width=32, allow_nan=not finite, allow_infinity=not finite))


def optimizer_blobs() -> st.SearchStrategy[bytes | None]:
    """Absent, or opaque bytes that start like a torch.save payload (zip or legacy pickle): what
    readers and writers must carry through unchanged, whatever it holds."""
    magic = st.sampled_from([TORCH_ZIP_MAGIC, TORCH_LEGACY_MAGIC])
    return st.none() | st.builds(lambda m, b: m + b, magic, st.binary(max_size=40))


def _accumulators(shape: tuple[int, ...]) -> st.SearchStrategy[NDArray[np.float32]]:
    return hnp.arrays(np.float32, shape, elements=st.floats(0, 1e6, width=32))


@st.composite
def row_adagrad_blobs(draw: Draw, count: int) -> bytes | None:
    """Absent, or a valid RowAdagrad state of ``count`` rows (pbgio.spec.optimizer)."""
    if draw(st.booleans()):
        return None
    return encode_row_adagrad(draw(_accumulators((count,))), lr=draw(st.floats(0, 1)))


@st.composite
def adagrad_blobs(draw: Draw, shapes: list[tuple[int, ...]]) -> bytes | None:
    """Absent, or a valid Adagrad state of parameters of these shapes, in this order."""
    if draw(st.booleans()):
        return None
    sums = [draw(_accumulators(shape)) for shape in shapes]
    return encode_adagrad(sums, lr=draw(st.floats(0, 1)), steps=draw(st.integers(0, 1000)))


@st.composite
def embeddings_states(draw: Draw, count: int, dimension: int, *, finite: bool = True
                      ) -> EmbeddingsState:
    return EmbeddingsState(draw(float32_arrays((count, dimension), finite=finite)),
                           draw(row_adagrad_blobs(count)))


@st.composite
def model_states(draw: Draw, config: ConfigSchema, num_dynamic_rels: int | None = None, *,
                 finite: bool = True) -> ModelState:
    """Exactly the parameters ``config`` implies, with their shapes, and a valid optimizer state."""
    shapes = expected_params(config, num_dynamic_rels)
    params = {name: draw(float32_arrays(shape, finite=finite)) for name, shape in shapes.items()}
    return ModelState(params, draw(adagrad_blobs(list(shapes.values()))))


@st.composite
def model_param_names(draw: Draw) -> str:
    """Any public model parameter name (not tied to a config)."""
    if draw(st.booleans()):
        return global_embedding_name(draw(entity_type_names()))
    param = draw(st.text(st.characters(exclude_characters="./", exclude_categories=["C"]),
                         min_size=1, max_size=12))
    return operator_param_name(draw(st.integers(0, 99)), draw(st.sampled_from(["lhs", "rhs"])),
                               param)


@st.composite
def any_model_states(draw: Draw, *, finite: bool = False) -> ModelState:
    """Models with arbitrary valid names, shapes (scalars, empty axes) and values."""
    names = draw(st.lists(model_param_names(), max_size=5, unique=True))
    params = {name: draw(float32_arrays(draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                               max_side=4)), finite=finite))
              for name in names}
    return ModelState(params, draw(optimizer_blobs() | st.binary(max_size=20)))


def _attr_chars() -> st.SearchStrategy[str]:
    """Characters of HDF5 string attributes: UTF-8 encodable, no NUL (HDF5 refuses it)."""
    return st.characters(codec="utf-8", exclude_characters="\x00")


@st.composite
def iteration_infos(draw: Draw) -> IterationInfo:
    small = st.integers(-(2**63), 2**63 - 1)
    return IterationInfo(
        num_epochs=draw(small), epoch_idx=draw(small), num_edge_paths=draw(small),
        edge_path_idx=draw(small),
        edge_path=draw(st.text(_attr_chars(), max_size=20)),
        num_edge_chunks=draw(small), edge_chunk_idx=draw(small),
    )


@st.composite
def file_metadata(draw: Draw) -> FileMetadata:
    """Root attributes of a checkpoint file: config JSON text and iteration, each optional."""
    return FileMetadata(
        config_json=draw(st.none() | st.text(_attr_chars(), max_size=40)),
        iteration=draw(st.none() | iteration_infos()),
    )


def stats_objects() -> st.SearchStrategy[dict[str, Any]]:
    """``{count, metrics}`` objects, as the original's Stats.from_dict accepts them."""
    metrics = st.dictionaries(st.text(max_size=8), st.integers(-1000, 1000) | _finite(-1e6, 1e6), max_size=4)
    return st.fixed_dictionaries({"count": st.integers(0, 10**6), "metrics": metrics})


@st.composite
def stats_records(draw: Draw) -> list[dict[str, Any]]:
    """Valid training_stats.json lines: an index, some stats objects, and any sibling keys."""
    scalar = st.none() | st.booleans() | st.integers(-1000, 1000) | _finite(-1e6, 1e6) | st.text(max_size=5)

    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)

    siblings = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in (*STATS_KEYS, "index")),
                               st.recursive(scalar, nest, max_leaves=6), max_size=3)
    lines = []
    for _ in range(draw(st.integers(0, 3))):
        line = {**draw(siblings), "index": draw(st.integers(0, 10**6))}
        for key in draw(st.lists(st.sampled_from(STATS_KEYS), unique=True, max_size=3)):
            line[key] = draw(stats_objects())
        lines.append(line)
    return lines


@st.composite
def checkpoints(draw: Draw, config: ConfigSchema, counts: dict[Part, int],
                num_dynamic_rels: int | None = None) -> CheckpointContents:
    """A committed checkpoint version for ``config``: finite embeddings and model."""
    version = draw(st.integers(1, 50))
    embeddings = {
        (etype, part): draw(embeddings_states(counts[(etype, part)], config.entity_dimension(etype)))
        for etype, part in all_parts(config)
    }
    return CheckpointContents(
        version=version,
        embeddings=embeddings,
        model=draw(model_states(config, num_dynamic_rels)),
        metadata=checkpoint_metadata(config, version),
        snapshot_epoch=draw(st.none() | st.integers(1, 5)),
        stats=draw(stats_records()),
    )


# --------------------------------------------------------------------------- layouts


@st.composite
def layouts(draw: Draw, *, dynamic: bool | None = None, featurized: bool | None = None,
            checkpoint: bool | None = None, max_edges: int = MAX_EDGES) -> LayoutContents:
    """Complete valid layouts; ``write_layout`` + ``validate_path`` report no issue at all."""
    cfg = draw(configs(dynamic=dynamic, featurized=featurized))
    counts = draw(entity_counts(cfg))
    layout = LayoutContents(cfg, counts, names=draw(entity_names(cfg, counts)))
    if cfg.dynamic_relations:
        layout.dynamic_rel_count = draw(st.integers(1, 4))
        if draw(st.booleans()):
            layout.relation_names = draw(st.lists(relation_names(), min_size=layout.dynamic_rel_count,
                                                  max_size=layout.dynamic_rel_count))
    elif draw(st.booleans()):
        layout.relation_names = [r.name for r in cfg.relations]
    for edge_path in cfg.edge_paths:
        layout.buckets[edge_path] = {
            key: draw(edge_buckets(cfg, counts, key, num_relations=layout.num_relations,
                                   max_edges=max_edges))
            for key in grid(cfg)
        }
    has_checkpoint = draw(st.integers(0, 2)) > 0 if checkpoint is None else checkpoint
    if has_checkpoint:
        layout.checkpoint = draw(checkpoints(cfg, counts, layout.dynamic_rel_count))
    return layout
