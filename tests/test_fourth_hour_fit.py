"""Issue 56, a new user's fourth hour, points 1, 2 and 3 (``pbgtrain fit``), each met through the real
command line: ``--valid`` on a featurized graph (featurized lhs, rhs, both; with the options that go
with it) ranking as ``pbgtrain eval --filter`` ranks, or same-batch candidates where no relation has a
plain side to rank, and saying which; the last version of a run stopped by its time cap validated or
named; and ``--max-minutes`` choosing the edge chunks that keep an iteration short, a run that is then
the run of those chunks given by hand, file for file, resumed as it was."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.featurized_example import write_featurized_example
from pbgio.spec.stats import EXTRA_KEY
from tests import test_new_user_fit
from tests.cli import pbgio, pbgtrain

TRAIN = ("-p", "edge_paths=data/train", "--no-progress")
graph = test_new_user_fit.graph  # the imported WordNet-like graph (3 epochs, dimension 8): one fixture for both
SIDES = ("lhs", "rhs", "both")
EDGES = 400  # training edges of the featurized layouts (a tenth as many test edges)
BATCH = 100


def _featurized(root: Path, side: str, *, dynamic: bool = False) -> Path:
    """pbgio's featurized example (authors read documents: ``doc`` featurized on the rhs), turned so
    that the featurized type is on ``side`` (``both``: a document cites a document), imported."""
    config = write_featurized_example(root, num_edges=EDGES)
    cfg = json.loads(config.read_text())
    if side != "rhs":
        for name in ("train.tsv", "test.tsv"):
            rows = [line.split("\t") for line in (root / name).read_text().splitlines()]
            lines = [f"{words}\treads\t{author}" if side == "lhs" else f"{words}\treads\t{words.split()[0]} {author}"
                     for author, _, words in rows]
            (root / name).write_text("\n".join(lines) + "\n")
        cfg["relations"][0].update(lhs="doc", rhs="author" if side == "lhs" else "doc")
    cfg.update(num_epochs=2, batch_size=BATCH, num_batch_negs=20, eval_num_batch_negs=20)
    if dynamic:
        cfg.update(dynamic_relations=True, global_emb=False)
        cfg["relations"][0]["operator"] = "translation"
    config.write_text(json.dumps(cfg))
    done = pbgio("import", str(config), str(root / "train.tsv"), str(root / "test.tsv"))
    assert done.returncode == 0, done.stderr
    return config


@pytest.fixture(scope="module")
def featurized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three layouts (and the rhs one with dynamic relations), imported once; each test trains
    into a checkpoint path of its own."""
    root = tmp_path_factory.mktemp("featurized")
    layouts = {side: _featurized(root / side, side) for side in SIDES}
    layouts["rhs-dynamic"] = _featurized(root / "rhs-dynamic", "rhs", dynamic=True)
    return layouts


def _records(checkpoint: Path, key: str) -> list[dict[str, Any]]:
    lines = CheckpointDir(checkpoint).read_stats()
    return [line[EXTRA_KEY][key] for line in lines if key in line.get(EXTRA_KEY, {})]


def _last_line(done: Any) -> str:
    return done.stdout.strip().splitlines()[-1]


# --------------------------------------------------------------------------- 1. --valid on a featurized graph


COMPANIONS = {
    "alone": (),
    "sample": ("--valid-sample", "25"),
    "patience": ("--patience", "1", "--lr-decay", "0.5", "--lr-patience", "1"),
    "freeze": ("--freeze", "doc"),
}
NOT_RANKED = "('doc' is featurized: its bags have no table to rank against)"
SAME_BATCH_NOTE = ("validation: --valid ranks same-batch candidates (the config's eval negatives), not all entities: "
                   "every side that takes negatives is featurized (entity type 'doc': bags of features, with no table "
                   "to rank against) (each validation line states the protocol)")


def _authors(config: Path) -> int:
    """The entities a plain side is ranked against: the layout's authors, as ``pbgio import`` counted them."""
    return int((config.parent / "data" / "entity_count_author_0.txt").read_text())


def _expected(config: Path, side: str, *, dynamic: bool = False, filters: str = "train+test") -> tuple[str, str]:
    """The line before training and each validation's protocol for the layout whose ``side`` is
    featurized: its plain side ranked against all authors as ``eval --filter`` ranks it (the filter
    paths named ``filters``: by default the training path and the validation path), the featurized
    side named as not ranked; with both sides featurized, same-batch candidates."""
    if side == "both":
        return SAME_BATCH_NOTE, "raw, 20 batch negatives, both sides averaged"
    ranked = "rhs" if side == "lhs" else "lhs"
    not_ranked = f"the {side} side of {'every relation' if dynamic else repr('reads')} {NOT_RANKED}"
    note = (f"validation: --valid ranks the {ranked} side against all entities, filtered (against {filters}), as "
            f"pbgtrain eval --filter ranks; not ranked: {not_ranked} (each validation line states the protocol)")
    return note, (f"filtered (against {filters}), all {_authors(config)} entities as candidates, {ranked} side only; "
                  f"not ranked: {not_ranked}")


def _said_before_training(done: Any, note: str) -> bool:
    lines = done.stderr.splitlines()
    return note in lines and lines.index(note) < next(i for i, line in enumerate(lines) if line.startswith("epoch 1/"))


@pytest.mark.parametrize("companion", list(COMPANIONS))
@pytest.mark.parametrize("side", SIDES)
def test_valid_on_a_featurized_graph_ranks_as_eval_filter_does_and_says_which_sides(
        featurized: dict[str, Path], side: str, companion: str) -> None:
    """A plain side (the authors) is ranked against all authors, filtered by the default filter
    paths; the featurized side is named as not ranked. With both sides featurized nothing has a
    table to rank: same-batch candidates, said so."""
    config = featurized[side]
    checkpoint = f"model-{companion}"
    args = COMPANIONS[companion]
    if companion == "freeze" and side == "both":
        args = ("--freeze", "author")  # doc is every type of the relation: freezing it would train nothing
    done = pbgtrain("fit", str(config), *TRAIN, "-p", f"checkpoint_path={checkpoint}", "--valid", "data/test", *args)
    assert done.returncode == 0, done.stderr
    note, protocol = _expected(config, side)
    assert _said_before_training(done, note), done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("validation after version ")]
    assert [line.split(" (")[0] for line in lines] == ["validation after version 1", "validation after version 2"]
    ranked = 25 if companion == "sample" else EDGES // 10
    assert all(f"({protocol}; {ranked} edges); " in line for line in lines), lines
    records = _records(config.parent / checkpoint, "validation")
    assert [r["protocol"] for r in records] == [protocol] * 2
    assert (config.parent / checkpoint / "best").is_dir()
    assert re.search(r"^best on .*data/test: version [12] \(MRR [\d.]+\), kept in ", done.stdout, re.MULTILINE)


def test_valid_with_relation_prediction_on_a_featurized_graph_with_dynamic_relations(
        featurized: dict[str, Path]) -> None:
    config = featurized["rhs-dynamic"]
    done = pbgtrain("fit", str(config), *TRAIN, "--relation-prediction", "0.5", "--valid", "data/test")
    assert done.returncode == 0, done.stderr
    note, protocol = _expected(config, "rhs", dynamic=True)
    assert _said_before_training(done, note), done.stderr
    assert [r["protocol"] for r in _records(config.parent / "model", "validation")] == [protocol] * 2


@pytest.mark.parametrize("side", ["lhs", "rhs", "rhs-dynamic"])
def test_best_is_the_best_by_the_figures_eval_filter_then_measures(featurized: dict[str, Path], side: str) -> None:
    """``--filter`` is taken wherever a side is ranked against all entities, and a validation is
    ``pbgtrain eval --filter``'s ranking: ``eval --filter`` of ``best/`` with the same paths gives
    the protocol and the figures recorded for the best version, every one."""
    config = featurized[side]
    filters = ("--filter", "data/train", "--filter", "data/test")
    done = pbgtrain("fit", str(config), *TRAIN, "-p", "checkpoint_path=model-same", "--valid", "data/test", *filters)
    assert done.returncode == 0, done.stderr
    note, protocol = _expected(config, side.removesuffix("-dynamic"), dynamic=side.endswith("-dynamic"))
    assert _said_before_training(done, note), done.stderr
    records = _records(config.parent / "model-same", "validation")
    best = next(r for r in records if r["version"] == records[-1]["best_version"])
    assert best["protocol"] == protocol
    measured = pbgtrain("eval", str(config), "-p", "checkpoint_path=model-same/best", "--edges", "data/test", *filters,
                        "--json")
    assert measured.returncode == 0, measured.stderr
    result = json.loads(measured.stdout)
    assert (result["protocol"], result["count"], result["metrics"]) == (protocol, best["count"], best["metrics"])


FALLBACKS = {"both": ("both", ()), "rhs-lhs-negs-disabled": ("rhs", ("-p", "disable_lhs_negs=true"))}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_filter_is_refused_before_anything_runs_only_where_validation_falls_back_to_same_batch(
        featurized: dict[str, Path], case: str) -> None:
    side, override = FALLBACKS[case]
    config = featurized[side]
    done = pbgtrain("fit", str(config), *TRAIN, *override, "-p", "checkpoint_path=model-filter", "--valid",
                    "data/test", "--filter", "data/train")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --filter: --valid ranks same-batch candidates (the config's eval negatives), "
                                  "not all entities: every side that takes negatives is featurized (entity type "
                                  "'doc': bags of features"), done.stderr
    assert done.stderr.rstrip().endswith("drop --filter"), done.stderr
    assert "--all-entities" not in done.stderr and "Traceback" not in done.stderr
    assert not (config.parent / "model-filter").exists()  # nothing trained, nothing written


def test_valid_ranks_same_batch_candidates_when_the_plain_side_takes_no_negatives(featurized: dict[str, Path]) -> None:
    """Authors read documents, the documents featurized, and no lhs negatives: the one side that
    takes negatives is featurized, so same-batch candidates, on that side only."""
    config = featurized["rhs"]
    done = pbgtrain("fit", str(config), *TRAIN, "-p", "disable_lhs_negs=true", "-p", "checkpoint_path=model-rhs-only",
                    "--valid", "data/test")
    assert done.returncode == 0, done.stderr
    assert _said_before_training(done, SAME_BATCH_NOTE), done.stderr
    assert [r["protocol"] for r in _records(config.parent / "model-rhs-only", "validation")] == \
        ["raw, 20 batch negatives, rhs side only"] * 2


# --------------------------------------------------------------------------- 2. the last version past the time cap




VALID = (*TRAIN, "--valid", "data/valid")


def test_past_the_time_cap_the_last_version_is_validated_when_it_costs_less_than_its_share(graph: Path) -> None:
    """A share no validation can reach decides without timing: version 2 is validated past the cap."""
    done = pbgtrain("fit", str(graph), *VALID, "--max-iterations", "1")
    assert done.returncode == 0, done.stderr
    done = pbgtrain("fit", str(graph), *VALID, "--max-minutes", "0", "--last-validation-share", "1e12")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^validation after version 2, the last: past the time cap \(--max-minutes\), validated all the "
                     r"same: its validation is expected to take [\d.]+ s, less than 1e\+12 × an epoch of training",
                     done.stderr, re.MULTILINE), done.stderr
    assert re.search(r"^validation after version 2 \(epoch 2\), 30 edges in", done.stderr, re.MULTILINE)
    records = _records(graph.parent / "model", "validation")
    assert [r["version"] for r in records] == [1, 2]
    best = records[-1]["best_version"]
    assert CheckpointDir(graph.parent / "model" / "best").read_version() == best
    assert "never validated" not in done.stdout
    assert _last_line(done).endswith("stopped early at checkpoint version 2 of 3 (time cap: --max-minutes 0 passed)")


def test_a_last_version_left_unvalidated_is_named_on_the_last_line_with_what_best_holds(graph: Path) -> None:
    done = pbgtrain("fit", str(graph), *VALID, "--max-iterations", "1")
    assert done.returncode == 0, done.stderr
    mrr = _records(graph.parent / "model", "validation")[0]["metrics"]["mrr"]
    done = pbgtrain("fit", str(graph), *VALID, "--max-minutes", "0", "--last-validation-share", "0")
    assert done.returncode == 0, done.stderr
    assert re.search(r"validation after version 2 skipped: past the time cap \(--max-minutes\); best/ keeps version 1 "
                     r"\(MRR [\d.]+\); its validation is expected to take [\d.]+ s, not less than 0 × an epoch",
                     done.stderr), done.stderr
    assert _last_line(done).endswith(f"stopped early at checkpoint version 2 of 3 (time cap: --max-minutes 0 passed); "
                                     f"version 2 never validated, best/ holds version 1 (MRR {mrr:.4f})")


def test_the_last_validation_share_is_checked_and_goes_with_valid(graph: Path) -> None:
    done = pbgtrain("fit", str(graph), *VALID, "--last-validation-share", "-1")
    assert done.returncode == 2 and "--last-validation-share: expected a share of an epoch ≥ 0, found -1" in \
        done.stderr, done.stderr
    done = pbgtrain("fit", str(graph), *TRAIN, "--last-validation-share", "0.5")
    assert done.returncode == 2 and "--last-validation-share go with --valid PATH" in done.stderr, done.stderr
    assert not (graph.parent / "model").exists()


def test_the_decision_past_the_cap_is_a_function_of_the_measured_times() -> None:
    from pbgtrain.early_stopping import validate_past_cap

    assert validate_past_cap(4.0, 80.0, 0.1)[0]  # the 2,000-edge sample: 4 s against an epoch of 80 s
    assert not validate_past_cap(8.0, 80.0, 0.1)[0]  # no less than the share: not validated
    assert not validate_past_cap(None, 80.0, 0.1)[0]  # nothing measured to expect it from
    assert not validate_past_cap(0.001, 80.0, 0.0)[0]  # a share of 0: never


# --------------------------------------------------------------------------- 3. edge chunks under --max-minutes


def test_the_chunk_choice_is_a_function_of_the_cap_and_the_measured_rate() -> None:
    from pbgtrain.training.edge_chunk_plan import ITERATION_SHARE_OF_CAP, chunks_for_time_cap

    assert ITERATION_SHARE_OF_CAP == 0.1
    # the graph: 542,048 edges an epoch in one bucket, batches of 1,000, at 4,000 edges/s (136 s)
    epoch = dict(iteration_edges=542_048, largest_bucket=542_048, batch_size=1_000, seconds_per_edge=1 / 4_000)
    assert chunks_for_time_cap(1, **epoch, cap_seconds=14 * 60) == 2  # 68 s ≤ 84 s
    assert chunks_for_time_cap(1, **epoch, cap_seconds=5 * 60) == 5  # 27 s ≤ 30 s
    assert chunks_for_time_cap(1, **epoch, cap_seconds=60 * 60) == 1  # already within 6 minutes
    assert chunks_for_time_cap(8, **epoch, cap_seconds=60 * 60) == 8  # never fewer than the config's
    assert chunks_for_time_cap(1, **epoch, cap_seconds=0.001) == 542  # a batch of the largest bucket in a chunk
    assert chunks_for_time_cap(1, **epoch, cap_seconds=0) == 542


def _checkpoint_files(checkpoint: Path, version: int) -> dict[str, object]:
    """The version's files that the run's results are (not training_stats.json: it holds times):
    ``config.json``'s bytes, and every dataset's and attribute's bytes of its HDF5 files (not the
    files' bytes: h5py before 3.11 stamps each object header with the second it was written)."""
    import h5py

    def contents(path: Path) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        with h5py.File(path, "r") as f:
            for name, value in f.attrs.items():
                found[f"/@{name}"] = np.asarray(value).tobytes()

            def visit(name: str, obj: object) -> None:
                for key, value in obj.attrs.items():  # type: ignore[attr-defined]
                    found[f"{name}@{key}"] = np.asarray(value).tobytes()
                if isinstance(obj, h5py.Dataset):
                    found[name] = np.asarray(obj[()]).tobytes()

            f.visititems(visit)
        return found

    names = sorted(p.name for p in checkpoint.iterdir() if p.name.endswith(f".v{version}.h5"))
    return {"config.json": (checkpoint / "config.json").read_bytes(),
            **{name: contents(checkpoint / name) for name in names}}


def test_max_minutes_chooses_edge_chunks_and_the_run_is_the_run_of_those_chunks_by_hand(
        featurized: dict[str, Path], tmp_path: Path) -> None:
    """``--max-minutes 0``: no iteration is short enough, so the most chunks that keep a batch (400
    edges, batches of 100: 4) whatever the measured rate; resumed with another count given, the
    checkpoint's is kept."""
    source = featurized["rhs"].parent
    auto, by_hand = tmp_path / "auto", tmp_path / "by-hand"
    for copy in (auto, by_hand):
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("model*"))
    done = pbgtrain("fit", str(auto / "config.json"), *TRAIN, "--max-minutes", "0")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^edge chunks: 4 per bucket, not the config's 1, so that the time cap ends the run within an "
                     r"iteration: the step measured at [\d,]+ edges/s trains an iteration of 100 edges in ≈ [\d.]+ s, "
                     r".*\(the run of -p num_edge_chunks=4\)$", done.stderr, re.MULTILINE), done.stderr
    assert _last_line(done).endswith("stopped early at checkpoint version 1 of 8 (time cap: --max-minutes 0 passed)")
    done = pbgtrain("fit", str(auto / "config.json"), *TRAIN, "-p", "num_edge_chunks=2")
    assert done.returncode == 0, done.stderr
    assert "edge chunks: 4 per bucket, as the checkpoint's versions count them (the config gives 2)" in done.stderr
    assert _last_line(done).endswith("committed checkpoint version 8 of 8")
    done = pbgtrain("fit", str(by_hand / "config.json"), *TRAIN, "-p", "num_edge_chunks=4")
    assert done.returncode == 0, done.stderr
    assert "edge chunks:" not in done.stderr
    assert json.loads((auto / "model" / "config.json").read_text())["num_edge_chunks"] == 4
    assert _checkpoint_files(auto / "model", 8) == _checkpoint_files(by_hand / "model", 8)
