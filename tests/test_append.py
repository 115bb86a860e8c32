"""``pbgio import --append`` / ``append_edge_lists``: known entities stay put, new ones are placed by
the documented rule, buckets gain exactly the new edges, and a failure leaves the old layout
byte for byte."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbgio.config import load_config
from pbgio.edges import read_bucket
from pbgio.entities import read_entity_count, read_entity_names, read_relation_names
from pbgio.errors import FormatError, InputError, MissingArtifactError, OutputError
from pbgio.importers import InputOptions, import_edge_lists
from pbgio.importers.append import append_edge_lists, fill_shares, place_new
from pbgio.importers.partition import shuffled_order
from pbgio.importers.plan import ImportSetupError
from pbgio.spec import naming
from pbgio.validate import validate_path
from tests import cli
from tests.profiles import examples

Row = tuple[str, str, str]

STATIC = {
    "entities": {"user": {"num_partitions": 3}, "item": {"num_partitions": 1}},
    "relations": [{"name": "follows", "lhs": "user", "rhs": "user"},
                  {"name": "likes", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
    "dimension": 4, "entity_path": "data", "edge_paths": ["data/train", "data/test"], "checkpoint_path": "model",
}
DYNAMIC = {
    "entities": {"n": {"num_partitions": 2}},
    "relations": [{"name": "all", "lhs": "n", "rhs": "n", "operator": "diagonal"}],
    "dynamic_relations": True, "global_emb": False,
    "dimension": 4, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
}


def write_tsv(path: Path, rows: Sequence[Row]) -> Path:
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_config(root: Path, config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"
    path.write_text(json.dumps(config))
    return path


def static_rows(seed: int, n: int, users: range, items: range) -> list[Row]:
    rng = random.Random(seed)
    rows: list[Row] = []
    for _ in range(n):
        if rng.random() < 0.5:
            rows.append((f"u{rng.choice(users)}", "follows", f"u{rng.choice(users)}"))
        else:
            rows.append((f"u{rng.choice(users)}", "likes", f"i{rng.choice(items)}"))
    return rows


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too), by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def names_of(data: Path, entity_type: str, parts: int) -> list[list[str]]:
    return [read_entity_names(data, entity_type, p) for p in range(parts)]


def bucket_edges(edge_dir: Path, grid: tuple[int, int]) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    out = {}
    for lhs in range(grid[0]):
        for rhs in range(grid[1]):
            b = read_bucket(edge_dir / naming.bucket_file(lhs, rhs))
            out[(lhs, rhs)] = list(zip(b.rel.tolist(), b.lhs.tolist(), b.rhs.tolist(), strict=True))
    return out


def direct_buckets(config: Path, tsvs: Sequence[Path]) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """The buckets computed straight from the TSVs (rows in file order) and the names files."""
    cfg = load_config(config)
    data = config.parent / cfg.entity_path
    place = {t: {name: (p, o) for p in range(e.num_partitions)
                 for o, name in enumerate(read_entity_names(data, t, p))} for t, e in cfg.entities.items()}
    rel_names = read_relation_names(data) if cfg.dynamic_relations else [r.name for r in cfg.relations]
    out: dict[tuple[int, int], list[tuple[int, int, int]]] = {
        (lhs, rhs): [] for lhs in range(cfg.bucket_grid()[0]) for rhs in range(cfg.bucket_grid()[1])}
    for tsv in tsvs:
        for line in tsv.read_text(encoding="utf-8").split("\n")[:-1]:  # not splitlines: names may hold \x1e
            lhs, rel, rhs = line.split("\t")
            rel_id = rel_names.index(rel)
            relation = cfg.relations[0 if cfg.dynamic_relations else rel_id]
            (lp, lo), (rp, ro) = place[relation.lhs][lhs], place[relation.rhs][rhs]
            out[(lp, rp)].append((rel_id, lo, ro))
    return out


@pytest.fixture(scope="session")
def static_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``static_layout``, imported once (its paths are relative: copies work)."""
    base = tmp_path_factory.mktemp("static-layout")
    config = make_config(base / "layout", STATIC)
    train = write_tsv(base / "train.tsv", static_rows(1, 400, range(40), range(15)))
    test = write_tsv(base / "test.tsv", static_rows(2, 60, range(40), range(15)))
    import_edge_lists(config, [train, test], seed=3)
    return base


@pytest.fixture
def static_layout(static_template: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """An imported layout: 40 users (3 partitions), 15 items, train and test edges (a copy of
    the session's, which tests may change)."""
    shutil.copytree(static_template, tmp_path, dirs_exist_ok=True)
    return tmp_path / "layout" / "config.json", [tmp_path / "train.tsv", tmp_path / "test.tsv"]


# ------------------------------------------------------------------------------- the rule


def test_fill_shares_fills_the_smallest_partitions_first() -> None:
    assert fill_shares([5, 3, 4], 4) == [1, 2, 1]
    assert fill_shares([10, 0, 0], 5) == [0, 3, 2]  # ties go to the lower partition number
    assert fill_shares([10, 0, 0], 30) == [4, 13, 13]
    assert fill_shares([0], 7) == [7]
    with pytest.raises(ValueError, match="expected"):
        fill_shares([1], -1)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(0, 200))
def test_fill_shares_is_balanced(sizes: list[int], new: int) -> None:
    shares = fill_shares(sizes, new)
    final = [s + n for s, n in zip(sizes, shares, strict=True)]
    assert sum(shares) == new and min(shares) >= 0
    for p, share in enumerate(shares):
        if share:  # a partition that got names is within one of every partition (water-filling)
            assert all(final[p] <= f + 1 for f in final)
    # no partition was raised past the level of one that could have taken its names
    assert max(final) - min(final) <= max(max(sizes) - min(final), 1)
    assert fill_shares(sizes, new) == shares
    parts, offsets = place_new(sizes, new)
    assert np.bincount(parts, minlength=len(sizes)).tolist() == shares
    for p in range(len(sizes)):
        assert offsets[parts == p].tolist() == list(range(sizes[p], final[p]))


NAME = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\t\n\r\ufeff"),
               min_size=1, max_size=5)


@settings(max_examples=examples(15), deadline=None)
@given(st.lists(NAME, min_size=1, max_size=20, unique=True), st.lists(NAME, min_size=1, max_size=20, unique=True),
       st.integers(1, 4), st.integers(0, 5), st.randoms(use_true_random=False))
def test_append_property(old: list[str], more: list[str], partitions: int, seed: int, rnd: random.Random) -> None:
    """Random names: known ones keep their place, new ones go where the rule says, the same inputs in
    another order give the same names files, and the buckets hold old edges then new ones."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        config = make_config(root / "a", {**DYNAMIC, "entities": {"n": {"num_partitions": partitions}}})
        old_rows = [(a, "r", rnd.choice(old)) for a in old]
        new_rows = [(rnd.choice(old + more), rnd.choice(["r", "s"]), b) for b in more]
        first = write_tsv(root / "old.tsv", old_rows)
        second = write_tsv(root / "new.tsv", new_rows)
        import_edge_lists(config, [first], seed=seed)
        shutil.copytree(root / "a", root / "b")
        before = names_of(root / "a/data", "n", partitions)
        append_edge_lists(config, [second], seed=seed)
        after = names_of(root / "a/data", "n", partitions)
        assert all(a[: len(b)] == b for a, b in zip(after, before, strict=True))
        new = sorted(set(more) - set(old), key=lambda s: s.encode("utf-8"))
        new = [new[i] for i in shuffled_order(len(new), seed=seed, salt="n")]
        shares = fill_shares([len(b) for b in before], len(new))
        start = 0
        for p in range(partitions):
            assert after[p][len(before[p]):] == new[start:start + shares[p]]
            start += shares[p]
        assert validate_path(config).ok
        assert bucket_edges(root / "a/data/train", (partitions, partitions)) == direct_buckets(config, [first, second])
        shuffled = list(new_rows)
        rnd.shuffle(shuffled)
        append_edge_lists(root / "b/config.json", [write_tsv(root / "shuffled.tsv", shuffled)], seed=seed)
        assert names_of(root / "b/data", "n", partitions) == after


# ------------------------------------------------------------------------------- round trip


def test_round_trip(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    config, old_inputs = static_layout
    root = config.parent
    data = root / "data"
    users_before, items_before = names_of(data, "user", 3), names_of(data, "item", 1)
    new_train = write_tsv(tmp_path / "new_train.tsv", static_rows(5, 150, range(30, 62), range(10, 20)))
    new_test = write_tsv(tmp_path / "new_test.tsv", static_rows(6, 20, range(35, 62), range(12, 20)))
    report = append_edge_lists(config, [new_train, new_test], seed=7)

    users, items = names_of(data, "user", 3), names_of(data, "item", 1)
    for after, before in ((users, users_before), (items, items_before)):
        assert all(a[: len(b)] == b for a, b in zip(after, before, strict=True))  # partition and offset kept
    for entity_type, after, before in (("user", users, users_before), ("item", items, items_before)):
        seen = {n for f in (new_train, new_test) for line in f.read_text().splitlines()
                for n in (line.split("\t")[0], line.split("\t")[2]) if n[0] == entity_type[0]}
        new = sorted(seen - {n for part in before for n in part})
        new = [new[i] for i in shuffled_order(len(new), seed=7, salt=entity_type)]
        shares = fill_shares([len(b) for b in before], len(new))
        expected, start = [], 0
        for p, b in enumerate(before):
            expected.append(b + new[start:start + shares[p]])
            start += shares[p]
        assert after == expected
        for p, names in enumerate(after):
            assert read_entity_count(data, entity_type, p) == len(names)
        assert report.append is not None
        assert report.append.new[entity_type] == shares
        assert report.append.before[entity_type] == [len(b) for b in before]
        assert report.entities[entity_type] == [len(a) for a in after]
    assert validate_path(config).ok
    for edge_path, inputs in (("train", [old_inputs[0], new_train]), ("test", [old_inputs[1], new_test])):
        assert bucket_edges(data / edge_path, (3, 3)) == direct_buckets(config, inputs)
    added = report.append.added
    assert sum(added[str(data / "train")].values()) == 150 and sum(added[str(data / "test")].values()) == 20
    assert sum(report.buckets[str(data / "train")].values()) == 400 + 150
    assert report.kept == 170 and report.relation_types == 2 and report.append.relation_types_before == 2
    assert not list(root.rglob(".pbgio-import-*")) and not list(root.rglob("*.tmp"))


def test_append_twice_and_determinism(tmp_path: Path, static_layout: tuple[Path, list[Path]]) -> None:
    config, old_inputs = static_layout
    shutil.copytree(config.parent, tmp_path / "copy")
    batches = [write_tsv(tmp_path / f"b{i}.tsv", static_rows(10 + i, 80, range(20 + 10 * i, 50 + 15 * i),
                                                           range(5, 25))) for i in range(2)]
    for copy in (config.parent, tmp_path / "copy"):
        for batch in batches:
            append_edge_lists(copy / "config.json", [batch], edge_path="data/train", seed=1)
    first, second = snapshot(config.parent / "data"), snapshot(tmp_path / "copy" / "data")
    assert {k: v for k, v in first.items() if k.endswith((".json", ".txt"))} == \
        {k: v for k, v in second.items() if k.endswith((".json", ".txt"))}
    for edge_path in ("train", "test"):
        assert bucket_edges(config.parent / "data" / edge_path, (3, 3)) == \
            bucket_edges(tmp_path / "copy" / "data" / edge_path, (3, 3))
    assert bucket_edges(config.parent / "data/train", (3, 3)) == direct_buckets(config, [old_inputs[0], *batches])
    assert bucket_edges(config.parent / "data/test", (3, 3)) == direct_buckets(config, [old_inputs[1]])
    assert validate_path(config).ok


def test_a_new_edge_path_is_created(tmp_path: Path, static_layout: tuple[Path, list[Path]]) -> None:
    config, _ = static_layout
    cfg = json.loads(config.read_text())
    cfg["edge_paths"] = ["data/train", "data/test", "data/extra"]
    config.write_text(json.dumps(cfg))
    extra = write_tsv(tmp_path / "extra.tsv", [("u1", "likes", "i99"), ("u99", "follows", "u1")])
    report = append_edge_lists(config, [extra], edge_path="data/extra")
    assert validate_path(config).ok
    assert bucket_edges(config.parent / "data/extra", (3, 3)) == direct_buckets(config, [extra])
    assert list(report.append.added) == [str(config.parent / "data/extra")]


def test_dynamic_relations_grow(tmp_path: Path) -> None:
    config = make_config(tmp_path / "dyn", DYNAMIC)
    old = write_tsv(tmp_path / "old.tsv", [("a", "r2", "b"), ("b", "r1", "c"), ("c", "r2", "a")])
    import_edge_lists(config, [old])
    data = config.parent / "data"
    assert read_relation_names(data) == ["r1", "r2"]
    new = write_tsv(tmp_path / "new.tsv", [("d", "r3", "a"), ("a", "r1", "e"), ("e", "r0", "d")])
    report = append_edge_lists(config, [new])
    assert read_relation_names(data) == ["r1", "r2", "r0", "r3"]  # known ids kept, new ones sorted after
    assert (data / "dynamic_rel_count.txt").read_text().strip() == "4"
    assert report.relation_types == 4 and report.append.relation_types_before == 2
    assert "4 relation types (2 new)" in report.entity_line()
    assert bucket_edges(data / "train", (2, 2)) == direct_buckets(config, [old, new])
    assert validate_path(config).ok


def test_weights_are_kept(tmp_path: Path) -> None:
    config = make_config(tmp_path / "w", {**STATIC, "edge_paths": ["data/train"]})
    options = InputOptions(weight_col=3)
    old = tmp_path / "old.tsv"
    old.write_text("u1\tfollows\tu2\t0.5\nu2\tlikes\ti1\t2\n")
    import_edge_lists(config, [old], options=options)
    new = tmp_path / "new.tsv"
    new.write_text("u3\tfollows\tu1\t1.5\n")
    with pytest.raises(ImportSetupError, match="weight column"):
        append_edge_lists(config, [new])
    append_edge_lists(config, [new], options=options)
    weights = sorted(float(w) for lhs in range(3) for rhs in range(3)
                     for w in read_bucket(config.parent / "data/train" / naming.bucket_file(lhs, rhs)).weight)
    assert weights == [0.5, 1.5, 2.0]
    assert validate_path(config).ok


def test_dry_run_writes_nothing(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    config, _ = static_layout
    before = snapshot(config.parent)
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    dry = append_edge_lists(config, [new], edge_path="data/train", dry_run=True)
    assert snapshot(config.parent) == before
    assert dry.summary().startswith("dry run, nothing written: read 50 edges")
    real = append_edge_lists(config, [new], edge_path="data/train")
    assert (dry.append.added, dry.append.new, dry.entities, dry.buckets) == \
        (real.append.added, real.append.new, real.entities, real.buckets)


# ------------------------------------------------------------------------------- errors


def test_unknown_static_relation_names_file_and_line(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    config, _ = static_layout
    before = snapshot(config.parent)
    bad = write_tsv(tmp_path / "bad.tsv", [("u1", "follows", "u2"), ("u1", "blocks", "u3")])
    with pytest.raises(InputError, match=r"bad\.tsv:2: expected a relation of the config \('follows', 'likes'\), "
                                         r"found 'blocks'"):
        append_edge_lists(config, [bad], edge_path="data/train")
    assert snapshot(config.parent) == before


def test_missing_or_invalid_layout(tmp_path: Path, static_layout: tuple[Path, list[Path]]) -> None:
    new = write_tsv(tmp_path / "new.tsv", [("u1", "follows", "u2")])
    empty = make_config(tmp_path / "empty", STATIC)
    with pytest.raises(MissingArtifactError, match="layout to append to"):
        append_edge_lists(empty, [new], edge_path="data/train")
    config, _ = static_layout
    (config.parent / "data/test" / "edges_1_2.h5").unlink()
    with pytest.raises(FormatError, match="edge-file-missing"):
        append_edge_lists(config, [new], edge_path="data/train")
    (config.parent / "data/entity_names_user_1.json").unlink()
    with pytest.raises(FormatError):
        append_edge_lists(config, [new, new])


def test_names_files_are_needed(tmp_path: Path, static_layout: tuple[Path, list[Path]]) -> None:
    config, _ = static_layout
    for p in range(3):
        (config.parent / f"data/entity_names_user_{p}.json").unlink()  # a layout with counts only validates
    assert validate_path(config).ok
    new = write_tsv(tmp_path / "new.tsv", [("u1", "follows", "u2")])
    with pytest.raises(MissingArtifactError, match="needs the names of the layout"):
        append_edge_lists(config, [new], edge_path="data/train")


def test_featurized_types_are_refused(tmp_path: Path) -> None:
    config = make_config(tmp_path / "f", {
        "entities": {"doc": {"num_partitions": 1, "featurized": True}, "user": {"num_partitions": 1}},
        "relations": [{"name": "wrote", "lhs": "user", "rhs": "doc"}], "dimension": 4, "num_uniform_negs": 0,
        "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model"})
    new = write_tsv(tmp_path / "new.tsv", [("u1", "wrote", "w1 w2")])
    with pytest.raises(ImportSetupError, match="append does not support featurized entity types yet \\('doc' is"):
        append_edge_lists(config, [new])


def test_inputs_must_fit_the_edge_paths(tmp_path: Path, static_layout: tuple[Path, list[Path]]) -> None:
    config, _ = static_layout
    new = write_tsv(tmp_path / "new.tsv", [("u1", "follows", "u2")])
    with pytest.raises(ImportSetupError, match=r"expected 2 input files.*--edge-path"):
        append_edge_lists(config, [new])
    with pytest.raises(ImportSetupError, match="one of the config's edge_paths"):
        append_edge_lists(config, [new], edge_path="data/nope")


# ------------------------------------------------------------------------------- atomicity


def test_a_failure_while_writing_leaves_the_layout(static_layout: tuple[Path, list[Path]], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = static_layout
    before = snapshot(config.parent)
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    from pbgio.edges import BucketWriter

    real_close, closed = BucketWriter.close, []

    def failing_close(self: BucketWriter) -> None:
        if len(closed) == 4:
            raise OutputError(str(self.path), OSError(28, "No space left on device"))
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(BucketWriter, "close", failing_close)
    with pytest.raises(OutputError, match=r"edges_1_1\.h5: could not write"):
        append_edge_lists(config, [new], edge_path="data/train")
    assert snapshot(config.parent) == before


@pytest.mark.parametrize("moves", [0, 3, 10, 15])
def test_a_failure_while_committing_rolls_back(static_layout: tuple[Path, list[Path]], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, moves: int) -> None:
    """The commit moves 9 + 9 buckets, 5 names files and 4 counts; it fails after ``moves``."""
    config, _ = static_layout
    before = snapshot(config.parent)
    new_train = write_tsv(tmp_path / "a.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    new_test = write_tsv(tmp_path / "b.tsv", static_rows(6, 10, range(30, 50), range(10, 20)))
    import pbgio.importers.write as write

    real_replace, done = os.replace, []

    def failing_replace(src: str | Path, dst: str | Path) -> None:
        committing = ".pbgio-import-" in str(src) and ".pbgio-import-" not in str(dst)
        if committing and write.BACKUP_DIR not in str(src):
            if len(done) == moves:
                raise OSError(5, "Input/output error")
            done.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(write.os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output"):
        append_edge_lists(config, [new_train, new_test])
    monkeypatch.undo()
    assert snapshot(config.parent) == before


def test_a_killed_commit_is_rolled_back_by_the_next_append(static_layout: tuple[Path, list[Path]], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit stopped half-way with no chance to clean up (as by kill -9): the layout does not
    validate, and the next append puts the old layout back before it appends."""
    config, _ = static_layout
    root = config.parent
    before = snapshot(root)
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    import pbgio.importers.write as write

    real_replace, done = os.replace, []

    def dying_replace(src: str | Path, dst: str | Path) -> None:
        if ".pbgio-import-" in str(src) and ".pbgio-import-" not in str(dst):  # a move of the commit
            if len(done) == 12:
                raise KeyboardInterrupt  # stands for the kill: nothing after it runs...
            done.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(write.os, "replace", dying_replace)
    monkeypatch.setattr(write.Staging, "abort", lambda self: None)  # ...no clean-up either
    with pytest.raises(KeyboardInterrupt):
        append_edge_lists(config, [new, new])
    monkeypatch.undo()
    _as_dead(root)
    assert not validate_path(config).ok  # half-committed: the entity counts are missing
    with pytest.raises(ImportSetupError, match="killed while moving its files into place"):
        append_edge_lists(config, [new], edge_path="data/train", dry_run=True)  # a dry run repairs nothing
    assert not validate_path(config).ok
    from pbgio.importers.write import remove_stale_staging

    remove_stale_staging([root / "data", root / "data/train", root / "data/test"])  # what the next append does
    assert snapshot(root) == before
    report = append_edge_lists(config, [new], edge_path="data/train")
    assert report.append is not None and validate_path(config).ok


# ------------------------------------------------------------------------------- command line


def pbgio(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pbgio ARGS`` in a new process (for the LD_PRELOAD fault shim in ``env``)."""
    return subprocess.run([sys.executable, "-m", "pbgio", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CI": "1", "COLUMNS": "200", **(env or {})})


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages on one line each, as with ``pbgio`` below (for the in-process command)."""
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("COLUMNS", "200")


@pytest.mark.usefixtures("wide")
def test_command_line(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    pbgio = cli.pbgio
    config, _ = static_layout
    new = write_tsv(tmp_path / "new.tsv", [("u1", "follows", "u77"), ("u77", "likes", "i3")])
    before = snapshot(config.parent)
    dry = pbgio("import", "--append", "--dry-run", str(config), str(new), "--edge-path", "data/train", "--json")
    assert dry.returncode == 0, dry.stderr
    assert snapshot(config.parent) == before
    assert json.loads(dry.stdout)["append"]["dry_run"] is True
    assert "user: 1 known, 1 new entity (partitions: +0, +1, +0), 41 in all" in dry.stderr
    done = pbgio("import", "--append", str(config), str(new), "--edge-path", "data/train")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("read 2 edges from 1 file")
    assert lines[1] == ("user: 1 known, 1 new entity (partitions: +0, +1, +0), 41 in all; "
                        "item: 1 known, 0 new entities, 15 in all; 2 relation types (0 new)")
    assert lines[2].startswith(f"{config.parent / 'data/train'}: 2 edges added to 9 buckets, 402 in all (0_0: +")
    assert pbgio("validate", str(config)).returncode == 0


@pytest.mark.usefixtures("wide")
def test_command_line_errors(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    pbgio = cli.pbgio
    config, _ = static_layout
    new = write_tsv(tmp_path / "new.tsv", [("u1", "follows", "u77")])
    usage = pbgio("import", str(config), str(new), "--dry-run")
    assert usage.returncode == 2 and "--dry-run goes with --append" in usage.stderr
    usage = pbgio("import", "--append", "--overwrite", str(config), str(new))
    assert usage.returncode == 2 and "--overwrite does not go with --append" in usage.stderr
    missing = pbgio("import", "--append", str(make_config(tmp_path / "none", STATIC)), str(new), "--edge-path",
                    "data/train")
    assert missing.returncode == 2 and "layout to append to" in missing.stderr
    bad = write_tsv(tmp_path / "bad.tsv", [("u1", "blocks", "u77")])
    failed = pbgio("import", "--append", str(config), str(bad), "--edge-path", "data/train")
    assert failed.returncode == 1 and "bad.tsv:1: expected a relation" in failed.stderr
    assert "(the layout is as it was)" in failed.stderr


def test_a_full_disk_leaves_the_layout(static_layout: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """The OS's own ENOSPC (LD_PRELOAD shim, as tests/test_fault_injection.py) in the middle of a bucket."""
    from pbgio.testing.faults import FaultsUnavailable, build_shim, shim_env

    try:
        build_shim()
    except FaultsUnavailable as exc:  # pragma: no cover - machines without a C compiler
        pytest.skip(str(exc))
    config, _ = static_layout
    before = snapshot(config.parent)
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 3000, range(30, 90), range(10, 30)))
    log = tmp_path / "fault.log"
    done = pbgio("import", "--append", str(config), str(new), "--edge-path", "data/train", "--no-progress",
                 env=shim_env("enospc", "edges_1_", after=2_000, log=log))
    assert log.exists(), done.stderr
    assert done.returncode == 1, done.stderr
    assert "no space left on device" in done.stderr and 'File "/' not in done.stderr
    assert snapshot(config.parent) == before
    again = pbgio("import", "--append", str(config), str(new), "--edge-path", "data/train", "--no-progress")
    assert again.returncode == 0, again.stderr
    assert validate_path(config).ok


def _as_dead(root: Path) -> None:
    """Rename the staging directories under ``root`` as if a process that is gone had left them."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for staged in root.rglob(".pbgio-import-*"):
        staged.rename(staged.with_name(f".pbgio-import-{dead.stdout.strip()}-{staged.name.rsplit('-', 1)[1]}"))


def test_a_rollback_cut_short_is_done_again(static_layout: tuple[Path, list[Path]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = static_layout
    root = config.parent
    before = snapshot(root)
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    import pbgio.importers.write as write

    real_replace, moved = os.replace, []

    def dying_replace(src: str | Path, dst: str | Path) -> None:
        if ".pbgio-import-" in str(src) and ".pbgio-import-" not in str(dst):
            if len(moved) == 20:
                raise KeyboardInterrupt
            moved.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(write.os, "replace", dying_replace)
    monkeypatch.setattr(write.Staging, "abort", lambda self: None)
    with pytest.raises(KeyboardInterrupt):
        append_edge_lists(config, [new, new])
    monkeypatch.undo()
    _as_dead(root)
    real_restore, restored = write._restore, []

    def dying_restore(backup: Path, path: Path) -> None:
        if len(restored) == 6:
            raise KeyboardInterrupt  # the rollback itself is killed
        restored.append(path)
        real_restore(backup, path)

    monkeypatch.setattr(write, "_restore", dying_restore)
    monkeypatch.setattr(write.shutil, "rmtree", lambda *a, **k: None)
    targets = [root / "data", root / "data/train", root / "data/test"]
    with pytest.raises(KeyboardInterrupt):
        write.remove_stale_staging(targets)
    monkeypatch.undo()
    assert not validate_path(config).ok
    write.remove_stale_staging(targets)  # done again, to the end
    assert snapshot(root) == before


def test_a_dead_append_that_moved_every_file_is_kept(static_layout: tuple[Path, list[Path]], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after its last move but before it removed its marker: the appended layout is complete."""
    config, _ = static_layout
    root = config.parent
    new = write_tsv(tmp_path / "new.tsv", static_rows(5, 50, range(30, 50), range(10, 20)))
    import pbgio.importers.write as write

    monkeypatch.setattr(write.shutil, "rmtree", lambda *a, **k: None)  # the staging directories stay...
    append_edge_lists(config, [new], edge_path="data/train")
    monkeypatch.undo()
    [first] = [d for d in (root / "data").iterdir() if d.name.startswith(".pbgio-import-")]
    (first / write.COMMIT_MARKER).write_bytes(b"")  # ...with the marker, as if killed before its removal
    _as_dead(root)
    appended = {k: v for k, v in snapshot(root).items() if ".pbgio-import-" not in k}
    assert validate_path(config).ok
    write.remove_stale_staging([root / "data", root / "data/train"])
    assert snapshot(root) == appended
