"""The ``pbgio`` command line: validate, info, example, convert, import, export, embed, neighbors, names, index.

Exit codes: 0 valid (warnings allowed), 1 invalid data or failed command,
2 usage error (bad option, missing path), 130 interrupted.
Data goes to stdout (``--json``); messages and progress go to stderr.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pbgio.console import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    exit_codes,
    print_error,
    printable,
    stderr_console,
    widen_help_off_terminal,
)
from pbgio.options import (
    AsJson,
    BaseOption,
    CandidatesFileOption,
    CandidatesOption,
    CheckpointOption,
    ConfigArg,
    ConfinedGroup,
    NoProgress,
    Overrides,
    ProposalsOption,
    VersionOption,
)
from pbgio.progress import progress_wanted

app = typer.Typer(
    name="pbgio",
    help="Read, write and validate PyTorch-BigGraph files.",
    no_args_is_help=True,
    cls=ConfinedGroup,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"pbgio {version('pbg')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Read, write and validate PyTorch-BigGraph files."""





def _usage_error(message: str) -> typer.Exit:
    print_error(message)
    return typer.Exit(EXIT_USAGE)


@app.command()
def validate(
    path: Annotated[str, typer.Argument(help="A config .json, a layout/checkpoint directory, or one .h5 file: "
                                      "a path or an fsspec URL (s3://…, gs://…, hdfs://…).")],
    as_json: AsJson = False,
    param: Overrides = None,
    base: BaseOption = None,
    no_progress: NoProgress = False,
    max_issues: Annotated[int, typer.Option(help="Issues shown in the human report.")] = 50,
) -> None:
    """Check every rule of the format; report all problems (exit 0 valid, 1 invalid).

    What it guarantees: every file is read as the format says (counts, names, buckets, checkpoints,
    indexes) and every rule of docs/format/rules.md is checked; a layout from someone else is judged
    as a stranger's: links leading out of it, files that are not regular files, HDF5 links and
    storage in other files, sizes beyond their bounds, paths outside the config's folder and URLs of
    storage you did not name are reported, and none of them is followed, read or contacted while
    validating. It runs no code (a .py config is run only because you named it, isolated, and says
    so). A layout that validates can be given to every pbg command: they read and write only inside
    it (docs/security.md).

    What it does not guarantee: that the data is what its author says (edges and embeddings can be
    poisoned or mislabelled), that the model is any good, or that the files stay as validated
    (someone who can change them while a command runs is outside the threat model).
    """
    from rich.markup import escape

    from pbgio import storage
    from pbgio.errors import MissingArtifactError
    from pbgio.validate import validate_path

    console = stderr_console()
    with exit_codes(usage=(MissingArtifactError,)):
        base_path = None if base is None else storage.resolve(base)
        report = (_validate_with_progress(path, base_path, param or []) if progress_wanted(no_progress)
                  else validate_path(path, base=base_path, overrides=param or []))
    if as_json:
        typer.echo(report.to_json())
    else:
        for issue in report.issues[:max_issues]:
            style = "red" if issue.severity == "error" else "yellow"
            console.print(f"[{style}]{issue.severity}[/]: {escape(str(issue))}", soft_wrap=True)
        if len(report.issues) > max_issues:
            console.print(f"… {len(report.issues) - max_issues} more (use --json for all)")
        checked = ", ".join(f"{v:,} {k}" for k, v in sorted(report.checked.items()))
        verdict = "[green]valid[/]" if report.ok else "[bold red]invalid[/]"
        console.print(f"{escape(storage.display(path))}: {verdict} ({report.kind}): {len(report.errors)} error(s), "
                      f"{len(report.warnings)} warning(s); checked {checked or 'nothing'}")
    raise typer.Exit(report.exit_code)


def _validate_with_progress(path: str, base: Any, overrides: list[str]) -> Any:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from pbgio.console import printable
    from pbgio.validate import validate_path

    with Progress(TextColumn("{task.description}"), BarColumn(), TransferSpeedColumn(),
                  TimeElapsedColumn(), console=stderr_console(), transient=True) as progress:
        task = progress.add_task("validating", total=None)

        def on_bucket(name: str, size: int) -> None:  # a path of the layout's: text, never markup
            progress.update(task, description=escape(printable(f"checking {name}")), advance=size)

        return validate_path(path, base=base, on_bucket=on_bucket, overrides=overrides)


@app.command()
def info(
    path: Annotated[str, typer.Argument(help="A config .json or an artifact directory (a path or an fsspec URL).")],
    as_json: AsJson = False,
    param: Overrides = None,
    base: BaseOption = None,
) -> None:
    """Summarize a layout: types, partitions, counts, buckets, edges, checkpoint versions."""
    from pbgio import storage
    from pbgio.errors import MissingArtifactError
    from pbgio.info import summarize

    with exit_codes(usage=(MissingArtifactError,), on_interrupt=lambda: None):
        summary = summarize(path, base=None if base is None else storage.resolve(base), overrides=param or [])
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)


SHOWN_NAMES = 10
"""Relation names ``pbgio info`` prints before saying how many more there are and how to list them."""


def _print_dynamic_relations(summary: dict[str, Any], console: Any) -> None:
    """The dynamic relation types (all, or the first and the command that lists them all), then
    the config's relation as what it is with dynamic relations: the template of their operators."""
    from pbgio.names import names_command

    names = summary.get("dynamic_rel_names") or []
    count = summary["dynamic_rel_count"]
    shown = ", ".join(names[:SHOWN_NAMES]) + (
        f", … ({len(names) - SHOWN_NAMES:,} more: {names_command(None, summary['config'])}, or pbgio info --json)"
        if len(names) > SHOWN_NAMES else "")
    console.print(f"dynamic relation types: {'unreadable' if count is None else f'{count:,}'}"
                  + (f": {shown}" if names else ""), soft_wrap=True)
    for r in summary["relations"]:
        console.print(f"operator template: {r['name']!r} ({r['lhs']} → {r['rhs']}, {r['operator']}) gives "
                      f"each dynamic relation type its operators; it is not a relation of the graph", soft_wrap=True)


def _print_summary(summary: dict[str, Any]) -> None:
    """The human summary of ``pbgio info``: names and paths shown as they are (no rich markup: a
    relation named ``[/]`` is a name), their control characters escaped (the console's)."""
    from rich.table import Table

    from pbgio.console import console as make_console

    console = make_console(markup=False)
    if "config" in summary:
        console.print(f"config {summary['config']}: dimension {summary['dimension']}, "
                      f"{'dynamic' if summary['dynamic_relations'] else 'static'} relations")
        types = Table("entity type", "partitions", "featurized", "dimension", "counts", title="entities")
        for name, e in summary["entities"].items():
            counts = ", ".join("missing" if c is None else f"{c:,}" for c in e["counts"])
            if e.get("count_files_missing"):  # partitions past those listed: a number, not a list
                counts += f", … ({e['count_files_missing']:,} count files missing in all)"
            types.add_row(name, str(e["num_partitions"]), str(e["featurized"]), str(e["dimension"]), counts)
        console.print(types)
        if summary["dynamic_relations"]:
            _print_dynamic_relations(summary, console)
        else:
            rels = Table("#", "relation", "lhs", "rhs", "operator", title="relations")
            for i, r in enumerate(summary["relations"]):
                rels.add_row(str(i), r["name"], r["lhs"], r["rhs"], r["operator"])
            console.print(rels)
        edge_paths = summary["edge_paths"]
    else:
        console.print(f"{summary['path']}")
        if summary["entity_counts"]:
            console.print("entity counts: " + ", ".join(f"{k}: {v}" for k, v in summary["entity_counts"].items()))
        edge_paths = [summary["edges"]] if summary["edges"]["buckets"] else []
    for ep in edge_paths:
        table = Table("bucket", "edges", title=f"{ep['path']}: {ep['total_edges']:,} edges", title_justify="left")
        for bucket, n in ep["buckets"].items():
            table.add_row(bucket, "unreadable" if n is None else f"{n:,}")
        console.print(table)
    ck = summary["checkpoint"]
    if ck["exists"]:
        best = f", best on validation: version {ck['best_version']} (best/)" if ck.get("best_version") else ""
        indexes = f", indexes {', '.join(ck['indexes'])}" if ck.get("indexes") else ""
        console.print(f"checkpoint {ck['path']}: version {ck['version']}, versions on disk "
                      f"{ck['versions_on_disk']}, snapshots {ck['snapshots'] or 'none'}{best}{indexes}")
    else:
        console.print(f"checkpoint {ck['path']}: not written yet")
    if summary.get("training_memory"):
        console.print(f"memory: {summary['training_memory']['line']}")


@app.command()
def example(
    dest: Annotated[Path, typer.Argument(help="Directory to create the example in.")],
    edges: Annotated[int, typer.Option(help="Number of (training) edges.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    featurized: Annotated[bool, typer.Option(
        "--featurized", help="Write raw edge lists of a featurized example instead (authors read documents "
        "made of planted topic words; import them with pbgio import).")] = False,
) -> None:
    """Write a small example (planted structure) and print its config path."""
    if dest.exists() and any(dest.iterdir()):
        raise _usage_error(f"{dest}: exists and is not empty")
    if featurized:
        from pbgio.featurized_example import write_featurized_example

        typer.echo(write_featurized_example(dest, num_edges=edges, seed=seed))
        return
    from pbgio.example import build_example

    typer.echo(build_example(dest, num_edges=edges, seed=seed))


class NeighborMetric(str, enum.Enum):
    cos = "cos"
    dot = "dot"


@app.command()
def neighbors(
    config: ConfigArg,
    names: Annotated[list[str] | None, typer.Argument(
        help="Names of the entities whose neighbours to find (one or more; or --names-file).", show_default=False)
    ] = None,
    entity_type: Annotated[str | None, typer.Option(
        "--type", "-t", help="The entity type of the names (default: the config's only type).",
        show_default=False)] = None,
    k: Annotated[int, typer.Option("-k", "--top-k", min=1, help="Neighbours per name.")] = 10,
    metric: Annotated[NeighborMetric | None, typer.Option(
        "--metric", help="cos: cosine of the vectors; dot: their inner product (default: the config's comparator "
        "when it is one of them, else cos, as for pbgio index build).", show_default=False)] = None,
    device: Annotated[str, typer.Option(
        "--device", help="Where the products run: cpu (numpy) or cuda, cuda:N (torch).")] = "cpu",
    include_self: Annotated[bool, typer.Option(
        "--include-self", help="Let a name be among its own neighbours.")] = False,
    no_global: Annotated[bool, typer.Option(
        "--no-global", help="Compare the stored rows, without the type's global embedding (added by default when "
        "global_emb is true, as pbgio export adds it).")] = False,
    version: VersionOption = None,
    checkpoint: CheckpointOption = None,
    param: Overrides = None,
    base: BaseOption = None,
    as_json: AsJson = False,
    names_file: Annotated[str | None, typer.Option(
        "--names-file", help="Text file of names, one per line (- for stdin), answered together (with --index, "
        "the index is loaded once).")] = None,
    index: Annotated[bool, typer.Option(
        "--index", help="Search the version's index by --metric (pbgio index build) instead of every row; the rows "
        "it proposes are scored exactly, and the output names the index and says whether its answer is exact (a flat "
        "index) or approximate (with the recall@10 measured when it was built).")] = False,
    nprobe: Annotated[int | None, typer.Option(
        "--nprobe", min=1, help="With --index (ivf): lists to visit (default: the index's).")] = None,
    proposals: ProposalsOption = None,
    candidates: CandidatesOption = None,
    candidates_file: CandidatesFileOption = None,
) -> None:
    """Nearest neighbours of entities among the trained embeddings of their type (cos or dot): exact,
    or through the version's index with --index."""
    from pbgio.candidates import CandidateFilter, old_form_proposals
    from pbgio.errors import MissingArtifactError, MissingLibraryError
    from pbgio.layout import Layout
    from pbgio.neighbors import NeighborsError, format_neighbors, nearest_neighbors

    with exit_codes():
        if (old_form := old_form_proposals(candidates, candidates_file, index, proposals)) is not None:
            proposals, candidates = old_form, None
    index_only = [name for name, value in (("--nprobe", nprobe), ("--proposals", proposals)) if value is not None]
    if index_only and not index:
        raise _usage_error(f"{' and '.join(index_only)} appl{'y' if len(index_only) > 1 else 'ies'} to --index "
                           "searches")
    wanted = list(names or [])
    if names_file is not None:
        wanted += _read_names(names_file)
    if not wanted:
        raise _usage_error("give one or more names, or --names-file")
    with exit_codes(usage=(MissingArtifactError, MissingLibraryError, NeighborsError), on_interrupt=lambda: None):
        only = CandidateFilter.from_options(candidates, candidates_file)
        layout = Layout.load(config, base=base, overrides=param or [])
        found = nearest_neighbors(layout, entity_type, wanted, k=k, metric=None if metric is None else metric.value,
                                  include_self=include_self, add_global=not no_global, device=device,
                                  version=version, checkpoint=checkpoint, index=index, nprobe=nprobe,
                                  candidates=proposals, candidate_filter=only)
    if as_json:
        _shortfall_notes(found, k)
        typer.echo(json.dumps([f.to_dict() for f in found], indent=2))
        return
    first = found[0]
    filtered = "" if first.admitted is None else f"{printable(first.admitted.describe(first.entity_type))}; "
    how = "" if first.searched == "exact" else f"searched: {first.searched}; "
    stderr_console().print(f"{k} nearest {first.entity_type!r} entities by {first.metric} among "
                           f"{first.candidates:,} ({filtered}{how}checkpoint version {first.version})",
                           soft_wrap=True, markup=False)
    _shortfall_notes(found, k)
    typer.echo(format_neighbors(found))


def _shortfall_notes(found: list[Any], k: int) -> None:
    """On stderr, a note for each query that found fewer than ``k`` neighbours passing the
    candidate filter through the index (:meth:`pbgio.neighbors.Neighbors.shortfall`)."""
    for result in found:
        short = result.shortfall(k)
        if short is not None:
            stderr_console().print(f"note: {printable(result.query)}: {short}; without --index every entity is "
                                   "scored", soft_wrap=True, markup=False)


def _read_names(source: str) -> list[str]:
    """Names, one per line, from a file or stdin (blank lines skipped)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _usage_error(f"{source}: names file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _usage_error(f"{source}: cannot read it as UTF-8 text ({exc})") from None
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


config_app = typer.Typer(name="config", help="Run configs: convert the original's Python config files to JSON.",
                         no_args_is_help=True)
app.add_typer(config_app)


@config_app.command("from-py")
def config_from_py(
    source: Annotated[Path, typer.Argument(help="The original's Python config file (CFG.py). It is EXECUTED, "
                                           "in a subprocess, to call its get_torchbiggraph_config().")],
    output: Annotated[str, typer.Option("-o", "--output", help="JSON file to write (relative paths in the config "
                                        "are rewritten to stay right from its directory), or - for stdout "
                                        "(paths unchanged: relative to the current directory).")],
    param: Overrides = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds the file may run before it is stopped.")] = 60.0,
) -> None:
    """Convert the original's Python config to JSON. The file is EXECUTED: only run files you trust.

    CFG.py runs in a separate Python process; the dict its get_torchbiggraph_config() returns is validated.
    """
    from rich.markup import escape

    from pbgio.storage.atomic import write_text

    if not source.is_file():
        raise _usage_error(f"{source}: no such file")
    target = None if output == "-" else Path(output)
    if target is not None:
        if target.is_dir():
            raise _usage_error(f"{target}: is a directory; give the JSON file to write")
        if target.exists() and not force:
            raise _usage_error(f"{target}: exists; pass --force to replace it")
        if not target.parent.is_dir():
            raise _usage_error(f"{target.parent}: no such directory")
    with exit_codes(note=" (nothing was written)"):
        from pbgio.layout import config_from_python
        from pbgio.python_config import rebase_paths

        cfg = config_from_python(source, param or [], timeout=timeout)
        if target is None:
            typer.echo(cfg.to_json())
            return
        cfg, changed = rebase_paths(cfg, Path.cwd(), target.parent)
        write_text(target, cfg.to_json() + "\n")
    console = stderr_console()
    if changed:
        console.print(f"note: relative paths resolve against the current directory in {escape(str(source))} "
                      f"and against the JSON file's directory in {escape(str(target))}; rewritten:", soft_wrap=True)
        for key, (old, new) in changed.items():
            console.print(f"  {key}: {escape(old)} -> {escape(new)}", soft_wrap=True)
    console.print(f"wrote {escape(str(target))}", soft_wrap=True)


def _register_subcommands() -> None:
    # Each module imports only typer at import time; the heavy work is imported inside the command.
    from pbgio.cli.converting import convert
    from pbgio.cli.exporting import embed, export
    from pbgio.cli.finding import names
    from pbgio.cli.importing import import_edges
    from pbgio.cli.indexing import index_app

    app.command()(convert)
    app.command("import")(import_edges)
    app.command()(export)
    app.command()(embed)
    app.command()(names)
    app.add_typer(index_app)


_register_subcommands()


def main() -> None:
    """Console-script entry point."""
    widen_help_off_terminal()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
