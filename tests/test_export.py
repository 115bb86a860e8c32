"""``pbgio export``: embeddings and relation parameters leave a checkpoint exactly (float32)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import load_config, parse_config
from pbgio.entities import (
    read_entity_count,
    read_entity_names,
    read_relation_names,
    write_entity_count,
    write_entity_names,
)
from pbgio.errors import MissingArtifactError
from pbgio.exporters import ExportError, OutputExistsError, export_embeddings, export_relations
from pbgio.importers import import_edge_lists
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.testing import small_valid_layout, write_layout
from pbgio.testing.layouts import expected_params
from pbgio.testing.strategies import float32_arrays

Floats = NDArray[np.float32]


def bits(a: Floats) -> NDArray[np.uint32]:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def expected_rows(root: Path, entity_type: str, add_global: bool = True) -> tuple[list[str], Floats]:
    """Names and rows the export must hold, computed here from the checkpoint files."""
    cfg = load_config(root / "config.json")
    ckpt = CheckpointDir(root / cfg.checkpoint_path)
    names: list[str] = []
    rows = []
    for part in range(cfg.num_partitions(entity_type)):
        names += read_entity_names(root / cfg.entity_path, entity_type, part)
        rows.append(ckpt.read_embeddings(entity_type, part).embeddings)
    values = np.concatenate(rows)
    if add_global and cfg.global_emb:
        values = values + ckpt.read_model().params[global_embedding_name(entity_type)]
    return names, values.astype(np.float32)


def read_tsv(path: Path) -> dict[str, Floats]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, *values = line.split("\t")
        found[name] = np.array([np.float32(v) for v in values], dtype=np.float32)
    return found


@pytest.fixture(scope="module")
def static_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    write_layout(root, small_valid_layout(featurized=False))
    return root


@pytest.fixture(scope="module")
def dynamic_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dynamic")
    write_layout(root, small_valid_layout(featurized=False, dynamic=True))
    return root


@pytest.mark.parametrize("add_global", [True, False])
def test_tsv_round_trips_exactly(static_layout: Path, tmp_path: Path, add_global: bool) -> None:
    out = tmp_path / "emb.tsv"
    report = export_embeddings(static_layout / "config.json", out, add_global=add_global)
    assert report.global_added == (["item", "user"] if add_global else [])
    found = read_tsv(out)
    lines = out.read_text(encoding="utf-8").splitlines()
    order = []
    for entity_type in ("user", "item"):  # config order, partitions in order: the original's order
        names, values = expected_rows(static_layout, entity_type, add_global)
        order += names
        for name, row in zip(names, values, strict=True):
            assert np.array_equal(bits(found[name]), bits(row)), name
    assert [line.split("\t")[0] for line in lines] == order
    assert report.rows == {"user": 9, "item": 7}


@pytest.mark.parametrize("layout", ["list", "columns"])
def test_parquet_round_trips_exactly(static_layout: Path, tmp_path: Path, layout: str) -> None:
    report = export_embeddings(static_layout / "config.json", tmp_path / "out", fmt="parquet",
                               parquet_layout=layout)  # type: ignore[arg-type]
    for entity_type in ("user", "item"):
        names, values = expected_rows(static_layout, entity_type)
        frame = pl.read_parquet(tmp_path / "out" / f"{entity_type}.parquet")
        assert frame.get_column("name").to_list() == names
        if layout == "list":
            assert frame.schema["embedding"] == pl.Array(pl.Float32, values.shape[1])
            got = frame.get_column("embedding").to_numpy()
        else:
            assert frame.columns == ["name", *[f"dim_{i}" for i in range(values.shape[1])]]
            assert all(frame.schema[c] == pl.Float32 for c in frame.columns[1:])
            got = frame.drop("name").to_numpy()
        assert np.array_equal(bits(got), bits(values))
    assert len(report.outputs) == 2


def test_npy_round_trips_exactly(static_layout: Path, tmp_path: Path) -> None:
    export_embeddings(static_layout / "config.json", tmp_path / "out", fmt="npy")
    for entity_type in ("user", "item"):
        names, values = expected_rows(static_layout, entity_type)
        got = np.load(tmp_path / "out" / f"{entity_type}.npy")
        assert got.dtype == np.float32 and np.array_equal(bits(got), bits(values))
        assert json.loads((tmp_path / "out" / f"{entity_type}.names.json").read_text()) == names


def test_single_type_to_a_named_file(static_layout: Path, tmp_path: Path) -> None:
    export_embeddings(static_layout / "config.json", tmp_path / "users.npy", fmt="npy", entity_types=["user"])
    assert np.load(tmp_path / "users.npy").shape == (9, 4)
    assert len(json.loads((tmp_path / "users.names.json").read_text())) == 9
    with pytest.raises(ExportError, match="holds one entity type"):
        export_embeddings(static_layout / "config.json", tmp_path / "both.parquet", fmt="parquet")


def test_static_relations_tsv_and_json(static_layout: Path, tmp_path: Path) -> None:
    params = CheckpointDir(static_layout / "checkpoint").read_model().params
    export_relations(static_layout / "config.json", tmp_path / "rel.tsv")
    lines = [line.split("\t") for line in (tmp_path / "rel.tsv").read_text().splitlines()]
    assert [line[:5] for line in lines] == [["follows", "rhs", "translation", "translation", "4"],
                                           ["likes", "rhs", "diagonal", "diagonal", "6"]]
    for i, line in enumerate(lines):
        want = params[f"relations/{i}/operator/rhs/{line[3]}"]
        assert np.array_equal(bits(np.array([np.float32(v) for v in line[5:]])), bits(want.ravel()))
    export_relations(static_layout / "config.json", tmp_path / "rel.json", fmt="json")
    doc = json.loads((tmp_path / "rel.json").read_text())
    assert doc["checkpoint_version"] == 1 and doc["dynamic_relations"] is False
    got = np.array(doc["relations"][1]["parameters"]["rhs"]["diagonal"]["values"], dtype=np.float32)
    assert np.array_equal(bits(got), bits(params["relations/1/operator/rhs/diagonal"]))


def test_dynamic_relations_both_sides(dynamic_layout: Path, tmp_path: Path) -> None:
    params = CheckpointDir(dynamic_layout / "checkpoint").read_model().params
    names = read_relation_names(dynamic_layout / "entities")
    export_relations(dynamic_layout / "config.json", tmp_path / "rel.tsv")
    lines = [line.split("\t") for line in (tmp_path / "rel.tsv").read_text().splitlines()]
    assert len(lines) == len(names) * 2 * 2  # relations x sides x (linear_transformations, translations)
    for line in lines:
        name, side, op, param, shape, *values = line
        assert op == "affine"
        full = params[f"relations/0/operator/{side}/{param}"][names.index(name)]
        assert shape == "x".join(map(str, full.shape))
        assert np.array_equal(bits(np.array([np.float32(v) for v in values])), bits(full.ravel()))
    export_relations(dynamic_layout / "config.json", tmp_path / "r.json", fmt="json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["name"] for r in doc["relations"]] == names
    lt = np.array(doc["relations"][2]["parameters"]["lhs"]["linear_transformations"]["values"], np.float32)
    assert np.array_equal(bits(lt), bits(params["relations/0/operator/lhs/linear_transformations"][2]))
    # dynamic mode has no global embeddings: rows are exported as stored
    export_embeddings(dynamic_layout / "config.json", tmp_path / "e.tsv")
    names_u, values_u = expected_rows(dynamic_layout, "user", add_global=False)
    found = read_tsv(tmp_path / "e.tsv")
    assert all(np.array_equal(bits(found[n]), bits(v)) for n, v in zip(names_u, values_u, strict=True))


def test_export_refusals(static_layout: Path, tmp_path: Path) -> None:
    config = static_layout / "config.json"
    out = tmp_path / "emb.tsv"
    export_embeddings(config, out)
    with pytest.raises(OutputExistsError):
        export_embeddings(config, out)
    export_embeddings(config, out, overwrite=True)
    with pytest.raises(ExportError, match="entity types of the config"):
        export_embeddings(config, tmp_path / "x.tsv", entity_types=["nope"])
    with pytest.raises(MissingArtifactError):
        export_embeddings(config, tmp_path / "x.tsv", version=7)


def test_export_checks_names_and_global_embeddings(tmp_path: Path) -> None:
    layout = small_valid_layout(featurized=False)
    layout.names[("item", 0)][3] = "has\ttab"
    assert layout.checkpoint is not None
    del layout.checkpoint.model.params[global_embedding_name("item")]
    write_layout(tmp_path, layout)
    config = tmp_path / "config.json"
    with pytest.raises(ExportError, match="global_embedding"):
        export_embeddings(config, tmp_path / "a.tsv")
    with pytest.raises(ExportError, match="tab or a line break"):
        export_embeddings(config, tmp_path / "a.tsv", add_global=False)
    export_embeddings(config, tmp_path / "a.parquet", fmt="parquet", add_global=False, entity_types=["item"])
    assert pl.read_parquet(tmp_path / "a.parquet")["name"][3] == "has\ttab"


def test_import_train_export_pipeline_with_featurized_type(tmp_path: Path) -> None:
    """Import (featurized docs), fake a trained checkpoint, export: features come out named."""
    (tmp_path / "config.json").write_text(json.dumps({
        "entities": {"author": {"num_partitions": 2}, "doc": {"num_partitions": 1, "featurized": True}},
        "relations": [{"name": "wrote", "lhs": "author", "rhs": "doc", "operator": "diagonal"}],
        "dimension": 3, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
        "num_uniform_negs": 0, "eval_num_uniform_negs": 0}))
    (tmp_path / "t.tsv").write_text("ann\twrote\tcats purr\nbob\twrote\tdogs bark\ncy\twrote\tcats bark\n")
    import_edge_lists(tmp_path / "config.json", [tmp_path / "t.tsv"])
    cfg = load_config(tmp_path / "config.json")
    rng = np.random.default_rng(0)
    embeddings = {(t, p): EmbeddingsState(rng.standard_normal(
        (read_entity_count(tmp_path / "data", t, p), 3)).astype(np.float32))
        for t, e in cfg.entities.items() for p in range(e.num_partitions)}
    model = ModelState({k: rng.standard_normal(v).astype(np.float32)
                        for k, v in expected_params(cfg, None).items()})
    write_checkpoint(CheckpointDir(tmp_path / "model"), 1, embeddings=embeddings, model=model, config=cfg)
    export_embeddings(tmp_path / "config.json", tmp_path / "emb.tsv")
    found = read_tsv(tmp_path / "emb.tsv")
    assert set(found) == {"ann", "bob", "cy", "cats", "purr", "dogs", "bark"}
    names, values = expected_rows(tmp_path, "doc")
    assert all(np.array_equal(bits(found[n]), bits(v)) for n, v in zip(names, values, strict=True))


@given(st.integers(1, 6).flatmap(lambda d: st.tuples(float32_arrays((5, d)), float32_arrays((d,)))))
def test_any_float32_survives_every_format(arrays: tuple[Floats, Floats]) -> None:
    rows, shift = arrays
    cfg = parse_config({"entities": {"user": {"num_partitions": 1}},
                        "relations": [{"name": "r", "lhs": "user", "rhs": "user"}],
                        "dimension": rows.shape[1],
                        "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model"})
    names = [f"u{i}" for i in range(len(rows))]
    want = (rows + shift).astype(np.float32)
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "config.json").write_text(cfg.to_json())
        write_entity_names(root / "data", "user", 0, names)
        write_entity_count(root / "data", "user", 0, len(names))
        write_checkpoint(CheckpointDir(root / "model"), 1, embeddings={("user", 0): EmbeddingsState(rows)},
                         model=ModelState({global_embedding_name("user"): shift}), config=cfg)
        export_embeddings(root / "config.json", root / "e.tsv")
        export_embeddings(root / "config.json", root / "e.parquet", fmt="parquet")
        export_embeddings(root / "config.json", root / "e.npy", fmt="npy")
        found = read_tsv(root / "e.tsv")
        assert np.array_equal(bits(np.stack([found[n] for n in names])), bits(want))
        got = pl.read_parquet(root / "e.parquet").get_column("embedding").to_numpy()
        assert np.array_equal(bits(got), bits(want))
        assert np.array_equal(bits(np.load(root / "e.npy")), bits(want))


def test_cli_export(static_layout: Path, tmp_path: Path) -> None:
    import typer

    from pbgio.cli.exporting import export

    app = typer.Typer()
    app.command("export")(export)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    config = str(static_layout / "config.json")
    result = runner.invoke(app, ["export", config, "-o", str(tmp_path / "e.tsv"), "--relations-output",
                                 str(tmp_path / "r.json"), "--relations-format", "json", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "global embeddings added to item, user" in result.output
    assert runner.invoke(app, ["export", config, "-o", str(tmp_path / "e.tsv")]).exit_code == 2
    assert runner.invoke(app, ["export", config]).exit_code == 2
    result = runner.invoke(app, ["export", config, "--entities-output", str(tmp_path / "n.tsv"),
                                 "--no-global", "--version", "1", "-t", "user"])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "n.tsv").read_text().splitlines()) == 9


def test_an_export_that_fails_leaves_none_of_its_outputs(static_layout: Path, tmp_path: Path) -> None:
    """The second type's output is in the way: the first type's files, already written, do not
    appear either (no half set of outputs), and the file in the way is untouched."""
    from pbgio.exporters.common import OutputExistsError

    out = tmp_path / "out"
    out.mkdir()
    (out / "item.names.json").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"item\.names\.json"):
        export_embeddings(static_layout / "config.json", out, fmt="npy")
    assert sorted(p.name for p in out.iterdir()) == ["item.names.json"]
    assert (out / "item.names.json").read_text() == "mine"


def test_cli_export_of_embeddings_and_relations_is_one(static_layout: Path, tmp_path: Path) -> None:
    import typer

    from pbgio.cli.exporting import export

    app = typer.Typer()
    app.command("export")(export)
    app.command("noop")(lambda: None)
    (tmp_path / "r.json").write_text("mine")
    result = CliRunner().invoke(app, ["export", str(static_layout / "config.json"), "-o", str(tmp_path / "e.tsv"),
                                      "--relations-output", str(tmp_path / "r.json"), "--no-progress"])
    assert result.exit_code == 2 and "r.json: exists" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
