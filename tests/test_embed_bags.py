"""``embed_bags`` / ``pbgio embed``: new bags of features embedded as the mean of their features,
checked on the original's own featurized sample (``doc`` is featurized, 24 features)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir
from pbgio.cli import app
from pbgio.exporters import ExportError, embed_bags, export_embeddings
from pbgio.exporters.bags import BagError

NAMES = [f"f{i:02d}" for i in range(24)]


@pytest.fixture
def sample(featurized_sample: Path) -> Path:
    """The sample with names for doc's features and the authors, and a config beside it; returns the config."""
    dest = featurized_sample
    (dest / "entities" / "entity_names_doc_0.json").write_text(json.dumps(NAMES))
    (dest / "entities" / "entity_names_author_0.json").write_text(json.dumps([f"a{i}" for i in range(15)]))
    config = dest / "config.json"
    shutil.copy(dest / "checkpoint" / "config.json", config)
    return config


def _rows(config: Path) -> tuple[np.ndarray, np.ndarray]:
    ckpt = CheckpointDir(config.parent / "checkpoint")
    rows = ckpt.read_embeddings("doc", 0, 1).embeddings
    return rows, ckpt.read_model(1).params["entities/doc/global_embedding"]


def test_a_bag_is_the_mean_of_its_features_plus_the_global_embedding(sample: Path) -> None:
    rows, glob = _rows(sample)
    got = embed_bags(sample, "doc", [[0, 3, 3], [23], ["f05", "f07"]])
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_allclose(got[0], rows[[0, 3, 3]].mean(0) + glob, rtol=1e-6)  # a repeat counts twice
    np.testing.assert_allclose(got[1], rows[23] + glob, rtol=1e-6)
    np.testing.assert_allclose(got[2], rows[[5, 7]].mean(0) + glob, rtol=1e-6)
    plain = embed_bags(sample, "doc", [[0, 3, 3]], add_global=False)
    np.testing.assert_allclose(plain[0], rows[[0, 3, 3]].mean(0), rtol=1e-6)


def test_a_bag_is_the_mean_of_what_export_embeddings_writes(sample: Path, tmp_path: Path) -> None:
    export_embeddings(sample, tmp_path / "out", fmt="npy", entity_types=["doc"])
    exported = np.load(tmp_path / "out" / "doc.npy")
    bag = ["f01", "f10", "f11", "f01"]
    np.testing.assert_allclose(embed_bags(sample, "doc", [bag])[0], exported[[1, 10, 11, 1]].mean(0), rtol=1e-6)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"entity_type": "author", "bags": [[0]]}, "not featurized"),
    ({"entity_type": "nope", "bags": [[0]]}, "entity type"),
    ({"entity_type": "doc", "bags": [[0], []]}, "bag 1: expected at least one feature"),
    ({"entity_type": "doc", "bags": [[24]]}, r"bag 0: expected feature offsets in \[0, 24\)"),
    ({"entity_type": "doc", "bags": [["f01", "zz"]]}, r"bag 0: features \['zz'\] are not in the dictionary"),
    ({"entity_type": "doc", "bags": [["zz"]], "unknown": "ignore"}, "none after dropping unknown"),
    ({"entity_type": "doc", "bags": ["f01"]}, "found the string"),
    ({"entity_type": "doc", "bags": [[1.5]]}, "names .str. or offsets .int."),
    ({"entity_type": "doc", "bags": [[0]], "partition": 1}, r"partition of 'doc' in \[0, 1\)"),
    ({"entity_type": "doc", "bags": [[0]], "unknown": "skip"}, "unknown='error' or 'ignore'"),
])
def test_errors_name_the_bag_and_the_rule(sample: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ExportError, match=match):
        embed_bags(sample, **kwargs)  # type: ignore[arg-type]


def test_unknown_features_can_be_ignored(sample: Path) -> None:
    got = embed_bags(sample, "doc", [["f02", "zz", "f04"]], unknown="ignore")
    np.testing.assert_array_equal(got, embed_bags(sample, "doc", [["f02", "f04"]]))
    with pytest.raises(BagError) as info:
        embed_bags(sample, "doc", [["f02"], ["zz"]])
    assert info.value.bag == 1


def test_cli_embeds_one_bag_per_line(sample: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.txt"
    bags.write_text("f00 f03 f03\nf23\n")
    result = CliRunner().invoke(app, ["embed", str(sample), "--type", "doc", str(bags), "-o", "-"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == ["1", "2"]
    values = np.array([[float(v) for v in line[1:]] for line in lines], dtype=np.float32)
    np.testing.assert_array_equal(values, embed_bags(sample, "doc", [[0, 3, 3], [23]]))

    out = tmp_path / "out.tsv"
    assert CliRunner().invoke(app, ["embed", str(sample), "-t", "doc", str(bags), "-o", str(out)]).exit_code == 0
    assert out.read_text().count("\n") == 2
    again = CliRunner().invoke(app, ["embed", str(sample), "-t", "doc", str(bags), "-o", str(out)])
    assert again.exit_code == 2 and "exists" in again.output


def test_cli_names_the_file_and_line_of_a_bad_bag(sample: Path, tmp_path: Path) -> None:
    bags = tmp_path / "bags.txt"
    bags.write_text("f00\nf01 unheard\n")
    result = CliRunner().invoke(app, ["embed", str(sample), "-t", "doc", str(bags), "-o", "-"])
    assert result.exit_code == 1
    assert "bags.txt:2:" in result.output and "unheard" in result.output
    bags.write_text("f00\n\n")
    result = CliRunner().invoke(app, ["embed", str(sample), "-t", "doc", str(bags), "-o", "-"])
    assert result.exit_code == 1 and "bags.txt:2: expected at least one feature" in result.output
    result = CliRunner().invoke(app, ["embed", str(sample), "-t", "doc", str(bags), "-o", "-", "--feature-separator",
                                      ",", "--unknown", "ignore"])
    assert result.exit_code == 1


def test_embedding_bags_does_not_import_torch(sample: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; from pbgio.exporters import embed_bags; "
            f"embed_bags({str(sample)!r}, 'doc', [[0, 1]]); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
