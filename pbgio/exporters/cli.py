"""``pbgio export``: embeddings and relation parameters as tables.

Register with ``app.command("export")(export)``.

Exit codes: 0 exported, 1 bad checkpoint or entity files, 2 usage error (bad option,
missing file, an output that exists without ``--overwrite``), 130 interrupted.
Imports only typer at import time.
"""

from __future__ import annotations

import contextlib
import enum
import json
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _error(message: str) -> None:
    from rich.markup import escape

    _console().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


Output = Annotated[Path | None, typer.Option(
    "--output", "-o", "--entities-output",
    help="Embeddings output: the TSV file; for parquet and npy a directory ({type}.parquet, {type}.npy + "
    "{type}.names.json) or, with one entity type, the file itself.")]
Format = Annotated[EmbeddingFormat, typer.Option("--format", "-f", help="Embeddings format.")]
RelationsOutput = Annotated[Path | None, typer.Option(
    "--relations-output", "--relation-types-output", help="Relation operator parameters output file.")]
RelationsFormat = Annotated[RelationFormat, typer.Option("--relations-format",
                                                         help="Relation parameters format.")]
Version = Annotated[int | None, typer.Option(
    "--version", help="Checkpoint version (default: the committed one).")]
EntityTypes = Annotated[list[str] | None, typer.Option(
    "--entity-type", "-t", help="Export this entity type (repeatable; default: all).")]
NoGlobal = Annotated[bool, typer.Option(
    "--no-global", help="Do not add the global embedding of each type (the original adds it when global_emb "
    "is true).")]
Layout = Annotated[ParquetLayout, typer.Option(
    "--parquet-layout", help="Parquet values: one fixed-size list column, or one column per dimension.")]
Checkpoint = Annotated[Path | None, typer.Option(
    "--checkpoint", help="Checkpoint directory (default: the config's checkpoint_path).")]
Base = Annotated[Path | None, typer.Option(
    "--base", help="Directory that relative paths in the config resolve against (default: the config's "
    "directory).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the export report as JSON on stdout.")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="No progress bars.")]


def export(
    config: Annotated[Path, typer.Argument(help="The run config (.json) of the trained model.")],
    output: Output = None,
    fmt: Format = EmbeddingFormat.tsv,
    relations_output: RelationsOutput = None,
    relations_format: RelationsFormat = RelationFormat.tsv,
    version: Version = None,
    entity_type: EntityTypes = None,
    no_global: NoGlobal = False,
    parquet_layout: Layout = ParquetLayout.list,
    checkpoint: Checkpoint = None,
    base: Base = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Export trained embeddings (TSV, Parquet, npy) and relation parameters (TSV, JSON)."""
    from rich.markup import escape

    from pbgio.errors import MissingArtifactError, PbgioError
    from pbgio.exporters.common import OutputExistsError
    from pbgio.exporters.embeddings import export_embeddings
    from pbgio.exporters.relations import export_relations
    from pbgio.progress import Progress, RichProgress, progress_wanted

    if output is None and relations_output is None:
        _error("nothing to export: give --output and/or --relations-output")
        raise typer.Exit(EXIT_USAGE)
    console = _console()
    reports = []
    try:
        if output is not None:
            bars: contextlib.AbstractContextManager[Progress] = (
                RichProgress() if progress_wanted(no_progress) else contextlib.nullcontext(Progress()))
            with bars as progress:
                reports.append(export_embeddings(
                    config, output, fmt=fmt.value, version=version, entity_types=entity_type or None,
                    add_global=not no_global, parquet_layout=parquet_layout.value, checkpoint=checkpoint,
                    base=base, overwrite=overwrite, progress=progress))
        if relations_output is not None:
            reports.append(export_relations(
                config, relations_output, fmt=relations_format.value, version=version, checkpoint=checkpoint,
                base=base, overwrite=overwrite))
    except (MissingArtifactError, OutputExistsError) as exc:
        _error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except PbgioError as exc:
        _error(str(exc))
        raise typer.Exit(EXIT_INVALID) from None
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    for report in reports:
        console.print(escape(report.summary()), soft_wrap=True)
        for path in report.outputs:
            console.print(f"  wrote {escape(path)}", soft_wrap=True)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in reports], indent=2))
