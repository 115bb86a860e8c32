"""The model: relation operators, per-type global embeddings, comparator, loss and regularizer.

Entity embeddings are not parameters of the model; they live in :class:`EntityTable` objects
(one per entity type and partition) that the training loop swaps in and out. The model's
state dict uses the original's private names, which pbgio maps to checkpoint names:
``rhs_operators.{i}.{param}`` (static, one per relation), ``lhs_operators.0.*`` and
``rhs_operators.0.*`` (dynamic), ``global_embs.emb_{type}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from pbgtrain.model.comparators import Comparator, make_comparator
from pbgtrain.model.losses import LossFunction, make_loss
from pbgtrain.model.operators import (
    DynamicOperator,
    Operator,
    draw_parameters,
    make_dynamic_operator,
    make_operator,
)
from pbgtrain.model.regularizers import N3Regularizer
from pbgtrain.model.relation_adagrad import RelationAdagrad

if TYPE_CHECKING:
    from pbgio.config import ConfigSchema


class RelationSides(Protocol):
    """Anything naming a relation's entity types: :class:`RelationSpec`, or the config's relations."""

    @property
    def lhs(self) -> str: ...

    @property
    def rhs(self) -> str: ...


@dataclass(frozen=True)
class RelationSpec:
    """One relation type, as the config describes it."""

    name: str
    lhs: str
    rhs: str
    weight: float = 1.0
    operator: str = "none"
    all_negs: bool = False


@dataclass(frozen=True)
class NegativeSampling:
    """How negatives are drawn.

    ``share_uniform_negs`` (the default, a deliberate difference from the original) samples one
    set of ``num_uniform_negs`` uniform negatives per side per batch and shares it across the
    batch's chunks; False draws a separate set per chunk, as the original does.
    """

    num_batch_negs: int = 50
    num_uniform_negs: int = 50
    disable_lhs_negs: bool = False
    disable_rhs_negs: bool = False
    share_uniform_negs: bool = True


@dataclass(frozen=True)
class ModelSpec:
    """Everything the model needs from the run config.

    ``num_dynamic_rels`` is None for static relations, else the number of dynamic relation ids.
    ``featurized`` names the entity types whose entities are bags of features (docs/guides/featurized.md).
    ``frozen`` names the entity types kept fixed (``pbgtrain fit --freeze``; not a config key):
    their tables are looked up without gradients and never written (``max_norm`` clips the
    looked-up copy), and their global embeddings are not trained either.
    ``relation_prediction`` weighs the auxiliary relation-prediction loss of a training step
    (``pbgtrain fit --relation-prediction``, dynamic relations; 0: off;
    :mod:`pbgtrain.model.relation_prediction`).
    """

    entity_dimensions: dict[str, int]
    relations: tuple[RelationSpec, ...]
    num_dynamic_rels: int | None = None
    comparator: str = "cos"
    bias: bool = False
    loss_fn: str = "ranking"
    margin: float = 0.1
    regularization_coef: float = 0.0
    global_emb: bool = True
    max_norm: float | None = None
    init_scale: float = 1e-3
    lr: float = 0.01
    relation_lr: float = 0.01
    train_negatives: NegativeSampling = field(default_factory=NegativeSampling)
    eval_negatives: NegativeSampling = field(default_factory=lambda: NegativeSampling(1000, 1000))
    featurized: frozenset[str] = frozenset()
    frozen: frozenset[str] = frozenset()
    relation_prediction: float = 0.0

    @property
    def dynamic(self) -> bool:
        return self.num_dynamic_rels is not None

    def featurized_sides(self, relation: RelationSides) -> tuple[bool, bool]:
        """Whether the relation's lhs and rhs types are featurized (their entities come as bags)."""
        return relation.lhs in self.featurized, relation.rhs in self.featurized

    @classmethod
    def from_config(cls, config: ConfigSchema, num_dynamic_rels: int | None = None, *,
                    share_uniform_negs: bool = True, frozen: frozenset[str] = frozenset(),
                    relation_prediction: float = 0.0) -> ModelSpec:
        """The spec of ``config``; ``num_dynamic_rels`` is required with dynamic relations;
        ``frozen`` and ``relation_prediction``: run options (see :class:`ModelSpec`)."""
        if config.dynamic_relations and num_dynamic_rels is None:
            raise ValueError("dynamic_relations needs num_dynamic_rels (dynamic_rel_count.txt)")
        train = NegativeSampling(config.num_batch_negs, config.num_uniform_negs, config.disable_lhs_negs,
                                 config.disable_rhs_negs, share_uniform_negs)
        evaluation = NegativeSampling(
            config.num_batch_negs if config.eval_num_batch_negs is None else config.eval_num_batch_negs,
            config.num_uniform_negs if config.eval_num_uniform_negs is None else config.eval_num_uniform_negs,
            config.disable_lhs_negs, config.disable_rhs_negs, share_uniform_negs)
        return cls(
            entity_dimensions={name: config.entity_dimension(name) for name in config.entities},
            relations=tuple(RelationSpec(r.name, r.lhs, r.rhs, r.weight, r.operator, r.all_negs)
                            for r in config.relations),
            num_dynamic_rels=num_dynamic_rels if config.dynamic_relations else None,
            comparator=config.comparator,
            bias=config.bias,
            loss_fn=config.loss_fn,
            margin=config.margin,
            regularization_coef=config.regularization_coef,
            global_emb=config.global_emb,
            max_norm=config.max_norm,
            init_scale=config.init_scale,
            lr=config.lr,
            relation_lr=config.lr if config.relation_lr is None else config.relation_lr,
            train_negatives=train,
            eval_negatives=evaluation,
            featurized=frozenset(config.featurized_types()),
            frozen=frozenset(frozen),
            relation_prediction=relation_prediction,
        )


def relation_prediction_problem(weight: float, dynamic: bool, operator: str) -> str | None:
    """Why relation prediction at ``weight`` cannot train (None when it can, or is off): it needs
    dynamic relations (every relation between the same entities, each with its own parameters)
    and an operator with parameters (the identity scores every relation alike).

    >>> relation_prediction_problem(0.1, True, "complex_diagonal") is None
    True
    >>> print(relation_prediction_problem(0.1, False, "diagonal"))
    relation prediction needs dynamic_relations (it scores every relation of an edge's pair)
    """
    if weight < 0 or weight != weight:
        return f"expected a weight ≥ 0, found {weight:g}"
    if weight == 0:
        return None
    if not dynamic:
        return "relation prediction needs dynamic_relations (it scores every relation of an edge's pair)"
    if operator == "none":
        return "relation prediction needs an operator with parameters (operator 'none' scores every relation alike)"
    return None


class EmbeddingModel(nn.Module):
    """Operators and global embeddings (the trainable relation parameters) plus the scoring parts."""

    lhs_operators: nn.ModuleList
    rhs_operators: nn.ModuleList
    global_embs: nn.ParameterDict

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self._check(spec)
        self.comparator: Comparator = make_comparator(spec.comparator, spec.bias)
        self.loss_fn: LossFunction = make_loss(spec.loss_fn, spec.margin)
        self.regularizer = N3Regularizer(spec.regularization_coef)
        dims = spec.entity_dimensions
        if spec.num_dynamic_rels is not None:
            rel = spec.relations[0]
            self.lhs_operators = nn.ModuleList(
                [make_dynamic_operator(rel.operator, dims[rel.lhs], spec.num_dynamic_rels)])
            self.rhs_operators = nn.ModuleList(
                [make_dynamic_operator(rel.operator, dims[rel.rhs], spec.num_dynamic_rels)])
        else:
            self.lhs_operators = nn.ModuleList()
            self.rhs_operators = nn.ModuleList([make_operator(r.operator, dims[r.rhs]) for r in spec.relations])
        # One by one, in the config's order of entity types: a plain dict given to ParameterDict is
        # sorted, and the original's parameter order (which positions its optimizer state) is not.
        self.global_embs = nn.ParameterDict()
        for name, dim in dims.items() if spec.global_emb else ():
            # A frozen type's global embedding is frozen too (no gradient; its Adagrad state, kept
            # in the optimizer in its place, never changes).
            self.global_embs[f"emb_{name}"] = nn.Parameter(torch.zeros(dim), requires_grad=name not in spec.frozen)

    @classmethod
    def from_config(cls, config: ConfigSchema, num_dynamic_rels: int | None = None, *,
                    share_uniform_negs: bool = True, frozen: frozenset[str] = frozenset(),
                    relation_prediction: float = 0.0) -> EmbeddingModel:
        return cls(ModelSpec.from_config(config, num_dynamic_rels, share_uniform_negs=share_uniform_negs,
                                         frozen=frozen, relation_prediction=relation_prediction))

    @staticmethod
    def _check(spec: ModelSpec) -> None:
        if not spec.relations:
            raise ValueError("expected at least one relation")
        if spec.dynamic and len(spec.relations) != 1:
            raise ValueError(f"dynamic relations need exactly one relation, found {len(spec.relations)}")
        if spec.dynamic and spec.global_emb:
            raise ValueError("global embeddings cannot be used with dynamic relations")
        problem = relation_prediction_problem(spec.relation_prediction, spec.dynamic, spec.relations[0].operator)
        if problem is not None:
            raise ValueError(f"relation_prediction={spec.relation_prediction:g}: {problem}")
        if spec.train_negatives.disable_lhs_negs and spec.train_negatives.disable_rhs_negs:
            raise ValueError("negatives cannot be disabled on both sides")
        unknown = sorted(spec.featurized - set(spec.entity_dimensions))
        if unknown:
            raise ValueError(f"featurized types {unknown} are not entity types")
        unknown = sorted(spec.frozen - set(spec.entity_dimensions))
        if unknown:
            raise ValueError(f"frozen types {unknown} are not entity types; the entity types are "
                             f"{sorted(spec.entity_dimensions)}")
        negatives = spec.train_negatives
        for rel in spec.relations:
            for side, etype in (("lhs", rel.lhs), ("rhs", rel.rhs)):
                if etype not in spec.entity_dimensions:
                    raise ValueError(f"relation {rel.name!r} uses unknown entity type {etype!r}")
                if etype not in spec.featurized or getattr(negatives, f"disable_{side}_negs"):
                    continue
                # A featurized side takes same-batch negatives only (its uniform ones are skipped).
                if rel.all_negs:
                    raise ValueError(f"relation {rel.name!r} has all_negs, but {etype!r} is featurized "
                                     "(featurized types take same-batch negatives only)")
                if negatives.num_batch_negs == 0:
                    raise ValueError(f"entity type {etype!r} is featurized: it takes same-batch negatives only, "
                                     "so num_batch_negs must be > 0 (found 0)")
            dl, dr = spec.entity_dimensions[rel.lhs], spec.entity_dimensions[rel.rhs]
            if dl != dr:
                raise ValueError(f"relation {rel.name!r} compares {rel.lhs!r} (dimension {dl}) with "
                                 f"{rel.rhs!r} (dimension {dr}); the comparator needs equal dimensions")

    # --- lookups used by scoring ---------------------------------------------------------------
    @property
    def dynamic(self) -> bool:
        return self.spec.dynamic

    def relation(self, rel: int | torch.Tensor) -> RelationSpec:
        """The relation of a batch: ``spec.relations[rel]`` (static) or the only one (dynamic)."""
        if self.dynamic:
            if not isinstance(rel, torch.Tensor):
                raise TypeError("dynamic relations need rel as a LongTensor of relation ids")
            return self.spec.relations[0]
        if isinstance(rel, torch.Tensor):
            raise TypeError("static relations need rel as an int (one relation per batch)")
        return self.spec.relations[rel]

    def static_operator(self, rel: int) -> Operator:
        op = self.rhs_operators[rel]
        assert isinstance(op, Operator)
        return op

    def draw_operators(self, scale: float, seed: int) -> None:
        """Every operator's parameters drawn from ``scale · N(0, 1)`` (lhs operators, then rhs, in
        order), seeded by ``seed``; see :func:`pbgtrain.model.operators.draw_parameters`."""
        generator = torch.Generator().manual_seed(seed)
        for op in (*self.lhs_operators, *self.rhs_operators):
            draw_parameters(op, scale, generator)

    def dynamic_operators(self) -> tuple[DynamicOperator, DynamicOperator]:
        """(lhs operator g, rhs operator h)."""
        lhs, rhs = self.lhs_operators[0], self.rhs_operators[0]
        assert isinstance(lhs, DynamicOperator) and isinstance(rhs, DynamicOperator)
        return lhs, rhs

    def global_emb(self, entity_type: str) -> torch.Tensor | None:
        key = f"emb_{entity_type}"
        emb: torch.Tensor | None = self.global_embs.get(key)
        return emb

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters that train (all but the global embeddings of frozen types)."""
        return [p for p in self.parameters() if p.requires_grad]


def make_relation_optimizer(model: EmbeddingModel) -> RelationAdagrad | None:
    """Adagrad over the relation parameters at ``relation_lr`` (:class:`RelationAdagrad`); None
    when there are none.

    Every parameter is in it, frozen ones included (they get no gradient, so their state never
    changes): its state lists the parameters in the original's order, whatever is frozen.
    """
    params = list(model.parameters())
    if not params:
        return None
    return RelationAdagrad(params, lr=model.spec.relation_lr, eps=1e-10)
