"""``pbgio.leakage.reverse_leakage`` against a brute force over the named edges: a reverse joins the
same entities the other way, under a relation from the right type to the left one (ids of two types
collide; entities do not), found in the bucket of the swapped partitions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pbgio.importers import InputOptions, import_edge_lists
from pbgio.layout import Layout
from pbgio.leakage import reverse_leakage

RELATIONS = {"buys": ("user", "item"), "bought_by": ("item", "user"), "knows": ("user", "user"),
             "rates": ("user", "item")}


def _graph(seed: int) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    rng = random.Random(seed)
    users, items = [f"u{i}" for i in range(15)], [f"i{i}" for i in range(15)]
    pool = {"user": users, "item": items}
    edges = {(rng.choice(pool[lt]), rel, rng.choice(pool[rt]))
             for rel, (lt, rt) in RELATIONS.items() for _ in range(120)}
    ordered = sorted(edges)
    rng.shuffle(ordered)
    return ordered[:250], ordered[250:]


def _brute_force(train: list[tuple[str, str, str]], test: list[tuple[str, str, str]]) -> dict[str, tuple[int, ...]]:
    known = set(train)
    out: dict[str, list[int]] = {}
    for h, r, t in test:
        symmetric = (t, r, h) in known and RELATIONS[r][0] == RELATIONS[r][1]
        inverse = any((t, other, h) in known for other, types in RELATIONS.items()
                      if other != r and types == RELATIONS[r][::-1])
        row = out.setdefault(r, [0, 0, 0, 0])
        for column, hit in enumerate((True, inverse, symmetric, inverse or symmetric)):
            row[column] += hit
    return {r: tuple(v) for r, v in out.items()}


@pytest.mark.parametrize(("seed", "user_parts"), [(1, 1), (2, 2), (3, 3)])
def test_reverse_leakage_equals_a_brute_force_over_names(tmp_path: Path, seed: int, user_parts: int) -> None:
    config = {"entities": {"user": {"num_partitions": user_parts}, "item": {"num_partitions": 1}},
              "relations": [{"name": n, "lhs": lt, "rhs": rt} for n, (lt, rt) in RELATIONS.items()],
              "dimension": 4, "entity_path": "data", "edge_paths": ["data/train", "data/test"],
              "checkpoint_path": "model"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    train, test = _graph(seed)
    for name, edges in (("train", train), ("test", test)):
        (tmp_path / f"{name}.tsv").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in edges))
    import_edge_lists(tmp_path / "config.json", [tmp_path / "train.tsv", tmp_path / "test.tsv"],
                      options=InputOptions(header=False))
    layout = Layout.load(tmp_path / "config.json")
    found = {r.relation: (r.edges, r.inverse, r.symmetric, r.inverse_or_symmetric)
             for r in reverse_leakage(layout, layout.edge_paths[0], layout.edge_paths[1])}
    want = _brute_force(train, test)
    assert found == want
    assert want["buys"][1] and want["knows"][2]  # inverse and symmetric hits, not a vacuous equality
    assert want["rates"][1] and not want["rates"][2]  # rates's reverse is bought_by; never itself (user → item)
