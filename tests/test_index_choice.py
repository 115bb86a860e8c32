"""Several indexes per entity type and version: one per metric and kind, named so
(``index_{type}.{metric}.{kind}.v{version}.h5``), each search taking the one that fits it and
saying which; pbgio 0.1's ``index_{type}.v{version}.h5`` still read; a name that disagrees with
its metadata refused and reported by ``pbgio validate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pbgio.cli import app as pbgio_app
from pbgio.config import load_config
from pbgio.errors import FormatError
from pbgio.index import IndexMismatchError, build_index, find_index, open_index
from pbgio.layout import open_checkpoint
from pbgio.names import names_at
from pbgio.neighbors import nearest_neighbors
from pbgio.spec import naming
from pbgio.validate import validate_path
from tests.test_index import _clustered_layout
from tests.test_predict import model_layout

pytest.importorskip("faiss")


def test_a_cos_index_beside_a_dot_one_each_search_takes_its_own_and_says_which(tmp_path: Path) -> None:
    """The trial of issue 37: a cos index built for neighbours no longer replaces the dot index a
    dot model's predictions use."""
    from pbgtrain.cli import app as pbgtrain_app

    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="dot")
    cfg = load_config(config)
    relation = next(r for r in cfg.relations if r.name == "follows")  # user → user
    runner = CliRunner()
    for metric in ("dot", "cos"):
        built = runner.invoke(pbgio_app, ["index", "build", str(config), "--type", "user", "--metric", metric,
                                          "--no-progress"])
        assert built.exit_code == 0, built.output
    ckpt = tmp_path / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("index_")) == [
        "index_user.cos.flat.v1.h5", "index_user.dot.flat.v1.h5"]
    name = names_at(config.parent / cfg.entity_path, relation.lhs, 0, [0])[0]
    predicted = runner.invoke(pbgtrain_app, ["predict", str(config), "--lhs", name, "--rel", relation.name, "-k", "3",
                                             "--index"])
    assert predicted.exit_code == 0, predicted.output
    assert "searched: index_user.dot.flat.v1.h5, faiss flat, " in predicted.output.splitlines()[0]
    for metric in ("cos", "dot"):
        found = nearest_neighbors(config, "user", [name], k=3, metric=metric, index=True)  # type: ignore[arg-type]
        exact = nearest_neighbors(config, "user", [name], k=3, metric=metric)  # type: ignore[arg-type]
        assert found[0].searched == f"index_user.{metric}.flat.v1.h5, faiss flat, exact"
        assert [n.name for n in found[0].neighbors] == [n.name for n in exact[0].neighbors]
    assert validate_path(config).ok


def test_a_model_with_no_index_of_its_metric_falls_back_and_names_what_there_is(tmp_path: Path) -> None:
    from pbgtrain.predict import top_k

    config = model_layout(tmp_path, operators=("diagonal", "diagonal"), comparator="dot")
    cfg = load_config(config)
    build_index(config, "user", metric="cos")
    name = names_at(config.parent / cfg.entity_path, "user", 0, [0])[0]
    ranking = top_k(config, rel="follows", lhs=name, k=3, index=True)
    assert ranking.searched.startswith("exact (the model ranks 'user' candidates by dot, no index of version 1 "
                                       "does: found index_user.cos.flat.v1.h5 (flat by cos); build one: ")
    assert "found index_user.cos.flat.v1.h5 (flat by cos)" in ranking.searched
    assert "pbgio index build CONFIG --type user --metric dot" in ranking.searched
    assert ranking.predictions == top_k(config, rel="follows", lhs=name, k=3).predictions


def test_of_several_fitting_kinds_the_approximate_one_is_taken_unless_a_kind_is_asked(tmp_path: Path) -> None:
    config = _clustered_layout(tmp_path)
    build_index(config, "item", kind="flat")
    build_index(config, "item", kind="ivf", nlist=20)
    with open_index(config, "item") as index:
        assert index.path.name == "index_item.cos.ivf.v1.h5" and index.describe().startswith(index.path.name)
    with open_index(config, "item", kind="flat") as index:
        assert index.path.name == "index_item.cos.flat.v1.h5"
    with pytest.raises(IndexMismatchError, match=r"a hnsw index of 'item'.*found index_item.cos.flat.v1.h5 \(flat by "
                                                 r"cos\); index_item.cos.ivf.v1.h5 \(ivf by cos\).*--kind hnsw"):
        open_index(config, "item", kind="hnsw")
    with pytest.raises(IndexMismatchError, match=r"a dot index of 'item'"):
        open_index(config, "item", metric="dot")
    build_index(config, "item", kind="flat")  # built again: the same file, replaced
    assert sorted(p.name for p in (tmp_path / "model").iterdir() if p.name.startswith("index_")) == [
        "index_item.cos.flat.v1.h5", "index_item.cos.ivf.v1.h5"]


def test_the_rows_with_or_without_the_global_embedding_pick_the_index(tmp_path: Path) -> None:
    config = model_layout(tmp_path, comparator="cos", global_emb=True)
    build_index(config, "user", kind="flat", add_global=False)
    build_index(config, "user", kind="hnsw")
    cfg = load_config(config)
    name = names_at(config.parent / cfg.entity_path, "user", 0, [0])[0]
    with_global = nearest_neighbors(config, "user", [name], k=2, index=True)
    without = nearest_neighbors(config, "user", [name], k=2, index=True, add_global=False)
    assert with_global[0].searched.startswith("index_user.cos.hnsw.v1.h5")
    assert without[0].searched.startswith("index_user.cos.flat.v1.h5")


def test_an_index_with_the_name_of_pbgio_0_1_is_still_read_after_one_of_today(tmp_path: Path) -> None:
    config = model_layout(tmp_path, comparator="cos")
    built = build_index(config, "user", kind="flat")
    old = built.path.with_name("index_user.v1.h5")  # how pbgio 0.1 named it
    built.path.rename(old)
    assert naming.parse_index_file(old.name) == naming.IndexName("user", 1, None, None)
    source = open_checkpoint(config)
    assert find_index(source, "user", metric="cos", kind="flat") == old  # its metadata says cos and flat
    with open_index(config, "user") as index:
        assert index.describe() == "index_user.v1.h5, faiss flat, exact"
    report = validate_path(config)
    assert report.ok and report.checked["index files"] == 1
    rebuilt = build_index(config, "user", kind="flat")
    assert find_index(source, "user") == rebuilt.path  # today's name first
    with pytest.raises(IndexMismatchError, match=r"index_user.v1.h5 \(flat by cos\)"):
        find_index(source, "user", metric="dot")


def test_a_name_that_disagrees_with_the_metadata_is_refused_and_reported(tmp_path: Path) -> None:
    config = model_layout(tmp_path, comparator="cos")
    built = build_index(config, "user", kind="flat")
    renamed = built.path.with_name(naming.index_file("user", 1, "dot", "flat"))
    built.path.rename(renamed)
    with pytest.raises(FormatError, match=r"expected metric 'dot' \(the file name's\), found metric 'cos'.*"
                                          r"\[index-version-mismatch\]"):
        open_index(config, "user", metric="dot")
    report = validate_path(config)
    assert report.rule_ids() == {"index-version-mismatch"}
    assert any(renamed.name in str(issue) for issue in report.errors)


def test_info_lists_the_indexes_of_the_checkpoint(tmp_path: Path) -> None:
    config = model_layout(tmp_path, comparator="dot")
    for metric in ("cos", "dot"):
        build_index(config, "user", metric=metric)
    runner = CliRunner()
    done = runner.invoke(pbgio_app, ["info", str(config), "--json"])
    assert done.exit_code == 0, done.output
    indexes = ["index_user.cos.flat.v1.h5", "index_user.dot.flat.v1.h5"]
    assert json.loads(done.stdout)["checkpoint"]["indexes"] == indexes
    human = " ".join(runner.invoke(pbgio_app, ["info", str(config)], env={"COLUMNS": "200"}).stdout.split())
    assert "indexes index_user.cos.flat.v1.h5, index_user.dot.flat.v1.h5" in human, human


def test_a_fitting_index_whose_metadata_is_gone_is_refused_with_its_rule(tmp_path: Path) -> None:
    """Neighbours read every candidate's metadata (for its global embedding): the one whose name
    fits the search and whose metadata is gone is refused for that, not passed over."""
    import h5py

    from pbgio.spec.index import META_ATTR

    config = model_layout(tmp_path, comparator="cos")
    path = build_index(config, "user", kind="flat").path
    with h5py.File(path, "r+") as f:
        del f.attrs[META_ATTR]
    cfg = load_config(config)
    name = names_at(config.parent / cfg.entity_path, "user", 0, [0])[0]
    with pytest.raises(FormatError, match="index-foreign"):
        nearest_neighbors(config, "user", [name], k=2, index=True)
    with pytest.raises(IndexMismatchError, match=r"found index_user.cos.flat.v1.h5 \(unreadable\)"):
        nearest_neighbors(config, "user", [name], k=2, metric="dot", index=True)
