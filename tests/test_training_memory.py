"""The memory rule of partitioned training (pbgio.training_memory), as pbgio info and fit state it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pbgio.entities import read_entity_count
from pbgio.example import build_example
from pbgio.layout import Layout
from pbgio.training_memory import (
    CONSTANT_BYTES,
    EDGE_BYTES,
    GIB,
    MAX_PARTITIONS,
    ROW_STATE_BYTES,
    MemoryRule,
    memory_rule,
    partitions_needed,
    summary,
)
from tests.cli import pbgio


def test_the_rule_reads_the_largest_partition_and_bucket_of_a_layout(tmp_path: Path) -> None:
    config = build_example(tmp_path, num_edges=500)
    layout = Layout.load(config)
    rule = memory_rule(layout)
    cfg = layout.config
    counts = [read_entity_count(layout.entity_path, name, part)
              for name, entity in cfg.entities.items() for part in range(entity.num_partitions)]
    assert rule.partition_rows == max(counts)
    assert rule.partitions_held == 2  # the example is partitioned
    assert rule.partition_bytes == max(counts) * (4 * cfg.dimension + ROW_STATE_BYTES)
    assert rule.total_bytes == 2 * rule.partition_bytes + EDGE_BYTES * rule.chunk_edges + CONSTANT_BYTES
    assert rule.bucket_edges > 0 and rule.describe().startswith("training holds ≈ ")


def test_one_partition_is_held_once() -> None:
    one = MemoryRule(1000, 10, 100, partitions_held=1)
    two = MemoryRule(1000, 10, 100)
    assert two.total_bytes - one.total_bytes == one.partition_bytes
    assert "1 partition of" in one.describe() and "2 partitions ×" in two.describe()


def test_edge_chunks_divide_the_edges_held() -> None:
    whole, chunked = MemoryRule(10, 4, 1_000_000), MemoryRule(10, 4, 1_000_000, edge_chunks=20)
    assert chunked.chunk_edges == 50_000 and "a 20th" in chunked.describe()
    assert whole.total_bytes - chunked.total_bytes == EDGE_BYTES * 950_000


@given(rows=st.integers(1, 10**9), dimension=st.integers(1, 1000), edges=st.integers(0, 10**10),
       memory=st.floats(1.0, 4096.0))
def test_partitions_needed_is_the_fewest_that_fit(rows: int, dimension: int, edges: int, memory: float) -> None:
    def fits(parts: int) -> bool:
        rule = MemoryRule(-(-rows // parts), dimension, -(-edges // parts**2), 1, min(2, parts))
        return rule.total_bytes <= memory * GIB

    if not fits(MAX_PARTITIONS):
        with pytest.raises(ValueError, match="do not train in"):
            partitions_needed(rows=rows, dimension=dimension, edges=edges, memory_gib=memory)
        return
    parts = partitions_needed(rows=rows, dimension=dimension, edges=edges, memory_gib=memory)
    assert fits(parts)
    assert parts == 1 or not fits(parts - 1)


def test_more_memory_never_needs_more_partitions() -> None:
    needs = [partitions_needed(rows=86_054_151, dimension=100, edges=338_586_276, memory_gib=m)
             for m in (8, 16, 24, 64, 128)]
    assert needs == sorted(needs, reverse=True)
    with pytest.raises(ValueError, match="constant alone"):
        partitions_needed(rows=10, dimension=10, edges=10, memory_gib=0.1)


def test_info_states_the_rule_and_what_this_machine_needs(tmp_path: Path) -> None:
    config = build_example(tmp_path, num_edges=500)
    stated = summary(Layout.load(config))
    assert stated["bytes"] == memory_rule(Layout.load(config)).total_bytes
    assert stated["partitions_needed"] == 1  # a tiny graph fits any machine in one partition
    shown = pbgio("info", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "memory: training holds ≈" in shown.stdout and "partition" in shown.stdout
    as_json = json.loads(pbgio("info", str(config), "--json").stdout)
    assert as_json["training_memory"]["bytes"] == stated["bytes"]
