"""The model core: operators, comparators, losses, N3, negatives, tables and the step functions.

Entry points: :func:`train_step` (one optimisation step on a batch), :func:`eval_step` (scores
against evaluation negatives) and :func:`score_candidates` (scores against all entities or given
candidates, for ranking metrics). A run's step is a :class:`StepRunner` made once from a
:class:`StepChoice` (:func:`make_runner`): the score-matrix head or the softmax as attention
(:class:`AttentionHead`), eager or replayed as a CUDA graph.
"""

from pbgtrain.model.allocator import keep_freed_memory, release_freed_memory
from pbgtrain.model.attention import AttentionHead, ExplicitAttention, FusedAttention
from pbgtrain.model.comparators import Comparator, make_comparator
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.gradients import TrainingStep, training_gradients
from pbgtrain.model.inputs import BucketEdges, EdgeBatch, FeatureBags
from pbgtrain.model.lookup import GatheredRows, gather_rows
from pbgtrain.model.losses import LossFunction, make_loss
from pbgtrain.model.model import (
    EmbeddingModel,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    make_relation_optimizer,
)
from pbgtrain.model.negative_sampling import MASKED_SCORE, BatchNegatives, NegativeMode, batch_negatives
from pbgtrain.model.negative_scores import Head, HeadGradients, ScoreMatrixHead
from pbgtrain.model.operators import DynamicOperator, Operator, make_dynamic_operator, make_operator
from pbgtrain.model.regularizers import N3Regularizer
from pbgtrain.model.relation_adagrad import ParameterOptimizer, RelationAdagrad
from pbgtrain.model.runner import StepRunner, make_runner
from pbgtrain.model.scoring import (
    ForwardResult,
    Scores,
    SideScores,
    candidate_space_query,
    forward_batch,
    score_candidates,
)
from pbgtrain.model.step import (
    EvalResult,
    StepStats,
    StepTotals,
    add_train_step,
    batch_loss,
    eval_step,
    step_body,
    train_step,
)
from pbgtrain.model.step_choice import StepChoice
from pbgtrain.model.tables import EntityTable, row_adagrad_

__all__ = [
    "MASKED_SCORE",
    "AttentionHead",
    "BatchNegatives",
    "BucketEdges",
    "Comparator",
    "CounterGenerator",
    "DynamicOperator",
    "EdgeBatch",
    "EmbeddingModel",
    "EntityTable",
    "EvalResult",
    "ExplicitAttention",
    "FeatureBags",
    "ForwardResult",
    "FusedAttention",
    "GatheredRows",
    "Head",
    "HeadGradients",
    "LossFunction",
    "ModelSpec",
    "N3Regularizer",
    "NegativeMode",
    "NegativeSampling",
    "Operator",
    "ParameterOptimizer",
    "RelationAdagrad",
    "RelationSpec",
    "ScoreMatrixHead",
    "Scores",
    "SideScores",
    "StepChoice",
    "StepRunner",
    "StepStats",
    "StepTotals",
    "TrainingStep",
    "add_train_step",
    "batch_loss",
    "batch_negatives",
    "candidate_space_query",
    "eval_step",
    "forward_batch",
    "gather_rows",
    "keep_freed_memory",
    "make_comparator",
    "make_dynamic_operator",
    "make_loss",
    "make_operator",
    "make_relation_optimizer",
    "make_runner",
    "release_freed_memory",
    "row_adagrad_",
    "score_candidates",
    "step_body",
    "train_step",
    "training_gradients",
]
