"""``pbgio import``: edge lists to a PBG layout.

Register with ``app.command("import")(import_edges)``.

Exit codes follow ``pbgio``'s: 0 imported, 1 bad input (malformed rows, unreadable
files; nothing was written), 2 usage error (bad option, missing file, an output that
holds a layout without ``--overwrite``), 130 interrupted. With ``--append``: 1 also when
the layout does not validate, 2 when it does not exist or has featurized types; a failed
append leaves the layout as it was. The summary goes to stderr;
``--json`` prints the full report on stdout.

This module imports only typer at import time, so registering the command keeps
``pbgio validate`` free of polars.
"""

from __future__ import annotations

import contextlib
import enum
import json
from typing import Annotated, Any

import typer

from pbgio.console import EXIT_USAGE, exit_codes, print_error, stderr_console
from pbgio.options import AsJson, BaseOption, ConfigArg, NoProgress, Overrides
from pbgio.progress import progress_wanted


class OnError(str, enum.Enum):
    fail = "fail"
    skip = "skip"


class InputFormat(str, enum.Enum):
    auto = "auto"
    text = "text"
    parquet = "parquet"




Inputs = Annotated[list[str], typer.Argument(
    help="Edge-list files (TSV, CSV, text, Parquet): one per edge path in the config's order (e.g. train "
    "valid test), or any number for a config with one edge path.")]
Delimiter = Annotated[str, typer.Option(
    "--delimiter", "-d", help="Field delimiter of text files: one character, or tab, comma, space, "
    "semicolon, pipe, whitespace (runs of blanks, as the original).")]
Quote = Annotated[str, typer.Option(
    "--quote", help="Quote character of text files: a field it quotes may hold the delimiter and doubled quotes "
    "(RFC 4180, as CSV writers quote); 'none': every delimiter splits; 'auto': \" except for tab-separated "
    "text (TSV has no quoting).")]
Header = Annotated[bool | None, typer.Option(
    "--header/--no-header", show_default=False, help="Text files start with a header line (columns may then be "
    "given by name), or do not. Said neither way, a first line that looks like a header (a usual column name, "
    "none of its names in the next lines) is refused, and nothing is imported.")]
LhsCol = Annotated[str, typer.Option(
    "--lhs-col", "-l", help="Column of the left entity (0-based index or name).")]
RelCol = Annotated[str, typer.Option(
    "--rel-col", help="Column of the relation type; 'none' gives every edge the config's only relation.")]
RhsCol = Annotated[str, typer.Option("--rhs-col", "-r", help="Column of the right entity.")]
WeightCol = Annotated[str | None, typer.Option(
    "--weight-col", help="Column of float edge weights (stored as float32).")]
FeatureSeparator = Annotated[str, typer.Option(
    "--feature-separator", help="Separator of the features in a featurized entity's cell.")]
Format = Annotated[InputFormat, typer.Option(
    "--format", help="Input format; auto: Parquet for .parquet/.pq files, else text.")]
Seed = Annotated[int, typer.Option(help="Seed of the entity shuffle (partition assignment).")]
EntityMinCount = Annotated[int, typer.Option(
    "--entity-min-count", help="Drop entities (features, for featurized types) seen fewer times; their edges "
    "are filtered.")]
RelationMinCount = Annotated[int, typer.Option(
    "--relation-type-min-count", "--relation-min-count",
    help="Drop relation types with fewer edges; their edges are filtered.")]
OnErrorOption = Annotated[OnError, typer.Option(
    "--on-error", help="Malformed rows: fail (report the first, write nothing) or skip (count and report "
    "them).")]
Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="Replace a layout already in the output directories.")]
Append = Annotated[bool, typer.Option(
    "--append", help="Add the edges to the existing layout of the config: known entities keep their partition and "
    "offset, new ones are appended to the smallest partitions, new dynamic relations get new ids.")]
DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="With --append: read and map the inputs, report what would be added, write nothing.")]
EdgePath = Annotated[str | None, typer.Option(
    "--edge-path", help="With --append: every input goes to this edge path of the config (as written there); the "
    "others are left as they are.")]


def import_edges(
    config: ConfigArg,
    inputs: Inputs,
    delimiter: Delimiter = "tab",
    quote: Quote = "auto",
    header: Header = None,
    lhs_col: LhsCol = "0",
    rel_col: RelCol = "1",
    rhs_col: RhsCol = "2",
    weight_col: WeightCol = None,
    feature_separator: FeatureSeparator = " ",
    input_format: Format = InputFormat.auto,
    seed: Seed = 0,
    entity_min_count: EntityMinCount = 1,
    relation_min_count: RelationMinCount = 1,
    on_error: OnErrorOption = OnError.fail,
    overwrite: Overwrite = False,
    append: Append = False,
    dry_run: DryRun = False,
    edge_path: EdgePath = None,
    param: Overrides = None,
    base: BaseOption = None,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Import edge lists into a PBG layout: dictionaries, partitions, every bucket (--append: into an existing one).

    The layout goes to the config's entity_path and edge_paths (paths or fsspec URLs).
    """
    from rich.markup import escape

    from pbgio.errors import MissingArtifactError
    from pbgio.importers.append import append_edge_lists
    from pbgio.importers.importer import import_edge_lists
    from pbgio.importers.plan import ImportSetupError
    from pbgio.importers.read import InputOptions, parse_column, parse_delimiter
    from pbgio.importers.write import LayoutExistsError
    from pbgio.layout import Layout
    from pbgio.progress import Progress, RichProgress

    console = stderr_console()
    try:
        lhs, rhs = parse_column(lhs_col), parse_column(rhs_col)
        if lhs is None or rhs is None:
            raise ValueError("the lhs and rhs columns are required")
        options = InputOptions(
            delimiter=parse_delimiter(delimiter), header=header, lhs_col=lhs, rel_col=parse_column(rel_col),
            rhs_col=rhs, weight_col=parse_column(weight_col), feature_separator=feature_separator,
            file_format=input_format.value, quote=None if quote.lower() == "none" else quote)
        if not append:
            given = [flag for flag, on in (("--dry-run", dry_run), ("--edge-path", edge_path is not None)) if on]
            if given:
                raise ValueError(f"{given[0]} goes with --append")
        else:
            given = [flag for flag, on in (("--overwrite", overwrite), ("--entity-min-count", entity_min_count != 1),
                                           ("--relation-type-min-count", relation_min_count != 1)) if on]
            if given:
                raise ValueError(f"{given[0]} does not go with --append (an append keeps the layout and every "
                                 "name of the inputs)")
    except ValueError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    note = " (nothing was written)" if not append else " (the layout is as it was)"
    with exit_codes(usage=(MissingArtifactError, LayoutExistsError, ImportSetupError), note=note,
                    on_interrupt=lambda: console.print(f"interrupted{note}")):
        bars: contextlib.AbstractContextManager[Progress] = (
            RichProgress() if progress_wanted(no_progress) else contextlib.nullcontext(Progress()))
        layout = Layout.load(config, base=base, overrides=param or [])
        with bars as progress:
            if append:
                report = append_edge_lists(
                    layout, list(inputs), edge_path=edge_path, options=options, seed=seed, on_error=on_error.value,
                    dry_run=dry_run, progress=progress)
            else:
                report = import_edge_lists(
                    layout, list(inputs), options=options, seed=seed,
                    entity_min_count=entity_min_count, relation_min_count=relation_min_count,
                    on_error=on_error.value, overwrite=overwrite,
                    progress=progress)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}", soft_wrap=True)
    for file in report.files:
        for problem in file.problems[:5]:
            console.print(f"[yellow]skipped[/]: {escape(str(problem))}", soft_wrap=True)
        if file.malformed > 5:
            console.print(f"… {file.malformed - 5:,} more malformed rows skipped in {escape(file.path)}")
    console.print(escape(report.summary()), soft_wrap=True)
    console.print(escape(report.entity_line()), soft_wrap=True)
    for line in report.bucket_lines():
        console.print(escape(line), soft_wrap=True)
    leakage = _leakage(layout, console) if not append and len(layout.edge_paths) > 1 else {}
    if as_json:
        typer.echo(json.dumps(report.to_dict() | ({"leakage": leakage} if leakage else {}), indent=2))


LEAKAGE_LINES = 12
"""Relations listed one per line in import's leakage report; more: the ones with the most edges."""


def _leakage(layout: Any, console: Any) -> dict[str, list[dict[str, Any]]]:
    """Inverse and symmetric leakage of each edge path after the first (the training split) from
    the first, printed per relation (:func:`pbgio.leakage.reverse_leakage`); by held-out path. Nothing
    where no relation leads back to the type it comes from."""
    from rich.markup import escape

    from pbgio import storage
    from pbgio.leakage import reverse_leakage, reverses_possible

    if not reverses_possible(layout):  # no relation leads back: no edge can have a reverse
        return {}
    train, out = layout.edge_paths[0], {}
    for held_out in layout.edge_paths[1:]:
        relations = reverse_leakage(layout, train, held_out)
        edges, either = sum(r.edges for r in relations), sum(r.inverse_or_symmetric for r in relations)
        share = f"{either / edges:.1%}" if edges else "-"
        console.print(escape(f"{storage.display(held_out)}: {either:,} of {edges:,} edges ({share}) have their reverse "
                             f"in {storage.display(train)} (inverse or symmetric leakage: such edges are answered "
                             "by reversing a training edge)"), soft_wrap=True)
        shown = [] if not either else relations if len(relations) <= LEAKAGE_LINES else \
            sorted(relations, key=lambda r: r.edges, reverse=True)[:LEAKAGE_LINES - 2]
        for relation in shown:
            console.print(escape(f"  {relation.line()}"), soft_wrap=True)
        if shown and len(shown) < len(relations):
            console.print(f"  … ({len(relations) - len(shown):,} more relations, with fewer edges; every relation "
                          "with --json)", soft_wrap=True)
        out[storage.display(held_out)] = [r.to_dict() for r in relations]
    return out

