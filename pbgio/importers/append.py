"""``pbgio import --append`` and :func:`append_edge_lists`: new edges, and the new entities and
relations they name, added to an existing layout of the same config.

The layout must exist and validate: entity counts and names files of every type under
``entity_path`` (``dynamic_rel_names.json`` too with dynamic relations), and a complete bucket
grid in every edge path that is not receiving edges. An edge path receiving edges may be
missing or empty: its grid is created. The inputs are read as ``pbgio import`` reads them
(same options, same row checks, malformed rows fail or are skipped the same way); what changes:

- **Known names keep their place.** A name already in ``entity_names_{type}_{part}.json``
  keeps its partition and offset exactly, so the rows of a trained table still belong to the
  same entities.
- **New names** of a type (the inputs' names that no names file of the type holds) are sorted,
  shuffled with the permutation ``pbgio import`` uses (:func:`~pbgio.importers.partition.shuffled_order`,
  seeded by ``seed`` and the type's name), and cut in that order, partition 0 first, into one
  piece per partition whose sizes :func:`fill_shares` gives: the smallest partitions are filled
  first, up to the level the new names reach, and when several partitions tie at the last level
  the lower partition numbers get one more. Partitions that receive names thus end within one
  entity of each other and of the smallest partition, the most even the old sizes allow. Each
  piece is appended after its partition's rows: offsets ``old count``, ``old count + 1``, …. The
  same layout, inputs and seed always give the same result, whatever the order of the input rows.
- **Relations.** Dynamic relations: known names keep their ids; new names, sorted, get the next
  ids (``dynamic_rel_names.json`` and ``dynamic_rel_count.txt`` grow). Static relations: the
  config's, by name; a row naming another relation is malformed (the error names file and line).
- **Buckets.** Every bucket of an edge path receiving inputs is rewritten as its old edges, in
  their order, followed by the new edges that fall in it, in input order (buckets without new
  edges are rewritten unchanged). Weights must be as they were: ``weight_col`` exactly when the
  edge path's buckets have weights.
- **Not supported (yet):** featurized entity types (an :class:`ImportSetupError` says so),
  minimum counts, and layouts on remote storage.

Nothing changes until everything is written: entity files and buckets are staged as an import
stages them (:class:`~pbgio.importers.write.Staging` with ``append=True``), then the old files
are hard-linked aside and the new ones moved in, entity counts last. A failure or Ctrl-C before
the commit leaves the old layout untouched; one during the commit, or a ``kill -9`` there (found
by the next import or append into the same directories), puts the old files back, byte for byte.
``dry_run=True`` reads and maps everything and reports what would be added, writing nothing.

>>> import json, tempfile, pathlib
>>> from pbgio.entities import read_entity_names
>>> from pbgio.importers.importer import import_edge_lists
>>> from pbgio.validate import validate_path
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "config.json").write_text(json.dumps({
...     "entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
...     "dimension": 8, "entity_path": "data", "edge_paths": ["data/train"],
...     "checkpoint_path": "model"}))
>>> _ = (root / "old.tsv").write_text("ann\\tfollows\\tbob\\nbob\\tfollows\\tcy\\ncy\\tfollows\\tann\\n")
>>> _ = import_edge_lists(root / "config.json", [root / "old.tsv"])
>>> before = [read_entity_names(root / "data", "user", p) for p in (0, 1)]
>>> before
[['bob', 'ann'], ['cy']]
>>> _ = (root / "new.tsv").write_text("dan\\tfollows\\tann\\neve\\tfollows\\tdan\\nfay\\tfollows\\tcy\\n")
>>> report = append_edge_lists(root / "config.json", [root / "new.tsv"])
>>> print(report.entity_line())
user: 2 known, 3 new entities (partitions: +1, +2), 6 in all; 1 relation type (0 new)
>>> after = [read_entity_names(root / "data", "user", p) for p in (0, 1)]
>>> all(a[:len(b)] == b for a, b in zip(after, before)), [len(a) for a in after]
(True, [3, 3])
>>> validate_path(root / "config.json").ok
True
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio import storage
from pbgio.config import ConfigSchema
from pbgio.entities import read_entity_count, read_entity_names, read_relation_names
from pbgio.errors import MissingArtifactError
from pbgio.formats.h5 import open_h5
from pbgio.importers.dictionary import Counter, Dictionary, relation_names
from pbgio.importers.importer import (
    InputFile,
    OnError,
    PathLike,
    check_reachable,
    count_inputs,
    input_sets,
    write_edges,
    write_entities,
)
from pbgio.importers.mapping import Vocabulary, mapped_batches
from pbgio.importers.nameindex import NameIndex
from pbgio.importers.partition import shuffled_order
from pbgio.importers.plan import ImportPlan, ImportSetupError, RelationMap, checked_frame
from pbgio.importers.read import InputOptions, open_source
from pbgio.importers.summary import AppendInfo, FileReport, ImportReport
from pbgio.importers.write import Staging, interrupted_commits, layout_files
from pbgio.layout import Layout
from pbgio.progress import Progress
from pbgio.spec import naming
from pbgio.storage import AnyPath

Ints = NDArray[np.int64]


def fill_shares(sizes: Sequence[int], new: int) -> list[int]:
    """How many of ``new`` entities each partition of these ``sizes`` gets: the smallest are
    filled first (water-filling); ties at the last level go to the lower partition numbers.

    >>> fill_shares([5, 3, 4], 4)  # 3 -> 4 (1 name), then 4, 4 -> 5, 5 (2), then one more to partition 0
    [1, 2, 1]
    >>> fill_shares([10, 0], 3), fill_shares([2, 2, 2], 7), fill_shares([7], 5), fill_shares([1, 9], 0)
    ([0, 3], [3, 2, 2], [5], [0, 0])
    """
    if new < 0 or not sizes or min(sizes) < 0:
        raise ValueError(f"expected partition sizes >= 0 and new >= 0, found {list(sizes)} and {new}")
    order = sorted(range(len(sizes)), key=lambda p: (sizes[p], p))
    level, left, filling = sizes[order[0]], new, 0  # order[:filling] are raised together to `level`
    while True:
        while filling < len(order) and sizes[order[filling]] == level:
            filling += 1
        cost = None if filling == len(order) else filling * (sizes[order[filling]] - level)
        if cost is None or cost > left:
            break
        left -= cost
        level = sizes[order[filling]]
    raised, extra = divmod(left, filling)
    lucky = set(sorted(order[:filling])[:extra])
    final = {p: level + raised + (p in lucky) for p in order[:filling]}
    return [final.get(p, sizes[p]) - sizes[p] for p in range(len(sizes))]


def place_new(sizes: Sequence[int], new: int) -> tuple[Ints, Ints]:
    """Partition and offset of the ``i``-th of ``new`` shuffled names (:func:`fill_shares`, cut in
    partition order, each piece after its partition's rows).

    >>> [a.tolist() for a in place_new([5, 3, 4], 4)]
    [[0, 1, 1, 2], [5, 3, 4, 4]]
    """
    shares = fill_shares(sizes, new)
    parts = np.repeat(np.arange(len(sizes), dtype=np.int64), shares)
    offsets = np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(sizes, shares, strict=True)]
                             or [np.zeros(0, np.int64)])
    return parts, offsets


@dataclass
class _Grown:
    """Everything the writing pass needs: the dictionaries (known + new names) and the relations."""

    vocab: Vocabulary
    relation_names: list[str]
    info: AppendInfo


def append_edge_lists(
    config: Layout | ConfigSchema | PathLike,
    inputs: Sequence[PathLike | Sequence[PathLike]],
    *,
    edge_path: str | None = None,
    options: InputOptions | None = None,
    base: AnyPath | None = None,
    seed: int = 0,
    on_error: OnError = "fail",
    dry_run: bool = False,
    progress: Progress | None = None,
) -> ImportReport:
    """Append edge lists to the existing layout of ``config`` (see the module doc for the rules).

    ``inputs`` are given as to :func:`~pbgio.importers.import_edge_lists` (one file per edge path,
    any number for a config with one edge path, or one sequence of files per edge path, where an
    empty sequence leaves that edge path as it is); with ``edge_path`` (one of the config's
    ``edge_paths``, as written there) every input goes to that edge path. Raises
    :class:`~pbgio.errors.MissingArtifactError` when the layout does not exist,
    :class:`~pbgio.errors.FormatError` when it does not validate, :class:`ImportSetupError` when
    config, options and inputs do not fit (featurized types among them), and
    :class:`~pbgio.errors.InputError` for malformed input (with ``on_error="fail"``).
    """
    started = time.perf_counter()
    options = options or InputOptions()
    progress = progress or Progress()
    if on_error not in ("fail", "skip"):
        raise ImportSetupError(f"on_error is 'fail' or 'skip', got {on_error!r}")
    layout = Layout.of(config, base=base)
    cfg, config_name = layout.config, layout.file_name
    featurized = cfg.featurized_types()
    if featurized:
        shown = ", ".join(map(repr, featurized))
        raise ImportSetupError(f"append does not support featurized entity types yet ({shown} "
                               f"{'is' if len(featurized) == 1 else 'are'} featurized); import all the edge lists "
                               "again with pbgio import --overwrite")
    plan = ImportPlan.build(cfg, has_rel_column=options.rel_col is not None,
                            feature_separator=options.feature_separator)
    entity_dir = _local(layout.entity_path)
    edge_dirs = [_local(p) for p in layout.edge_paths]
    for key, target in [("entity_path", entity_dir), *(("edge_paths", t) for t in edge_dirs)]:
        check_reachable(key, target)
    if len({str(storage.absolute(p)) for p in edge_dirs}) != len(edge_dirs):
        raise ImportSetupError(f"expected distinct edge_paths, found {cfg.edge_paths}")
    sets = _append_sets(inputs, edge_path, cfg)
    receiving = [i for i, files in enumerate(sets) if files]
    staging = Staging([entity_dir, *(edge_dirs[i] for i in receiving)], overwrite=False, append=True)
    if not dry_run:
        staging.check()  # puts back the layout of an append killed while committing, first
    elif killed := interrupted_commits(staging.targets):
        raise ImportSetupError(f"{killed[0]}: an import or append into this layout was "
                               "killed while moving its files into place; run the append without --dry-run (it "
                               "puts the previous layout back first)")
    _check_layout(layout, entity_dir, edge_dirs, receiving)
    weights = [_has_weights(edge_dirs[i], options.weight_col is not None) if i in receiving else False
               for i in range(len(sets))]

    report = ImportReport(config=config_name, entity_path=str(entity_dir), dynamic=plan.dynamic, seed=seed)
    items = [InputFile(open_source(Path(f), options), i, FileReport(str(f), str(edge_dirs[i])))
             for i, files in enumerate(sets) for f in files]
    report.files = [item.report for item in items]
    counter, _, _ = count_inputs(items, plan, report, relation_min_count=1, on_error=on_error, progress=progress)
    grown = _grow(plan, entity_dir, counter, seed, progress)
    grown.info.dry_run = dry_run
    report.append = grown.info
    report.relation_types = len(grown.relation_names)
    old_totals = {i: _bucket_lengths(edge_dirs[i], plan.grid) for i in receiving}
    if dry_run:
        for name, dictionary in grown.vocab.entities.items():
            report.entities[name] = [dictionary.count(p) for p in range(len(dictionary.bounds) - 1)]
        added = {i: _count_buckets([it for it in items if it.edge_path == i], plan, grown.vocab) for i in receiving}
    else:
        added = {}
        relations_file = plan.dynamic or (entity_dir / naming.DYNAMIC_REL_NAMES).is_file()
        with staging:
            write_entities(staging.staged(entity_dir), plan, grown.vocab, grown.relation_names, report, progress,
                           relation_names_file=relations_file)
            for i in receiving:
                added[i] = write_edges(staging.staged(edge_dirs[i]), [it for it in items if it.edge_path == i],
                                       plan, grown.vocab, progress, weights=weights[i], previous=edge_dirs[i])
            progress.stop()
            staging.commit()
    progress.stop()
    report.entity_path = storage.display(entity_dir)
    for i in receiving:
        shown = storage.display(edge_dirs[i])
        grown.info.added[shown] = added[i]
        report.buckets[shown] = {k: old_totals[i].get(k, 0) + n for k, n in added[i].items()}
    grew = any(sum(n) for n in grown.info.new.values()) or len(grown.relation_names) > grown.info.relation_types_before
    if grew:
        report.warnings += _checkpoint_warnings(layout, dry_run)
    report.seconds = time.perf_counter() - started
    return report


def _checkpoint_warnings(layout: Layout, dry_run: bool) -> list[str]:
    """A committed checkpoint in the config's checkpoint_path no longer fits the grown layout."""
    from pbgio.checkpoint import CheckpointDir
    from pbgio.errors import PbgioError

    checkpoint = layout.checkpoint_path
    try:
        version = CheckpointDir(checkpoint).read_version() if checkpoint.is_dir() else 0
    except PbgioError:
        return []
    if version == 0:
        return []
    verb = "would no longer fit" if dry_run else "no longer fits"
    return [f"{storage.display(checkpoint)}: the checkpoint of checkpoint_path (version {version}) {verb} the grown "
            f"layout; train on from it with a new checkpoint_path and init_path = {layout.config.checkpoint_path} "
            "(a warm start keeps its rows and adds the new ones)"]


def _local(path: AnyPath) -> Path:
    if not isinstance(path, Path):
        raise ImportSetupError(f"append works on local layouts only, found {storage.display(path)} (append "
                               "locally, then copy the layout)")
    return path


def _append_sets(inputs: Sequence[PathLike | Sequence[PathLike]], edge_path: str | None,
                 cfg: ConfigSchema) -> list[list[PathLike]]:
    """The input files of each edge path (empty lists for the edge paths left as they are)."""
    n_paths = len(cfg.edge_paths)
    if edge_path is not None:
        if edge_path not in cfg.edge_paths:
            raise ImportSetupError(f"expected --edge-path to be one of the config's edge_paths {cfg.edge_paths}, "
                                   f"found {edge_path!r}")
        flat = [i for i in inputs if isinstance(i, str | Path)]
        if len(flat) != len(inputs):
            raise ImportSetupError("expected input files, not sets of files, with an edge path")
        sets: list[list[PathLike]] = [[] for _ in range(n_paths)]
        sets[cfg.edge_paths.index(edge_path)] = flat
    else:
        sets = input_sets(inputs, n_paths, hint=" (or name the edge path they go to with --edge-path)")
    if not any(sets):
        raise ImportSetupError("expected at least one input file, found none")
    return sets


def _check_layout(layout: Layout, entity_dir: Path, edge_dirs: list[Path], receiving: list[int]) -> None:
    """Refuse a layout that does not exist (no entity counts) or does not validate. An edge path
    receiving edges may be missing or hold no bucket (it is created); any other is checked whole."""
    cfg = layout.config
    counts = [key for file in layout_files(entity_dir)  # listed once: num_partitions is not walked
              if (key := naming.parse_entity_count_file(file.name)) is not None]
    if not any(t in cfg.entities and p < cfg.entities[t].num_partitions for t, p in counts):
        raise MissingArtifactError(str(entity_dir), "layout to append to (the entity counts and names of "
                                   "entity_path; create it with pbgio import first)")
    present = [i for i, d in enumerate(edge_dirs)
               if i not in receiving or any(naming.parse_bucket_file(p.name) for p in layout_files(d))]
    checked = cfg.model_copy(update={"edge_paths": [cfg.edge_paths[i] for i in present]})
    from pbgio.validate import validate_layout

    validation = validate_layout(dataclasses.replace(layout, config=checked), checkpoints=False)
    validation.raise_if_errors()
    for entity_type, entity in cfg.entities.items():
        for part in range(entity.num_partitions):
            names = entity_dir / naming.entity_names_file(entity_type, part)
            if not names.is_file():
                raise MissingArtifactError(str(names), f"names file of {entity_type!r} partition {part} (an append "
                                           "keeps every known name in place, so it needs the names of the layout)")
    if cfg.dynamic_relations and not (entity_dir / naming.DYNAMIC_REL_NAMES).is_file():
        raise MissingArtifactError(str(entity_dir / naming.DYNAMIC_REL_NAMES),
                                   "relation names file (an append keeps the ids of known relations)")


def _has_weights(edge_dir: Path, wanted: bool) -> bool:
    """Whether the buckets of ``edge_dir`` have weights (all or none); they must match ``wanted``
    (the input has a weight column), unless the edge path has no bucket yet."""
    buckets = [p for p in layout_files(edge_dir) if naming.parse_bucket_file(p.name)]
    if not buckets:
        return wanted
    found = {}
    for bucket in buckets:
        with open_h5(bucket) as f:
            found[bucket] = "weight" in f
    if len(set(found.values())) > 1:
        odd = next(b for b, w in found.items() if w != found[buckets[0]])
        raise ImportSetupError(f"{odd}: expected every bucket of {edge_dir} with weights or none, found a mix")
    has = found[buckets[0]]
    if has != wanted:
        raise ImportSetupError(f"{edge_dir}: its buckets {'have' if has else 'have no'} weights; expected the new "
                               f"edges {'with' if has else 'without'} a weight column "
                               f"({'pass' if has else 'leave out'} --weight-col)")
    return has


def _bucket_lengths(edge_dir: Path, grid: tuple[int, int]) -> dict[str, int]:
    from pbgio.edges import bucket_length

    out = {}
    for lhs in range(grid[0]):
        for rhs in range(grid[1]):
            path = edge_dir / naming.bucket_file(lhs, rhs)
            out[f"{lhs}_{rhs}"] = bucket_length(path) if path.is_file() else 0
    return out


def _count_buckets(items: list[InputFile], plan: ImportPlan, vocab: Vocabulary) -> dict[str, int]:
    """Edges of ``items`` per bucket, as the writing pass would place them (a dry run)."""
    n_lhs, n_rhs = plan.grid
    counts = np.zeros(n_lhs * n_rhs, dtype=np.int64)
    for item in items:
        for batch in mapped_batches(checked_frame(item.source, plan, vocab.relations), plan, vocab):
            counts += np.bincount(batch.lhs_part * n_rhs + batch.rhs_part, minlength=len(counts))
            item.report.kept += len(batch)
    return {f"{i // n_rhs}_{i % n_rhs}": int(c) for i, c in enumerate(counts)}


def _grow(plan: ImportPlan, entity_dir: Path, counter: Counter, seed: int, progress: Progress) -> _Grown:
    """The dictionaries of the layout with the inputs' new names placed, and the relation names."""
    info = AppendInfo()
    progress.start("placing new names", total=len(plan.types))
    dictionaries = {}
    for entity_type in plan.types:
        dictionaries[entity_type] = _grow_dictionary(entity_type, plan.config.num_partitions(entity_type), entity_dir,
                                                     counter.entities[entity_type], seed, info)
        progress.advance()
    if plan.dynamic:
        old = read_relation_names(entity_dir)
        known = set(old)
        names = old + [n for n in relation_names(counter.relation_names, 1) if n not in known]
        relations = RelationMap(names, False)
    else:
        old = names = plan.static_names()
        relations = RelationMap(names, True)
    info.relation_types_before = len(old)
    return _Grown(Vocabulary(dictionaries, relations), names, info)


def _grow_dictionary(entity_type: str, num_partitions: int, entity_dir: Path, seen: NameIndex, seed: int,
                     info: AppendInfo) -> Dictionary:
    sizes = [read_entity_count(entity_dir, entity_type, p) for p in range(num_partitions)]
    known_parts = [pl.Series("name", read_entity_names(entity_dir, entity_type, p), dtype=pl.String)
                   for p in range(num_partitions)]
    known = pl.concat(known_parts) if known_parts else pl.Series("name", [], dtype=pl.String)
    index = NameIndex()
    index.add(known)
    inputs = seen.names()
    is_new = index.lookup(inputs) < 0
    new = inputs.filter(pl.Series(is_new)).sort()
    new = new.gather(shuffled_order(len(new), seed=seed, salt=entity_type))
    index.add(new)
    new_parts, new_offsets = place_new(sizes, len(new))
    known_ids, new_ids = index.lookup(known), index.lookup(new)
    part_of = np.full(len(index) + 1, -1, dtype=np.int32)
    offset_of = np.full(len(index) + 1, -1, dtype=np.int32)
    start = 0
    for part, size in enumerate(sizes):
        ids = known_ids[start:start + size]
        part_of[ids], offset_of[ids] = part, np.arange(size, dtype=np.int32)
        start += size
    part_of[new_ids], offset_of[new_ids] = new_parts, new_offsets
    order_parts, bounds = [], [0]
    start = 0
    for part, size in enumerate(sizes):
        mine = new_ids[new_parts == part]
        order_parts += [known_ids[start:start + size], mine]
        start += size
        bounds.append(bounds[-1] + size + len(mine))
    order = np.concatenate(order_parts).astype(np.int64, copy=False)
    info.before[entity_type] = sizes
    info.new[entity_type] = np.bincount(new_parts, minlength=num_partitions).astype(int).tolist()
    info.known[entity_type] = int((~is_new).sum())
    return Dictionary(entity_type, index.names(), order, bounds, index, part_of, offset_of)
