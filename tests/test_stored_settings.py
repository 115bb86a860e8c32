"""A checkpoint is read as what it is (``pbgio.layout.Layout.open_checkpoint``): every command given a
config whose model settings differ from the checkpoint's own ``config.json`` either reads the
checkpoint with its own settings and says so on one line, or stops with one message naming both
values and the fix (``checkpoint-config-mismatch``). Never a traceback, never rows of another
width written silently, never "rebuild the index" when the config is the cause.

One test per command of the issue's table, run through the real command lines (in this process),
and a hypothesis property over one differing model setting at a time and every command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pbgio.config import load_config
from pbgio.example import build_example
from pbgio.index_file import read_index_meta
from pbgio.spec import naming
from tests.cli import pbgio, pbgtrain

NOTE = "(the config the checkpoint was trained with) has dimension = 16 (the config says 24): the checkpoint is read " \
       "with its own settings"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example (user: 2 partitions, item: 1; dimension 16), trained two iterations."""
    config = build_example(tmp_path_factory.mktemp("stored") / "example", num_edges=2000)
    done = pbgtrain("fit", str(config), "-p", "num_epochs=2", "-p", "workers=1", "--no-progress")
    assert done.returncode == 0, done.stderr
    return config


@pytest.fixture
def example(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained example (commands may write into its checkpoint directory)."""
    shutil.copytree(trained.parent, tmp_path / "example")
    return tmp_path / "example" / "config.json"


def _one_note(done: subprocess.CompletedProcess[str]) -> None:
    lines = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert len(lines) == 1 and NOTE in lines[0], done.stderr


# --------------------------------------------------------------------------- the table, row by row

def test_neighbors_reads_the_stored_dimension(example: Path) -> None:
    done = pbgio("neighbors", str(example), "--type", "user", "user000", "-k", "3", "-p", "dimension=24")
    assert done.returncode == 0, done.stderr
    _one_note(done)
    assert len(done.stdout.strip().splitlines()) == 1 + 3  # header and three neighbours


def test_index_build_indexes_the_stored_rows(example: Path) -> None:
    done = pbgio("index", "build", str(example), "--type", "user", "-p", "dimension=24")
    assert done.returncode == 0, done.stderr
    _one_note(done)
    meta = read_index_meta(example.parent / "checkpoint" / naming.index_file("user", 2, "dot", "flat"))
    assert meta.dimension == 16


def test_export_writes_rows_of_the_stored_width(example: Path) -> None:
    out = example.parent / "emb.tsv"
    done = pbgio("export", str(example), "-o", str(out), "-p", "dimension=24")
    assert done.returncode == 0, done.stderr
    _one_note(done)
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(rows) == 60 + 40 and {len(r) for r in rows} == {1 + 16}


def test_eval_evaluates_the_stored_model(example: Path) -> None:
    done = pbgtrain("eval", str(example), "--edges", "edges/test", "--all-entities", "--json", "-p", "dimension=24")
    assert done.returncode == 0, done.stderr
    _one_note(done)
    assert json.loads(done.stdout)["metrics"]["mrr"] > 0


def test_a_model_trained_with_an_override_is_evaluated_without_repeating_it(example: Path) -> None:
    """On an H200, eval of a model trained with -p dimension=1000 failed until the -p was repeated."""
    done = pbgtrain("fit", str(example), "-p", "dimension=24", "-p", "checkpoint_path=wide", "-p", "num_epochs=1",
                    "-p", "workers=1", "--no-progress")
    assert done.returncode == 0, done.stderr
    done = pbgtrain("eval", str(example), "-p", "checkpoint_path=wide", "--edges", "edges/test", "--all-entities")
    assert done.returncode == 0, done.stderr
    assert "dimension = 24 (the config says 16)" in done.stderr


def test_neighbors_through_an_index_of_the_stored_rows(example: Path) -> None:
    assert pbgio("index", "build", str(example), "--type", "user", "--metric", "cos").returncode == 0
    done = pbgio("neighbors", str(example), "--type", "user", "user000", "--index", "--metric", "cos",
                 "-p", "dimension=24")
    assert done.returncode == 0, done.stderr  # not "index-stale … rebuild it": the index is the checkpoint's
    _one_note(done)
    assert "searched: index_user.cos.flat.v2.h5, faiss flat" in done.stderr


def test_predict_scores_with_the_stored_operators(example: Path) -> None:
    done = pbgtrain("predict", str(example), "--lhs", "user000", "--rel", "likes", "-k", "2",
                    "-p", "relations.1.operator=complex_diagonal")
    assert done.returncode == 0, done.stderr
    assert "relations.1.operator = 'diagonal' (the config says 'complex_diagonal')" in done.stderr


def test_fit_refuses_to_resume_another_model(example: Path) -> None:
    done = pbgtrain("fit", str(example), "-p", "dimension=24", "--no-progress")
    assert done.returncode == 1, done.stderr
    assert "expected dimension as in the checkpoint being resumed (16), found 24" in done.stderr
    assert "[checkpoint-config-mismatch]" in done.stderr and "Traceback" not in done.stderr


def test_fit_refuses_to_resume_on_another_plan_of_edge_paths(example: Path) -> None:
    """Trained on edges/train; resumed with the config's edge paths changed (as a recipe trained with
    -p edge_paths=data/train and resumed without it): refused, both plans named, the fix given."""
    version = (example.parent / "checkpoint" / naming.CHECKPOINT_VERSION).read_text()
    done = pbgtrain("fit", str(example), "-p", "edge_paths=edges/train,edges/test", "-p", "num_epochs=3",
                    "--no-progress")
    assert done.returncode == 1, done.stderr
    assert "expected edge_paths as in the checkpoint being resumed (['edges/train']), found ['edges/train', " \
           "'edges/test']" in done.stderr
    assert "resume with -p edge_paths=edges/train" in done.stderr
    assert (example.parent / "checkpoint" / naming.CHECKPOINT_VERSION).read_text() == version  # nothing trained


def test_eval_of_an_absent_checkpoint_says_only_that(example: Path) -> None:
    done = pbgtrain("eval", str(example), "-p", "checkpoint_path=model_x", "--edges", "edges/train")
    assert done.returncode == 1, done.stderr
    assert "warning" not in done.stderr  # not "the model trained on these edges" first
    assert "model_x: expected the checkpoint_path directory, found nothing (train first" in done.stderr


def test_other_entity_files_are_refused_with_both_values_and_the_fix(example: Path) -> None:
    done = pbgio("export", str(example), "-o", str(example.parent / "e.tsv"), "-p", "entities.user.num_partitions=4")
    assert done.returncode == 1, done.stderr
    assert "expected entities.user as in the config the checkpoint was trained with ({'num_partitions': 2, " \
           "'featurized': False}), found {'num_partitions': 4, 'featurized': False}" in done.stderr
    assert "read it with the config it was trained with" in done.stderr
    assert not (example.parent / "e.tsv").exists()


def test_a_config_of_fewer_types_reads_the_types_it_names(example: Path) -> None:
    cfg = json.loads(example.read_text())
    cfg["entities"] = {"user": cfg["entities"]["user"]}
    cfg["relations"] = [r for r in cfg["relations"] if r["lhs"] == r["rhs"] == "user"]
    example.write_text(json.dumps(cfg))
    assert pbgio("neighbors", str(example), "user000", "-k", "2").returncode == 0
    done = pbgtrain("predict", str(example), "--lhs", "user000", "--rel", "follows")  # builds the model: refused
    assert done.returncode == 1 and "expected relations as in the config the checkpoint was trained" in done.stderr


# --------------------------------------------------------------------------- any one setting, any command

SETTINGS = st.one_of(
    st.integers(1, 40).filter(lambda d: d != 16).map(lambda d: f"dimension={d}"),
    st.sampled_from(["cos", "l2", "squared_l2"]).map(lambda c: f"comparator={c}"),
    st.just("global_emb=false"),
    st.just("bias=true"),
    st.tuples(st.integers(0, 1), st.sampled_from(["none", "diagonal", "translation", "affine", "complex_diagonal"]))
    .filter(lambda r: r not in {(0, "translation"), (1, "diagonal")})  # the example's own operators
    .map(lambda r: f"relations.{r[0]}.operator={r[1]}"),
    st.integers(1, 20).map(lambda d: f"entities.item.dimension={d}"),
    st.sampled_from([1, 3]).map(lambda n: f"entities.user.num_partitions={n}"),
    st.just("entities.item.featurized=true"),
    st.just("relations.1.rhs=user"),
    st.just("dynamic_relations=true"),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(setting=SETTINGS)
def test_no_command_shows_a_traceback_or_writes_rows_of_another_width(trained: Path, setting: str) -> None:
    """For a config that differs from the checkpoint in one model setting, every command exits 0,
    1 or 2 with a message (an exception escaping a command fails here, as a traceback would), and
    what it writes has the checkpoint's shapes."""
    stored = load_config(trained.parent / "checkpoint" / naming.CONFIG_JSON)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "example"
        shutil.copytree(trained.parent, root)
        config = str(root / "config.json")
        p = ["-p", setting]
        runs = {
            "export": pbgio("export", config, "-o", str(root / "e.tsv"), *p),
            "neighbors": pbgio("neighbors", config, "--type", "user", "user000", *p),
            "index": pbgio("index", "build", config, "--type", "item", *p),
            "eval": pbgtrain("eval", config, "--edges", "edges/test", "--all-entities", *p),
            "predict": pbgtrain("predict", config, "--lhs", "user000", "--rel", "follows", *p),
            "fit": pbgtrain("fit", config, "-p", "num_epochs=3", "--no-progress", *p),
        }
        for name, done in runs.items():
            shown = done.stdout + done.stderr
            assert done.returncode in (0, 1, 2) and "Traceback" not in shown, (name, shown)
            assert done.returncode == 0 or "error:" in done.stderr, (name, shown)
        assert runs["fit"].returncode != 0  # a resume never trains another model
        if runs["export"].returncode == 0:
            widths = {len(line.split("\t")) - 1 for line in (root / "e.tsv").read_text().splitlines()}
            assert widths <= {stored.entity_dimension("user"), stored.entity_dimension("item")}, widths
        if runs["index"].returncode == 0:
            meta = read_index_meta(root / "checkpoint" / naming.index_file("item", 2, "dot", "flat"))
            assert meta.dimension == stored.entity_dimension("item")
