"""``pbgio export``: embeddings and relation parameters as tables; ``pbgio embed``: new bags.

Register with ``app.command("export")(export)`` and ``app.command("embed")(embed)``.

Exit codes: 0 exported, 1 bad checkpoint or entity files, 2 usage error (bad option,
missing file, an output that exists without ``--overwrite``), 130 interrupted.
Imports only typer at import time.
"""

from __future__ import annotations

import contextlib
import enum
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pbgio.console import EXIT_USAGE, exit_codes, print_error, stderr_console
from pbgio.options import AsJson, BaseOption, CheckpointOption, ConfigArg, NoProgress, Overrides, VersionOption
from pbgio.progress import progress_wanted


class EmbeddingFormat(str, enum.Enum):
    tsv = "tsv"
    parquet = "parquet"
    npy = "npy"


class RelationFormat(str, enum.Enum):
    tsv = "tsv"
    json = "json"


class ParquetLayout(str, enum.Enum):
    list = "list"
    columns = "columns"




def _usage_errors() -> tuple[type[BaseException], ...]:
    """A missing input or an existing output: usage errors (exit 2); imported when a command runs."""
    from pbgio.errors import MissingArtifactError
    from pbgio.exporters.common import OutputExistsError

    return MissingArtifactError, OutputExistsError


Output = Annotated[Path | None, typer.Option(
    "--output", "-o", "--entities-output",
    help="Embeddings output: the TSV file; for parquet and npy a directory ({type}.parquet, {type}.npy + "
    "{type}.names.json) or, with one entity type, the file itself.")]
Format = Annotated[EmbeddingFormat, typer.Option("--format", "-f", help="Embeddings format.")]
RelationsOutput = Annotated[Path | None, typer.Option(
    "--relations-output", "--relation-types-output", help="Relation operator parameters output file.")]
RelationsFormat = Annotated[RelationFormat, typer.Option("--relations-format",
                                                         help="Relation parameters format.")]
EntityTypes = Annotated[list[str] | None, typer.Option(
    "--entity-type", "-t", help="Export this entity type (repeatable; default: all).")]
NoGlobal = Annotated[bool, typer.Option(
    "--no-global", help="Do not add the global embedding of each type (the original adds it when global_emb "
    "is true).")]
ParquetLayoutOption = Annotated[ParquetLayout, typer.Option(
    "--parquet-layout", help="Parquet values: one fixed-size list column, or one column per dimension.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.")]


def export(
    config: ConfigArg,
    output: Output = None,
    fmt: Format = EmbeddingFormat.tsv,
    relations_output: RelationsOutput = None,
    relations_format: RelationsFormat = RelationFormat.tsv,
    version: VersionOption = None,
    entity_type: EntityTypes = None,
    no_global: NoGlobal = False,
    parquet_layout: ParquetLayoutOption = ParquetLayout.list,
    checkpoint: CheckpointOption = None,
    param: Overrides = None,
    base: BaseOption = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Export trained embeddings (TSV, Parquet, npy) and relation parameters (TSV, JSON)."""
    from rich.markup import escape

    from pbgio.exporters.embeddings import export_embeddings
    from pbgio.exporters.relations import export_relations
    from pbgio.layout import Layout
    from pbgio.progress import Progress, RichProgress
    from pbgio.storage import atomic

    if output is None and relations_output is None:
        print_error("nothing to export: give --output and/or --relations-output")
        raise typer.Exit(EXIT_USAGE)
    console = stderr_console()
    reports = []
    with exit_codes(usage=_usage_errors()), atomic.together():  # every output, or none
        layout = Layout.load(config, base=base, overrides=param or [])
        if output is not None:
            bars: contextlib.AbstractContextManager[Progress] = (
                RichProgress() if progress_wanted(no_progress) else contextlib.nullcontext(Progress()))
            with bars as progress:
                reports.append(export_embeddings(
                    layout, output, fmt=fmt.value, version=version, entity_types=entity_type or None,
                    add_global=not no_global, parquet_layout=parquet_layout.value, checkpoint=checkpoint,
                    overwrite=overwrite, progress=progress))
        if relations_output is not None:
            reports.append(export_relations(
                layout, relations_output, fmt=relations_format.value, version=version, checkpoint=checkpoint,
                overwrite=overwrite))
    for report in reports:
        console.print(escape(report.summary()), soft_wrap=True)
        for path in report.outputs:
            console.print(f"  wrote {escape(path)}", soft_wrap=True)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in reports], indent=2))


class UnknownFeatures(str, enum.Enum):
    error = "error"
    ignore = "ignore"


def embed(
    config: ConfigArg,
    bags: Annotated[Path, typer.Argument(help="Text file of bags, one per line: features separated by "
                                              "--feature-separator.")],
    entity_type: Annotated[str, typer.Option("--type", "-t", help="The featurized entity type.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output TSV (line number, then the values), or - "
                                                               "for stdout.")],
    feature_separator: Annotated[str, typer.Option(
        "--feature-separator", help="Separator of the features on a line (default: runs of whitespace).")] = "",
    unknown: Annotated[UnknownFeatures, typer.Option(
        "--unknown", help="Features missing from the dictionary: fail, or ignore them.")] = UnknownFeatures.error,
    offsets: Annotated[bool, typer.Option(
        "--offsets", help="Features are row offsets within the partition (integers), not names: for layouts "
        "without a names file.")] = False,
    partition: Annotated[int, typer.Option(help="Partition whose features the bags use.")] = 0,
    version: VersionOption = None,
    no_global: NoGlobal = False,
    checkpoint: CheckpointOption = None,
    param: Overrides = None,
    base: BaseOption = None,
    overwrite: Overwrite = False,
) -> None:
    """Embed new bags of features (e.g. unseen documents) of a featurized type: the mean of their features."""
    from pbgio.errors import InputError
    from pbgio.exporters.bags import BagError, embed_bags, write_bag_tsv
    from pbgio.layout import Layout

    try:
        lines = bags.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        print_error(f"{bags}: cannot read it as UTF-8 text ({exc})")
        raise typer.Exit(EXIT_USAGE) from None
    with exit_codes(usage=_usage_errors()):
        layout = Layout.load(config, base=base, overrides=param or [])
        parsed: list[list[str] | list[int]] = []
        for number, line in enumerate(lines, 1):
            features = [f for f in (line.split(feature_separator) if feature_separator else line.split()) if f]
            if not features:
                raise InputError(str(bags), number, "expected at least one feature, found an empty line")
            parsed.append(_offsets(features, str(bags), number) if offsets else features)
        try:
            vectors = embed_bags(layout, entity_type, parsed, version=version, partition=partition,
                                 add_global=not no_global, unknown=unknown.value, checkpoint=checkpoint)
        except BagError as exc:
            raise InputError(str(bags), exc.bag + 1, exc.reason) from None
        if output == "-":
            write_bag_tsv(sys.stdout.buffer, vectors)
            sys.stdout.flush()
        else:
            from pbgio.exporters.common import output_file

            with output_file(Path(output), overwrite) as tmp, tmp.open("wb") as out:
                write_bag_tsv(out, vectors)
            stderr_console().print(f"embedded {len(parsed):,} bags of {entity_type!r} into {output}", soft_wrap=True,
                                   markup=False)


def _offsets(features: list[str], file: str, line: int) -> list[int]:
    """The features of one line read as integer row offsets (``--offsets``)."""
    from pbgio.errors import InputError

    found = []
    for feature in features:
        try:
            found.append(int(feature))
        except ValueError:
            raise InputError(file, line, f"expected integer feature offsets (--offsets), found {feature!r}") from None
    return found
