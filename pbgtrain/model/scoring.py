"""Scores of a batch: positives, and negatives per side, all chunks at once.

Static relations score an edge (u, r, v) as ``c(u, f_r(v))`` (operator on the rhs only); lhs
negatives are ``c(u', f_r(v))`` and rhs negatives ``c(u, f_r(v'))``. Dynamic relations keep a
lhs operator g and a rhs operator h: lhs negatives are ``c(u', h_r(v))`` against the positive
``c(u, h_r(v))``, rhs negatives ``c(g_r(u), v')`` against ``c(g_r(u), v)``. Before the
operator the per-type global embedding is added; after it the comparator prepares.

Negative scores of one side are laid out as ``[batch negatives (chunk_size) | uniform]`` or, for
``all_negs``, ``[every entity of the partition]``; ignored slots hold ``MASKED_SCORE``.

A featurized side (the batch carries its feature bags) embeds each entity as the mean of its
features and takes same-batch negatives only: the other bags of its chunk (docs/guides/featurized.md). Its uniform
negatives are skipped, as the original skips them, while a plain side of the same relation still
takes its uniform negatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pbgtrain.model.chains import (
    Chain,
    Traced,
    dynamic_operator_link,
    prepare_link,
    shift_link,
    static_operator_link,
)
from pbgtrain.model.comparators import Comparator, CosComparator, DotComparator
from pbgtrain.model.inputs import EdgeBatch, FeatureBags
from pbgtrain.model.lookup import GatheredRows, gather_rows
from pbgtrain.model.model import EmbeddingModel, NegativeSampling, RelationSpec
from pbgtrain.model.negative_sampling import (
    MASKED_SCORE,
    BatchNegatives,
    Draws,
    NegativeMode,
    batch_negatives,
    sample_uniform_many,
)
from pbgtrain.model.negative_scores import BlockShape, UniformLayout, negative_blocks, stack_sides
from pbgtrain.model.precision import full_precision
from pbgtrain.model.tables import EntityTable

SIDES = ("lhs", "rhs")


@dataclass(frozen=True)
class SideScores:
    """Scores of the sides scored together (one or both): positives [S, B] and negative blocks
    [S, B, K_i] (batch negatives, uniform negatives, or every entity), ``sides`` naming axis 0."""

    sides: tuple[str, ...]
    pos: Tensor
    neg_blocks: tuple[Tensor, ...]


@dataclass(frozen=True)
class Scores:
    """Positive scores [B] and negative scores of each side (lhs: the lhs corrupted), kept as
    the groups the sides were scored in (:class:`SideScores`), which the loss consumes without
    splitting or concatenating; ``lhs_neg``/``rhs_neg`` give one side's whole [B, K] matrix."""

    groups: tuple[SideScores, ...]

    def side(self, side: str) -> tuple[Tensor, tuple[Tensor, ...]]:
        """``(pos [B], negative blocks [B, K_i])`` of ``side``."""
        for group in self.groups:
            if side in group.sides:
                i = group.sides.index(side)
                return group.pos[i], tuple(block[i] for block in group.neg_blocks)
        raise KeyError(side)

    @property
    def lhs_pos(self) -> Tensor:
        return self.side("lhs")[0]

    @property
    def rhs_pos(self) -> Tensor:
        return self.side("rhs")[0]

    @property
    def lhs_neg_blocks(self) -> tuple[Tensor, ...]:
        return self.side("lhs")[1]

    @property
    def rhs_neg_blocks(self) -> tuple[Tensor, ...]:
        return self.side("rhs")[1]

    @property
    def lhs_neg(self) -> Tensor:
        return _concat(*self.side("lhs"))

    @property
    def rhs_neg(self) -> Tensor:
        return _concat(*self.side("rhs"))


def _concat(pos: Tensor, blocks: tuple[Tensor, ...]) -> Tensor:
    if not blocks:
        return pos.new_zeros(pos.shape[0], 0)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)


@dataclass
class ForwardResult:
    scores: Scores
    reg: Tensor | None
    gathered: list[GatheredRows]
    negs: BatchNegatives


@dataclass
class _SideView:
    """What scoring one side's candidates needs; the positive score is ``pair(query, positives)``
    (every comparator is symmetric)."""

    traced_query: Traced  # [B, D] the other side, prepared (operator included)
    traced_positives: Traced  # [B, D] this side's positives, prepared (the batch negatives)
    adjust: Chain  # raw embeddings of this side's candidates → prepared

    @property
    def query(self) -> Tensor:
        return self.traced_query.out

    @property
    def positives(self) -> Tensor:
        return self.traced_positives.out


def _side_views(model: EmbeddingModel, rel: int | Tensor, lhs_type: str, rhs_type: str,
                u_raw: Tensor, v_raw: Tensor) -> tuple[_SideView, _SideView]:
    prepare = prepare_link(model.comparator)
    if isinstance(rel, Tensor):
        g_op, h_op = model.dynamic_operators()
        plain = Chain.of(prepare)
        u, v = plain.trace(u_raw), plain.trace(v_raw)
        hv = Chain.of(dynamic_operator_link(h_op, rel), prepare).trace(v_raw)
        gu = Chain.of(dynamic_operator_link(g_op, rel), prepare).trace(u_raw)
        return _SideView(hv, u, plain), _SideView(gu, v, plain)
    op = model.static_operator(rel)
    lhs_chain = Chain.of(shift_link(model.global_emb(lhs_type)), prepare)
    rhs_chain = Chain.of(shift_link(model.global_emb(rhs_type)), static_operator_link(op), prepare)
    u, v = lhs_chain.trace(u_raw), rhs_chain.trace(v_raw)
    return _SideView(v, u, lhs_chain), _SideView(u, v, rhs_chain)


def candidate_space_query(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, lhs: Tensor,
                          rel: int | Tensor, rhs: Tensor, side: str) -> tuple[Tensor, str] | str:
    """The query of one edge's ``side`` candidates moved into their own space: ``(q, metric)``
    such that ranking candidate rows x (global embedding added or not) by ``dot(q, x)`` or
    ``cos(q, x)`` ranks them as :func:`score_candidates` does, so that a nearest-neighbour
    index over the rows can propose them; or, as a string, why no such vector exists.

    With the dot comparator every operator is affine in x, so ``q`` is the gradient of the
    score with respect to the candidate row (the operator's adjoint applied to the query; a
    translation or the global embedding adds the same amount to every candidate). With cos,
    ``q`` exists only when nothing but the global embedding touches the candidate before it is
    normalized. ``max_norm`` clips candidates non-linearly: the ranking then holds only for rows
    within the norm, which the exact re-ranking that follows an index makes up for.
    """
    cmp = model.comparator
    if type(cmp) not in (DotComparator, CosComparator):
        what = "with a bias" if not isinstance(cmp, (DotComparator, CosComparator)) and cmp.name in ("dot", "cos") \
            else "ranks by a distance"
        return f"the {cmp.name} comparator {what}, not by an inner product a vector index can search"
    batch = EdgeBatch(lhs, rhs, rel)
    lhs_type, rhs_type = _check_tables(model, batch, lhs_table, rhs_table)
    frozen = (lhs_type in model.spec.frozen, rhs_type in model.spec.frozen)
    _, rows, _ = _gather((lhs_table, rhs_table), [[batch.entities("lhs")], [batch.entities("rhs")]],
                      max_norm=model.spec.max_norm, requires_grad=False, frozen=frozen)
    view = _side_views(model, rel, lhs_type, rhs_type, rows[0][0], rows[1][0])[SIDES.index(side)]
    cand_type = lhs_type if side == "lhs" else rhs_type
    dim = model.spec.entity_dimensions[cand_type]
    query = full_precision(view.query).detach()
    if isinstance(cmp, DotComparator):
        probe = torch.zeros(1, dim, device=query.device, requires_grad=True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad((query[:1] * full_precision(view.adjust(probe))).sum(), probe)
        return grad[0].detach(), "dot"
    shift = None if isinstance(rel, Tensor) else model.global_emb(cand_type)
    probe = torch.randn(4, dim, generator=torch.Generator().manual_seed(0)).to(query.device)
    plain = cmp.prepare(probe if shift is None else probe + shift.detach())
    if torch.allclose(full_precision(view.adjust(probe)), full_precision(plain), atol=1e-5):
        return query[0], "cos"
    return (f"the cos comparator with the {model.relation(rel).operator} operator on the {side} side: the "
            "candidate is transformed before it is normalized, which no single query vector can rank")


def _block_shape(mode: NegativeMode, negs: BatchNegatives, candidates: Tensor | None) -> BlockShape:
    uniform: UniformLayout = "none"
    if mode is NegativeMode.ALL:
        uniform = "all"
    elif candidates is not None and candidates.shape[0] > 0:
        uniform = "shared" if negs.share_uniform else "per_chunk"
    return BlockShape(mode, negs.chunk_size, negs.num_pos, uniform)


@dataclass(frozen=True)
class ScoreGroup:
    """Sides scored together (both when their blocks have the same shape, else one each): their
    names, the shape of their blocks and the block inputs, traced (each side's query, positives
    and candidates; one candidates tensor when every entity of one table serves both sides), and
    ``own`` [S, B], each positive's own row (every-entity negatives only)."""

    sides: tuple[str, ...]
    shape: BlockShape
    queries: list[Traced]
    positives: list[Traced]
    candidates: list[Traced]
    own: Tensor | None

    def tensors(self, traced: list[Traced]) -> list[Tensor]:
        return [t.out for t in traced]


def _side_group(side: str, view: _SideView, shape: BlockShape, candidates: Traced | None,
                own: Tensor | None) -> ScoreGroup:
    """One side's negatives, a group of its own."""
    return ScoreGroup((side,), shape, [view.traced_query], [view.traced_positives],
                      [] if candidates is None else [candidates], None if own is None else own.unsqueeze(0))


def _joined(a: ScoreGroup, b: ScoreGroup) -> ScoreGroup | None:
    """The two sides as one group when their blocks have the same shape (None when they do not)."""
    same_candidates = len(a.candidates) == len(b.candidates) and all(
        x.out.shape == y.out.shape for x, y in zip(a.candidates, b.candidates, strict=True))
    if a.shape != b.shape or a.queries[0].out.shape != b.queries[0].out.shape or not same_candidates:
        return None
    shared = bool(a.candidates) and a.candidates[0] is b.candidates[0]  # one tensor of every entity serves both
    own = None if a.own is None or b.own is None else torch.cat((a.own, b.own))
    return ScoreGroup(a.sides + b.sides, a.shape, a.queries + b.queries, a.positives + b.positives,
                      a.candidates if shared else a.candidates + b.candidates, own)


def score_sides(cmp: Comparator, groups: Sequence[ScoreGroup], num_real: Tensor | None = None) -> Scores:
    """The scores of both sides (stacked when their blocks have the same shape); ``num_real``: the
    rows from there on are padding (a count on the device)."""
    out = []
    for g in groups:
        queries, positives = g.tensors(g.queries), g.tensors(g.positives)
        pos = cmp.pair(stack_sides(queries), stack_sides(positives))
        blocks = () if g.shape.mode is NegativeMode.NONE else negative_blocks(
            cmp, g.shape, queries, positives, g.tensors(g.candidates), masked=MASKED_SCORE, own=g.own,
            num_real=num_real)
        out.append(SideScores(g.sides, pos, blocks))
    return Scores(tuple(out))


Source = tuple[int, int]
"""Where a group of rows sits: (which gathered table, which of its groups)."""


def _gather(tables: Sequence[EntityTable], groups: Sequence[Sequence[Tensor | FeatureBags]], *, max_norm: float | None,
            requires_grad: bool, frozen: Sequence[bool] = (False, False),
            updates: bool | None = None) -> tuple[list[GatheredRows], list[list[Tensor]], list[list[Source]]]:
    """Gather each side's groups, once per distinct table (lhs and rhs may share one, and then a
    group both sides hold, every entity, is gathered once); a ``frozen`` side's table is only read
    (see :func:`~pbgtrain.model.lookup.gather_rows`). Also returns where each side's groups sit."""
    if tables[0] is tables[1]:  # the sides' groups interleaved (lhs and rhs positives side by side), each once
        combined: list[Tensor | FeatureBags] = []
        parts: list[list[int]] = [[], []]
        for k in range(max(len(groups[0]), len(groups[1]))):
            for side_groups, side_parts in zip(groups, parts, strict=True):
                if k < len(side_groups):
                    side_parts.append(_position(combined, side_groups[k]))
        g, rows = gather_rows(tables[0], combined, max_norm=max_norm, requires_grad=requires_grad,
                              frozen=frozen[0] or frozen[1], updates=updates)
        return [g], [[rows[i] for i in p] for p in parts], [[(0, i) for i in p] for p in parts]
    out_g, out_rows, where = [], [], []
    for index, (table, side_groups, side_frozen) in enumerate(zip(tables, groups, frozen, strict=True)):
        g, rows = gather_rows(table, side_groups, max_norm=max_norm, requires_grad=requires_grad, frozen=side_frozen,
                              updates=updates)
        out_g.append(g)
        out_rows.append(rows)
        where.append([(index, i) for i in range(len(rows))])
    return out_g, out_rows, where


def _position(groups: list[Tensor | FeatureBags], group: Tensor | FeatureBags) -> int:
    """Where ``group`` (the object itself) is in ``groups``, appended if absent."""
    for i, known in enumerate(groups):
        if known is group:
            return i
    groups.append(group)
    return len(groups) - 1


def _check_tables(model: EmbeddingModel, batch: EdgeBatch, lhs_table: EntityTable,
                  rhs_table: EntityTable) -> tuple[str, str]:
    relation = model.relation(batch.rel)
    for side, table, etype in (("lhs", lhs_table, relation.lhs), ("rhs", rhs_table, relation.rhs)):
        has_bags = batch.bags(side) is not None
        if etype in model.spec.featurized and not has_bags:
            raise ValueError(f"{side} type {etype!r} is featurized: expected the batch's {side}_bags, found none")
        if has_bags and etype not in model.spec.featurized:
            raise ValueError(f"{side} type {etype!r} is not featurized: expected no {side}_bags, found them")
        dim = model.spec.entity_dimensions[etype]
        if table.dimension != dim:
            raise ValueError(f"{side} table has dimension {table.dimension}, expected {dim} for {etype!r}")
    return relation.lhs, relation.rhs


@dataclass
class PreparedBatch:
    """A batch looked up and transformed, ready to be scored: its sides' negatives, grouped as they
    are scored."""

    negs: BatchNegatives
    gathered: list[GatheredRows]
    groups: list[ScoreGroup]
    sources: dict[int, Source]  # id of each traced tensor → the rows it was computed from
    raw: tuple[Source, Source]  # where the positives' rows of lhs and rhs sit
    raw_rows: tuple[Tensor, Tensor]  # and those rows
    live: Tensor | None  # [B] 1.0 for an edge, 0.0 for a padding row (None: no padding)


def prepare_batch(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch,
                  negatives: NegativeSampling, generator: Draws, requires_grad: bool,
                  updates: bool | None = None) -> PreparedBatch:
    lhs_type, rhs_type = _check_tables(model, batch, lhs_table, rhs_table)
    relation = model.relation(batch.rel)
    num_pos = len(batch)
    negs = batch_negatives(relation, negatives, num_pos)
    tables = (lhs_table, rhs_table)
    pos_ids = (batch.lhs, batch.rhs)
    groups: list[list[Tensor | FeatureBags]] = []
    every_entity: dict[int, Tensor] = {}  # one list of every entity per table
    drawing: list[int] = []  # the sides that draw uniform negatives
    draws: list[tuple[int, int]] = []  # and what they draw: (entities, count)
    for side, table in zip(SIDES, tables, strict=True):
        side_groups: list[Tensor | FeatureBags] = [batch.entities(side)]
        mode = negs.mode(side)
        if batch.bags(side) is not None:
            _check_featurized_negatives(relation, side, mode)
        elif mode is NegativeMode.ALL:
            if id(table) not in every_entity:
                every_entity[id(table)] = torch.arange(table.num_entities, device=table.device)
            side_groups.append(every_entity[id(table)])
        elif negs.num_uniform_samples(side) > 0:
            drawing.append(len(groups))
            draws.append((table.num_entities, negs.num_uniform_samples(side)))
        groups.append(side_groups)
    for i, ids in zip(drawing, sample_uniform_many(draws, device=batch.lhs.device, generator=generator), strict=True):
        groups[i].append(ids)  # the sides' draws in one pass, in their order (the same ids as one draw per side)
    frozen = (lhs_type in model.spec.frozen, rhs_type in model.spec.frozen)
    gathered, rows, where = _gather(tables, groups, max_norm=model.spec.max_norm, requires_grad=requires_grad,
                                    frozen=frozen, updates=updates)
    u_raw, v_raw = rows[0][0], rows[1][0]
    views = _side_views(model, batch.rel, lhs_type, rhs_type, u_raw, v_raw)
    sources = {id(views[0].traced_query): where[1][0], id(views[0].traced_positives): where[0][0],
               id(views[1].traced_query): where[0][0], id(views[1].traced_positives): where[1][0]}
    scored: list[ScoreGroup] = []  # each side's negatives
    shared_candidates: Traced | None = None
    for side, view, side_rows, side_where, ids in zip(SIDES, views, rows, where, pos_ids, strict=True):
        mode = negs.mode(side)
        candidates = None
        if len(side_rows) > 1:
            if side == "rhs" and side_rows[1] is rows[0][-1] and view.adjust == views[0].adjust:
                candidates = shared_candidates  # the lhs side's candidates: the same rows, prepared alike
            else:
                candidates = view.adjust.trace(side_rows[1])
                sources[id(candidates)] = side_where[1]
        if side == "lhs":
            shared_candidates = candidates
        own = ids if mode is NegativeMode.ALL else None
        shape = _block_shape(mode, negs, None if candidates is None else candidates.out)
        scored.append(_side_group(side, view, shape, candidates, own))
    both = _joined(*scored)  # the sides scored together when their blocks have the same shape
    return PreparedBatch(negs, gathered, scored if both is None else [both], sources, (where[0][0], where[1][0]),
                         (u_raw, v_raw), batch.live_rows())


def forward_batch(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch,
                  negatives: NegativeSampling, *, generator: Draws = None,
                  requires_grad: bool = True) -> ForwardResult:
    """Positive and negative scores of ``batch`` and its N3 term (None when disabled): what
    evaluation ranks, and the reference that a training step's gradients
    (:func:`~pbgtrain.model.gradients.training_gradients`) are tested against."""
    prepared = prepare_batch(model, lhs_table, rhs_table, batch, negatives, generator, requires_grad)
    u_raw, v_raw = prepared.raw_rows
    reg = regularization(model, batch.rel, u_raw, v_raw, prepared.live) if model.regularizer.enabled else None
    return ForwardResult(score_sides(model.comparator, prepared.groups, batch.num_real), reg, prepared.gathered,
                         prepared.negs)


def _check_featurized_negatives(relation: RelationSpec, side: str, mode: NegativeMode) -> None:
    """A featurized side has no table to sample or list: it takes same-batch negatives only, and
    its uniform negatives are skipped (as the original does); ``all_negs`` or uniform-only
    sampling on it cannot run (the config rules refuse both before training)."""
    etype = getattr(relation, side)
    if mode is NegativeMode.ALL:
        raise ValueError(f"relation {relation.name!r} has all_negs, but its {side} type {etype!r} is featurized: "
                         "featurized entities take same-batch negatives only")
    if mode is NegativeMode.UNIFORM:
        raise ValueError(f"the {side} type {etype!r} of relation {relation.name!r} is featurized: featurized "
                         "entities take same-batch negatives only (set num_batch_negs > 0)")


def regularization(model: EmbeddingModel, rel: int | Tensor, u_raw: Tensor, v_raw: Tensor,
                   live: Tensor | None = None) -> Tensor | None:
    """N3 of a batch: the positive embeddings and each edge's operator parameters; ``live`` [B]
    (1.0 an edge, 0.0 a padding row) leaves the padding out.

    Dynamic relations count the embeddings twice, once per direction (lhs negatives with h,
    rhs negatives with g), as the original sums the regularizer of its two directions.
    """
    reg = model.regularizer
    if not reg.enabled:
        return None
    if isinstance(rel, Tensor):
        g_op, h_op = model.dynamic_operators()
        emb = reg.embedding_term([u_raw, v_raw], h_op.complex_valued, live)
        return reg(2 * emb, [reg.dynamic_operator_term(h_op.cube_sums(), rel, live),
                             reg.dynamic_operator_term(g_op.cube_sums(), rel, live)])
    op = model.static_operator(rel)
    emb = reg.embedding_term([u_raw, v_raw], op.complex_valued, live)
    edges: Tensor | int = u_raw.shape[0] if live is None else live.sum()
    return reg(emb, [reg.static_operator_term(op.cube_sum(), edges)])


@torch.no_grad()
def score_candidates(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, lhs: Tensor,
                     rel: int | Tensor, rhs: Tensor, side: str, candidates: Tensor | None = None, *,
                     lhs_bags: FeatureBags | None = None, rhs_bags: FeatureBags | None = None) -> tuple[Tensor, Tensor]:
    """Rank-ready scores of edges (lhs, rel, rhs) with ``side`` replaced by candidates.

    ``candidates`` is None (every entity of that side's table, in row order), a LongTensor [C]
    of row offsets shared by all edges, or [B, C] per edge. Returns ``(pos [B], cand [B, C])``
    scored exactly as the corresponding training negatives; nothing is masked. The side kept
    fixed may be featurized (give its ``*_bags``); the candidate side must be plain, since a
    featurized type has no list of entities to rank, only features.
    """
    if side not in SIDES:
        raise ValueError(f"side must be 'lhs' or 'rhs', found {side!r}")
    batch = EdgeBatch(lhs, rhs, rel, lhs_bags=lhs_bags, rhs_bags=rhs_bags)
    if batch.bags(side) is not None:
        raise ValueError(f"the {side} side is featurized: its entities are bags of features, so they can only be "
                         "ranked against other bags (same-batch candidates), not against a table of entities")
    lhs_type, rhs_type = _check_tables(model, batch, lhs_table, rhs_table)
    tables = (lhs_table, rhs_table)
    cand_table = tables[SIDES.index(side)]
    cand_ids = torch.arange(cand_table.num_entities, device=cand_table.device) if candidates is None else candidates
    groups: list[list[Tensor | FeatureBags]] = [[batch.entities("lhs")], [batch.entities("rhs")]]
    groups[SIDES.index(side)].append(cand_ids)
    frozen = (lhs_type in model.spec.frozen, rhs_type in model.spec.frozen)
    _, rows, _ = _gather(tables, groups, max_norm=model.spec.max_norm, requires_grad=False, frozen=frozen)
    views = _side_views(model, rel, lhs_type, rhs_type, rows[0][0], rows[1][0])
    view = views[SIDES.index(side)]
    cand = view.adjust(rows[SIDES.index(side)][1].view(*cand_ids.shape, -1))
    pos = model.comparator.pair(view.query, view.positives)
    if cand.dim() == 2:
        return pos, full_precision(model.comparator.all_pairs(view.query, cand))
    return pos, full_precision(model.comparator.all_pairs(view.query.unsqueeze(1), cand).squeeze(1))
