"""Link-prediction metrics, raw or filtered, and the protocol every printed figure states.

Given the scores of positive edges ``pos [B]`` and of their candidates ``cand [B, C]`` (the
model's scoring, one side corrupted at a time), the rank of a positive is

    rank = 1 + #{candidates c not excluded : cand[c] >= pos}

so **ties count against the positive** (the original's pessimistic rule: a constant scorer
gets the worst rank, C + 1) and a NaN positive score gets the worst rank too. From ranks:
MRR (mean of 1/rank), MR (mean rank), Hits@k (fraction with rank <= k, k in 1, 3, 10, 50),
and AUC as the original estimates it: as many random (positive, candidate) pairs as
positives, drawn across the whole batch, counting pairs where the positive scores strictly
higher. Metrics are kept per side (lhs corrupted, rhs corrupted) and reported as the average
of the two sides, each over its own edges.

*Filtered* ranking removes the candidates that form known true edges (from the filter edge
paths) through :class:`FilterIndex`, a sorted/CSR index, with no per-edge Python.

>>> acc = RankingAccumulator(EvalProtocol.sampled(2, 0))
>>> _ = acc.add("rhs", torch.tensor([1.0, 0.0]), torch.tensor([[0.5, 0.2], [0.0, 3.0]]))
>>> _ = acc.add("lhs", torch.tensor([1.0, 0.0]), torch.tensor([[2.0, 0.2], [-1.0, -2.0]]))
>>> result = acc.result()
>>> result.mrr, result.per_side["rhs"].mrr, result.mr
(0.7083333333333333, 0.6666666666666666, 1.75)
>>> print(result.format(hits=(1, 10)))
MRR 0.7083  MR 1.75  Hits@1 0.5000  Hits@10 1.0000  AUC 0.7500  (raw, 2 batch negatives, both sides averaged; 2 edges)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

Side = Literal["lhs", "rhs"]
SIDES: tuple[Side, Side] = ("lhs", "rhs")
HITS_AT: tuple[int, ...] = (1, 3, 10, 50)

# --------------------------------------------------------------------------- protocol


class NotRanked(NamedTuple):
    """A side left out of ranking against every entity: its entity type is featurized (bags of
    features, no table of entities). ``relation`` is None with dynamic relations (every id)."""

    relation: str | None
    side: Side
    entity_type: str

    def describe(self) -> str:
        relation = "every relation" if self.relation is None else repr(self.relation)
        return f"the {self.side} side of {relation} ({self.entity_type!r} is featurized: its bags have no table to " \
               "rank against)"


@dataclass(frozen=True)
class EvalProtocol:
    """How ranks were obtained: raw or filtered, against which candidates, on which sides
    (``not_ranked``: the featurized sides left out when ranking against every entity)."""

    filtered: bool
    candidates: str
    sides: tuple[Side, ...] = SIDES
    filter_sources: tuple[str, ...] = ()
    not_ranked: tuple[NotRanked, ...] = ()

    @classmethod
    def all_entities(cls, num_entities: int, *, filtered: bool, sides: Sequence[Side] = SIDES,
                     filter_sources: Sequence[str] = ()) -> EvalProtocol:
        """Every entity of the (one) partition is a candidate.

        >>> EvalProtocol.all_entities(14541, filtered=True, filter_sources=["train", "valid", "test"]).describe()
        'filtered (against train+valid+test), all 14,541 entities as candidates, both sides averaged'
        """
        return cls(filtered, f"all {num_entities:,} entities as candidates", tuple(sides), tuple(filter_sources))

    @classmethod
    def sampled(cls, num_batch_negs: int, num_uniform_negs: int, *, filtered: bool = False,
                sides: Sequence[Side] = SIDES, filter_sources: Sequence[str] = ()) -> EvalProtocol:
        """Candidates are same-batch and uniformly drawn negatives.

        >>> EvalProtocol.sampled(1000, 1000).describe()
        'raw, 1,000 batch + 1,000 uniform negatives, both sides averaged'
        """
        parts = [f"{num_batch_negs:,} batch"] if num_batch_negs else []
        parts += [f"{num_uniform_negs:,} uniform"] if num_uniform_negs else []
        return cls(filtered, " + ".join(parts or ["no"]) + " negatives", tuple(sides), tuple(filter_sources))

    def describe(self) -> str:
        kind = "filtered" if self.filtered else "raw"
        if self.filtered and self.filter_sources:
            kind += f" (against {'+'.join(self.filter_sources)})"
        if len(self.sides) == 2:
            sides = "both sides averaged"
        elif self.sides:
            sides = f"{self.sides[0]} side only"
        else:
            sides = "no side"
        if self.not_ranked:
            sides += f"; not ranked: {', '.join(n.describe() for n in self.not_ranked)}"
        return f"{kind}, {self.candidates}, {sides}"

    def __str__(self) -> str:
        return self.describe()


# --------------------------------------------------------------------------- ranks and AUC


def ranks(pos_scores: Tensor, candidate_scores: Tensor, exclude: Tensor | None = None) -> Tensor:
    """``1 + #(candidate >= positive)`` per row, ignoring candidates where ``exclude`` is True.

    >>> ranks(torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 0.0], [3.0, 4.0]])).tolist()
    [2, 3]
    """
    pos, cand = _check_scores(pos_scores, candidate_scores, exclude)
    beats = cand >= pos.unsqueeze(1)
    if exclude is not None:
        beats.masked_fill_(exclude, False)  # in place: no [B, C] temporary (~exclude) per batch
    out = _row_counts(beats) + 1
    nan = torch.isnan(pos)
    if bool(nan.any()):
        valid = cand.shape[1] - (exclude.sum(1) if exclude is not None else 0)
        out = torch.where(nan, torch.as_tensor(valid) + 1, out)
    return out


def _row_counts(mask: Tensor) -> Tensor:
    """Number of True per row (numpy's count is several times faster than torch's bool sum on CPU)."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.count_nonzero(mask.numpy(), axis=1).astype(np.int64))
    return mask.sum(1)


def _check_scores(pos: Tensor, cand: Tensor, exclude: Tensor | None) -> tuple[Tensor, Tensor]:
    if pos.dim() != 1 or cand.dim() != 2 or cand.shape[0] != pos.shape[0]:
        raise ValueError(f"expected pos_scores [B] and candidate_scores [B, C], found {tuple(pos.shape)} "
                         f"and {tuple(cand.shape)}")
    if exclude is not None and (exclude.shape != cand.shape or exclude.dtype != torch.bool):
        raise ValueError(f"expected a bool exclude mask of shape {tuple(cand.shape)}, found "
                         f"{exclude.dtype} {tuple(exclude.shape)}")
    return pos.detach().float(), cand.detach().float()


def randomized_auc(pos_scores: Tensor, candidate_scores: Tensor, exclude: Tensor | None = None, *,
                   num_samples: int | None = None, generator: torch.Generator | None = None) -> tuple[int, int]:
    """(pairs where the positive scores strictly higher, pairs drawn), the original's AUC estimate.

    ``num_samples`` (default B) pairs each take a random positive of the batch and a random
    non-excluded candidate of the batch (any row). Excluded candidates are redrawn a few
    times; pairs still excluded after that are dropped.
    """
    pos, cand = _check_scores(pos_scores, candidate_scores, exclude)
    b, c = cand.shape
    samples = b if num_samples is None else num_samples
    if b == 0 or c == 0 or samples == 0:
        return 0, 0
    device = cand.device
    pi = torch.randint(b, (samples,), generator=generator).to(device)
    ni = torch.randint(b * c, (samples,), generator=generator).to(device)
    keep = torch.ones(samples, dtype=torch.bool, device=device)
    if exclude is not None:
        flat = exclude.reshape(-1)
        for _ in range(16):
            bad = flat[ni]
            redraw = int(bad.sum())
            if not redraw:
                break
            ni[bad] = torch.randint(b * c, (redraw,), generator=generator).to(device)
        keep = ~flat[ni]
    wins = (pos[pi] > cand.reshape(-1)[ni]) & keep
    return int(wins.sum()), int(keep.sum())


# --------------------------------------------------------------------------- accumulation


@dataclass
class _SideTotals:
    count: int = 0
    rank_sum: float = 0.0
    reciprocal_sum: float = 0.0
    hits: dict[int, int] = field(default_factory=dict)
    auc_wins: int = 0
    auc_pairs: int = 0

    def merge(self, other: _SideTotals) -> None:
        self.count += other.count
        self.rank_sum += other.rank_sum
        self.reciprocal_sum += other.reciprocal_sum
        for k, v in other.hits.items():
            self.hits[k] = self.hits.get(k, 0) + v
        self.auc_wins += other.auc_wins
        self.auc_pairs += other.auc_pairs


@dataclass(frozen=True)
class SideMetrics:
    """Metrics of one side (NaN when nothing was ranked on it; AUC NaN without pairs)."""

    count: int
    mrr: float
    mr: float
    hits: dict[int, float]
    auc: float

    def values(self) -> dict[str, float]:
        """Under the original's names: ``pos_rank``, ``mrr``, ``r{k}``, ``auc``."""
        return {"pos_rank": self.mr, "mrr": self.mrr, **{f"r{k}": v for k, v in self.hits.items()},
                "auc": self.auc}


def _side_metrics(totals: _SideTotals, hits_at: Sequence[int]) -> SideMetrics:
    n = totals.count
    if n == 0:
        return SideMetrics(0, math.nan, math.nan, {k: math.nan for k in hits_at}, math.nan)
    return SideMetrics(n, totals.reciprocal_sum / n, totals.rank_sum / n,
                       {k: totals.hits.get(k, 0) / n for k in hits_at},
                       totals.auc_wins / totals.auc_pairs if totals.auc_pairs else math.nan)


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


@dataclass(frozen=True)
class RankingMetrics:
    """Metrics averaged over the sides ranked, with the per-side values and the protocol.

    ``count`` is the number of positive edges (the largest per-side count); ``loss`` is the
    mean loss per edge when losses were added, else None.
    """

    protocol: EvalProtocol
    count: int
    mrr: float
    mr: float
    hits: dict[int, float]
    auc: float
    per_side: dict[Side, SideMetrics]
    loss: float | None = None

    def values(self) -> dict[str, float]:
        """The averaged metrics under the original's names (``pos_rank`` = MR, ``r10`` = Hits@10)."""
        out = {"pos_rank": self.mr, "mrr": self.mrr, **{f"r{k}": v for k, v in self.hits.items()}, "auc": self.auc}
        if self.loss is not None:
            out = {"loss": self.loss, **out}
        return out

    def to_stats(self) -> dict[str, Any]:
        """The original's stats object ``{count, metrics}`` (a ``training_stats.json`` entry, exactly
        those keys). NaN metrics (nothing ranked) are left out, keeping the JSON strict."""
        return {"count": self.count, "metrics": _finite(self.values())}

    def per_side_stats(self) -> dict[str, dict[str, Any]]:
        """The stats object of each side."""
        return {side: {"count": m.count, "metrics": _finite(m.values())} for side, m in self.per_side.items()}

    def to_dict(self) -> dict[str, Any]:
        """The stats object plus the protocol and the per-side values (``pbgtrain eval --json``); with
        featurized sides left out, the sides ranked and those not ranked."""
        out = {**self.to_stats(), "protocol": self.protocol.describe(), "per_side": self.per_side_stats()}
        return out | ({"sides_ranked": list(self.protocol.sides), "not_ranked": [
            n._asdict() | {"why": "featurized"} for n in self.protocol.not_ranked]} if self.protocol.not_ranked else {})

    def format(self, hits: Sequence[int] | None = None) -> str:
        """One line: the metrics, then the protocol and the number of edges."""
        if self.count == 0:
            return f"no edges evaluated ({self.protocol.describe()})"
        parts = [f"MRR {self.mrr:.4f}", f"MR {self.mr:.2f}"]
        parts += [f"Hits@{k} {self.hits[k]:.4f}" for k in (hits or self.hits) if k in self.hits]
        if not math.isnan(self.auc):
            parts.append(f"AUC {self.auc:.4f}")
        if self.loss is not None:
            parts.insert(0, f"loss {self.loss:.4g}")
        return f"{'  '.join(parts)}  ({self.protocol.describe()}; {self.count:,} edges)"

    def __str__(self) -> str:
        return self.format()


def _finite(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if not math.isnan(v)}


class RankingAccumulator:
    """Sums ranks (and AUC pairs, losses) over batches and sides; :meth:`result` averages them.

    Accumulators of disjoint work (threads, buckets) combine with :meth:`merge`.
    """

    def __init__(self, protocol: EvalProtocol, *, hits_at: Sequence[int] = HITS_AT, seed: int = 0) -> None:
        self.protocol = protocol
        self.hits_at = tuple(hits_at)
        self.generator = torch.Generator().manual_seed(seed)
        self._sides: dict[Side, _SideTotals] = {side: _SideTotals() for side in protocol.sides}
        self._loss_sum = 0.0
        self._loss_count = 0

    def add(self, side: Side, pos_scores: Tensor, candidate_scores: Tensor, exclude: Tensor | None = None) -> Tensor:
        """Rank one batch on ``side`` (the side whose entity is replaced); returns the ranks."""
        r = ranks(pos_scores, candidate_scores, exclude)
        self.add_ranks(side, r)
        wins, pairs = randomized_auc(pos_scores, candidate_scores, exclude, generator=self.generator)
        totals = self._sides[side]
        totals.auc_wins += wins
        totals.auc_pairs += pairs
        return r

    def add_ranks(self, side: Side, batch_ranks: Tensor) -> None:
        """Add ranks computed elsewhere (no AUC)."""
        if side not in self._sides:
            raise ValueError(f"side {side!r} is not in the protocol ({self.protocol.describe()})")
        totals = self._sides[side]
        r = batch_ranks.detach().to(torch.float64)
        totals.count += len(r)
        totals.rank_sum += float(r.sum())
        totals.reciprocal_sum += float(r.reciprocal().sum())
        for k in self.hits_at:
            totals.hits[k] = totals.hits.get(k, 0) + int((r <= k).sum())

    def add_loss(self, loss_sum: float, count: int) -> None:
        """Add the summed loss of ``count`` edges."""
        self._loss_sum += float(loss_sum)
        self._loss_count += count

    def merge(self, other: RankingAccumulator) -> None:
        if other.protocol != self.protocol or other.hits_at != self.hits_at:
            raise ValueError("cannot merge accumulators of different protocols")
        for side, totals in other._sides.items():
            self._sides[side].merge(totals)
        self._loss_sum += other._loss_sum
        self._loss_count += other._loss_count

    def result(self) -> RankingMetrics:
        per_side = {side: _side_metrics(t, self.hits_at) for side, t in self._sides.items()}
        ranked = [m for m in per_side.values() if m.count]
        count = max((m.count for m in ranked), default=0)
        return RankingMetrics(
            protocol=self.protocol,
            count=count,
            mrr=_mean([m.mrr for m in ranked]),
            mr=_mean([m.mr for m in ranked]),
            hits={k: _mean([m.hits[k] for m in ranked]) for k in self.hits_at},
            auc=_mean([m.auc for m in ranked]),
            per_side=per_side,
            loss=self._loss_sum / self._loss_count if self._loss_count else None,
        )


# --------------------------------------------------------------------------- filtering


_INT64_MAX = np.iinfo(np.int64).max


class _Direction:
    """Known true targets per (query entity, relation): CSR over sorted group keys, plus sorted
    ``group_index * stride + target`` keys for membership tests. numpy throughout (its repeat and
    searchsorted run on the calling thread; torch's wake its thread pool even for tiny inputs)."""

    def __init__(self, known: np.ndarray, rel: np.ndarray, target: np.ndarray, num_rels: int) -> None:
        self.num_rels = num_rels
        self.max_known = int(known.max()) if len(known) else -1
        if (self.max_known + 1) * num_rels > _INT64_MAX:
            raise ValueError("entity and relation ids too large for an int64 filter key")
        group = known * num_rels + rel
        order = np.lexsort((target, group))
        group, target = group[order], target[order]
        fresh = np.r_[True, (group[1:] != group[:-1]) | (target[1:] != target[:-1])] if len(group) else []
        group, target = group[fresh], target[fresh]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, np.int64)
        self.group_keys = group[starts]
        self.offsets = np.r_[starts, len(group)].astype(np.int64)
        self.targets = target
        self.stride = int(target.max()) + 1 if len(target) else 1
        if len(starts) * self.stride > _INT64_MAX:
            raise ValueError("too many (entity, relation) groups for an int64 filter key")
        self.pair_keys = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(self.offsets)) * self.stride + target

    def lookup(self, known: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group index, found) per query."""
        valid = (known >= 0) & (known <= self.max_known) & (rel >= 0) & (rel < self.num_rels)
        key = np.where(valid, known * self.num_rels + rel, 0)
        gi = np.searchsorted(self.group_keys, key)
        gi_safe = np.minimum(gi, max(len(self.group_keys) - 1, 0))
        found = valid & (gi < len(self.group_keys))
        if len(self.group_keys):
            found &= self.group_keys[gi_safe] == key
        return gi_safe, found

    def dense_mask(self, known: np.ndarray, rel: np.ndarray, num_entities: int) -> np.ndarray:
        mask = np.zeros((len(known), num_entities), dtype=bool)
        if not len(self.group_keys):
            return mask
        gi, found = self.lookup(known, rel)
        first = self.offsets[gi]
        lengths = np.where(found, self.offsets[gi + 1] - first, 0)
        rows = np.repeat(np.arange(len(known)), lengths)
        before = np.cumsum(lengths) - lengths
        cols = self.targets[np.arange(len(rows)) + np.repeat(first - before, lengths)]
        inside = cols < num_entities
        mask[rows[inside], cols[inside]] = True
        return mask

    def member_mask(self, known: np.ndarray, rel: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        cand = candidates if candidates.ndim == 2 else np.broadcast_to(candidates, (len(known), len(candidates)))
        if not len(self.pair_keys):
            return np.zeros(cand.shape, dtype=bool)
        gi, found = self.lookup(known, rel)
        ok = found[:, None] & (cand >= 0) & (cand < self.stride)
        key = np.where(ok, gi[:, None] * self.stride + cand, 0)
        at = np.minimum(np.searchsorted(self.pair_keys, key), len(self.pair_keys) - 1)
        member: np.ndarray = ok & (self.pair_keys[at] == key)
        return member


def _as_numpy(values: Any) -> np.ndarray:
    if isinstance(values, Tensor):
        return np.asarray(values.detach().cpu().numpy())
    return np.asarray(values)


def _int64_array(values: Any) -> np.ndarray:
    arr = _as_numpy(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D array of ids, found shape {arr.shape}")
    return arr.astype(np.int64, copy=False)


class FilterIndex:
    """Known true edges ``(lhs, rel, rhs)``, indexed to mask candidates in filtered ranking.

    >>> index = FilterIndex.from_edges((np.array([0, 0, 1]), np.array([0, 0, 0]), np.array([1, 2, 2])))
    >>> index.mask("rhs", torch.tensor([0]), 0, torch.tensor([1]), num_entities=4).tolist()
    [[False, False, True, False]]
    >>> index.mask("lhs", torch.tensor([0, 1]), 0, torch.tensor([2, 2]), candidates=torch.tensor([0, 1, 3])).tolist()
    [[False, True, False], [True, False, False]]
    """

    def __init__(self, lhs: Any, rel: Any, rhs: Any) -> None:
        lhs_a, rel_a, rhs_a = _int64_array(lhs), _int64_array(rel), _int64_array(rhs)
        if not len(lhs_a) == len(rel_a) == len(rhs_a):
            raise ValueError(f"lhs, rel and rhs differ in length: {len(lhs_a)}, {len(rel_a)}, {len(rhs_a)}")
        for name, arr in (("lhs", lhs_a), ("rel", rel_a), ("rhs", rhs_a)):
            if len(arr) and int(arr.min()) < 0:
                raise ValueError(f"expected non-negative {name} ids, found {int(arr.min())}")
        num_rels = int(rel_a.max()) + 1 if len(rel_a) else 1
        self.num_edges = len(lhs_a)
        # "rhs": rank rhs candidates of (lhs, rel) queries; "lhs": lhs candidates of (rhs, rel).
        self._directions: dict[Side, _Direction] = {
            "rhs": _Direction(lhs_a, rel_a, rhs_a, num_rels),
            "lhs": _Direction(rhs_a, rel_a, lhs_a, num_rels),
        }

    @classmethod
    def from_edges(cls, *edge_sets: tuple[Any, Any, Any]) -> FilterIndex:
        """One index over several ``(lhs, rel, rhs)`` edge sets (e.g. train, valid and test)."""
        parts = [tuple(_int64_array(a) for a in edges) for edges in edge_sets]
        return cls(*(np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(3)))

    def mask(self, side: Side, lhs: Tensor, rel: int | Tensor, rhs: Tensor, *, candidates: Tensor | None = None,
             num_entities: int | None = None, include_positive: bool = False) -> Tensor:
        """Bool mask [B, C] of the candidates that make known true edges, for ranking ``side``.

        The batch is the positive edges ``(lhs[i], rel[i], rhs[i])``; ranking ``"rhs"`` asks which
        candidates ``c`` have ``(lhs[i], rel[i], c)`` known, ranking ``"lhs"`` which have
        ``(c, rel[i], rhs[i])``. Candidates are all ``num_entities`` entities (column = entity id)
        or the ids in ``candidates`` ([C] shared by the batch, or [B, C]). The positive's own slot
        (the candidates equal to the positive entity) is left out of the mask, for the model to
        mask, unless ``include_positive``, which masks it whether or not the filter edges hold the
        positive edge (the standard filtered protocol: rank against the non-true candidates).
        """
        known_t, positive_t = (lhs, rhs) if side == "rhs" else (rhs, lhs)
        known, positive = _int64_array(known_t), _int64_array(positive_t)
        rel_a = np.broadcast_to(_int64_array(np.atleast_1d(_as_numpy(rel))), known.shape)
        direction = self._directions[side]
        rows = np.arange(len(known))
        if candidates is None:
            if num_entities is None:
                raise ValueError("give the candidates or num_entities (all entities as candidates)")
            mask = direction.dense_mask(known, rel_a, num_entities)
            inside = (positive >= 0) & (positive < num_entities)
            mask[rows[inside], positive[inside]] = include_positive
            return torch.from_numpy(mask)
        cand = _as_numpy(candidates).astype(np.int64, copy=False)
        if cand.ndim not in (1, 2) or (cand.ndim == 2 and cand.shape[0] != len(known)):
            raise ValueError(f"expected candidates [C] or [{len(known)}, C], found {tuple(cand.shape)}")
        mask = direction.member_mask(known, rel_a, cand)
        own_slot = (cand if cand.ndim == 2 else cand[None, :]) == positive[:, None]
        mask = mask | own_slot if include_positive else mask & ~own_slot
        return torch.from_numpy(np.ascontiguousarray(mask))
