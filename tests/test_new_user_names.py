"""Issue 46, a new user's third hour: names found by a word (``dog`` finds ``dog.n.02000000``),
lists of names that are complete or say how to see them all, aligned scores, and the relation
that stands for every dynamic relation shown as what it is. Through the real command lines, on
a trained WordNet-like graph (tests/wordnet_like.py) with 22 relation types."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pbgio.entities import read_entity_names, read_relation_names
from tests.cli import pbgio, pbgtrain
from tests.wordnet_like import write_wordnet_like

EXTRA_RELATIONS = [f"also_see_{i:02d}" for i in range(14)]  # 8 of WordNet's + 14: more than a message shows


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wordnet")
    config = write_wordnet_like(root, dimension=4, num_epochs=1)
    train = root / "train.csv"
    first, _, second = train.read_text().splitlines()[1].split(",")
    with train.open("a") as out:
        out.writelines(f"{first},{relation},{second}\n" for relation in EXTRA_RELATIONS)
    done = pbgio("import", str(config), str(train), str(root / "valid.csv"), str(root / "test.csv"), "-d", "comma",
                 "--header")
    assert done.returncode == 0, done.stderr
    done = pbgtrain("fit", str(config), "-p", "edge_paths=data/train", "--no-progress")
    assert done.returncode == 0, done.stderr
    return config


def synsets(config: Path) -> list[str]:
    return read_entity_names(config.parent / "data", "synset", 0)


def containing(config: Path, word: str) -> list[str]:
    """The synsets whose name contains ``word``: those starting with it first, in file order."""
    names = [n for n in synsets(config) if word in n.casefold()]
    return [n for n in names if n.casefold().startswith(word)] + [n for n in names
                                                                  if not n.casefold().startswith(word)]


# --------------------------------------------------------------------------- 5. a name found by its word


def test_neighbors_and_predict_list_the_names_that_contain_a_word(graph: Path) -> None:
    dogs = containing(graph, "dog")
    assert 1 < len(dogs) <= 5 and "dog" not in synsets(graph)
    listed = ", ".join(repr(n) for n in dogs)
    for done in (pbgio("neighbors", str(graph), "--type", "synset", "dog"),
                 pbgtrain("predict", str(graph), "--lhs", "dog", "--rel", "hypernym")):
        assert done.returncode == 1, done.stderr
        assert " ".join(done.stderr.split()).endswith(f"no 'synset' entity named 'dog' in "
                                                      f"{graph.parent / 'data' / 'entity_names_synset_0.json'}; "
                                                      f"{len(dogs)} names contain it: {listed}"), done.stderr
    near = pbgtrain("predict", str(graph), "--lhs", dogs[0].replace(".0", ".", 1), "--rel", "hypernym")
    assert near.returncode == 1 and f"did you mean {dogs[0]!r}?" in near.stderr  # a near-typo: as before
    relation = pbgtrain("predict", str(graph), "--lhs", dogs[0], "--rel", "part")
    assert relation.returncode == 1
    assert "2 relations contain it: 'part_holonym', 'part_meronym'" in " ".join(relation.stderr.split())


def test_pbgio_names_lists_every_name_that_contains_a_pattern(graph: Path) -> None:
    done = pbgio("names", str(graph), "--type", "synset", "DOG")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == containing(graph, "dog")
    assert f"{len(containing(graph, 'dog'))} 'synset' entity names contain 'DOG'" in done.stderr
    every = pbgio("names", str(graph))  # the only type; no pattern: every name
    assert every.returncode == 0 and every.stdout.splitlines() == synsets(graph)
    relations = pbgio("names", str(graph), "--relations", "part")
    assert relations.returncode == 0 and relations.stdout.splitlines() == ["part_holonym", "part_meronym"]
    none = pbgio("names", str(graph), "--type", "synset", "unicorn")
    assert none.returncode == 1 and "no 'synset' entity name contains 'unicorn'" in none.stderr
    wrong = pbgio("names", str(graph), "--type", "animal", "dog")
    assert wrong.returncode == 2 and "--type: expected an entity type of the config (synset), found 'animal'" \
        in wrong.stderr


# --------------------------------------------------------------------------- 6. lists that say how to see them all


def test_a_long_list_of_matches_says_how_to_see_them_all(graph: Path) -> None:
    many = containing(graph, "o")
    done = pbgio("neighbors", str(graph), "--type", "synset", "o")
    assert done.returncode == 1
    shown = ", ".join(repr(n) for n in many[:5])
    assert (f"; {len(many)} names contain it: {shown}, … ({len(many) - 5} more: pbgio names CONFIG --type synset o)"
            in " ".join(done.stderr.split())), done.stderr
    listing = pbgio("names", str(graph), "--type", "synset", "o")
    assert listing.returncode == 0 and listing.stdout.splitlines() == many


def test_an_unknown_relation_lists_ten_and_says_how_to_see_all_22(graph: Path) -> None:
    known = read_relation_names(graph.parent / "data")
    assert len(known) == 22
    done = pbgtrain("predict", str(graph), "--lhs", containing(graph, "dog")[0], "--rel", "xyzzy")
    assert done.returncode == 1
    shown = ", ".join(repr(n) for n in known[:10])
    assert " ".join(done.stderr.split()).endswith(
        f"the relations are {shown}, … (12 more: pbgio names CONFIG --relations)"), done.stderr
    listing = pbgio("names", str(graph), "--relations")
    assert listing.returncode == 0 and listing.stdout.splitlines() == known


def test_info_says_how_to_see_every_dynamic_relation(graph: Path) -> None:
    known = read_relation_names(graph.parent / "data")
    done = pbgio("info", str(graph))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("dynamic relation types"))
    assert line == (f"dynamic relation types: 22: {', '.join(known[:10])}, … (12 more: pbgio names {graph} "
                    f"--relations, or pbgio info --json)")


def test_an_import_error_says_how_to_see_every_relation_of_the_config(tmp_path: Path) -> None:
    config = write_wordnet_like(tmp_path)
    raw = json.loads(config.read_text())
    relations = ["hypernym", "hyponym", "part_holonym", "part_meronym", "similar_to", "derivationally_related",
                 "cause"]  # static relations, entailment left out: its edges are refused
    raw.update(dynamic_relations=False, relations=[{"name": r, "lhs": "synset", "rhs": "synset",
                                                    "operator": "diagonal"} for r in relations])
    config.write_text(json.dumps(raw))
    done = pbgio("import", str(config), *(str(tmp_path / f"{s}.csv") for s in ("train", "valid", "test")),
                 "-d", "comma", "--header")
    assert done.returncode == 1
    shown = ", ".join(repr(r) for r in relations[:5])
    assert (f"expected a relation of the config ({shown}, … (2 more: pbgio names CONFIG --relations)), found "
            f"'entailment'") in " ".join(done.stderr.split()), done.stderr


# --------------------------------------------------------------------------- 10. scores aligned, the template relation


def test_info_shows_the_dynamic_relations_template_as_a_template(graph: Path) -> None:
    done = pbgio("info", str(graph))
    assert done.returncode == 0, done.stderr
    assert not re.search(r"\b0\b.*all_edges", done.stdout), done.stdout  # no row "0  all_edges" of relations
    assert ("operator template: 'all_edges' (synset → synset, complex_diagonal) gives each dynamic relation type "
            "its operators; it is not a relation of the graph") in done.stdout


def decimal_points(table: str) -> set[int]:
    """Where the decimal point of each row's last column (the score) is, from the line's end."""
    return {len(line) - line.rindex(".") for line in table.splitlines()[1:]}


def test_scores_are_aligned_in_their_column(graph: Path) -> None:
    query = containing(graph, "dog")[0]
    ranked = pbgtrain("predict", str(graph), "--rhs", query, "--rel", "hypernym", "-k", "100")
    assert ranked.returncode == 0, ranked.stderr
    assert len(ranked.stdout.splitlines()) == 101 and len(decimal_points(ranked.stdout)) == 1, ranked.stdout
    near = pbgio("neighbors", str(graph), query, "-k", "100")
    assert near.returncode == 0, near.stderr
    assert len(near.stdout.splitlines()) == 101 and len(decimal_points(near.stdout)) == 1, near.stdout
