"""Property tests: everything pbgio writes reads back exactly, and valid layouts validate clean."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pbgio import entities
from pbgio.checkpoint import CheckpointDir, EmbeddingsState, FileMetadata, ModelState, write_checkpoint
from pbgio.config import CONFIG_KEYS, ConfigSchema, parse_config, semantic_issues
from pbgio.edges import BucketWriter, EdgeBucket, FeatureLists, bucket_length, read_bucket, write_bucket
from pbgio.spec.edges import chunk_bounds
from pbgio.testing import strategies as pst
from pbgio.testing.layouts import LayoutContents, layout_summary, write_layout
from pbgio.validate import validate_path


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh directory per example (function-scoped fixtures are shared across examples)."""
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def slice_bucket(bucket: EdgeBucket, start: int, end: int) -> EdgeBucket:
    """Edges ``[start, end)`` of a bucket, feature offsets rebased to 0."""

    def feats(f: FeatureLists | None) -> FeatureLists | None:
        if f is None:
            return None
        off = f.offsets[start:end + 1]
        return FeatureLists(off - off[0], f.data[off[0]:off[-1]])

    return EdgeBucket(
        bucket.rel[start:end], bucket.lhs[start:end], bucket.rhs[start:end],
        None if bucket.weight is None else bucket.weight[start:end],
        feats(bucket.lhs_features), feats(bucket.rhs_features),
    )


def assert_same_bucket(found: EdgeBucket, expected: EdgeBucket) -> None:
    for name in ("rel", "lhs", "rhs"):
        assert getattr(found, name).dtype == np.int64
        np.testing.assert_array_equal(getattr(found, name), getattr(expected, name), err_msg=name)
    if expected.weight is None:
        assert found.weight is None
    else:
        assert found.weight is not None
        assert found.weight.dtype == np.float32
        assert found.weight.tobytes() == expected.weight.tobytes()
    for side in ("lhs", "rhs"):
        want = expected.features(side)  # type: ignore[arg-type]
        got = found.features(side)  # type: ignore[arg-type]
        assert (got is None) == (want is None), side
        if want is not None and got is not None:
            np.testing.assert_array_equal(got.offsets, want.offsets, err_msg=f"{side} offsets")
            np.testing.assert_array_equal(got.data, want.data, err_msg=f"{side} data")
    assert found == expected


# --------------------------------------------------------------------------- edges


@given(pst.raw_edge_buckets(), st.integers(1, 7), st.data())
def test_bucket_writer_roundtrip(bucket: EdgeBucket, buffer_edges: int, data: st.DataObject) -> None:
    n = len(bucket)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6), label="cuts"))
    bounds = [0, *cuts, n]
    with scratch() as d:
        path = d / "edges_0_0.h5"
        with BucketWriter(path, buffer_edges=buffer_edges) as writer:
            for start, end in itertools.pairwise(bounds):
                writer.append(slice_bucket(bucket, start, end))
        assert writer.written == n
        assert bucket_length(path) == n
        assert_same_bucket(read_bucket(path), bucket)


@given(pst.raw_edge_buckets(), st.integers(1, 8))
def test_chunks_concatenate_to_the_bucket(bucket: EdgeBucket, num_chunks: int) -> None:
    n = len(bucket)
    with scratch() as d:
        path = d / "edges_0_1.h5"
        write_bucket(path, bucket)
        chunks = [read_bucket(path, chunk=(i, num_chunks)) for i in range(num_chunks)]
        size = -(-n // num_chunks)
        for i, chunk in enumerate(chunks):
            start, end = chunk_bounds(n, num_chunks, i)
            assert (start, end) == (min(i * size, n), min((i + 1) * size, n))
            assert len(chunk) == end - start
            assert_same_bucket(chunk, slice_bucket(bucket, start, end))
        assert_same_bucket(EdgeBucket.concat(chunks), bucket)


@given(pst.raw_edge_buckets(), st.integers(-3, 40), st.integers(-3, 40))
def test_edge_range_reads(bucket: EdgeBucket, start: int, end: int) -> None:
    with scratch() as d:
        path = d / "edges_0_0.h5"
        write_bucket(path, bucket)
        lo, hi = max(0, start), min(len(bucket), end)
        part = read_bucket(path, edge_range=(start, end))
        assert len(part) == max(0, hi - lo)
        if hi > lo:
            assert_same_bucket(part, slice_bucket(bucket, lo, hi))


# --------------------------------------------------------------------------- entities


@given(pst.entity_type_names(), st.integers(0, 99), st.integers(0, 2**63 - 1),
       st.lists(st.text(), max_size=8))
def test_entity_files_roundtrip(etype: str, part: int, count: int, names: list[str]) -> None:
    with scratch() as d:
        entities.write_entity_count(d, etype, part, count)
        entities.write_entity_names(d, etype, part, names)
        assert entities.read_entity_count(d, etype, part) == count
        assert entities.read_entity_names(d, etype, part) == names
        assert json.loads((d / f"entity_names_{etype}_{part}.json").read_text("utf-8")) == names


@given(st.integers(0, 2**63 - 1), st.lists(st.text(), max_size=8))
def test_relation_files_roundtrip(count: int, names: list[str]) -> None:
    with scratch() as d:
        entities.write_dynamic_rel_count(d, count)
        entities.write_relation_names(d, names)
        assert entities.read_dynamic_rel_count(d) == count
        assert entities.read_relation_names(d) == names


# --------------------------------------------------------------------------- checkpoint


def assert_bits_equal(found: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    assert found.dtype == np.float32
    assert found.shape == expected.shape
    assert found.tobytes() == expected.tobytes()


@given(
    st.dictionaries(
        st.tuples(pst.entity_type_names(), st.integers(0, 3)),
        st.tuples(st.integers(0, 5), st.integers(1, 6)).flatmap(
            lambda shape: pst.embeddings_states(*shape, finite=False)),
        max_size=3,
    ),
    pst.any_model_states(),
    pst.file_metadata(),
    st.integers(1, 10**6),
)
def test_checkpoint_roundtrip(embeddings: dict[tuple[str, int], EmbeddingsState], model: ModelState,
                              metadata: FileMetadata, version: int) -> None:
    with scratch() as d:
        ckpt = CheckpointDir(d / "checkpoint")
        write_checkpoint(ckpt, version, embeddings=embeddings, model=model, metadata=metadata)
        assert ckpt.read_version() == version
        for (etype, part), state in embeddings.items():
            back = ckpt.read_embeddings(etype, part)
            assert_bits_equal(back.embeddings, state.embeddings)
            assert back.optimizer_state == state.optimizer_state
            assert ckpt.read_metadata(ckpt.embeddings_path(etype, part, version)) == metadata
        back_model = ckpt.read_model()
        assert set(back_model.params) == set(model.params)
        for name, value in model.params.items():
            assert_bits_equal(back_model.params[name], value)
        assert back_model.optimizer_state == model.optimizer_state
        assert back_model.state_dict().keys() == model.state_dict().keys()
        assert ckpt.read_metadata(ckpt.model_path(version)) == metadata


@given(st.data())
def test_checkpoint_of_a_config_roundtrip(data: st.DataObject) -> None:
    cfg = data.draw(pst.configs(), label="config")
    counts = data.draw(pst.entity_counts(cfg), label="counts")
    num_dynamic = data.draw(st.integers(0, 3), label="dynamic rels") if cfg.dynamic_relations else None
    checkpoint = data.draw(pst.checkpoints(cfg, counts, num_dynamic), label="checkpoint")
    with scratch() as d:
        ckpt = CheckpointDir(d)
        write_checkpoint(ckpt, checkpoint.version, embeddings=checkpoint.embeddings,
                         model=checkpoint.model, metadata=checkpoint.metadata, config=cfg)
        assert ckpt.read_config() == cfg
        model = ckpt.read_model()
        assert {k: v.shape for k, v in model.params.items()} == {
            k: v.shape for k, v in checkpoint.model.params.items()}
        meta = ckpt.read_metadata(ckpt.model_path(checkpoint.version))
        assert meta == checkpoint.metadata
        assert meta.config_json is not None
        assert parse_config(json.loads(meta.config_json)) == cfg


# --------------------------------------------------------------------------- config


@given(pst.configs())
def test_config_json_roundtrip(cfg: ConfigSchema) -> None:
    text = cfg.to_json()
    data = json.loads(text)
    assert tuple(data) == CONFIG_KEYS  # every key, in the original's order
    assert parse_config(data) == cfg
    assert parse_config(json.loads(parse_config(data).to_json())).to_json() == text
    assert semantic_issues(cfg) == []


# --------------------------------------------------------------------------- whole layouts


@given(pst.layouts())
def test_written_layout_validates_clean(layout: LayoutContents) -> None:
    with scratch() as d:
        config_path = write_layout(d, layout)
        report = validate_path(config_path)
        assert report.issues == [], (
            "\n".join(str(i) for i in report.issues) + "\n" + layout_summary(layout))
        assert report.ok
        buckets = sum(len(b) for b in layout.buckets.values())
        assert report.checked.get("bucket files", 0) == buckets
        edges = sum(len(b) for bs in layout.buckets.values() for b in bs.values())
        assert report.checked.get("edges", 0) == edges


@given(pst.layouts(checkpoint=False))
def test_written_layout_reads_back(layout: LayoutContents) -> None:
    cfg = layout.config
    with scratch() as d:
        write_layout(d, layout)
        for (etype, part), count in layout.counts.items():
            assert entities.read_entity_count(d / cfg.entity_path, etype, part) == count
        for (etype, part), names in layout.names.items():
            assert entities.read_entity_names(d / cfg.entity_path, etype, part) == names
        for edge_path, buckets in layout.buckets.items():
            for (lhs, rhs), bucket in buckets.items():
                assert_same_bucket(read_bucket(d / edge_path / f"edges_{lhs}_{rhs}.h5"), bucket)
