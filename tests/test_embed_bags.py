"""``embed_bags`` / ``pbgio embed``: new bags of features embedded as the mean of their features' rows
exactly as ``export_embeddings`` writes them, on built layouts and on the original's own featurized
sample (``doc`` is featurized, 24 features, no names files)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.cli.commands import app
from pbgio.config import parse_config
from pbgio.entities import write_entity_count, write_entity_names
from pbgio.errors import MissingArtifactError
from pbgio.exporters import ExportError, embed_bags, export_embeddings
from pbgio.exporters.bags import BagError
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.testing import small_valid_layout, write_layout
from tests.shared import SAMPLES

Floats = NDArray[np.float32]
NAMES = [f"f{i:02d}" for i in range(24)]
FEATURIZED_SAMPLE = SAMPLES / "sample_current_featurized"


def bag_mean(rows: Floats, bag: list[int]) -> Floats:
    """The mean of ``rows[bag]`` accumulated in float64, rounded once to float32 (what embed_bags promises)."""
    return np.asarray(rows[bag], dtype=np.float64).mean(axis=0).astype(np.float32)


def exported(config: Path, tmp_path: Path, entity_type: str, add_global: bool = True) -> Floats:
    out = tmp_path / f"export-{entity_type}-{add_global}"
    export_embeddings(config, out, fmt="npy", entity_types=[entity_type], add_global=add_global)
    return np.load(out / f"{entity_type}.npy")


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["embed", *args])


# --------------------------------------------------------------------------- a built layout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small_valid_layout: ``doc`` featurized (9 features, named here), global_emb true; returns the config."""
    root = tmp_path_factory.mktemp("built")
    layout = small_valid_layout()
    layout.names[("doc", 0)] = [f"w{i}" for i in range(layout.count("doc", 0))]
    return write_layout(root, layout)


BAGS: list[list[Any]] = [["w0"], ["w1", "w4", "w4"], ["w8", "w2", "w3", "w5", "w6", "w7", "w0", "w1", "w2"]]
IDS = [[0], [1, 4, 4], [8, 2, 3, 5, 6, 7, 0, 1, 2]]


@pytest.mark.parametrize("add_global", [True, False])
def test_bags_are_the_mean_of_the_exported_rows(built: Path, tmp_path: Path, add_global: bool) -> None:
    rows = exported(built, tmp_path, "doc", add_global)
    got = embed_bags(built, "doc", BAGS, add_global=add_global)
    assert got.dtype == np.float32 and got.shape == (3, 6) and got.flags.c_contiguous
    want = np.stack([bag_mean(rows, ids) for ids in IDS])
    np.testing.assert_array_equal(got, want)  # bit for bit
    np.testing.assert_allclose(got, np.stack([rows[ids].mean(0) for ids in IDS]), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[0], rows[0])  # a bag of one feature is that feature's exported row
    np.testing.assert_array_equal(embed_bags(built, "doc", IDS, add_global=add_global), got)  # offsets


def test_global_embedding_is_added_once(built: Path) -> None:
    ckpt = CheckpointDir(built.parent / "checkpoint")
    glob = ckpt.read_model().params[global_embedding_name("doc")]
    with_global = embed_bags(built, "doc", BAGS)
    plain = embed_bags(built, "doc", BAGS, add_global=False)
    np.testing.assert_allclose(with_global, plain + glob, rtol=1e-6, atol=1e-6)


def test_offsets_names_and_numpy_inputs_mix(built: Path) -> None:
    want = embed_bags(built, "doc", [["w1", "w4", "w4"]])
    for bag in ([1, "w4", np.int64(4)], np.array([1, 4, 4]), (np.uint8(1), 4, np.str_("w4")),
                np.array(["w1", "w4", "w4"])):
        np.testing.assert_array_equal(embed_bags(built, "doc", [bag]), want)
    assert embed_bags(built, "doc", []).shape == (0, 6)


def test_without_global_embeddings_in_the_config(tmp_path: Path) -> None:
    layout = small_valid_layout(dynamic=True)  # global_emb false; doc featurized
    config = write_layout(tmp_path, layout)
    assert layout.checkpoint is not None
    rows = layout.checkpoint.embeddings[("doc", 0)].embeddings
    np.testing.assert_array_equal(embed_bags(config, "doc", [[2, 3, 3]])[0], bag_mean(rows, [2, 3, 3]))


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A featurized type in two partitions (trained ones can be), with names and a checkpoint."""
    root = tmp_path_factory.mktemp("partitioned")
    cfg = parse_config({
        "entities": {"author": {"num_partitions": 2}, "doc": {"num_partitions": 2, "featurized": True}},
        "relations": [{"name": "reads", "lhs": "author", "rhs": "doc", "operator": "diagonal"}],
        "dimension": 3, "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model",
        "num_uniform_negs": 0, "eval_num_uniform_negs": 0})
    rng = np.random.default_rng(3)
    counts = {("author", 0): 2, ("author", 1): 3, ("doc", 0): 4, ("doc", 1): 5}
    for (t, p), n in counts.items():
        write_entity_count(root / "data", t, p, n)
        write_entity_names(root / "data", t, p, [f"{t}{p}-{i}" for i in range(n)])
    params = {global_embedding_name(t): rng.standard_normal(3).astype(np.float32) for t in cfg.entities}
    params["relations/0/operator/rhs/diagonal"] = np.ones(3, np.float32)
    write_checkpoint(CheckpointDir(root / "model"), 1, config=cfg, model=ModelState(params),
                     embeddings={k: EmbeddingsState(rng.standard_normal((n, 3)).astype(np.float32))
                                 for k, n in counts.items()})
    (root / "config.json").write_text(cfg.to_json())
    return root / "config.json"


def test_a_bag_takes_the_features_of_one_partition(partitioned: Path, tmp_path: Path) -> None:
    rows = exported(partitioned, tmp_path, "doc")  # partition 0 (4 rows), then partition 1 (5 rows)
    got = embed_bags(partitioned, "doc", [["doc1-0", "doc1-4"], [2]], partition=1)
    np.testing.assert_array_equal(got, np.stack([bag_mean(rows, [4, 8]), rows[6]]))
    with pytest.raises(BagError, match=r"bag 0: features \['doc1-0'\] are not in the dictionary of 'doc' "
                                       "partition 0"):
        embed_bags(partitioned, "doc", [["doc1-0"]])
    with pytest.raises(ExportError, match=r"expected a partition of 'doc' in \[0, 2\), found 2"):
        embed_bags(partitioned, "doc", [[0]], partition=2)
    with pytest.raises(BagError, match=r"offsets in \[0, 5\) for 'doc' partition 1, found 5"):
        embed_bags(partitioned, "doc", [[4], [5]], partition=1)


# --------------------------------------------------------------------------- the original's sample


@pytest.fixture
def genuine() -> Path:
    """The sample as the original wrote it (read only; no names files): its checkpoint's config."""
    return FEATURIZED_SAMPLE / "checkpoint" / "config.json"


def test_the_original_sample_embeds_bags_of_offsets(genuine: Path) -> None:
    ckpt = CheckpointDir(genuine.parent)
    rows = ckpt.read_embeddings("doc", 0, 1).embeddings
    glob = ckpt.read_model(1).params["entities/doc/global_embedding"]
    got = embed_bags(genuine, "doc", [[0, 3, 3], [23]])
    np.testing.assert_array_equal(got[0], bag_mean(rows + glob, [0, 3, 3]))  # a repeat counts twice
    np.testing.assert_allclose(got[0], rows[[0, 3, 3]].mean(0) + glob, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[1], rows[23] + glob)
    np.testing.assert_allclose(embed_bags(genuine, "doc", [[0, 3, 3]], add_global=False)[0],
                               rows[[0, 3, 3]].mean(0), rtol=1e-6, atol=1e-7)
    with pytest.raises(BagError, match=r"bag 1: feature 'f01' is a name, but 'doc' partition 0 has no names "
                                       r"file .*entity_names_doc_0.json.*row offsets"):
        embed_bags(genuine, "doc", [[0], ["f01"]])


def test_cli_reads_offsets_on_the_original_sample(genuine: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.txt"
    bags.write_text("0 3 3\n23\n")
    result = run(str(genuine), "-t", "doc", str(bags), "-o", "-", "--offsets")
    assert result.exit_code == 0, result.output
    values = np.array([line.split("\t")[1:] for line in result.stdout.splitlines()], dtype=np.float32)
    np.testing.assert_array_equal(values, embed_bags(genuine, "doc", [[0, 3, 3], [23]]))
    bags.write_text("0 3\n1 x\n")
    result = run(str(genuine), "-t", "doc", str(bags), "-o", "-", "--offsets")
    assert result.exit_code == 1 and "bags.txt:2: expected integer feature offsets (--offsets), found 'x'" \
        in result.output
    result = run(str(genuine), "-t", "doc", str(bags), "-o", "-")  # without --offsets, "0" is a name
    assert result.exit_code == 1 and "bags.txt:1: feature '0' is a name" in result.output
    assert "--offsets" in result.output


# --------------------------------------------------------------------------- the sample, named


@pytest.fixture
def sample(featurized_sample: Path) -> Path:
    """The sample with names for doc's features and the authors, and a config beside it; returns the config."""
    dest = featurized_sample
    (dest / "entities" / "entity_names_doc_0.json").write_text(json.dumps(NAMES))
    (dest / "entities" / "entity_names_author_0.json").write_text(json.dumps([f"a{i}" for i in range(15)]))
    config = dest / "config.json"
    shutil.copy(dest / "checkpoint" / "config.json", config)
    return config


def test_named_features_match_the_export(sample: Path, tmp_path: Path) -> None:
    rows = exported(sample, tmp_path, "doc")
    bag = ["f01", "f10", "f11", "f01"]
    np.testing.assert_array_equal(embed_bags(sample, "doc", [bag])[0], bag_mean(rows, [1, 10, 11, 1]))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"entity_type": "author", "bags": [[0]]}, "'author' is not featurized.*export_embeddings"),
    ({"entity_type": "nope", "bags": [[0]]}, r"entity type of the config \['author', 'doc'\], found 'nope'"),
    ({"entity_type": "doc", "bags": [[0], []]}, "bag 1: expected at least one feature, found none$"),
    ({"entity_type": "doc", "bags": [[0], [24]]}, r"bag 1: expected feature offsets in \[0, 24\) for 'doc' "
                                                  "partition 0, found 24"),
    ({"entity_type": "doc", "bags": [[-1]]}, r"bag 0: expected feature offsets in \[0, 24\).*found -1"),
    ({"entity_type": "doc", "bags": [[2**70]]}, r"bag 0: expected feature offsets in \[0, 24\)"),
    ({"entity_type": "doc", "bags": [["f01"], ["f01", "zz", "yy", "f02"]]},
     r"bag 1: features \['zz', 'yy'\] are not in the dictionary of 'doc' partition 0; pass unknown='ignore'"),
    ({"entity_type": "doc", "bags": [["f01"], ["zz", "yy"]], "unknown": "ignore"},
     r"bag 1: expected at least one feature, found none after dropping unknown features \['zz', 'yy'\]"),
    ({"entity_type": "doc", "bags": ["f01"]}, "bag 0: expected a sequence of features, found the string"),
    ({"entity_type": "doc", "bags": [[0], 3]}, "bag 1: expected a sequence of features, found int"),
    ({"entity_type": "doc", "bags": [[1.5]]}, r"bag 0: expected feature names \(str\) or offsets \(int\), "
                                              "found 1.5"),
    ({"entity_type": "doc", "bags": [[0], [True]]}, r"bag 1: .*names \(str\) or offsets \(int\), found True"),
    ({"entity_type": "doc", "bags": [[0, [1]]]}, r"bag 0: .*found \[1\]"),
    ({"entity_type": "doc", "bags": [[0]], "partition": 1}, r"partition of 'doc' in \[0, 1\), found 1"),
    ({"entity_type": "doc", "bags": [[0]], "unknown": "skip"}, "unknown='error' or 'ignore', found 'skip'"),
])
def test_errors_name_the_bag_and_the_rule(sample: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ExportError, match=match):
        embed_bags(sample, **kwargs)


def test_the_first_bad_bag_is_named(sample: Path) -> None:
    """Problems of different kinds: the error names the earliest bag."""
    for bags, bag in [([["zz"], [99]], 0), ([[99], ["zz"]], 0), ([["f01"], [], ["zz"]], 1),
                      ([[0], ["zz"], [1.5]], 1)]:
        with pytest.raises(BagError) as info:
            embed_bags(sample, "doc", bags)
        assert info.value.bag == bag, (bags, str(info.value))


def test_unknown_features_can_be_ignored(sample: Path) -> None:
    got = embed_bags(sample, "doc", [["f02", "zz", "f04"], ["f03"]], unknown="ignore")
    np.testing.assert_array_equal(got, embed_bags(sample, "doc", [["f02", "f04"], ["f03"]]))


def test_duplicate_names_cannot_be_looked_up(sample: Path) -> None:
    (sample.parent / "entities" / "entity_names_doc_0.json").write_text(json.dumps([*NAMES[:-1], "f03"]))
    with pytest.raises(ExportError, match=r"expected unique feature names .* found \['f03'\] more than once"):
        embed_bags(sample, "doc", [["f01"]])
    assert embed_bags(sample, "doc", [[1]]).shape == (1, 4)  # offsets need no names


def test_checkpoint_problems_are_export_errors(sample: Path) -> None:
    with pytest.raises(MissingArtifactError):
        embed_bags(sample, "doc", [[0]], version=9)
    model = sample.parent / "checkpoint" / "model.v1.h5"
    import h5py

    with h5py.File(model, "r+") as f:
        del f["model/entities/doc/global_embedding"]
    with pytest.raises(ExportError, match=r"global_embedding.*--no-global"):
        embed_bags(sample, "doc", [[0]])
    assert embed_bags(sample, "doc", [[0]], add_global=False).shape == (1, 4)


# --------------------------------------------------------------------------- the command line


def test_cli_embeds_one_bag_per_line(sample: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.txt"
    bags.write_text("f00 f03 f03\nf23\n")
    result = run(str(sample), "--type", "doc", str(bags), "-o", "-")
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == ["1", "2"]
    values = np.array([line[1:] for line in lines], dtype=np.float32)
    np.testing.assert_array_equal(values, embed_bags(sample, "doc", [[0, 3, 3], [23]]))
    # a bag of one feature is its exported row, written by the same formatter, character for character
    export_embeddings(sample, tmp_path / "all.tsv", entity_types=["doc"])
    row = next(line for line in (tmp_path / "all.tsv").read_text().splitlines() if line.startswith("f23\t"))
    assert lines[1][1:] == row.split("\t")[1:]

    out = tmp_path / "out.tsv"
    result = run(str(sample), "-t", "doc", str(bags), "-o", str(out), "--no-global", "--version", "1")
    assert result.exit_code == 0, result.output
    written = np.array([line.split("\t")[1:] for line in out.read_text().splitlines()], dtype=np.float32)
    np.testing.assert_array_equal(written, embed_bags(sample, "doc", [[0, 3, 3], [23]], add_global=False))
    again = run(str(sample), "-t", "doc", str(bags), "-o", str(out))
    assert again.exit_code == 2 and "exists" in again.output
    assert run(str(sample), "-t", "doc", str(bags), "-o", str(out), "--overwrite").exit_code == 0


def test_cli_separator_and_unknown_features(sample: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.csv"
    bags.write_text("f00,f03,,zz\n")
    result = run(str(sample), "-t", "doc", str(bags), "-o", "-", "--feature-separator", ",", "--unknown", "ignore")
    assert result.exit_code == 0, result.output
    values = np.array(result.stdout.split("\t")[1:], dtype=np.float32)
    np.testing.assert_array_equal(values, embed_bags(sample, "doc", [[0, 3]])[0])


def test_cli_names_the_file_and_line_of_a_bad_bag(sample: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.txt"
    bags.write_text("f00\nf01 unheard\n")
    result = run(str(sample), "-t", "doc", str(bags), "-o", "-")
    assert result.exit_code == 1 and result.stdout == ""
    assert "bags.txt:2: features ['unheard'] are not in the dictionary" in result.output
    bags.write_text("f00\n\nf01\n")
    result = run(str(sample), "-t", "doc", str(bags), "-o", "-")
    assert result.exit_code == 1 and "bags.txt:2: expected at least one feature, found an empty line" in result.output
    bags.write_text("f00\nzz\n")
    result = run(str(sample), "-t", "doc", str(bags), "-o", "-", "--unknown", "ignore")
    assert result.exit_code == 1 and "bags.txt:2: expected at least one feature, found none after dropping" \
        in result.output
    result = run(str(sample), "-t", "author", str(bags), "-o", "-")
    assert result.exit_code == 1 and "not featurized" in result.output
    result = run(str(sample), "-t", "doc", str(tmp_path / "absent.txt"), "-o", "-")
    assert result.exit_code == 2
    result = run(str(tmp_path / "absent.json"), "-t", "doc", str(bags), "-o", "-")
    export_result = CliRunner().invoke(app, ["export", str(tmp_path / "absent.json"), "-o", str(tmp_path / "e.tsv")])
    assert result.exit_code == export_result.exit_code == 1 and "config-unreadable" in result.output  # as pbgio export


def test_embedding_bags_does_not_import_torch(sample: Path, tmp_path: Path) -> None:
    code = ("import sys; from pbgio.exporters import embed_bags; "
            f"embed_bags({str(sample)!r}, 'doc', [[0, 1]]); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    bags = tmp_path / "bags.txt"
    bags.write_text("f00 f01\n")
    code = ("import sys; from pbgio.cli.commands import app\n"
            f"try: app(['embed', {str(sample)!r}, '-t', 'doc', {str(bags)!r}, '-o', {str(tmp_path / 'o.tsv')!r}])\n"
            "except SystemExit as exc: assert not exc.code, exc.code\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
