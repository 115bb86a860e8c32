"""Link prediction for featurized entity types: the top-k entities of a table side for a bag of
features of the other side (``pbgtrain predict --lhs-features`` / ``--rhs-features``, and the
featurized fields of ``--queries``).

A featurized entity is a bag of features with no name and no row of its own (its embedding is the
mean of its features' rows, docs/guides/featurized.md). A bag given on one side of a relation is
scored against every entity of the other side, which must be plain, with the model's own scoring
(:func:`pbgtrain.model.score_candidates` given the bag): the features' rows are read alone (never
the whole dictionary's), ``max_norm`` clips each of them, their mean gets the type's global
embedding and goes through the relation's operator as in training. Features are names of the
featurized type's dictionary (``entity_names_{type}_0.json``; a featurized type with several
partitions has one dictionary per partition, and is refused). A feature given twice counts twice,
as in training. Unknown features are an error naming them (and the closest known ones), or, with
``unknown="ignore"``, are dropped and listed in the answer (:class:`RankedBag`); a bag left
without features is an error either way.

With filter edge paths, the candidates forming a known edge with the bag are left out, a known
edge's bag being the same entity when it holds the same features, each as many times, in any order
(:func:`pbgtrain.featurized_ranking.bag_keys`, the rule of ``pbgtrain eval --filter``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch

from pbgio import storage
from pbgio.candidates import AdmittedRows
from pbgio.edges import EdgeBucket, FeatureLists
from pbgio.entities import iter_entity_names
from pbgio.errors import UnknownNameError
from pbgio.names import Position, locate_entities, names_of
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.choices import UnknownFeatures
from pbgtrain.featurized_ranking import bag_keys
from pbgtrain.model import FeatureBags
from pbgtrain.predict.results import PredictError, Prediction, RankedBag, Ranking, Side
from pbgtrain.predict.scan import Relation, known_candidates, rows, scan

Unknown = Literal["error", "ignore"]
"""What to do with unknown features: the values of :class:`pbgtrain.choices.UnknownFeatures`."""


def split_features(text: str, separator: str = "") -> list[str]:
    """The features of a bag written as text: split on ``separator``, or on runs of whitespace
    when it is empty (as ``pbgio embed`` splits its lines); empty pieces dropped.

    >>> split_features(" w1  w2\\tw1 "), split_features("new york|ny", "|")
    (['w1', 'w2', 'w1'], ['new york', 'ny'])
    """
    return [f for f in (text.split(separator) if separator else text.split()) if f]


class BagRanker:
    """Top-k queries whose fixed side is a bag of features, from one loaded checkpoint version
    (a :class:`~pbgtrain.predict.Predictor`'s): each featurized type's dictionary is read once,
    at its first bag."""

    def __init__(self, reader: CheckpointReader) -> None:
        self.reader = reader
        self._rows: dict[str, dict[str, int]] = {}  # featurized type -> feature name -> row

    def is_featurized(self, rel: str, side: Side) -> bool:
        """Whether relation ``rel``'s ``side`` type is featurized (its entities are bags)."""
        relation = Relation.find(self.reader.layout, rel, bags=("lhs", "rhs"))
        return self.reader.layout.config.entities[relation.lhs if side == "lhs" else relation.rhs].featurized

    def top_k(self, *, rel: str, side: Side, features: Sequence[str], k: int, filter_paths: Sequence[str | AnyPath],
              unknown: Unknown = "error", where: str = "",
              admit: Callable[[str], AdmittedRows | None] | None = None) -> Ranking:
        """The ``k`` best candidates of the side opposite to ``side`` for the bag ``features`` on
        ``side`` of ``rel``; ``where`` names the bag in errors (``--lhs-features``, ``file:line``);
        ``admit(candidate type)``: the rows a candidate filter admits (None: all)."""
        if unknown not in {choice.value for choice in UnknownFeatures}:
            raise PredictError(f"expected unknown='error' or 'ignore', found {unknown!r}")
        layout, reader = self.reader.layout, self.reader
        relation = Relation.find(layout, rel, bags=("lhs", "rhs"))
        ranked: Side = "rhs" if side == "lhs" else "lhs"
        query_type, cand_type = relation.types(ranked)
        if not layout.config.entities[query_type].featurized:
            raise PredictError(f"relation {rel!r}: its {side} type {query_type!r} is not featurized: give its entity "
                               f"by name (--{side}), not a bag of features")
        if layout.config.entities[cand_type].featurized:
            raise PredictError(f"relation {rel!r}: both its types are featurized: a bag of {query_type!r} features "
                               f"has no table of {cand_type!r} entities to rank")
        features, ids, skipped = self._bag(query_type, list(features), unknown, where or f"{side} bag")
        distinct, bag_rows = np.unique(ids, return_inverse=True)
        device = reader.device
        query_rows = rows(reader, query_type, [Position(0, int(row)) for row in distinct])
        bag = FeatureBags(torch.tensor([0, len(ids)], device=device), torch.from_numpy(bag_rows.reshape(-1)).to(device))
        filters = [layout.argument_path(str(p)) for p in filter_paths]
        known = known_candidates(layout, filters, relation.rel_id, ranked, query_type, Position(0, 0), cand_type,
                                 is_query=_same_bag(side, ids))
        admitted = None if admit is None else admit(cand_type)
        scanned = scan(reader, relation.model_rel(device), ranked, cand_type, query_rows, known, k, query_bag=bag,
                       admitted=admitted)
        best = scanned.tops[0].items()
        names = names_of(layout.entity_path, cand_type, [Position(p, o) for _, p, o in best])
        predictions = [Prediction(i, names[Position(p, o)], s, p, o) for i, (s, p, o) in enumerate(best, 1)]
        shown = " ".join(features)
        asked = {"lhs": shown, "rel": rel} if side == "lhs" else {"rel": rel, "rhs": shown}
        return Ranking(reader.version, ranked, cand_type, asked, scanned.candidates, scanned.excluded,
                       [storage.display(p) for p in filters], predictions,
                       bag=RankedBag(side, query_type, features, skipped), admitted=admitted)

    def _bag(self, entity_type: str, features: list[str], unknown: Unknown,
             where: str) -> tuple[list[str], np.ndarray, list[str]]:
        """(the features kept, their rows, the unknown ones skipped) of a bag of ``entity_type``."""
        if not features:
            raise PredictError(f"{where}: expected at least one feature of {entity_type!r}, found none")
        dictionary = self._dictionary(entity_type)
        missing = list(dict.fromkeys(f for f in features if f not in dictionary))
        if missing and unknown == "error":
            raise _unknown(self.reader, entity_type, missing, where)
        kept = [f for f in features if f in dictionary]
        if not kept:
            raise PredictError(f"{where}: expected at least one feature of {entity_type!r}, found none after skipping "
                               f"the unknown ones: {', '.join(map(repr, missing))}")
        return kept, np.array([dictionary[f] for f in kept], dtype=np.int64), missing

    def _dictionary(self, entity_type: str) -> dict[str, int]:
        """Feature name -> row of a one-partition featurized type (read once)."""
        if entity_type not in self._rows:
            layout = self.reader.layout
            partitions = layout.config.num_partitions(entity_type)
            if partitions != 1:
                raise PredictError(f"featurized type {entity_type!r} has {partitions} partitions, each with its own "
                                   "dictionary of features: predict takes bags of a featurized type of one partition "
                                   "(pbgio import writes featurized types so)")
            found: dict[str, int] = {}
            row = 0
            for chunk in iter_entity_names(layout.entity_path, entity_type, 0):
                for name in chunk:
                    found.setdefault(name, row)
                    row += 1
            if len(found) != row:
                path = layout.entity_path / naming.entity_names_file(entity_type, 0)
                raise PredictError(f"{path}: expected unique feature names to look bags up by name, found "
                                   f"{row - len(found):,} repeated [entity-names-duplicate]")
            self._rows[entity_type] = found
        return self._rows[entity_type]


def _unknown(reader: CheckpointReader, entity_type: str, missing: list[str], where: str) -> UnknownNameError:
    """The error of features the dictionary lacks: every one of them, the closest known names, and
    how to skip them."""
    layout = reader.layout
    try:
        locate_entities(layout.entity_path, entity_type, 1, missing, context=where)
    except UnknownNameError as exc:
        hint = "; ".join(filter(None, [exc.hint, "unknown='ignore' (--unknown ignore) skips unknown features, "
                                                 "listing them in the answer"]))
        return UnknownNameError(exc.names, f"{entity_type!r} feature", exc.where, context=where, hint=hint)
    raise AssertionError(f"features {missing} were not found, then were")  # the dictionary is the names file


def _same_bag(side: Side, ids: np.ndarray) -> Callable[[EdgeBucket], np.ndarray]:
    """Marks the edges of a bucket whose ``side`` bag is the bag ``ids`` (same features, as many
    times each, in any order)."""
    query = FeatureLists(np.array([0, len(ids)], dtype=np.int64), ids)

    def same(edges: EdgeBucket) -> np.ndarray:
        lists = edges.features(side)
        if lists is None:  # no feature lists: no edge of this bucket has a bag on that side
            return np.zeros(len(edges), dtype=bool)
        keys, (mine,) = bag_keys(lists, query)
        return np.asarray(keys == mine)

    return same
