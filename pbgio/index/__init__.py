"""Nearest-neighbour indexes over trained embeddings (needs FAISS: ``pip install 'pbg[ann]'``).

An index belongs to one checkpoint version of one entity type, and has one metric and kind
(:mod:`pbgio.spec.index`): :func:`build_index` writes it beside that version (several, of other
metrics or kinds, may sit beside it), :func:`open_index` loads the one that fits a search
(:func:`find_index`; refusing a stale or damaged one) into an :class:`EmbeddingIndex` that answers
many searches, each re-ranked exactly (with a candidate filter, asking the index for more rows until
enough pass: :mod:`pbgio.index.widening`). An approximate index's recall@10 is measured as it is built
(:mod:`pbgio.index.recall`) and said by every search through it (``exact`` for a flat one).
``pbgio neighbors --index`` and ``pbgtrain predict --index`` use it.
Their exact scans read candidates through :class:`RowWindow` (a partition streamed a chunk at a time).

>>> import tempfile, pathlib
>>> from pbgio.testing import small_valid_layout, write_layout
>>> from pbgio.neighbors import indexed_neighbors
>>> config = write_layout(pathlib.Path(tempfile.mkdtemp()), small_valid_layout(featurized=False))
>>> print(build_index(config, "user").meta.describe())
faiss flat index of 9 'user' rows by cos, checkpoint version 1
>>> with open_index(config, "user") as index:  # load once, ask many times
...     [found] = indexed_neighbors(index, ["user-0-0"], k=3)
>>> len(found.neighbors), found.searched
(3, 'index_user.cos.flat.v1.h5, faiss flat, exact')
"""

from pbgio.index.build import BuiltIndex, IndexBuildError, build_index
from pbgio.index.rows import RowWindow
from pbgio.index.search import (
    DEFAULT_CANDIDATES,
    EmbeddingIndex,
    IndexAnswer,
    IndexMismatchError,
    IndexSearchError,
    find_index,
    open_index,
)
from pbgio.index.widening import Widened
from pbgio.index_file import IndexMeta, read_index_meta

__all__ = ["DEFAULT_CANDIDATES", "BuiltIndex", "EmbeddingIndex", "IndexAnswer", "IndexBuildError", "IndexMeta",
           "IndexMismatchError", "IndexSearchError", "RowWindow", "Widened", "build_index", "find_index", "open_index",
           "read_index_meta"]
