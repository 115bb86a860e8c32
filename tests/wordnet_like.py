"""A small WordNet-like graph of the tests' own (issue 46's trial used WordNet 3.0, which is not
shipped): synsets named as WordNet names them (``dog.n.02084071``: word, part of speech, offset;
one word has several senses), a hypernym tree with its inverse (hyponym), part-of pairs with theirs
(part_meronym, part_holonym), symmetric relations (similar_to, derivationally_related) and two
without a twin (cause, entailment), split 90/5/5 into CSV files with a header, as a user writes them.

>>> graph = wordnet_like()
>>> sorted(graph), len(graph["train"]) > 10 * len(graph["test"])
(['test', 'train', 'valid'], True)
>>> graph["train"][0]
('animal.n.00015388', 'hyponym', 'mammal.n.01861778')
"""

from __future__ import annotations

import json
import random
from pathlib import Path

Edge = tuple[str, str, str]
SPLITS = ("train", "valid", "test")
HEADER = ("source", "relation", "target")
WORDS = ("dog", "cat", "tree", "oak", "pine", "bird", "fish", "car", "wheel", "house", "door", "run", "walk",
         "eat", "sleep", "dream", "water", "fire", "stone", "river", "light", "sound", "king", "queen", "horse",
         "apple", "bread", "salt", "iron", "gold", "song", "word", "book", "ship", "road", "hand", "eye",
         "heart", "leaf", "root")
INVERSES = {"hypernym": "hyponym", "part_holonym": "part_meronym"}
SYMMETRIC = ("similar_to", "derivationally_related")
ONE_WAY = ("cause", "entailment")


def synset_name(word: str, pos: str, offset: int) -> str:
    return f"{word}.{pos}.{offset:08d}"


def wordnet_like(seed: int = 46, senses: int = 4, unseen: int = 6) -> dict[str, list[Edge]]:
    """The edges of each split. ``unseen`` test edges name a synset no other edge names (its vector
    is never trained); every word has ``senses`` synsets (``dog.n.…`` and ``dog.v.…`` among them)."""
    rng = random.Random(seed)
    nouns = [synset_name("animal", "n", 15388), synset_name("mammal", "n", 1861778)]
    verbs: list[str] = []
    for index, word in enumerate(WORDS):
        for sense in range(senses):
            pos = "v" if sense == senses - 1 else "n"
            name = synset_name(word, pos, 2_000_000 + 7919 * (index * senses + sense) % 9_000_000)
            (verbs if pos == "v" else nouns).append(name)
    edges: list[Edge] = [(nouns[1], "hypernym", nouns[0])]
    for position, child in enumerate(nouns[2:], start=2):
        parent = nouns[rng.randrange(max(1, position // 2), position)] if position > 3 else nouns[1]
        edges.append((child, "hypernym", parent))
    for _ in range(len(nouns) // 2):
        part, whole = rng.sample(nouns, 2)
        edges.append((whole, "part_holonym", part))
    edges += [(b, INVERSES[r], a) for a, r, b in list(edges)]
    for relation in SYMMETRIC:
        for _ in range(len(nouns) // 3):
            a, b = rng.sample(nouns + verbs, 2)
            edges += [(a, relation, b), (b, relation, a)]
    for relation in ONE_WAY:
        for _ in range(len(verbs)):
            a, b = rng.sample(verbs, 2)
            edges.append((a, relation, b))
    edges = sorted(set(edges))
    rng.shuffle(edges)
    edges.sort(key=lambda edge: edge != (nouns[0], "hyponym", nouns[1]))  # a fixed first edge (doctest)
    cut_valid, cut_test = int(0.9 * len(edges)), int(0.95 * len(edges))
    splits = {"train": edges[:cut_valid], "valid": edges[cut_valid:cut_test], "test": edges[cut_test:]}
    for index in range(unseen):
        lonely = synset_name("hermit", "n", 9_100_000 + index)
        splits["test"].append((lonely, "hypernym", nouns[0]))
    return splits


def write_wordnet_like(root: Path, *, dimension: int = 16, num_epochs: int = 3, **kwargs: int) -> Path:
    """``train.csv``, ``valid.csv``, ``test.csv`` (comma-separated, with a header) and a config of one
    entity type ``synset`` with dynamic relations, as getting-started writes one, under ``root``;
    returns the config's path. Import with ``pbgio import CONFIG train.csv valid.csv test.csv -d comma
    --header``."""
    root.mkdir(parents=True, exist_ok=True)
    for split, edges in wordnet_like(**kwargs).items():
        lines = [",".join(HEADER)] + [",".join(edge) for edge in edges]
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {"entities": {"synset": {"num_partitions": 1}},
              "relations": [{"name": "all_edges", "lhs": "synset", "rhs": "synset", "operator": "complex_diagonal"}],
              "dynamic_relations": True, "global_emb": False, "dimension": dimension, "comparator": "dot",
              "loss_fn": "softmax", "lr": 0.1, "num_epochs": num_epochs, "entity_path": "data",
              "edge_paths": ["data/train", "data/valid", "data/test"], "checkpoint_path": "model"}
    path = root / "config.json"
    path.write_text(json.dumps(config, indent=4))
    return path
