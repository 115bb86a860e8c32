"""The ``pbgtrain`` command line: fit, eval, predict, config, report.

Exit codes: 0 done, 1 failed (invalid data or config, unreadable checkpoint), 2 usage
error, 130 interrupted (the last committed checkpoint is intact; rerun ``fit`` to resume).
Results go to stdout (``--json`` for machines); progress and messages go to stderr.
Heavy modules (torch) are imported inside the commands so ``--help`` is instant.

Why this module is long: it declares the options of five commands, each with its help text; the
body of each command is a few lines that call its library.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from pbgio.console import EXIT_INTERRUPTED, EXIT_USAGE, exit_codes, print_error, printable, widen_help_off_terminal
from pbgio.options import (
    RELATIVE_TO_CONFIG,
    AsJson,
    BaseOption,
    CandidatesFileOption,
    CandidatesOption,
    ConfigArg,
    ConfinedGroup,
    NoProgress,
    Overrides,
    ProposalsOption,
    VersionOption,
)
from pbgio.options import DeviceOption as Device
from pbgio.progress import progress_wanted
from pbgtrain.choices import OperatorInit, PrecisionChoice, StepKind, UnknownFeatures

app = typer.Typer(
    name="pbgtrain",
    help="Train and evaluate PyTorch-BigGraph embeddings on files handled by pbgio.",
    no_args_is_help=True,
    cls=ConfinedGroup,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


PrecisionOption = Annotated[PrecisionChoice | None, typer.Option(
    "--precision", help="Matrix products in fp32 (the reference), tf32 (CUDA tensor cores), bf16, or auto: bf16 "
    "where the device computes it natively (a GPU; a CPU with AVX-512 BF16 or AMX), else fp32. Embeddings and "
    "optimizer state stay float32. The choice is said on the run's first lines (default: bf16 on a GPU when the "
    "config sets half_precision, else fp32).")]


def _load(config: str, overrides: list[str] | None, base: str | None) -> Any:
    """The run's :class:`pbgio.layout.Layout` (a bad config exits 1 with every problem)."""
    from pbgio import storage
    from pbgtrain.config import load_run_config

    with exit_codes(on_interrupt=lambda: None):
        return load_run_config(config, overrides or [], None if base is None else storage.resolve(base))


@app.command()
def fit(
    config: ConfigArg,
    param: Overrides = None,
    device: Device = None,
    precision: PrecisionOption = None,
    partition_memory: Annotated[float | None, typer.Option(
        "--partition-memory", help="GiB of memory (on the training device) for partitions the current bucket "
        "does not use, kept there instead of swapped out to disk until the iteration commits (default: a GPU's "
        "free memory less a quarter; 0 on a CPU, where only the current bucket's partitions are in memory). "
        "Single-process runs only.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of initialization, shuffling and sampling.")] = 0,
    operator_init: Annotated[OperatorInit, typer.Option(
        "--operator-init", help="How a fresh run's relation operators start: drawn from init_scale · N(0, 1) like "
        "the entities (random, the default: better on 4 of 6 graphs measured, and no entity starts as its own "
        "best answer), or as the identity (the original's behaviour). Operators read from the checkpoint or "
        "init_path replace them either way; pbgtrain's own option.")] = OperatorInit.random,
    relation_prediction: Annotated[float, typer.Option(
        "--relation-prediction", metavar="W", help="Also train each edge to predict its relation: every relation "
        "is scored for the edge's pair on each side, and W times that cross-entropy is added to the loss (an "
        "auxiliary objective, Chen et al. 2021; dynamic relations only). Only training changes: the checkpoint is "
        "an ordinary one. 0: off; pbgtrain's own option.")] = 0.0,
    step: Annotated[StepKind, typer.Option(
        "--step", help="The training step: attention (the softmax over negatives computed as fused attention, "
        "no score matrix written out; softmax loss with the dot or cos comparator; violators counted on a sample), "
        "scores (the score matrices: every loss and comparator), or auto: attention where it applies on a GPU, "
        "scores elsewhere (on a CPU the faster). The run's first lines say which, and why.")] = StepKind.auto,
    capture: Annotated[bool | None, typer.Option(
        "--capture/--no-capture", help="Replay the step: captured once per batch shape as a CUDA graph on a GPU "
        "(the default there with the attention step), or through the same driver on a CPU. Batches are padded to "
        "batch_size.", show_default=False)] = None,
    compile_step: Annotated[bool, typer.Option(
        "--compile", help="Fuse the score-matrix step's elementwise passes (softmax loss, violators) with "
        "torch.compile: Triton kernels on a GPU, C++ on a CPU (needs a C compiler); tens of seconds to compile, "
        "once.")] = False,
    static_shapes: Annotated[bool, typer.Option(
        "--static-shapes", help="Pad every batch to batch_size with zero-weight edges, masked wherever they would "
        "count: every step has the same shapes (what capturing the step needs; the same embeddings with the "
        "softmax or ranking loss and shared uniform negatives).")] = False,
    base: BaseOption = None,
    no_validate: Annotated[bool, typer.Option("--no-validate", help="Skip validating the input layout.")] = False,
    max_minutes: Annotated[float | None, typer.Option(
        help="Stop after the first committed checkpoint past this many minutes of training. A new checkpoint "
        "takes more edge chunks than the config's when an iteration would train longer than a tenth of this "
        "(the step's rate measured first; said on a line): the run of -p num_edge_chunks=K, resumed with "
        "K.")] = None,
    max_iterations: Annotated[int | None, typer.Option(
        help="Stop after committing this many iterations (edge chunks); run again to continue.")] = None,
    no_progress: NoProgress = False,
    rank: Annotated[int | None, typer.Option(
        "--rank", help="This trainer's rank (0 … num_machines-1) in a distributed run whose trainers meet at the "
        "config's distributed_init_method, as in the original. Not needed under torchrun.")] = None,
    peer_timeout: Annotated[float, typer.Option(
        help="Distributed runs: seconds without a sign of life from another trainer before every trainer "
        "stops with an error naming it.")] = 60.0,
    freeze: Annotated[list[str] | None, typer.Option(
        "--freeze", metavar="TYPE", help="Keep the embeddings of entity type TYPE fixed while the rest trains: "
        "its tables (every partition, feature tables of a featurized type), their Adagrad state and its global "
        "embedding stay bit for bit as loaded (from the checkpoint, init_path or the seeded initialization); it "
        "still gives negatives. Applies to the iterations this command runs (the checkpoint does not record it). "
        "Repeatable; pbgtrain's own option, not the original's.")] = None,
    valid: Annotated[str | None, typer.Option(
        "--valid", metavar="PATH", help="Validation edge path: every --eval-every epochs (and at the end) rank its "
        "edges against all entities (filtered by --filter), keep the best version in CHECKPOINT_PATH/best/, and "
        "with --patience stop early. Records go to training_stats.json (pbgtrain's key); single-process runs."
        + RELATIVE_TO_CONFIG)] = None,
    filter_paths: Annotated[list[str] | None, typer.Option(
        "--filter", metavar="PATH", help="With --valid: edge path of known edges left out of the candidates "
        "(default: the config's edge_paths and the --valid path). Repeatable." + RELATIVE_TO_CONFIG)] = None,
    eval_every: Annotated[int, typer.Option(
        "--eval-every", metavar="N", help="With --valid: evaluate after every N-th epoch.")] = 1,
    patience: Annotated[int | None, typer.Option(
        "--patience", metavar="P", help="With --valid: stop after P evaluations in a row without a better "
        "validation MRR (default: never stop early).")] = None,
    lr_decay: Annotated[float | None, typer.Option(
        "--lr-decay", metavar="F", help="With --valid: multiply lr and relation_lr by F (0 < F < 1) after "
        "--lr-patience evaluations without a better validation MRR.")] = None,
    lr_patience: Annotated[int, typer.Option(
        "--lr-patience", metavar="Q", help="With --lr-decay: evaluations without improvement (since the best or "
        "the last decay) before the learning rates decay.")] = 1,
    valid_sample: Annotated[int | None, typer.Option(
        "--valid-sample", metavar="N", help="With --valid: rank a sample of N of the validation edges instead of "
        "all (drawn uniformly without repeats by --seed, the same edges at every evaluation; a validation costs "
        "about its edges × the entities ranked). Each validation line and record says so.")] = None,
    last_share: Annotated[float | None, typer.Option(
        "--last-validation-share", metavar="F", help="With --valid and --max-minutes: past the time cap, the last "
        "version is validated all the same when its validation is expected (from the run's earlier ones) to take "
        "less than F × an epoch of training, so that best/ holds the best version; else the last line says which "
        "version was never validated and what best/ holds. 0: never. [default: 0.1]")] = None,
) -> None:
    """Train: resume from the latest committed checkpoint, commit one version per edge chunk.

    Distributed: run it once per trainer, with --rank R (num_machines and distributed_init_method from
    the config) or under torchrun (torchrun --nproc-per-node K -m pbgtrain fit cfg.json).
    """
    from pbgio.errors import CheckpointInUseError
    from pbgtrain.train import FitOptions, ValidationOptions
    from pbgtrain.train import fit as run_fit

    layout = _load(config, param, base)
    if valid is None and (filter_paths or patience is not None or lr_decay is not None or valid_sample is not None
                          or last_share is not None):
        print_error("--filter, --patience, --lr-decay, --valid-sample and --last-validation-share go with --valid PATH "
                    "(the validation edge path)")
        raise typer.Exit(EXIT_USAGE)
    validation = None if valid is None else ValidationOptions(
        valid, tuple(filter_paths or ()), eval_every, patience, lr_decay, lr_patience, valid_sample,
        **({} if last_share is None else {"last_share": last_share}))
    options = FitOptions(device=device, seed=seed, check_layout=not no_validate,
                         interactive=progress_wanted(no_progress),
                         max_seconds=None if max_minutes is None else max_minutes * 60,
                         max_iterations=max_iterations, rank=rank, peer_timeout=peer_timeout,
                         precision=None if precision is None else precision.value,
                         partition_memory=partition_memory, compile=compile_step, static_shapes=static_shapes,
                         step=step.value, capture=capture,
                         frozen_types=frozenset(freeze or ()),
                         validation=validation, operator_init=operator_init.value,
                         relation_prediction=relation_prediction)
    distributed = rank is not None or _under_torchrun()
    if distributed:
        _stop_on_sigterm()
    try:
        with exit_codes(usage=(CheckpointInUseError,), on_interrupt=lambda: _interrupted_fit(layout)):
            result = run_fit(layout, options)
    except typer.Exit as stop:
        if distributed:  # leave now: a lost peer can leave gloo's threads waiting at interpreter exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stop.exit_code)
        raise
    typer.echo(result.summary())


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _stop_on_sigterm() -> None:
    """torchrun stops its workers with SIGTERM (on Ctrl-C, or when one fails): stop as on Ctrl-C."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _interrupted_fit(layout: Any) -> None:
    from pbgio.checkpoint import CheckpointDir

    version = CheckpointDir(layout.checkpoint_path).read_version()
    if not version:
        print_error("interrupted before the first commit: nothing was committed (no checkpoint version yet); run "
                    "the same command to start again")
        return
    print_error(f"interrupted; checkpoint version {version} is committed and intact; run the same "
                "command to resume from it")


@app.command("eval")
def evaluate(
    config: ConfigArg,
    param: Overrides = None,
    edges: Annotated[list[str] | None, typer.Option(
        "--edges", help="Edge directory to evaluate (default: the config's edge_paths). Repeatable."
        + RELATIVE_TO_CONFIG)] = None,
    filter_paths: Annotated[list[str] | None, typer.Option(
        "--filter", help="Edge directory whose edges are known true and are not counted as better-ranked "
        "(filtered ranking). Repeatable." + RELATIVE_TO_CONFIG)] = None,
    all_entities: Annotated[bool, typer.Option(
        "--all-entities", help="Rank against every entity of the partition instead of the config's "
        "eval_num_batch_negs + eval_num_uniform_negs sampled candidates (implied by --filter).")] = False,
    version: VersionOption = None,
    device: Device = None,
    seed: Annotated[int, typer.Option(help="Seed of sampled candidates and of --sample.")] = 0,
    sample: Annotated[int | None, typer.Option(
        "--sample", metavar="N", min=1, help="Rank a sample of N of the edges instead of all (drawn uniformly "
        "without repeats by --seed: the same edges at every run, as fit's --valid-sample draws them). The result "
        "line and --json say so. Before ranking, a line on stderr says the edges × candidates and the time to "
        "expect.", show_default=False)] = None,
    per_relation: Annotated[bool, typer.Option(
        "--per-relation", help="Also the figures of each relation's edges (a table after the summary; "
        "\"per_relation\" with --json). With dynamic relations, ranks against all entities (--all-entities or "
        "--filter).")] = False,
    base: BaseOption = None,
    as_json: AsJson = False,
    no_progress: NoProgress = False,
) -> None:
    """Evaluate a checkpoint: MRR, MR, Hits@1/3/10/50, AUC, each side and averaged, with the protocol."""
    from pbgio import storage
    from pbgio.errors import MissingArtifactError
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint, trained_on

    layout = _load(config, param, base)
    with exit_codes(usage=(MissingArtifactError,)):  # layout parts: relative to the config's folder
        edge_paths = None if edges is None else [layout.existing_dir(e, "--edges") for e in edges]
        filters = [layout.existing_dir(f, "--filter") for f in filter_paths or []]
    options = EvalOptions(edge_paths=edge_paths, filter_paths=filters, all_entities=all_entities or bool(filters),
                          version=version, device=device, seed=seed, interactive=progress_wanted(no_progress),
                          per_relation=per_relation, sample=sample, watched=True)
    with exit_codes(on_interrupt=lambda: None):
        opened = layout.open_checkpoint(version, model=True)  # a missing checkpoint stops here, before warnings
        for path in map(printable, trained_on(opened, options.edge_paths)):
            typer.echo(f"warning: {path}: the model trained on these edges (the checkpoint's config.json), so these "
                       "are not held-out figures (evaluate a split it did not train on, with --edges)", err=True)
        result = evaluate_checkpoint(opened, options)
        untrained = _untrained(opened, options.edge_paths)
    if as_json:
        typer.echo(json.dumps(result.to_dict() | {"untrained_edges": untrained}, indent=2))
    else:  # the edge paths of a layout, shown: their secrets redacted, their control characters escaped
        typer.echo(printable(storage.display(result.summary())))
        if untrained["count"]:
            typer.echo(printable(storage.display(_untrained_line(untrained))))
    if result.per_relation is not None and not as_json:
        _print_per_relation(result.per_relation)


def _untrained(opened: Any, edge_paths: list[Any] | None) -> dict[str, Any]:
    """The evaluated edges naming an entity that no edge of the training paths names."""
    from pbgio import storage
    from pbgio.leakage import untrained_edges
    from pbgtrain.evaluate import training_paths

    trained = training_paths(opened)
    count, total = untrained_edges(opened.layout, trained, edge_paths or opened.layout.edge_paths)
    return {"count": count, "share": count / total if total else 0.0,
            "training_paths": [storage.display(p) for p in trained]}


def _untrained_line(untrained: dict[str, Any]) -> str:
    return (f"{untrained['count']:,} of the evaluated edges ({untrained['share']:.1%}) name an entity that no "
            f"training edge names (its vector was never trained; training paths: "
            f"{', '.join(untrained['training_paths'])})")


def _print_per_relation(per_relation: dict[str, Any]) -> None:
    """One row per relation: its edges and figures, the protocol of the summary above."""
    from rich.table import Table

    from pbgio.console import console

    table = Table("relation", "edges", "MRR", "MR", "Hits@1", "Hits@10", title="per relation", title_justify="left")
    for name, m in per_relation.items():
        table.add_row(name, f"{m.count:,}", f"{m.mrr:.4f}", f"{m.mr:.2f}", f"{m.hits.get(1, float('nan')):.4f}",
                      f"{m.hits.get(10, float('nan')):.4f}")
    console(markup=False).print(table)  # relation names are data: "[/]" is a name, not markup


@app.command()
def predict(
    config: ConfigArg,
    lhs: Annotated[str | None, typer.Option(
        "--lhs", help="Name of the left-hand entity: rank the rhs candidates of (LHS, REL).")] = None,
    rel: Annotated[str | None, typer.Option(
        "--rel", help="Relation name (the config's, or dynamic_rel_names.json with dynamic relations).")] = None,
    rhs: Annotated[str | None, typer.Option(
        "--rhs", help="Name of the right-hand entity: rank the lhs candidates of (REL, RHS); with --lhs too, "
        "score the triple and rank it on both sides.")] = None,
    lhs_features: Annotated[str | None, typer.Option(
        "--lhs-features", help="A bag of features on the lhs, where the relation's lhs type is featurized (names "
        "of its feature dictionary, separated by --feature-separator; e.g. the words of a new document): rank the "
        "rhs candidates (a plain type) for it, as the model scores an entity made of these features.")] = None,
    rhs_features: Annotated[str | None, typer.Option(
        "--rhs-features", help="A bag of features on the rhs, where the relation's rhs type is featurized: rank "
        "the lhs candidates for it (as --lhs-features).")] = None,
    k: Annotated[int, typer.Option("-k", "--top-k", min=1, help="Candidates to list.")] = 10,
    filter_paths: Annotated[list[str] | None, typer.Option(
        "--filter", help="Edge directory whose edges are known true: candidates forming one with the query are "
        "left out (filtered ranking). Repeatable." + RELATIVE_TO_CONFIG)] = None,
    triples: Annotated[str | None, typer.Option(
        "--triples", help="File of lhs, rel, rhs names, one triple a line (- for stdin), separated by --delimiter: "
        "print each triple with its score, in order, as TSV with a header (instead of --lhs/--rel/--rhs).")] = None,
    delimiter: Annotated[str, typer.Option(
        "--delimiter", help="What separates the fields of --triples and --queries: tab, comma, semicolon, pipe, "
        "space, whitespace or one character; fields may be quoted as CSV writers quote them (as pbgio import "
        "reads them).")] = "tab",
    queries: Annotated[str | None, typer.Option(
        "--queries", help="File of top-k queries (- for stdin), one per line, separated by --delimiter: lhs, rel "
        "and an empty rhs rank rhs candidates (lhs<TAB>rel<TAB>), an empty lhs, rel and rhs rank lhs ones; "
        "where the given side's type is featurized, its field is a bag of features (separated by "
        "--feature-separator: one bag a line); answered with one loaded model (and index); TSV output with a "
        "header.")] = None,
    feature_separator: Annotated[str, typer.Option(
        "--feature-separator", help="What separates the features of --lhs-features, --rhs-features and of a "
        "featurized field of --queries (default: runs of whitespace, as pbgio embed splits bags).")] = "",
    unknown: Annotated[UnknownFeatures | None, typer.Option(
        "--unknown", help="Features of a bag that the featurized type's dictionary lacks: fail, naming them "
        "(error, the default), or skip them (ignore: the output lists those skipped). A bag left without features "
        "fails either way.")] = None,
    index: Annotated[bool, typer.Option(
        "--index", help="Top-k through the candidate type's index by the model's metric (pbgio index build): the "
        "query is moved through the relation's operator, the index proposes candidates, the model scores them "
        "exactly, and the output names the index and says whether its answer is exact (a flat index) or "
        "approximate (with the recall@10 measured when it was built). Where the comparator allows no such query, or "
        "no index has its metric, every candidate is scored (and the output says why).")] = False,
    nprobe: Annotated[int | None, typer.Option(
        "--nprobe", min=1, help="With --index (ivf): lists to visit (default: the index's).")] = None,
    proposals: ProposalsOption = None,
    candidates: CandidatesOption = None,
    candidates_file: CandidatesFileOption = None,
    exclude_self: Annotated[bool, typer.Option(
        "--exclude-self", help="Top-k: leave the query entity itself out of the candidates (when it is of their "
        "type).")] = False,
    param: Overrides = None,
    version: VersionOption = None,
    device: Device = None,
    base: BaseOption = None,
    as_json: AsJson = False,
) -> None:
    """Score by name: the top-k entities for (entity, relation), a triple's ranks, or the scores of triples.

    Uses the model's own operator and comparator; every partition of the candidate type is ranked,
    or, with --index, the candidates its index proposes. A featurized side is given as a bag of
    features (--lhs-features, --rhs-features), and the other side's table is ranked for it.
    """
    from pbgio.candidates import CandidateFilter, old_form_proposals
    from pbgtrain.predict_options import PredictChoices, usage_problem

    with exit_codes():
        if (old_form := old_form_proposals(candidates, candidates_file, index, proposals)) is not None:
            proposals, candidates = old_form, None
    problem = usage_problem(PredictChoices(
        lhs, rhs, rel, lhs_features, rhs_features, triples, queries, bool(filter_paths), feature_separator, unknown,
        index, nprobe, proposals, bool(candidates), candidates_file is not None))
    if problem:
        print_error(problem)
        raise typer.Exit(EXIT_USAGE)
    from pbgio.fields import parse_delimiter

    try:
        separator = parse_delimiter(delimiter)
    except ValueError as exc:
        print_error(f"--delimiter: {exc}")
        raise typer.Exit(EXIT_USAGE) from None

    with exit_codes():
        only = CandidateFilter.from_options(candidates, candidates_file)
    if queries is not None:
        _predict_batch(config, queries, separator, k=k, filter_paths=filter_paths or [], index=index, nprobe=nprobe,
                       candidates=proposals, candidate_filter=only, param=param, version=version, device=device,
                       base=base, as_json=as_json, exclude_self=exclude_self, feature_separator=feature_separator,
                       unknown=(unknown or UnknownFeatures.error).value)
        return
    if triples is None and (rel is None or (lhs is None and rhs is None)) and lhs_features is None \
            and rhs_features is None:
        print_error("give --rel and --lhs (rank rhs candidates), --rhs (rank lhs candidates) or both (rank the "
                    "triple); or --triples FILE, or --queries FILE")
        raise typer.Exit(EXIT_USAGE)
    text = None
    if triples == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            print_error(f"<stdin>: cannot read it as UTF-8 text ({exc})")
            raise typer.Exit(EXIT_USAGE) from None
    from pbgio.console import stderr_console
    from pbgio.errors import MissingArtifactError
    from pbgtrain import predict as pred

    where, bag = ("--lhs-features", lhs_features) if lhs_features is not None else ("--rhs-features", rhs_features)
    features = None if bag is None else pred.split_features(bag, feature_separator)
    if features == []:
        print_error(f"{where}: expected at least one feature, found none")
        raise typer.Exit(EXIT_USAGE)
    parsed = None
    if triples is not None:
        with exit_codes(usage=(MissingArtifactError,)):  # a missing input is a usage error, as for embed
            parsed = (pred.parse_triples(text, "<stdin>", separator) if text is not None
                      else pred.read_triples(triples, separator))
    layout = _load(config, param, base)
    with exit_codes(usage=(MissingArtifactError,)):  # layout parts: relative to the config's folder
        filters = [layout.existing_dir(f, "--filter") for f in filter_paths or []]
    result: Any
    with exit_codes(on_interrupt=lambda: None):
        if parsed is not None:
            result = pred.score_triples(layout, parsed, version=version, device=device)
        elif lhs is not None and rhs is not None:
            assert rel is not None
            result = pred.rank_triple(layout, lhs, rel, rhs, filter_paths=filters, version=version, device=device)
        else:
            assert rel is not None
            result = pred.top_k(layout, lhs=lhs, rel=rel, rhs=rhs, k=k, filter_paths=filters, version=version,
                                device=device, index=index, nprobe=nprobe, candidates=proposals,
                                candidate_filter=only, exclude_self=exclude_self,
                                **{"lhs_features" if lhs_features is not None else "rhs_features": features},
                                unknown=(unknown or UnknownFeatures.error).value, where=where)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    if isinstance(result, pred.ScoredTriples):
        stderr_console().print(result.meaning(), soft_wrap=True, markup=False)
    else:
        stderr_console().print(result.describe(), soft_wrap=True, markup=False)
    table = result.format()
    if table:
        typer.echo(table)


def _shortfall_notes(results: list[Any]) -> None:
    """On stderr, a note for each top-k of ``--queries`` that found fewer than k candidates passing
    the candidate filter through the index."""
    from pbgio.console import stderr_console

    for number, ranking in enumerate(results, 1):
        short = ranking.shortfall()
        if short is not None:
            stderr_console().print(f"note: query {number}: {short}; without --index every candidate is scored",
                                   soft_wrap=True, markup=False)


def _predict_batch(config: str, source: str, separator: str, *, k: int, filter_paths: list[str], index: bool,
                   nprobe: int | None, candidates: int | None, candidate_filter: Any, param: list[str] | None,
                   version: int | None,
                   device: str | None, base: str | None, as_json: bool, exclude_self: bool, feature_separator: str,
                   unknown: Any) -> None:
    """``predict --queries``: every top-k query of a file, from one loaded model (and index)."""
    from pbgio.errors import MissingArtifactError, MissingLibraryError
    from pbgtrain import predict as pred

    with exit_codes(usage=(MissingArtifactError,)):
        parsed = (pred.parse_queries(sys.stdin.read(), "<stdin>", separator) if source == "-"
                  else pred.read_queries(source, separator))
    layout = _load(config, param, base)
    with exit_codes(usage=(MissingArtifactError,)):  # layout parts: relative to the config's folder
        filters = [layout.existing_dir(f, "--filter") for f in filter_paths]
    results = []
    with exit_codes(usage=(MissingArtifactError, MissingLibraryError), on_interrupt=lambda: None), \
            pred.Predictor(layout, version=version, device=device, index=index, nprobe=nprobe,
                           candidates=candidates) as predictor:
        for query in parsed:
            results.append(predictor.answer(query, k=k, filter_paths=filters, exclude_self=exclude_self,
                                            feature_separator=feature_separator, unknown=unknown,
                                            candidate_filter=candidate_filter))
    _shortfall_notes(results)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
        return
    typer.echo(pred.format_rankings(results))


@app.command("config")
def show_config(
    config: Annotated[str | None, typer.Argument(help="The run config (.json or the original's .py); omit it with "
                                                 "--schema.")] = None,
    param: Overrides = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the config's JSON Schema instead.")] = False,
) -> None:
    """Print the effective config (defaults filled in, overrides applied) or its JSON Schema."""
    if schema:
        from pbgio.config import config_json_schema

        typer.echo(json.dumps(config_json_schema(), indent=2))
        return
    if config is None:
        print_error("give a config file, or --schema")
        raise typer.Exit(EXIT_USAGE)
    typer.echo(_load(config, param, None).config.to_json())


@app.command("report")
def report(
    config: ConfigArg,
    output: Annotated[str, typer.Option(
        "-o", "--output", help="PNG to write (replaced if it exists): a path or an fsspec URL.")
    ] = "training-report.png",
    html: Annotated[str | None, typer.Option(
        "--html", help="Also write an HTML page: the same plots (embedded), the figures per iteration and "
        "the run config.")] = None,
    version: Annotated[int | None, typer.Option(
        "--version", help="Draw the run as it stood after this version, marked (default: all of it).")] = None,
    param: Overrides = None,
    base: BaseOption = None,
) -> None:
    """Plot loss, held-out metrics, validation (fit --valid) and edges/s per iteration from training_stats.json.

    The validation panel shows MRR and Hits@10 by version, the best version starred, learning-rate
    changes and the early stop. A kept version (-p checkpoint_path=model/best, or epoch_K) is
    drawn with its run, the version marked. Needs matplotlib: pip install 'pbg\\[report]'.
    """
    from pbgio import confinement, storage
    from pbgtrain.report import load_report, require_matplotlib, write_report

    layout = _load(config, param, base)
    for named in filter(None, (output, html)):  # this command's outputs, its default (in the current directory) too
        confinement.admit(named, write=True)
    targets = [storage.resolve(output), *([] if html is None else [storage.resolve(html)])]
    with exit_codes(on_interrupt=lambda: None):
        require_matplotlib()
        training = load_report(layout, version)
        write_report(training, *targets)
    typer.echo(training.summary())
    for target in targets:
        typer.echo(f"wrote {storage.display(target)}")


def main() -> None:
    """Console-script entry point."""
    widen_help_off_terminal()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
