"""Checkpoint directory: files, root attributes, model parameters, optimizer blobs.

Model parameters have a public HDF5 name and a private state-dict key; the two
map both ways:

>>> public_to_private("relations/0/operator/rhs/diagonal")
'rhs_operators.0.diagonal'
>>> private_to_public("global_embs.emb_user")
'entities/user/global_embedding'
>>> param_shapes("complex_diagonal", dimension=4, num_dynamic_rels=None)
{'real': (2,), 'imag': (2,)}
>>> param_shapes("affine", dimension=3, num_dynamic_rels=5)
{'linear_transformations': (5, 3, 3), 'translations': (5, 3)}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pbgio.spec.config import CONFIG_JSON_INDENT as CONFIG_JSON_INDENT  # declared with the config, named here too
from pbgio.spec.config import ConfigSchema

MODEL_GROUP = "model"
EMBEDDINGS_DATASET = "embeddings"
OPTIMIZER_DATASET = "optimizer/state_dict"
STATE_DICT_KEY_ATTR = "state_dict_key"
CONFIG_JSON_ATTR = "config/json"
GROWN_LAYOUT_HINT = ("the layout has more entities than this checkpoint (after pbgio import --append, warm start "
                     "a new checkpoint_path from it with init_path)")
"""Ends an ``embeddings-shape`` error about a checkpoint table with fewer rows than the entity count."""

# Root attributes describing the iteration that was running when a file was written
# (iteration index N produces version N + 1). Ints are stored as int64.
ITERATION_ATTRS: dict[str, type] = {
    "iteration/num_epochs": int,
    "iteration/epoch_idx": int,
    "iteration/num_edge_paths": int,
    "iteration/edge_path_idx": int,
    "iteration/edge_path": str,
    "iteration/num_edge_chunks": int,
    "iteration/edge_chunk_idx": int,
}

# Magic bytes of a torch.save payload: zip container, or the pre-1.6 pickle container.
TORCH_ZIP_MAGIC = b"PK\x03\x04"
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"

# Keys of the config that define the model; checkpoint files must agree with them.
MODEL_DEFINING_KEYS = (
    "entities",
    "relations",
    "dimension",
    "global_emb",
    "bias",
    "dynamic_relations",
    "comparator",
)

_X = r"[^./]+"
_PUBLIC_OPERATOR = re.compile(rf"^relations/(?P<idx>\d+)/operator/(?P<side>lhs|rhs)/(?P<param>{_X})$")
_PUBLIC_GLOBAL = re.compile(rf"^entities/(?P<type>{_X})/global_embedding$")
_PRIVATE_OPERATOR = re.compile(rf"^(?P<side>lhs|rhs)_operators\.(?P<idx>\d+)\.(?P<param>{_X})$")
_PRIVATE_GLOBAL = re.compile(rf"^global_embs\.emb_(?P<type>{_X})$")


def public_to_private(name: str) -> str | None:
    """State-dict key of a dataset name under ``model/``; None when it maps to nothing."""
    m = _PUBLIC_OPERATOR.match(name)
    if m:
        return f"{m['side']}_operators.{m['idx']}.{m['param']}"
    m = _PUBLIC_GLOBAL.match(name)
    if m:
        return f"global_embs.emb_{m['type']}"
    return None


def private_to_public(key: str) -> str | None:
    m = _PRIVATE_OPERATOR.match(key)
    if m:
        return f"relations/{m['idx']}/operator/{m['side']}/{m['param']}"
    m = _PRIVATE_GLOBAL.match(key)
    if m:
        return f"entities/{m['type']}/global_embedding"
    return None


def operator_param_name(idx: int, side: str, param: str) -> str:
    return f"relations/{idx}/operator/{side}/{param}"


def global_embedding_name(entity_type: str) -> str:
    return f"entities/{entity_type}/global_embedding"


@dataclass(frozen=True)
class OperatorSpec:
    """Parameters of an operator; each shape is a tuple of 'd', 'd/2' (per relation)."""

    name: str
    static_params: dict[str, tuple[str, ...]]
    dynamic_params: dict[str, tuple[str, ...]]


OPERATORS: dict[str, OperatorSpec] = {
    spec.name: spec
    for spec in (
        OperatorSpec("none", {}, {}),
        OperatorSpec("diagonal", {"diagonal": ("d",)}, {"diagonals": ("d",)}),
        OperatorSpec("translation", {"translation": ("d",)}, {"translations": ("d",)}),
        OperatorSpec("linear", {"linear_transformation": ("d", "d")},
                     {"linear_transformations": ("d", "d")}),
        OperatorSpec("affine", {"linear_transformation": ("d", "d"), "translation": ("d",)},
                     {"linear_transformations": ("d", "d"), "translations": ("d",)}),
        OperatorSpec("complex_diagonal", {"real": ("d/2",), "imag": ("d/2",)},
                     {"real": ("d/2",), "imag": ("d/2",)}),
    )
}
COMPARATORS = ("dot", "cos", "l2", "squared_l2")
LOSSES = ("ranking", "logistic", "softmax")
REGULARIZERS = ("N3",)
BUCKET_ORDERS = ("random", "affinity", "inside_out", "outside_in")


def param_shapes(operator: str, *, dimension: int, num_dynamic_rels: int | None) -> dict[str, tuple[int, ...]]:
    """Shapes of an operator's parameters; dynamic operators get a leading relation axis."""
    spec = OPERATORS[operator]
    size = {"d": dimension, "d/2": dimension // 2}
    params = spec.static_params if num_dynamic_rels is None else spec.dynamic_params
    lead = () if num_dynamic_rels is None else (num_dynamic_rels,)
    return {name: lead + tuple(size[s] for s in shape) for name, shape in params.items()}


def expected_model_params(config: ConfigSchema, num_dynamic_rels: int | None) -> dict[str, tuple[int, ...] | None]:
    """Public names and shapes of every model parameter a config implies.

    In dynamic mode the shapes need ``num_dynamic_rels``; when it is unknown they are None.
    """
    params: dict[str, tuple[int, ...] | None] = {}
    if config.dynamic_relations:
        rel = config.relations[0]
        for side in ("lhs", "rhs"):
            dim = config.entity_dimension(getattr(rel, side))
            shapes = param_shapes(rel.operator, dimension=dim, num_dynamic_rels=num_dynamic_rels or 0)
            for pname, shape in shapes.items():
                params[operator_param_name(0, side, pname)] = shape if num_dynamic_rels is not None else None
    else:
        for idx, rel in enumerate(config.relations):
            shapes = param_shapes(rel.operator, dimension=config.entity_dimension(rel.rhs), num_dynamic_rels=None)
            for pname, shape in shapes.items():
                params[operator_param_name(idx, "rhs", pname)] = shape
    if config.global_emb:
        for etype in config.entities:
            params[global_embedding_name(etype)] = (config.entity_dimension(etype),)
    return params
