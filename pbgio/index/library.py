"""The one place that speaks to the nearest-neighbour library (FAISS, the optional extra ``ann``).

Every index searches by inner product: ``cos`` indexes hold unit rows and take unit queries
(:func:`prepare`). Kinds (:data:`pbgio.spec.index.KINDS`): ``flat`` compares every row exactly;
``ivf`` is an inverted file of 8-bit scalar-quantized rows (``nlist`` lists, ``nprobe`` searched);
``hnsw`` a graph of float32 rows (``m`` links, ``ef_construction``, ``ef_search``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.errors import MissingLibraryError
from pbgio.index_file import byte_reader

INSTALL_HINT = "pip install 'pbg[ann]' (or pip install faiss-cpu)"
LIBRARY = "faiss"
IVF_TRAIN_PER_LIST = 64
"""Rows sampled per inverted list to train the IVF quantizer (FAISS asks for at least 39)."""
IVF_MIN_TRAIN = 10_000
READ_BLOCK = 1 << 24
"""Bytes handed to FAISS at a time while it reads an index."""
WRITE_BLOCK = 1 << 20
"""Bytes FAISS hands over at most at a time while it writes an index."""
MAX_NLIST = 65536
"""IVF lists: 4·√rows (FAISS's guidance is 4·√n to 16·√n), at most this many. On 10M planted-cluster
rows of d100, √n lists (3,162) needed nprobe 64 for recall@10 0.95 (20 ms a query); 4·√n lists
(12,649) reached 1.0 at nprobe 16 (6.5 ms), for a build of 5 minutes instead of 1."""

Floats = NDArray[np.float32]


def faiss_module() -> Any:
    """The faiss module, or :class:`MissingLibraryError` saying how to install it."""
    try:
        import faiss
    except ImportError as exc:
        raise MissingLibraryError(f"nearest-neighbour indexes need FAISS, which is not installed ({exc}); "
                                  f"{INSTALL_HINT}") from None
    return faiss


def library_version() -> str:
    return str(faiss_module().__version__)


def default_params(kind: str, rows: int) -> dict[str, int]:
    """The parameters of a ``kind`` index of ``rows`` rows.

    >>> default_params("ivf", 10_000_000)
    {'nlist': 12649, 'nprobe': 16}
    >>> default_params("hnsw", 10)
    {'m': 32, 'ef_construction': 64, 'ef_search': 128}
    """
    if kind == "ivf":
        return {"nlist": max(1, min(MAX_NLIST, round(4 * math.sqrt(max(rows, 1))))), "nprobe": 16}
    if kind == "hnsw":
        return {"m": 32, "ef_construction": 64, "ef_search": 128}
    return {}


def training_rows(kind: str, params: dict[str, int], rows: int) -> int:
    """Rows to sample for training (0: the kind needs none)."""
    if kind != "ivf":
        return 0
    return min(rows, max(IVF_MIN_TRAIN, IVF_TRAIN_PER_LIST * params["nlist"]))


def prepare(vectors: Floats, metric: str) -> Floats:
    """Rows or queries as the index compares them: float32, contiguous; unit length for ``cos``
    (a zero vector stays zero)."""
    out = np.array(vectors, dtype=np.float32, order="C", copy=True)
    if metric == "cos":
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, np.maximum(norms, np.float32(1e-30)), out=out)
    return out


def new_index(kind: str, dimension: int, params: dict[str, int]) -> Any:
    faiss = faiss_module()
    if kind == "flat":
        return faiss.IndexFlatIP(dimension)
    if kind == "ivf":
        quantizer = faiss.IndexFlatIP(dimension)
        index = faiss.IndexIVFScalarQuantizer(quantizer, dimension, params["nlist"], faiss.ScalarQuantizer.QT_8bit,
                                              faiss.METRIC_INNER_PRODUCT)
        index.own_fields = True
        quantizer.this.disown()
        return index
    index = faiss.IndexHNSWFlat(dimension, params["m"], faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params["ef_construction"]
    return index


def train(index: Any, sample: Floats) -> None:
    if not index.is_trained:
        index.train(sample)


Chunks = Callable[[str], Iterator[Floats]]
"""The rows to index, prepared (:func:`prepare`), a chunk at a time and in order, anew at each
call; its argument says what the pass over them does (for progress): :data:`ADDING` for the one
pass, of every kind, that adds them to the index."""
ADDING = "indexing"


def add_rows(index: Any, kind: str, chunks: Chunks) -> None:
    """Add every row of ``chunks`` to a trained index, in order: an IVF index in two passes
    (:func:`_add_to_sized_lists`), the other kinds in one."""
    (_add_to_sized_lists if kind == "ivf" else _add_as_they_come)(index, chunks)


def _add_as_they_come(index: Any, chunks: Chunks) -> None:
    for values in chunks(ADDING):
        index.add(values)


def _add_to_sized_lists(index: Any, chunks: Chunks) -> None:
    """The first pass assigns every row to its list (the costly part of adding), so that each list
    is allocated once at its final size (:func:`_reserve`); the second adds the rows with those
    assignments: the index adding them directly gives, byte for byte, without the room lists grown
    as rows arrive keep (up to twice their rows; about 40% more memory than the index)."""
    faiss = faiss_module()
    counts = np.zeros(index.nlist, np.int64)
    lists = []
    for values in chunks("assigning to lists"):
        assigned = index.quantizer.assign(values, 1).reshape(-1)
        counts += np.bincount(assigned[assigned >= 0], minlength=index.nlist)  # -1: a row of NaN, never added
        lists.append(assigned.astype(np.int32))
    _reserve(index.invlists, counts)
    for values, assigned in zip(chunks(ADDING), lists, strict=True):
        coarse = assigned.astype(np.int64)  # held while FAISS reads it: swig_ptr keeps no reference
        index.add_core(len(values), faiss.swig_ptr(values), None, faiss.swig_ptr(coarse))


def _reserve(lists: Any, counts: NDArray[np.int64]) -> None:
    """Room for exactly ``counts[i]`` entries in each empty inverted list ``i``: each is resized
    to its count (allocated at that size), then back to empty (the room stays)."""
    for list_no, count in enumerate(counts.tolist()):
        lists.resize(list_no, count)
        lists.resize(list_no, 0)


def write(index: Any, sink: Callable[[bytes], object]) -> None:
    """Serialize ``index`` into ``sink``, piece by piece, in order: the bytes of
    ``faiss.serialize_index``, never all of them in memory."""
    faiss = faiss_module()
    faiss.write_index(index, faiss.PyCallbackIOWriter(sink, WRITE_BLOCK))


def read(next_bytes: Callable[[int], bytes]) -> Any:
    """The index whose serialized bytes ``next_bytes(n)`` gives in order, read a block at a time:
    memory holds all of it. FAISS sizes each vector by the count its header declares before it
    reads the vector: give it only a payload whose claims were bounded by its bytes
    (:func:`pbgio.index_file.load_index_payload` checks them first: :mod:`pbgio.formats.faiss_claims`)."""
    faiss = faiss_module()
    return faiss.read_index(faiss.PyCallbackIOReader(next_bytes, READ_BLOCK))


def view(payload: NDArray[np.uint8]) -> Any:
    """The index whose serialized bytes are ``payload`` (a read-only memory map of its file), its
    large arrays (inverted lists, flat codes, graph links) left in place as views of ``payload``: a
    search reads the pages it touches, memory never holds the whole index. The index keeps
    ``payload`` referenced (FAISS's ``referenced_objects``), so the map lives as long as it; it
    answers searches, and takes no rows. FAISS before 1.9 has no zero-copy reader: there the index
    is read whole from ``payload``, as from a remote file. As for :func:`read`, ``payload``'s claims
    must have been bounded by its bytes first."""
    faiss = faiss_module()
    if not hasattr(faiss, "ZeroCopyIOReader"):
        return read(byte_reader(payload))
    index = faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(payload), payload.size))
    index.referenced_objects = [payload]
    return index


def row_count(index: Any) -> int:
    return int(index.ntotal)


def dimension(index: Any) -> int:
    return int(index.d)


def search(index: Any, queries: Floats, count: int, kind: str, params: dict[str, int]) -> NDArray[np.int64]:
    """Ids of up to ``count`` rows per query, best first by the index's own (approximate) scores;
    -1 pads a row with fewer results."""
    if kind == "ivf":
        index.nprobe = params["nprobe"]
    elif kind == "hnsw":
        index.hnsw.efSearch = max(params["ef_search"], count)
    _, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), count)
    return np.asarray(ids, dtype=np.int64)
