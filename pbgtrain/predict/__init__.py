"""Link prediction by name with a trained checkpoint: the top-k entities for (entity, relation),
the rank of a given triple, and the scores of many triples.

Scores are the model's own (:func:`pbgtrain.model.score_candidates`): the relation's operator
and the config's comparator, global embeddings added and ``max_norm`` applied, exactly as
training and ``pbgtrain eval`` score edges. Static relations score (u, r, v) as c(u, f_r(v)),
whichever side is ranked; dynamic relations rank rhs candidates v' by c(g_r(u), v') and lhs
candidates u' by c(u', h_r(v)), so a triple has two scores: ``score`` (the one that ranks rhs
candidates) and ``lhs_side_score`` (the one that ranks lhs candidates; equal for static ones).

:func:`top_k` ranks every entity of the candidate type, partition by partition and a block of
rows at a time, keeping the best ``k`` across blocks (:func:`pbgio.topk.scan_partitions`, the
scan ``pbgio neighbors`` uses too), each partition streamed a bounded chunk at a time
(``PBG_ROW_CHUNK_BYTES``): memory is a chunk or two, one block of scores and ``k``, never a partition.
Equal scores rank by (partition, row). With filter edge paths, the candidates that form a known
edge with the query (same relation, in any bucket of those edge paths that holds the query's
partition) are left out, as filtered evaluation leaves them out. :func:`rank_triple` ranks a
triple's rhs among all rhs candidates and its lhs among all lhs candidates as
``pbgtrain eval --all-entities`` does (ties count against it, the triple's own slot is left
out, filtering optional), over every partition.

Names: entity names come from the names files (:mod:`pbgio.names`), relation names from the
config (static) or ``dynamic_rel_names.json`` (dynamic). An unknown name raises
:class:`pbgio.errors.UnknownNameError`. Featurized types (bags of features) have no names to
look up nor table to rank: a bag of features given on one side (``lhs_features``,
``rhs_features``) ranks the other side's table (:mod:`~pbgtrain.predict.featurized`).

The library, along its seams: :mod:`~pbgtrain.predict.predictor` (:func:`top_k`, :class:`Predictor`,
:func:`rank_triple`, :func:`score_triples`), :mod:`~pbgtrain.predict.scan` (relations by name, stored
rows, known edges, the exact scan), :mod:`~pbgtrain.predict.results` (what each answers and how it
prints) and :mod:`~pbgtrain.predict.inputs` (``--triples`` and ``--queries`` files). Every answer
comes from a checkpoint version read as what it is (:meth:`pbgio.layout.Layout.open_checkpoint`).
"""

from pbgtrain.predict.featurized import split_features
from pbgtrain.predict.inputs import Query, Triple, parse_queries, parse_triples, read_queries, read_triples
from pbgtrain.predict.predictor import Predictor, rank_triple, score_triples, top_k
from pbgtrain.predict.results import (
    PredictError,
    Prediction,
    RankedBag,
    Ranking,
    ScoredTriples,
    TripleRank,
    TripleScore,
    format_rankings,
)

__all__ = [
    "PredictError",
    "Prediction",
    "Predictor",
    "Query",
    "RankedBag",
    "Ranking",
    "ScoredTriples",
    "Triple",
    "TripleRank",
    "TripleScore",
    "format_rankings",
    "parse_queries",
    "parse_triples",
    "rank_triple",
    "read_queries",
    "read_triples",
    "score_triples",
    "split_features",
    "top_k",
]
