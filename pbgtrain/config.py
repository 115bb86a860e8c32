"""The run config as the trainer sees it: loading, ``-p key=value`` overrides, support checks.

The schema itself is :class:`pbgio.config.ConfigSchema`, and a config with its ``-p`` overrides
and the folder its paths resolve against is a :class:`pbgio.layout.Layout`. This module adds
what only the trainer needs: the rule that no key is silently ignored. Every key either changes
the trainer's behaviour or, when set to a value this trainer cannot honour (partition servers,
several GPUs), is rejected with a message saying why. The rules of featurized types (same-batch
negatives only) are pbgio config rules, checked when the config is parsed.

>>> from pbgio.example import example_config
>>> layout = load_run_config(example_config(), ["num_epochs=3", "relations.0.operator=complex_diagonal"])
>>> layout.config.num_epochs, layout.config.relations[0].operator
(3, 'complex_diagonal')
>>> unsupported_settings(layout.config.model_copy(update={"num_partition_servers": 2}))  # doctest: +ELLIPSIS
['num_partition_servers=2: pbgtrain runs no partition servers; partitions move through the ...']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pbgio.checks.config import schema_issue
from pbgio.config import ConfigSchema
from pbgio.errors import ConfigError
from pbgio.layout import Layout
from pbgio.storage import AnyPath

# Keys that tune the original's partition servers, which pbgtrain does not run (partitions move
# through the checkpoint directory): any value but the default is refused, saying so.
_PARTITION_SERVER_TUNING: dict[str, Any] = {
    "num_groups_for_partition_server": 16,
    "num_groups_per_sharded_partition_server": 1,
    "partition_shard_size": 250,
}


# Where each key of the schema acts in pbgtrain (the training guide's table is checked against it).
# The tuning of the original's partition servers is refused unless left at its defaults.
KEY_EFFECTS: dict[str, str] = {
    "entities": "entity types; num_partitions splits a type into partitions, dimension overrides the "
                "global one, featurized makes its entities bags of features (mean of feature embeddings; "
                "same-batch negatives only)",
    "relations": "relation types: lhs/rhs types, operator, weight (loss multiplier), all_negs",
    "dimension": "embedding dimension", "init_scale": "std-dev of the initial embeddings",
    "max_norm": "embedding rows are renormalized to this norm when looked up",
    "global_emb": "a learned per-type vector added before the operator",
    "comparator": "dot, cos, l2 or squared_l2", "bias": "coordinate 0 is an additive bias",
    "loss_fn": "ranking, logistic or softmax", "margin": "margin of the ranking loss",
    "regularization_coef": "weight of the N3 regularizer (0 disables it)", "regularizer": "N3 (the only one)",
    "entity_path": "entity counts (and names) are read here", "edge_paths": "edge sets trained in order",
    "checkpoint_path": "versioned checkpoints are written here", "init_path": "warm start: embeddings, "
    "model and optimizer state of this checkpoint-like directory initialize a fresh run (tables shorter than "
    "the entity counts, after pbgio import --append, keep their rows and get fresh ones for the new entities)",
    "checkpoint_preservation_interval": "keep an epoch_{k}/ snapshot every this many epochs",
    "num_epochs": "passes over all edge paths", "num_edge_chunks": "chunks per bucket (one iteration each)",
    "max_edges_per_chunk": "sets num_edge_chunks when it is null",
    "bucket_order": "random, affinity, inside_out or outside_in",
    "workers": "torch threads (default: the machine's cores, split evenly among the trainers of a distributed "
               "run on it)",
    "batch_size": "edges per batch", "num_batch_negs": "same-batch negatives (chunk size)",
    "num_uniform_negs": "uniform negatives from the current partition (0 with a featurized type)",
    "disable_lhs_negs": "no lhs negatives", "disable_rhs_negs": "no rhs negatives",
    "lr": "row-wise Adagrad learning rate of embeddings", "relation_lr": "Adagrad learning rate of relation "
    "parameters (default: lr)", "eval_fraction": "share of each bucket chunk held out and evaluated",
    "eval_num_batch_negs": "batch negatives when evaluating", "eval_num_uniform_negs": "uniform negatives "
    "when evaluating", "background_io": "deprecated: a warning, no effect (as in the original)",
    "verbose": "> 0 prints a line per bucket", "dynamic_relations": "one operator set indexed by relation id; "
    "mixed-relation batches", "num_gpus": "1 trains on CUDA (same as --device cuda); more is refused",
    "hogwild_delay": "seconds each bucket of the first epoch waits on trainers of rank > 0 of a distributed "
                     "run (as in the original; no effect in a single-process run)",
    "half_precision": "true trains on a GPU with bf16 matrix products (float32 embeddings and optimizer "
                      "state), the same as --precision bf16; ignored on a CPU, as in the original",
    "num_machines": "trainers of a distributed run (pbgtrain fit --rank R on each; under torchrun, 1 or "
                    "torchrun's world size)",
    "distributed_init_method": "where the trainers of a --rank run meet: tcp://HOST:PORT of rank 0, or "
                               "file:///shared/path (torchrun brings its own)",
    "distributed_tree_init_order": "first pass of a distributed run: a bucket needs a side already trained, "
                                   "so that partitions start in one embedding space",
    "num_partition_servers": "-1 or 0: partitions move through the shared checkpoint directory; a positive "
                             "count (external partition servers) is refused",
    **{key: "refused unless left at its default (it tunes the original's partition servers)"
       for key in _PARTITION_SERVER_TUNING},
}


def load_run_config(path: str | AnyPath | ConfigSchema, overrides: Sequence[str] = (),
                    base: AnyPath | None = None) -> Layout:
    """The layout of a run config (:meth:`pbgio.layout.Layout.load`: a JSON file, the original's
    Python config, or a config in memory; ``overrides`` applied; relative paths against ``base``,
    by default the config file's folder, the current directory for a ``.py`` config), checked
    for settings this trainer cannot honour (:func:`unsupported_settings`).
    """
    layout = Layout.load(path, base=base, overrides=overrides)
    problems = unsupported_settings(layout.config)
    if problems:
        raise ConfigError(layout.source, [schema_issue(layout.source, None, p) for p in problems])
    return layout


def unsupported_settings(cfg: ConfigSchema) -> list[str]:
    """Messages for settings this trainer cannot honour (empty when all are supported)."""
    problems = []
    if cfg.num_partition_servers > 0:  # < -1 is the same as -1, as in the original (pbgio warns)
        problems.append(f"num_partition_servers={cfg.num_partition_servers}: pbgtrain runs no partition servers; "
                        "partitions move through the shared checkpoint directory; use -1 or 0")
    for key, default in _PARTITION_SERVER_TUNING.items():
        value = getattr(cfg, key)
        if value != default:
            problems.append(f"{key}={value}: it tunes the original's partition servers, which pbgtrain does "
                            f"not run (partitions move through the checkpoint directory); use {key}={default}")
    if cfg.num_gpus > 1:
        problems.append(f"num_gpus={cfg.num_gpus}: pbgtrain trains on one device; use num_gpus=1 "
                        "(or --device cuda)")
    return problems


def default_device(cfg: ConfigSchema) -> str:
    """``cuda`` when the config asks for a GPU (``num_gpus=1``), else ``cpu``."""
    return "cuda" if cfg.num_gpus > 0 else "cpu"


_SPLIT_NAMES = frozenset({"test", "testing", "valid", "validation", "val", "dev", "heldout", "held_out", "eval"})


def held_out_named(edge_paths: Sequence[str]) -> list[str]:
    """The edge paths whose last name says they are a held-out split (test, valid, dev …, alone or
    as a word of the name): training on one makes every figure measured on it optimistic.

    >>> held_out_named(["data/train", "data/valid", "s3://b/fb15k/test_edges", "data/contest", "x/dev-2"])
    ['data/valid', 's3://b/fb15k/test_edges', 'x/dev-2']
    """
    def words(path: str) -> set[str]:
        name = path.rstrip("/").rsplit("/", 1)[-1].lower()
        return set(filter(None, (w.strip() for w in name.replace("-", "_").replace(".", "_").split("_")))) | {name}

    return [p for p in edge_paths if words(p) & _SPLIT_NAMES]
