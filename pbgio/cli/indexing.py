"""``pbgio index build``: a nearest-neighbour index of one entity type, beside its checkpoint
version (searched by ``pbgio neighbors --index`` and ``pbgtrain predict --index``)."""

from __future__ import annotations

import contextlib
import enum
import json
from typing import Annotated

import typer

from pbgio.cli.exporting import NoGlobal
from pbgio.console import exit_codes, stderr_console
from pbgio.options import AsJson, BaseOption, CheckpointOption, ConfigArg, NoProgress, Overrides, VersionOption
from pbgio.progress import progress_wanted
from pbgio.spec.index import FLAT_MAX_ROWS, IVF_FLAT_SHARE, KINDS, METRICS, RECALL_TARGET

# Help texts are rich markup: "\\[" prints a bracket ("[ann]" alone would be read as a tag and dropped).
index_app = typer.Typer(name="index", help="Nearest-neighbour indexes of trained embeddings (needs FAISS: pip "
                                           "install 'pbg\\[ann]').", no_args_is_help=True)


# The choices come from the index's declaration (pbgio.spec.index), not a copy of it.
IndexKind = enum.Enum("IndexKind", {name: name for name in ("auto", *KINDS)}, type=str)  # type: ignore[misc]
IndexMetric = enum.Enum("IndexMetric", {name: name for name in METRICS}, type=str)  # type: ignore[misc]


@index_app.command("build")
def build(
    config: ConfigArg,
    entity_type: Annotated[str | None, typer.Option(
        "--type", "-t", help="The entity type to index (default: the config's only type).")] = None,
    kind: Annotated[IndexKind, typer.Option(
        "--kind", help="auto: flat (exact) up to --flat-max-rows rows; above, ivf, or flat where ivf must visit "
        f"more than {IVF_FLAT_SHARE:.0%} of its lists to reach recall@10 {RECALL_TARGET}; hnsw: a graph (slower to "
        "build).")] = IndexKind.auto,  # type: ignore[attr-defined]
    metric: Annotated[IndexMetric | None, typer.Option(
        "--metric", help="cos or dot (default: the config's comparator when it is one of them, else cos; the "
        "default of pbgio neighbors and the metric of pbgtrain predict).")] = None,
    nlist: Annotated[int | None, typer.Option("--nlist", min=1, help="ivf: inverted lists (default 4·√rows).")] = None,
    nprobe: Annotated[int | None, typer.Option(
        "--nprobe", min=1, help="ivf: lists a search visits by default (default: from 16, doubled until the recall@10 "
        f"measured at build reaches {RECALL_TARGET}).")] = None,
    m: Annotated[int | None, typer.Option("--m", min=2, help="hnsw: links per node (default 32).")] = None,
    ef_search: Annotated[int | None, typer.Option(
        "--ef-search", min=1, help="hnsw: search breadth by default (default: from 128, doubled until the recall@10 "
        f"measured at build reaches {RECALL_TARGET}).")] = None,
    flat_max_rows: Annotated[int, typer.Option(
        "--flat-max-rows", min=1, help="auto: the most rows indexed by an exact flat index without measuring an "
        "ivf one.")] = FLAT_MAX_ROWS,
    no_global: NoGlobal = False,
    version: VersionOption = None,
    checkpoint: CheckpointOption = None,
    param: Overrides = None,
    base: BaseOption = None,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Build the index of one entity type for a checkpoint version (default: the committed one).

    Written atomically as index_{type}.{metric}.{kind}.v{version}.h5 in the checkpoint directory
    (one per metric and kind: a cos index beside a dot one), removed with its version; a search
    takes one of its metric and refuses it once the version's tables change. An approximate index's
    recall@10 is measured as it is built, on rows drawn as queries, and printed.
    """
    from rich.markup import escape

    from pbgio.config import entity_type_or_only
    from pbgio.errors import MissingArtifactError, MissingLibraryError
    from pbgio.index import build_index
    from pbgio.layout import Layout
    from pbgio.progress import Progress, RichProgress

    bars: contextlib.AbstractContextManager[Progress] = (
        RichProgress() if progress_wanted(no_progress) else contextlib.nullcontext(Progress()))
    with exit_codes(usage=(MissingArtifactError, MissingLibraryError), note=" (no index was written)"), \
            bars as progress:
        layout = Layout.load(config, base=base, overrides=param or [])
        chosen = entity_type_or_only(layout.config, entity_type)
        built = build_index(layout, chosen, kind=kind.value, metric=None if metric is None else metric.value,
                            add_global=not no_global, flat_max_rows=flat_max_rows, nlist=nlist, nprobe=nprobe,
                            m=m, ef_search=ef_search, version=version, checkpoint=checkpoint, progress=progress)
    stderr_console().print(escape(built.summary()), soft_wrap=True)
    if as_json:
        tuning = built.tuning
        tried = [] if tuning is None else [{tuning.param: value, "recall_at_10": round(found, 4)}
                                           for value, found in tuning.tried]
        typer.echo(json.dumps({"path": str(built.path), "bytes": built.bytes, "seconds": round(built.seconds, 3),
                               "meta": json.loads(built.meta.to_json()), "recall_tried": tried,
                               "recall_seconds": round(built.recall_seconds, 3)}, indent=2))
