"""WordNet 3.0 as a user's own graph to train on: words and synsets, TSV edge lists.

Read from the WordNet database files (``data.noun``, ``data.verb``, ``data.adj``, ``data.adv``) that
Debian's ``wordnet-base`` package installs in ``/usr/share/wordnet`` (``apt-get install
wordnet-base``; nothing is downloaded here). Entities are synsets, named by their first word, part
of speech and offset (``dog.n.02084071``, as WN18RR's ids are offsets), and words (``dog``,
``hot_dog``: lower case, as WordNet's files spell them). Relations:

- ``has_sense``: word → each synset it is a word of (the question "what can this word mean");
- every pointer between synsets, by its WordNet name (``hypernym``, ``derivationally_related_form``,
  ``similar_to``, ``member_holonym``, …), lexical pointers (between two words of two synsets:
  derivation, antonym, pertainym, participle) taken between their synsets, as WN18RR does; of each
  pair of inverse pointers (hypernym / hyponym, holonym / meronym, domain / member of domain) only
  the first is kept, so that no held-out edge is its own inverse in train (WN18RR's rule).

The edges are shuffled with ``--seed`` and split into train/valid/test (``--valid-fraction`` each for
valid and test; a held-out edge whose entity never occurs in train goes to train), as
``tools/code_graph.py`` splits.

    .venv/bin/python tools/wordnet_graph.py OUT_DIR                 # /usr/share/wordnet
    .venv/bin/python tools/wordnet_graph.py OUT_DIR --source WORDNET_DICT_DIR

Prints the counts (WordNet 3.0: 264,965 entities, 19 relations, 442,334 edges); writes
``OUT_DIR/{train,valid,test}.tsv`` (lhs, relation, rhs; tab-separated).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from code_graph import Edge, write_splits

POSITIONS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
KEPT_POINTERS = {  # WordNet's pointer symbols (wninput(5WN)); the inverse of each pair is left out
    "@": "hypernym", "@i": "instance_hypernym", "#m": "member_holonym", "#s": "substance_holonym",
    "#p": "part_holonym", ";c": "domain_topic", ";r": "domain_region", ";u": "domain_usage",
    "&": "similar_to", "^": "also_see", "$": "verb_group", "=": "attribute", "*": "entailment", ">": "cause",
    "+": "derivationally_related_form", "!": "antonym", "\\": "pertainym", "<": "participle",
}
INVERSES = frozenset({"~", "~i", "%m", "%s", "%p", "-c", "-r", "-u"})


def _synset_rows(source: Path) -> Iterator[tuple[str, list[str], list[tuple[str, str]]]]:
    """Each synset: its key (offset and part of speech), its words, its pointers (symbol, target key)."""
    for name, pos in POSITIONS.items():
        with (source / f"data.{name}").open(encoding="latin-1") as lines:
            for line in lines:
                if line.startswith("  "):  # the licence at the head of the file
                    continue
                fields = line.split("|", 1)[0].split()
                words = [fields[4 + 2 * i] for i in range(int(fields[3], 16))]
                at = 4 + 2 * len(words)
                pointers = []
                for i in range(int(fields[at])):
                    symbol, offset, target_pos = fields[at + 1 + 4 * i: at + 4 + 4 * i]
                    pointers.append((symbol, f"{offset}{'a' if target_pos == 's' else target_pos}"))
                yield f"{fields[0]}{pos}", words, pointers


def _word(written: str) -> str:
    """A word as an entity: lower case, without the adjective marker ``(p)``/``(a)``/``(ip)``."""
    return written.split("(", 1)[0].lower()


def wordnet_graph(source: Path) -> list[Edge]:
    """Every edge of the WordNet database in ``source``."""
    rows = list(_synset_rows(source))
    names = {key: f"{_word(words[0])}.{key[-1]}.{key[:-1]}" for key, words, _ in rows}
    edges: set[Edge] = set()
    for key, words, pointers in rows:
        for word in words:
            edges.add((_word(word), "has_sense", names[key]))
        for symbol, target in pointers:
            if symbol in INVERSES:
                continue
            if symbol not in KEPT_POINTERS:
                raise ValueError(f"{source}: synset {key}: unknown pointer symbol {symbol!r}")
            edges.add((names[key], KEPT_POINTERS[symbol], names[target]))
    return sorted(e for e in edges if e[0] != e[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=Path("/usr/share/wordnet"),
                        help="WordNet's dict folder (default: Debian's wordnet-base)")
    parser.add_argument("--valid-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (args.source / "data.noun").is_file():
        sys.exit(f"--source {args.source}: no WordNet database (data.noun) there; on Debian or Ubuntu: "
                 "apt-get install wordnet-base")
    write_splits(args.out, wordnet_graph(args.source), args.valid_fraction, args.seed, str(args.source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
