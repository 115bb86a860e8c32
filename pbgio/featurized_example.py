"""A featurized example, as raw edge lists: authors read documents made of planted topic words.

Every author follows one topic of ``WORDS_PER_TOPIC`` words of its own. A document an author
reads is a bag of ``TOPIC_WORDS_PER_DOC`` of its topic's words (drawn with replacement) and
``COMMON_WORDS_PER_DOC`` words common to all topics. Every document is new (no document is
seen twice), so a document can only be recognised through its words: the ``doc`` type is
featurized, ``author`` is plain. ``train.tsv`` and ``test.tsv`` hold ``author<TAB>reads<TAB>words``
lines; ``topics.json`` holds the planted answer (each author's topic words, and the common
words); ``config.json`` puts ``train`` and ``test`` in ``data/train`` and ``data/test``.

>>> import tempfile, pathlib
>>> config = write_featurized_example(pathlib.Path(tempfile.mkdtemp()), num_edges=100)
>>> line = (config.parent / "train.tsv").read_text().splitlines()[0].split("\\t")
>>> line[0].startswith("author_"), line[1], len(line[2].split())
(True, 'reads', 5)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pbgio.config import ConfigSchema, parse_config
from pbgio.spec import naming

NUM_AUTHORS = 200
WORDS_PER_TOPIC = 4
NUM_COMMON_WORDS = 400
TOPIC_WORDS_PER_DOC = 2
COMMON_WORDS_PER_DOC = 3


def featurized_example_config() -> ConfigSchema:
    return parse_config({
        "entities": {"author": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        "relations": [{"name": "reads", "lhs": "author", "rhs": "doc", "operator": "none"}],
        "dimension": 32,
        "comparator": "dot",
        "loss_fn": "softmax",
        "entity_path": "data",
        "edge_paths": ["data/train", "data/test"],
        "checkpoint_path": "model",
        "num_epochs": 10,
        "batch_size": 500,
        "lr": 0.1,
        # Featurized types take same-batch negatives only (docs/guides/featurized.md).
        "num_batch_negs": 50,
        "num_uniform_negs": 0,
        "eval_fraction": 0,
        "eval_num_batch_negs": 50,
        "eval_num_uniform_negs": 0,
    }, "featurized example")


def write_featurized_example(dest: Path, *, num_edges: int = 20_000, seed: int = 0) -> Path:
    """Write config.json, train.tsv, test.tsv (a tenth of ``num_edges``) and topics.json under
    ``dest``; return the config's path."""
    rng = np.random.default_rng(seed)
    num_words = NUM_AUTHORS * WORDS_PER_TOPIC + NUM_COMMON_WORDS
    names = np.array([f"w{i:04d}" for i in rng.permutation(num_words)])
    topic_words = names[:NUM_AUTHORS * WORDS_PER_TOPIC].reshape(NUM_AUTHORS, WORDS_PER_TOPIC)
    common_words = names[NUM_AUTHORS * WORDS_PER_TOPIC:]
    authors = [f"author_{a:03d}" for a in range(NUM_AUTHORS)]
    dest.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.tsv", num_edges), ("test.tsv", max(1, num_edges // 10))):
        reader = rng.integers(0, NUM_AUTHORS, count)
        topical = topic_words[reader[:, None], rng.integers(0, WORDS_PER_TOPIC, (count, TOPIC_WORDS_PER_DOC))]
        common = common_words[rng.integers(0, NUM_COMMON_WORDS, (count, COMMON_WORDS_PER_DOC))]
        words = np.concatenate([topical, common], axis=1)
        words = np.take_along_axis(words, rng.permuted(np.tile(np.arange(words.shape[1]), (count, 1)), axis=1), 1)
        lines = [f"{authors[a]}\treads\t{' '.join(w)}\n" for a, w in zip(reader, words, strict=True)]
        (dest / name).write_text("".join(lines), encoding="utf-8")
    answer = {"topics": {a: list(topic_words[i]) for i, a in enumerate(authors)}, "common": list(common_words)}
    (dest / "topics.json").write_text(json.dumps(answer, indent=1) + "\n", encoding="utf-8")
    config_path = dest / naming.CONFIG_JSON
    config_path.write_text(featurized_example_config().to_json() + "\n", encoding="utf-8")
    return config_path
