"""Nearest-neighbour index files: ``index_{type}.{metric}.{kind}.v{version}.h5`` beside the checkpoint version.

An index belongs to one checkpoint version of one entity type: it is built from that version's
embeddings (every partition, in order; with the type's global embedding added when the config
has ``global_emb``, as export adds it) and removed with that version's other files. A version may
have several, one per metric and kind (a ``cos`` one for neighbours beside a ``dot`` one for a dot
model's predictions); a search takes one whose metric fits it, the first kind of
:data:`SEARCH_ORDER` among those. ``index_{type}.v{version}.h5``, the name of pbgio 0.1's
indexes (one per type and version), is still read: its metadata gives its metric and kind. It is an
HDF5 file holding

- the dataset :data:`PAYLOAD_DATASET`: the library's serialized index, 1-D ``uint8``;
- the root attribute ``format_version`` (1), as every file of the layout;
- the root attribute :data:`META_ATTR`: a JSON object whose keys are :data:`META_FIELDS`.

Row ``i`` of the index is row ``i - start[p]`` of partition ``p``, where ``start`` accumulates
``partition_rows``. A checkpoint without an index is complete; an index whose version,
fingerprint or rows disagree with its checkpoint is never used (``index-stale``).

>>> index_file_name("user", 7, "cos", "flat")
'index_user.cos.flat.v7.h5'
>>> sorted(META_FIELDS)[:3]
['add_global', 'dimension', 'entity_type']
>>> fingerprint_offsets(10)
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
>>> fingerprint_offsets(1000)[:4], fingerprint_offsets(1000)[-1]
([0, 67, 133, 200], 999)
"""

from __future__ import annotations

from dataclasses import dataclass

from pbgio.spec.naming import index_file as index_file_name

PAYLOAD_DATASET = "index"
META_ATTR = "pbg_index/json"

METRICS = ("cos", "dot")
"""cos: vectors divided by their L2 norm, then inner product; dot: the plain inner product."""


def default_metric(comparator: str) -> str:
    """The metric an index is built by and searched with unless one is asked for (``pbgio index
    build``, ``pbgio neighbors``; ``pbgtrain predict`` always ranks by it): the model's
    ``comparator`` when it is one of :data:`METRICS`, else ``cos``.

    >>> default_metric("dot"), default_metric("cos"), default_metric("squared_l2")
    ('dot', 'cos', 'cos')
    """
    return comparator if comparator in METRICS else "cos"


LIBRARIES = ("faiss",)
KINDS = ("flat", "ivf", "hnsw")
"""flat: every row compared (exact); ivf: inverted lists of 8-bit scalar-quantized rows, ``nprobe``
lists searched; hnsw: a navigable small-world graph of the float32 rows, ``ef_search`` wide."""

SEARCH_ORDER = ("hnsw", "ivf", "flat")
"""Which of several fitting indexes a search takes: the approximate kinds first (built on purpose,
for speed; every answer is re-ranked exactly), the exact flat one last."""

FINGERPRINT_ROWS = 16
"""Rows of each partition (evenly spaced, first and last included) hashed into the fingerprint."""


RECALL_K = 10
"""The k of the recall an approximate index's build measures (``recall_at_10``)."""
RECALL_TARGET = 0.95
"""The recall@10 a build raises ``nprobe``/``ef_search`` until it reaches (unless given them)."""
FLAT_MAX_ROWS = 100_000
"""Rows up to which ``pbgio index build --kind auto`` builds an exact flat index without measuring an
IVF one (``--flat-max-rows``)."""
IVF_FLAT_SHARE = 0.25
"""Above :data:`FLAT_MAX_ROWS`, ``auto`` builds the exact flat index instead of an IVF one that needs
more than this share of its lists visited to reach :data:`RECALL_TARGET`, or never reaches it: the
IVF search then costs about as much as a flat scan (measured: 110,000 rows of d100, 1,327 lists,
one thread: 6.7 ms a query flat; IVF nprobe 256 2.5 ms, 512 6.5 ms, 640 8.5 ms)."""


@dataclass(frozen=True)
class MetaField:
    """One key of the index's metadata object: its JSON type and meaning; an ``optional`` key is
    absent from the files written before it was added (then it reads as :attr:`absent`)."""

    json_type: str
    meaning: str
    optional: bool = False
    absent: object = None


META_FIELDS: dict[str, MetaField] = {
    "entity_type": MetaField("string", "The entity type indexed (also in the file name)."),
    "version": MetaField("integer", "The checkpoint version the rows come from (also in the file name)."),
    "metric": MetaField("string", f"How rows are compared: one of {', '.join(METRICS)} (also in the file name)."),
    "add_global": MetaField("boolean", "Whether the type's global embedding was added to every row."),
    "dimension": MetaField("integer", "The dimension of the rows (the type's dimension)."),
    "partition_rows": MetaField("array of integers", "Rows indexed from each partition, in partition order."),
    "fingerprint": MetaField("string",
                             f"SHA-256 (hex) of the partition_rows and, per partition, the float32 bytes of "
                             f"{FINGERPRINT_ROWS} evenly spaced rows (first and last included) as indexed "
                             "(global embedding added, not normalized): ties the index to the tables it was "
                             "built from."),
    "library": MetaField("string", f"The library that wrote the payload: one of {', '.join(LIBRARIES)}."),
    "library_version": MetaField("string", "Its version (informative)."),
    "kind": MetaField("string", f"The index kind: one of {', '.join(KINDS)} (also in the file name)."),
    "params": MetaField("object", "The kind's parameters (ivf: nlist, nprobe; hnsw: m, ef_construction, "
                                  "ef_search); nprobe and ef_search are the defaults a search uses: unless the "
                                  "build was given them, the smallest that reached its recall target "
                                  "(recall_at_10)."),
    "payload_sha256": MetaField("string", "SHA-256 (hex) of the payload bytes: a damaged file is refused."),
    "recall_at_10": MetaField(
        "number or null",
        f"Recall@{RECALL_K} measured at build (0 to 1): the share of the exact top {RECALL_K} (every row scored) "
        "that a search with the stored nprobe or ef_search finds among the recall_candidates rows the index "
        "proposes (the rows a search scores exactly), over recall_queries rows of the table drawn at random as "
        "queries, each left out of its own answer. null: not measured (a flat index is exact). Absent from "
        "files written before it was measured: not measured.", optional=True),
    "recall_queries": MetaField("integer", "Rows drawn as queries to measure recall_at_10 (0: not measured).",
                                optional=True, absent=0),
    "recall_candidates": MetaField("integer", "Rows the index proposed per query to measure recall_at_10 "
                                              "(a search's default; 0: not measured).", optional=True, absent=0),
}


def fingerprint_offsets(rows: int) -> list[int]:
    """The rows of a partition of ``rows`` rows that the fingerprint hashes (sorted, distinct)."""
    if rows <= FINGERPRINT_ROWS:
        return list(range(rows))
    return sorted({round(i * (rows - 1) / (FINGERPRINT_ROWS - 1)) for i in range(FINGERPRINT_ROWS)})


__all__ = ["FINGERPRINT_ROWS", "FLAT_MAX_ROWS", "IVF_FLAT_SHARE", "KINDS", "LIBRARIES", "META_ATTR", "META_FIELDS",
           "METRICS", "PAYLOAD_DATASET", "RECALL_K", "RECALL_TARGET", "SEARCH_ORDER", "MetaField", "default_metric",
           "fingerprint_offsets", "index_file_name"]
