"""Property tests: random edge lists and partition counts import to layouts that hold exactly the input."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pbgio.entities import read_entity_count
from pbgio.importers import InputOptions, import_edge_lists
from pbgio.importers.partition import partition_bounds
from pbgio.testing.edgelists import layout_edges
from pbgio.validate import validate_path

# Names: anything but the delimiter, line breaks and the empty string (a name may hold spaces,
# quotes, backslashes, non-ASCII letters).
NAME_CHARS = st.characters(blacklist_categories=["Cs"], blacklist_characters="\t\n\r\ufeff")
NAMES = st.text(NAME_CHARS, min_size=1, max_size=6)
Row = tuple[str, str, str]


@st.composite
def edge_lists(draw: st.DrawFn) -> tuple[list[str], list[list[Row]]]:
    entities = draw(st.lists(NAMES, min_size=1, max_size=25, unique=True))
    relations = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    row = st.tuples(st.sampled_from(entities), st.sampled_from(relations), st.sampled_from(entities))
    sets = draw(st.lists(st.lists(row, min_size=1, max_size=60), min_size=1, max_size=3))
    return relations, sets


def write_config(root: Path, *, partitions: int, dynamic: bool, relations: list[str], num_sets: int) -> Path:
    rels = ([{"name": "r", "lhs": "n", "rhs": "n"}] if dynamic
            else [{"name": name, "lhs": "n", "rhs": "n"} for name in relations])
    config = {"entities": {"n": {"num_partitions": partitions}}, "relations": rels, "dimension": 4,
              "dynamic_relations": dynamic, "global_emb": not dynamic, "entity_path": "data",
              "edge_paths": [f"data/set{i}" for i in range(num_sets)], "checkpoint_path": "model"}
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@given(edge_lists(), st.integers(1, 4), st.booleans(), st.integers(0, 3))
def test_import_holds_exactly_the_input(data: tuple[list[str], list[list[Row]]], partitions: int,
                                        dynamic: bool, seed: int) -> None:
    relations, sets = data
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        config = write_config(root, partitions=partitions, dynamic=dynamic, relations=relations,
                              num_sets=len(sets))
        files = []
        for i, rows in enumerate(sets):
            path = root / f"set{i}.tsv"
            path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
            files.append(path)
        report = import_edge_lists(config, files, seed=seed)
        assert validate_path(config).ok
        assert report.kept == sum(len(rows) for rows in sets) and report.skipped == report.filtered == 0
        edges = layout_edges(config)
        for i, rows in enumerate(sets):
            assert Counter(e[:3] for e in edges[f"data/set{i}"]) == Counter(rows)
        distinct = {name for rows in sets for r in rows for name in (r[0], r[2])}
        bounds = partition_bounds(len(distinct), partitions)
        assert [read_entity_count(root / "data", "n", p) for p in range(partitions)] == [
            bounds[p + 1] - bounds[p] for p in range(partitions)]


@given(st.lists(st.tuples(NAMES, NAMES), min_size=11, max_size=40),
       st.lists(st.sampled_from(["", "x", "x\ty\tz\tw", "\tr\ty", "a\t\tb"]), max_size=10),
       st.randoms(use_true_random=False))
def test_skip_keeps_exactly_the_good_rows(pairs: list[tuple[str, str]], junk: list[str], rnd: object) -> None:
    """Good rows outnumber the junk, so the expected field count is theirs wherever the junk lies."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        config = write_config(root, partitions=2, dynamic=False, relations=["r"], num_sets=1)
        lines = [f"{a}\tr\t{b}" for a, b in pairs] + junk
        rnd.shuffle(lines)  # type: ignore[attr-defined]
        path = root / "set0.tsv"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        bad = sum(1 for line in junk if line)  # empty lines are not rows
        report = import_edge_lists(config, [path], on_error="skip", options=InputOptions())
        assert (report.kept, report.skipped) == (len(pairs), bad)
        found = Counter(e[:3] for e in layout_edges(config)["data/set0"])
        assert found == Counter((a, "r", b) for a, b in pairs)
