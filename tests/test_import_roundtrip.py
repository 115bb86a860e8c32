"""``pbgio import``: edge lists in every supported shape round-trip to a layout that validates."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pbgio.edges import read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count, read_entity_names, read_relation_names
from pbgio.importers import ImportSetupError, InputOptions, import_edge_lists
from pbgio.importers.partition import partition_bounds
from pbgio.spec import naming
from pbgio.testing.edgelists import layout_edges
from pbgio.validate import validate_path


def write_config(root: Path, **overrides: Any) -> Path:
    config = {
        "entities": {"user": {"num_partitions": 3}},
        "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
        "dimension": 8,
        "entity_path": "data",
        "edge_paths": ["data/train"],
        "checkpoint_path": "model",
        **overrides,
    }
    if any(e.get("featurized") for e in config["entities"].values()):  # same-batch negatives only (featurized)
        config.setdefault("num_uniform_negs", 0)
        config.setdefault("eval_num_uniform_negs", 0)
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def write_tsv(path: Path, rows: list[tuple[str, ...]], delimiter: str = "\t",
              header: str | None = None) -> Path:
    lines = ([header] if header is not None else []) + [delimiter.join(r) for r in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def assert_valid(config: Path) -> None:
    report = validate_path(config)
    assert report.ok, [str(i) for i in report.issues]


A_B_C = [("a", "follows", "b", None), ("b", "follows", "c", None)]
RNG_NAMES = [f"n{i}" for i in range(40)] + ["émile", "日本", "with space", "quote\"d", "back\\slash"]


def random_rows(n: int, relations: list[str], seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    return [(RNG_NAMES[rng.integers(len(RNG_NAMES))], relations[rng.integers(len(relations))],
             RNG_NAMES[rng.integers(len(RNG_NAMES))]) for _ in range(n)]


def test_tsv_round_trip_static(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    rows = random_rows(500, ["follows"])
    report = import_edge_lists(config, [write_tsv(tmp_path / "train.tsv", rows)])
    assert_valid(config)
    assert (report.read, report.kept, report.skipped, report.filtered) == (500, 500, 0, 0)
    edges = layout_edges(config)["data/train"]
    assert Counter((a, r, b) for a, r, b, _ in edges) == Counter(rows)
    # every bucket of the 3x3 grid is written, empty or not
    present = {p.name for p in (tmp_path / "data/train").iterdir()}
    assert present == {naming.bucket_file(lhs, rhs) for lhs in range(3) for rhs in range(3)}
    assert sum(report.buckets[str(tmp_path / "data/train")].values()) == 500


def test_partitions_follow_the_original_formula_and_the_seed(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    rows = random_rows(300, ["follows"])
    train = write_tsv(tmp_path / "train.tsv", rows)
    import_edge_lists(config, [train], seed=7)
    data = tmp_path / "data"
    names = {p: read_entity_names(data, "user", p) for p in range(3)}
    n = len({r[0] for r in rows} | {r[2] for r in rows})
    bounds = partition_bounds(n, 3)
    assert [len(names[p]) for p in range(3)] == [bounds[p + 1] - bounds[p] for p in range(3)]
    assert [read_entity_count(data, "user", p) for p in range(3)] == [len(names[p]) for p in range(3)]
    first = {p: list(v) for p, v in names.items()}
    # same seed: byte-identical layout; another seed: another assignment
    snapshot = {p.relative_to(data): p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    import_edge_lists(config, [train], seed=7, overwrite=True)
    again = {p.relative_to(data): p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    assert set(again) == set(snapshot)
    assert all(again[k] == snapshot[k] for k in snapshot if k.suffix != ".h5")
    for key in snapshot:
        if key.suffix == ".h5":
            assert read_bucket(data / key) == read_bucket(data / key)
    import_edge_lists(config, [train], seed=8, overwrite=True)
    other = {p: read_entity_names(data, "user", p) for p in range(3)}
    assert other != first
    assert sorted(n for v in other.values() for n in v) == sorted(n for v in first.values() for n in v)


def test_bucket_order_is_input_order(tmp_path: Path) -> None:
    config = write_config(tmp_path, entities={"user": {"num_partitions": 1}})
    rows = random_rows(200, ["follows"], seed=3)
    import_edge_lists(config, [write_tsv(tmp_path / "train.tsv", rows)])
    assert [(a, r, b) for a, r, b, _ in layout_edges(config)["data/train"]] == rows


def test_train_valid_test_share_one_dictionary(tmp_path: Path) -> None:
    config = write_config(tmp_path, entities={"node": {"num_partitions": 2}},
                          relations=[{"name": "rel", "lhs": "node", "rhs": "node",
                                      "operator": "translation"}],
                          dynamic_relations=True, global_emb=False,
                          edge_paths=["data/train", "data/valid", "data/test"])
    sets = {name: random_rows(n, ["r1", "r2", "r3"], seed=i)
            for i, (name, n) in enumerate([("train", 300), ("valid", 40), ("test", 50)])}
    sets["test"].append(("only_in_test", "r_test_only", "n1"))
    files = [write_tsv(tmp_path / f"{name}.tsv", rows) for name, rows in sets.items()]
    report = import_edge_lists(config, files)
    assert_valid(config)
    data = tmp_path / "data"
    assert read_relation_names(data) == ["r1", "r2", "r3", "r_test_only"]
    assert read_dynamic_rel_count(data) == 4
    assert "only_in_test" in read_entity_names(data, "node", 0) + read_entity_names(data, "node", 1)
    edges = layout_edges(config)
    for name, rows in sets.items():
        assert Counter((a, r, b) for a, r, b, _ in edges[f"data/{name}"]) == Counter(rows)
    assert report.relation_types == 4 and report.dynamic


def test_static_relations_with_several_types(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 1}, "tag": {"num_partitions": 2}},
        relations=[{"name": "follows", "lhs": "user", "rhs": "user"},
                   {"name": "buys", "lhs": "user", "rhs": "item", "operator": "diagonal"},
                   {"name": "tagged", "lhs": "tag", "rhs": "item"}])
    rows = [("ann", "follows", "bob"), ("ann", "buys", "pen"), ("bob", "buys", "cup"),
            ("red", "tagged", "pen"), ("ann", "tagged", "cup"),  # 'ann' the tag is not 'ann' the user
            ("cy", "follows", "ann")]
    import_edge_lists(config, [write_tsv(tmp_path / "train.tsv", rows)])
    assert_valid(config)
    data = tmp_path / "data"
    users = read_entity_names(data, "user", 0) + read_entity_names(data, "user", 1)
    tags = read_entity_names(data, "tag", 0) + read_entity_names(data, "tag", 1)
    assert sorted(users) == ["ann", "bob", "cy"]
    assert sorted(tags) == ["ann", "red"]
    assert sorted(read_entity_names(data, "item", 0)) == ["cup", "pen"]
    assert read_relation_names(data) == ["follows", "buys", "tagged"]
    assert not (data / naming.DYNAMIC_REL_COUNT).exists()
    assert Counter((a, r, b) for a, r, b, _ in layout_edges(config)["data/train"]) == Counter(rows)


def test_float_weights_are_kept_as_float32(tmp_path: Path) -> None:
    config = write_config(tmp_path, entities={"user": {"num_partitions": 2}})
    rows = [("a", "follows", "b", "0.5"), ("b", "follows", "c", "1.7"), ("c", "follows", "a", "2e-3"),
            ("a", "follows", "c", "3")]
    import_edge_lists(config, [write_tsv(tmp_path / "train.tsv", rows)], options=InputOptions(weight_col=3))
    assert_valid(config)
    found = {(a, b): w for a, _, b, w in layout_edges(config)["data/train"]}
    assert found == {(a, b): float(np.float32(w)) for a, _, b, w in rows}


def test_csv_with_header_and_named_columns(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    rows = random_rows(50, ["follows"])
    path = write_tsv(tmp_path / "edges.csv", [(b, "x", a, r) for a, r, b in rows], delimiter=",",
                     header="target,junk,source,kind")
    options = InputOptions(delimiter=",", header=True, lhs_col="source", rel_col="kind", rhs_col="target")
    report = import_edge_lists(config, [path], options=options)
    assert report.kept == 50
    assert Counter((a, r, b) for a, r, b, _ in layout_edges(config)["data/train"]) == Counter(rows)


def test_whitespace_mode_like_the_original(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "edges.txt"
    path.write_text("a  follows\tb\n\n   \nb follows c   \n", encoding="utf-8")
    report = import_edge_lists(config, [path], options=InputOptions(delimiter="whitespace"))
    assert report.read == 2 and report.kept == 2
    assert sorted(layout_edges(config)["data/train"]) == A_B_C


def test_no_relation_column_uses_the_only_relation(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = write_tsv(tmp_path / "pairs.tsv", [("a", "b"), ("b", "c")])
    import_edge_lists(config, [path], options=InputOptions(rel_col=None, rhs_col=1))
    assert sorted(layout_edges(config)["data/train"]) == A_B_C


def test_crlf_bom_and_empty_lines(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = tmp_path / "win.tsv"
    path.write_bytes("\ufeffa\tfollows\tb\r\n\r\nb\tfollows\tc\r\n".encode())
    report = import_edge_lists(config, [path])
    assert report.read == 2
    assert sorted(layout_edges(config)["data/train"]) == A_B_C


def test_minimum_counts_filter_entities_and_relations(tmp_path: Path) -> None:
    config = write_config(tmp_path, entities={"n": {"num_partitions": 1}},
                          relations=[{"name": "r", "lhs": "n", "rhs": "n"}], dynamic_relations=True,
                          global_emb=False)
    rows = [("a", "common", "b")] * 3 + [("a", "common", "rare")] + [("a", "seldom", "b")]
    report = import_edge_lists(config, [write_tsv(tmp_path / "t.tsv", rows)], entity_min_count=2,
                               relation_min_count=2)
    data = tmp_path / "data"
    assert read_relation_names(data) == ["common"]
    # counts are taken over edges of kept relations: 'a' 4x, 'b' 3x, 'rare' once
    assert sorted(read_entity_names(data, "n", 0)) == ["a", "b"]
    assert (report.kept, report.filtered, report.skipped) == (3, 2, 0)
    assert_valid(config)


def test_static_relation_min_count_keeps_ids(tmp_path: Path) -> None:
    config = write_config(tmp_path, relations=[{"name": "follows", "lhs": "user", "rhs": "user"},
                                               {"name": "blocks", "lhs": "user", "rhs": "user"}])
    rows = [("a", "follows", "b"), ("b", "follows", "c"), ("c", "blocks", "a")]
    report = import_edge_lists(config, [write_tsv(tmp_path / "t.tsv", rows)], relation_min_count=2)
    assert report.kept == 2 and report.filtered == 1
    assert sorted(e[:3] for e in layout_edges(config)["data/train"]) == sorted(rows[:2])
    assert_valid(config)


def test_featurized_documents(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        entities={"author": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        relations=[{"name": "wrote", "lhs": "author", "rhs": "doc"},
                   {"name": "knows", "lhs": "author", "rhs": "author"}],
        num_uniform_negs=0)
    rows = [("ann", "wrote", "the cat sat"), ("bob", "wrote", "the  dog"), ("ann", "knows", "bob"),
            ("cy", "wrote", "cat")]
    import_edge_lists(config, [write_tsv(tmp_path / "t.tsv", rows)])
    assert_valid(config)
    data = tmp_path / "data"
    assert sorted(read_entity_names(data, "doc", 0)) == ["cat", "dog", "sat", "the"]
    assert read_entity_count(data, "doc", 0) == 4  # features, not documents
    edges = layout_edges(config)["data/train"]
    assert Counter(edges) == Counter([("ann", "wrote", ("the", "cat", "sat"), None),
                                      ("bob", "wrote", ("the", "dog"), None), ("ann", "knows", "bob", None),
                                      ("cy", "wrote", ("cat",), None)])
    bucket = read_bucket(tmp_path / "data/train/edges_0_0.h5")
    assert bucket.rhs_features is not None and bucket.lhs_features is None
    plain = bucket.rel == 1
    assert (bucket.rhs[~plain] == -1).all()  # ignored for featurized entities
    assert all(len(bucket.rhs_features.bag(i)) == 0 for i in np.flatnonzero(plain))


def test_featurized_min_count_drops_rare_features_and_empty_bags(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        entities={"author": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        relations=[{"name": "wrote", "lhs": "author", "rhs": "doc"}], num_uniform_negs=0)
    rows = [("ann", "wrote", "a b"), ("ann", "wrote", "a c"), ("bob", "wrote", "zz"), ("bob", "wrote", "a")]
    report = import_edge_lists(config, [write_tsv(tmp_path / "t.tsv", rows)], entity_min_count=2)
    assert read_entity_names(tmp_path / "data", "doc", 0) == ["a"]
    assert sorted(e[2] for e in layout_edges(config)["data/train"]) == [("a",), ("a",), ("a",)]
    assert report.filtered == 1  # 'zz' was its bag's only feature
    assert_valid(config)


def test_parquet_input_with_list_features_and_int_ids(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        entities={"user": {"num_partitions": 2}, "doc": {"num_partitions": 1, "featurized": True}},
        relations=[{"name": "reads", "lhs": "user", "rhs": "doc"}], num_uniform_negs=0)
    path = tmp_path / "edges.parquet"
    pl.DataFrame({"who": [1, 2, 3], "words": [["x", "y"], ["y"], ["z", "x"]],
                  "w": [0.5, 1.0, 2.0]}).write_parquet(path)
    options = InputOptions(lhs_col="who", rel_col=None, rhs_col="words", weight_col="w")
    report = import_edge_lists(config, [path], options=options)
    assert report.kept == 3
    assert_valid(config)
    assert sorted(layout_edges(config)["data/train"]) == [
        ("1", "reads", ("x", "y"), 0.5), ("2", "reads", ("y",), 1.0), ("3", "reads", ("z", "x"), 2.0)]


def test_one_edge_path_takes_many_files(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    a = write_tsv(tmp_path / "a.tsv", [("a", "follows", "b")])
    b = write_tsv(tmp_path / "b.tsv", [("b", "follows", "c")])
    report = import_edge_lists(config, [a, b])
    assert report.kept == 2 and len(report.files) == 2


def test_input_sets_must_match_edge_paths(tmp_path: Path) -> None:
    config = write_config(tmp_path, edge_paths=["data/train", "data/test"])
    a = write_tsv(tmp_path / "a.tsv", [("a", "follows", "b")])
    with pytest.raises(ImportSetupError, match="expected 2 input files"):
        import_edge_lists(config, [a])
    report = import_edge_lists(config, [[a, a], [a]])
    assert [f.kept for f in report.files] == [1, 1, 1]
    assert_valid(config)
