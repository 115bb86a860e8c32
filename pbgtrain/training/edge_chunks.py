"""The edges a trainer trains: one bucket's edge chunk of an iteration, through pbgio.

:class:`EdgeChunks` reads the chunk of a bucket file that an iteration step trains (remote
buckets through a bounded local copy), checks every id inside its table before anything is
indexed with it (an out-of-range id would be a device-side assert on a GPU: here it is a pbgio
error naming file and row), and reads the next bucket's chunk ahead on the trainer's
:class:`~pbgtrain.training.residency.Prefetcher` thread.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from pbgio import storage
from pbgio.checks.edges import check_bounds
from pbgio.edges import EdgeBucket, bucket_length, read_bucket
from pbgio.layout import Layout
from pbgio.spec import naming
from pbgio.spec.edges import chunk_bounds
from pbgio.storage import AnyPath, LocalCache
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.schedule.buckets import Bucket, PartitionKey, bucket_limits
from pbgtrain.training.residency import Prefetcher


class EdgeChunks:
    """The edge chunks of a run's buckets (see the module); ``num_dynamic_rels`` bounds the
    relation ids of a dynamic-relations model (None: static relations)."""

    def __init__(self, layout: Layout, counts: Mapping[PartitionKey, int], num_dynamic_rels: int | None,
                 bucket_cache: LocalCache, prefetcher: Prefetcher) -> None:
        self.layout = layout
        self.counts = dict(counts)
        self.num_dynamic_rels = num_dynamic_rels
        self.bucket_cache = bucket_cache
        self.prefetcher = prefetcher
        self._lengths: dict[tuple[str, int, int], int] = {}

    def path(self, step: IterationStep, bucket: Bucket) -> AnyPath:
        return self.layout.path(step.edge_path) / naming.bucket_file(bucket.lhs, bucket.rhs)

    def read(self, step: IterationStep, bucket: Bucket) -> EdgeBucket:
        """The chunk's edges: read ahead, or read now."""
        ahead = self.prefetcher.take(("edges", step.index, bucket))
        return ahead if ahead is not None else self._read(step, bucket)

    def read_ahead(self, step: IterationStep, bucket: Bucket) -> None:
        """Start reading ``bucket``'s chunk in the background."""
        self.bucket_length(step, bucket)  # cached here, on this thread, before the reader uses it
        self.prefetcher.submit(("edges", step.index, bucket), functools.partial(self._read, step, bucket))

    def _read(self, step: IterationStep, bucket: Bucket) -> EdgeBucket:
        """Runs on the read-ahead thread too: it reads only what no bucket changes."""
        path = self.path(step, bucket)
        with storage.relocated(self.bucket_cache, path) as local:
            edges = read_bucket(local, chunk=(step.edge_chunk_idx, step.num_edge_chunks))
        first_row, _ = chunk_bounds(self.bucket_length(step, bucket), step.num_edge_chunks, step.edge_chunk_idx)
        check_bounds(edges, path, first_row=first_row,
                     **bucket_limits(self.layout.config, self.counts, bucket, self.num_dynamic_rels))
        return edges

    def chunk_length(self, step: IterationStep, bucket: Bucket) -> int:
        """Edges of the bucket's chunk in this iteration."""
        start, end = chunk_bounds(self.bucket_length(step, bucket), step.num_edge_chunks, step.edge_chunk_idx)
        return end - start

    def bucket_length(self, step: IterationStep, bucket: Bucket) -> int:
        """Edges of the whole bucket file (lengths read once per edge path)."""
        key = (step.edge_path, bucket.lhs, bucket.rhs)
        if key not in self._lengths:
            with storage.relocated(self.bucket_cache, self.path(step, bucket)) as local:
                self._lengths[key] = bucket_length(local)
        return self._lengths[key]

    def close(self) -> None:
        self.bucket_cache.close()
