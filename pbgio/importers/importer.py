"""``import_edge_lists``: edge-list files to a complete PBG layout for a config.

Two passes over the inputs, each reading a file block by block (:mod:`~pbgio.importers.read`):

1. **Count** (:mod:`~pbgio.importers.dictionary`): check every row, count relations and
   the names of every entity type over *all* inputs, so train, valid and test share one
   dictionary, then build the dictionaries (minimum counts, sorted, seeded shuffle,
   partitions). With ``on_error="fail"`` a file with malformed rows stops the import once
   it is counted (the error names its first bad line and the number of problems), before
   anything is written. (A relation minimum count adds one more counting pass.)
2. **Map and write** (:mod:`~pbgio.importers.mapping`): look names up (vectorized hash
   lookups, :mod:`~pbgio.importers.nameindex`) as (partition, offset) and append the edges
   to one bucket writer per bucket.

Peak memory is the dictionaries (about 30 bytes per distinct name, plus the names until
the entity files are written), one block of input and the bucket write buffers
(:data:`~pbgio.importers.write.BUFFER_BUDGET_EDGES` edges), whatever the number of edges.
Inputs of at most :data:`IN_MEMORY_BYTES` in all are parsed once and kept for pass 2.

Everything is written into staging directories and moved into place at the end
(:mod:`~pbgio.importers.write`), entity counts last: a failed import leaves no layout
that validates, and an overwritten layout survives a failed re-import.

>>> import json, tempfile, pathlib
>>> from pbgio.validate import validate_path
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "config.json").write_text(json.dumps({
...     "entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
...     "dimension": 8, "entity_path": "data", "edge_paths": ["data/train"],
...     "checkpoint_path": "model"}))
>>> _ = (root / "train.tsv").write_text("ann\\tfollows\\tbob\\nbob\\tfollows\\tcy\\ncy\\tfollows\\tann\\n")
>>> report = import_edge_lists(root / "config.json", [root / "train.tsv"])
>>> report.kept, report.entities, validate_path(root / "config.json").ok
(3, {'user': [2, 1]}, True)
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from pbgio import confinement, storage
from pbgio.config import ConfigSchema
from pbgio.entities import (
    write_dynamic_rel_count,
    write_entity_count,
    write_entity_names,
    write_relation_names,
)
from pbgio.importers.dictionary import Counter, Dictionary, build_dictionary, kept_relation_ids, relation_names
from pbgio.importers.mapping import Vocabulary, mapped_batches
from pbgio.importers.plan import ImportPlan, ImportSetupError, RelationMap, checked_frame
from pbgio.importers.read import WHITESPACE, InputOptions, Source, open_source
from pbgio.importers.summary import FileReport, ImportReport, Problem
from pbgio.importers.write import BucketSink, RemoteTargets, Staging
from pbgio.layout import Layout
from pbgio.progress import Progress
from pbgio.storage import AnyPath

OnError = Literal["fail", "skip"]
PathLike = str | Path
_NAMES_PER_CHUNK = 1 << 16
# Inputs whose files add up to at most this many bytes are parsed once and kept in memory
# for the second pass; larger ones are streamed twice.
IN_MEMORY_BYTES = 32 << 20


@dataclass
class InputFile:
    source: Source
    edge_path: int
    report: FileReport


def import_edge_lists(
    config: Layout | ConfigSchema | PathLike,
    inputs: Sequence[PathLike | Sequence[PathLike]],
    *,
    options: InputOptions | None = None,
    base: AnyPath | None = None,
    seed: int = 0,
    entity_min_count: int = 1,
    relation_min_count: int = 1,
    on_error: OnError = "fail",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ImportReport:
    """Import edge lists into the layout of ``config`` (its ``entity_path`` and ``edge_paths``).

    ``inputs`` holds one file per edge path, in the config's order (or, for a config with
    one edge path, any number of files), or one sequence of files per edge path. Relative
    config paths resolve against ``base``, by default the config file's directory (the
    current directory for a :class:`ConfigSchema`). Raises :class:`~pbgio.errors.InputError`
    for malformed input (with ``on_error="fail"``), :class:`ImportSetupError` when config,
    options and inputs do not fit together, and
    :class:`~pbgio.importers.write.LayoutExistsError` when an output directory holds a
    layout and ``overwrite`` is false.
    """
    started = time.perf_counter()
    options = options or InputOptions()
    progress = progress or Progress()
    if on_error not in ("fail", "skip"):
        raise ImportSetupError(f"on_error is 'fail' or 'skip', got {on_error!r}")
    if entity_min_count < 0 or relation_min_count < 0:
        raise ImportSetupError("minimum counts are non-negative")
    layout = Layout.of(config, base=base)
    cfg, config_name = layout.config, layout.file_name
    plan = ImportPlan.build(cfg, has_rel_column=options.rel_col is not None,
                            feature_separator=options.feature_separator)
    if (options.delimiter == WHITESPACE and any(plan.featurized(t) for t in plan.types)
            and not options.feature_separator.strip()):
        raise ImportSetupError("expected a feature separator other than whitespace with a whitespace "
                               "delimiter (pass --feature-separator)")
    entity_target, edge_targets = layout.entity_path, layout.edge_paths
    for key, target in [("entity_path", entity_target), *(("edge_paths", t) for t in edge_targets)]:
        check_reachable(key, target)
    if len({str(storage.absolute(p)) for p in edge_targets}) != len(edge_targets):
        raise ImportSetupError(f"expected distinct edge_paths, found {cfg.edge_paths}")
    sets = input_sets(inputs, len(edge_targets))
    remote = RemoteTargets([entity_target, *edge_targets], overwrite=overwrite)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(remote.close)
        remote.check()
        report = _import(cfg, config_name, remote.stand_in(entity_target), [remote.stand_in(p) for p in edge_targets],
                         [[_local_input(f, cleanup) for f in files] for files in sets], plan, options, overwrite,
                         on_error, entity_min_count, relation_min_count, seed, progress)
        remote.publish()
    report.entity_path = storage.display(entity_target)
    report.buckets = {storage.display(target): buckets
                      for target, buckets in zip(edge_targets, report.buckets.values(), strict=True)}
    for item in report.files:
        item.edge_path = report_edge_path(item.edge_path, remote)
    report.seconds = time.perf_counter() - started
    return report


def check_reachable(key: str, target: AnyPath) -> None:
    """Refuse an output directory behind a symbolic link loop or a dangling link (the import could
    neither create nor fill it)."""
    if storage.is_remote(target):
        return
    for path in (target, *Path(target).parents):
        problem = storage.link_problem(path)
        if problem is not None:
            raise ImportSetupError(f"{storage.display(path)}: expected a directory (or nothing) on the way to "
                                   f"the {key} directory {storage.display(target)}, found {problem}")


def _local_input(location: PathLike, cleanup: contextlib.ExitStack) -> Path:
    """An input file as a local path: a remote one is downloaded to a temporary file first."""
    path = storage.resolve(location)
    if not storage.is_remote(path):
        return path
    local = Path(tempfile.mkdtemp(prefix="pbg-input-")) / path.name
    cleanup.callback(shutil.rmtree, local.parent, True)
    confinement.admit(local.parent, write=True)  # pbg's own temporary folder, made just now
    storage.copy_file(path, local)
    return local


def report_edge_path(local: str, remote: RemoteTargets) -> str:
    for target, stand_in in remote.local.values():
        if local == str(stand_in):
            return storage.display(target)
    return local


def _import(cfg: ConfigSchema, config_name: str | None, entity_dir: Path, edge_dirs: list[Path],
            sets: list[list[Path]], plan: ImportPlan, options: InputOptions, overwrite: bool,
            on_error: Literal["fail", "skip"], entity_min_count: int, relation_min_count: int, seed: int,
            progress: Progress) -> ImportReport:
    staging = Staging([entity_dir, *edge_dirs], overwrite=overwrite)
    staging.check()

    report = ImportReport(config=config_name, entity_path=str(entity_dir), dynamic=plan.dynamic, seed=seed)
    items = [InputFile(open_source(Path(f), options), i, FileReport(str(f), str(edge_dirs[i])))
             for i, files in enumerate(sets) for f in files]
    report.files = [item.report for item in items]
    relations = _count(items, plan, report, entity_min_count=entity_min_count,
                       relation_min_count=relation_min_count, on_error=on_error, seed=seed, progress=progress)
    vocab, names = relations
    with staging:
        write_entities(staging.staged(entity_dir), plan, vocab, names, report, progress)
        for i, edge_dir in enumerate(edge_dirs):
            mine = [item for item in items if item.edge_path == i]
            report.buckets[str(edge_dir)] = write_edges(
                staging.staged(edge_dir), mine, plan, vocab, progress, weights=options.weight_col is not None)
        progress.stop()
        staging.commit()
    return report


def input_sets(inputs: Sequence[PathLike | Sequence[PathLike]], n_paths: int, *,
               hint: str = "") -> list[list[PathLike]]:
    """The input files of each edge path: one file per edge path, any number of files for a config
    with one edge path, or one sequence of files per edge path; ``hint`` ends the message about a
    wrong number of files."""
    if not inputs:
        raise ImportSetupError("expected at least one input file, found none")
    if all(isinstance(i, str | Path) for i in inputs):
        flat = [i for i in inputs if isinstance(i, str | Path)]
        if len(flat) == n_paths:
            return [[f] for f in flat]
        if n_paths == 1:
            return [flat]
        raise ImportSetupError(f"expected {n_paths} input files, one per edge path of the config, "
                               f"found {len(flat)}{hint}")
    if len(inputs) != n_paths:
        raise ImportSetupError(f"expected {n_paths} input sets, one per edge path of the config, "
                               f"found {len(inputs)}")
    return [[i] if isinstance(i, str | Path) else list(i) for i in inputs]


@contextlib.contextmanager
def _reading(source: Source) -> Iterator[None]:
    """Polars errors while reading a file become :class:`InputError` naming the file (and line)."""
    try:
        yield
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:  # a damaged file can panic polars
        text = str(exc)
        if "utf8" in text.lower() or "utf-8" in text.lower():
            line = _invalid_utf8_line(source.path)
            raise source.problem(line, "expected UTF-8 text, found invalid bytes") from None
        first = text.splitlines()[0] if text else repr(exc)
        if isinstance(exc, pl.exceptions.PanicException):  # a Parquet file's headers passed, its data did not
            raise source.problem(None, f"expected data that decodes, found damaged data (polars stopped: "
                                 f"{first})") from None
        raise source.problem(None, f"cannot read the file: {first}") from None


def _invalid_utf8_line(path: Path) -> int | None:
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return None


def _count(items: list[InputFile], plan: ImportPlan, report: ImportReport, *, entity_min_count: int,
           relation_min_count: int, on_error: OnError, seed: int,
           progress: Progress) -> tuple[Vocabulary, list[str]]:
    """Pass 1 (and 1b): check rows, count, and build every dictionary."""
    counter, relations, names = count_inputs(items, plan, report, relation_min_count=relation_min_count,
                                             on_error=on_error, progress=progress)
    progress.start("building dictionaries", total=len(plan.types))
    dictionaries = {}
    for entity_type in plan.types:
        dictionaries[entity_type] = build_dictionary(
            entity_type, counter.entities[entity_type], min_count=entity_min_count,
            num_partitions=plan.config.num_partitions(entity_type), seed=seed)
        progress.advance()
    report.relation_types = len(names)
    return Vocabulary(dictionaries, relations), names


def count_inputs(items: list[InputFile], plan: ImportPlan, report: ImportReport, *, relation_min_count: int,
                 on_error: OnError, progress: Progress) -> tuple[Counter, RelationMap, list[str]]:
    """Check every row and count names and relations over all inputs (pass 1, and 1b with a
    relation minimum count); malformed rows fail here (``on_error="fail"``). Returns the counts,
    the relation map of the writing pass and the relation names it keeps."""
    two_pass = relation_min_count > 1
    first = RelationMap(None, False) if plan.dynamic else RelationMap(plan.static_names(), True)
    counter = Counter(plan)
    sizes = [item.source.path.stat().st_size for item in items]
    progress.start("counting (MB read)", total=sum(sizes) / 1e6 * (2 if two_pass else 1))
    cache_left = IN_MEMORY_BYTES
    for item, size in zip(items, sizes, strict=True):
        progress.describe(f"counting {item.source.path.name} (MB read)")
        if size <= cache_left:  # small inputs are parsed once for both passes
            cache_left -= size
            with _reading(item.source):
                item.source = item.source.cached()
        with _reading(item.source):
            counts = counter.count_file(checked_frame(item.source, plan, first), first,
                                        count_relations=plan.dynamic or two_pass, count_entities=not two_pass,
                                        on_block=_megabytes(progress, size))
        item.report.rows, item.report.malformed = counts.rows, counts.malformed
        item.report.problems = [Problem(str(item.source.path), line, msg, item.source.unit)
                                for line, msg in counts.problems]
        if counts.malformed and on_error == "fail":  # every problem kept (the first 20), one per line
            (line, msg), *others = counts.problems
            raise item.source.problem(line, msg, count=counts.malformed, others=others)
        if counts.rows == 0:
            empty = item.source.problem(item.source.first_line,
                                        "expected edges, found none (the file is empty)")
            if on_error == "fail":
                raise empty
            report.warnings.append(str(empty))
    if plan.dynamic:
        names = relation_names(counter.relation_names, relation_min_count)
        relations = RelationMap(names, False)
    else:
        names = plan.static_names()
        relations = RelationMap(names, True, kept_relation_ids(counter.relation_ids, relation_min_count))
    if two_pass:
        for item, size in zip(items, sizes, strict=True):
            progress.describe(f"counting entities of {item.source.path.name} (MB read)")
            with _reading(item.source):
                counter.count_file(checked_frame(item.source, plan, relations), relations,
                                   count_relations=False, count_entities=True, on_block=_megabytes(progress, size))
    return counter, relations, names


def _megabytes(progress: Progress, size: int) -> Callable[[float], None]:
    """A block callback advancing ``progress`` by the megabytes of a ``size``-byte file read since the last."""
    done = 0.0

    def on_block(share: float) -> None:
        nonlocal done
        progress.advance(size / 1e6 * (share - done))
        done = share

    return on_block


def _names(dictionary: Dictionary, part: int) -> Iterator[str]:
    names = dictionary.partition(part)
    for start in range(0, len(names), _NAMES_PER_CHUNK):
        yield from names.slice(start, _NAMES_PER_CHUNK).to_list()


def write_entities(directory: Path, plan: ImportPlan, vocab: Vocabulary, names: list[str],
                   report: ImportReport, progress: Progress, *, relation_names_file: bool = True) -> None:
    progress.start("writing entity names", total=len(plan.types))
    for entity_type, dictionary in vocab.entities.items():
        parts = len(dictionary.bounds) - 1
        for part in range(parts):
            write_entity_names(directory, entity_type, part, _names(dictionary, part))
            write_entity_count(directory, entity_type, part, dictionary.count(part))
        report.entities[entity_type] = [dictionary.count(p) for p in range(parts)]
        dictionary.drop_names()  # the mapping pass needs ids only
        if plan.featurized(entity_type):
            report.featurized.append(entity_type)
        progress.advance()
    if relation_names_file or plan.dynamic:
        write_relation_names(directory, names)
    if plan.dynamic:
        write_dynamic_rel_count(directory, len(names))


def write_edges(directory: Path, items: list[InputFile], plan: ImportPlan, vocab: Vocabulary,
                progress: Progress, *, weights: bool, previous: Path | None = None) -> dict[str, int]:
    """Write the edges of ``items`` into every bucket of the grid in ``directory``; with ``previous``
    (an append), each bucket starts with the edges of the bucket of the same name there. Returns the
    edges of ``items`` per bucket."""
    sink = BucketSink(directory, plan.grid, weights=weights, lhs_features=plan.has_features("lhs"),
                      rhs_features=plan.has_features("rhs"))
    try:
        if previous is not None:
            progress.start(f"copying the buckets of {previous.name}", total=len(sink.writers))
            sink.copy_from(previous, lambda _: progress.advance())
        progress.start(f"writing {directory.parent.name}", total=sum(i.report.rows - i.report.malformed
                                                                     for i in items))
        for item in items:
            progress.describe(f"writing {item.source.path.name} into {directory.parent.name}")
            with _reading(item.source):
                for batch in mapped_batches(checked_frame(item.source, plan, vocab.relations), plan, vocab):
                    sink.append(batch)
                    item.report.kept += len(batch)
                    progress.advance(len(batch))
            progress.advance(item.report.rows - item.report.malformed - item.report.kept)
        progress.start(f"writing buckets of {directory.parent.name}", total=len(sink.writers))
        counts = sink.close(lambda _: progress.advance())
    except BaseException:
        sink.abort()
        raise
    return {f"{lhs}_{rhs}": n for (lhs, rhs), n in counts.items()}
