"""``pbgio neighbors`` (pbgio.neighbors), the running top-k and the scan over partitions
(pbgio.topk), against numpy over the whole table."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray
from typer.testing import CliRunner

from pbgio import neighbors as nb
from pbgio.checkpoint import CheckpointDir
from pbgio.cli.commands import app
from pbgio.config import load_config
from pbgio.entities import read_entity_names
from pbgio.errors import MissingArtifactError, UnknownNameError
from pbgio.neighbors import NeighborsError, nearest_neighbors
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.testing import small_valid_layout, write_layout
from pbgio.topk import PartitionScan, TopK, scan_partitions

Floats = NDArray[np.float64]


# --------------------------------------------------------------------------- TopK


@given(scores=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, float("nan")]), max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=5), k=st.integers(1, 8), reverse=st.booleans())
def test_topk_is_the_sorted_prefix_whatever_the_blocks(scores: list[float], cuts: list[int], k: int,
                                                       reverse: bool) -> None:
    values = np.array(scores, dtype=np.float64)
    part = np.arange(len(values)) % 3  # rows spread over 3 partitions
    offset = np.arange(len(values)) // 3
    key = np.where(np.isnan(values), -np.inf, values)
    want = sorted(range(len(values)), key=lambda i: (-key[i], part[i], offset[i]))[:k]
    blocks = []
    for p in range(3):
        rows = np.flatnonzero(part == p)
        bounds = [0, *sorted(c % (len(rows) + 1) for c in cuts), len(rows)]
        blocks += [(p, rows[a:b]) for a, b in itertools.pairwise(bounds)]
    top = TopK(k)
    for p, rows in reversed(blocks) if reverse else blocks:
        top.add(values[rows], p, offset[rows])
    got = top.items()
    assert [(p, o) for _, p, o in got] == [(int(part[i]), int(offset[i])) for i in want]
    np.testing.assert_array_equal([s for s, _, _ in got], values[want])
    assert len(top) == min(k, len(values))


def test_topk_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="k >= 1"):
        TopK(0)
    with pytest.raises(ValueError, match="as many scores as offsets"):
        TopK(2).add(np.zeros(3), 0, np.arange(2))


# --------------------------------------------------------------------------- scan_partitions


@given(sizes=st.lists(st.integers(0, 7), min_size=1, max_size=4), queries=st.integers(1, 3),
       k=st.none() | st.integers(1, 6), block=st.integers(1, 8), reverse=st.booleans(), seed=st.integers(0, 99),
       excluded=st.booleans(), skipped=st.booleans(), thresholds=st.booleans())
def test_scan_partitions_is_the_whole_table_sorted(sizes: list[int], queries: int, k: int | None, block: int,
                                                   reverse: bool, seed: int, excluded: bool, skipped: bool,
                                                   thresholds: bool) -> None:
    rng = np.random.default_rng(seed)
    tables = [rng.choice([-1.0, 0.0, 0.5, 2.0, np.nan], size=(queries, n)) for n in sizes]
    exclude = {p: rng.choice(n + 2, size=2) for p, n in enumerate(sizes)} if excluded else None  # some beyond n
    rows = [(p, o) for p, n in enumerate(sizes) for o in range(n)]
    skip = rows[seed % len(rows)] if skipped and rows else None
    at_least = [0.5] * queries if thresholds else None
    opened: list[int] = []
    blocks: list[tuple[int, int, int]] = []

    def open_partition(part: int) -> tuple[int, Any]:
        opened.append(part)

        def scores(start: int, stop: int) -> NDArray[np.float64]:
            blocks.append((part, start, stop))
            out: NDArray[np.float64] = tables[part][:, start:stop]
            return out

        return sizes[part], scores

    order = list(range(len(sizes)))[::-1 if reverse else 1]
    scan = scan_partitions(order, open_partition, k=k, block_rows=block, queries=queries, exclude=exclude,
                           skip=skip, at_least=at_least)
    assert isinstance(scan, PartitionScan) and opened == order
    assert all(stop - start <= block for _, start, stop in blocks)
    left_out = {(p, int(o)) for p, ids in (exclude or {}).items() for o in ids if o < sizes[p]}
    kept = [(p, o) for p, o in rows if (p, o) not in left_out and (p, o) != skip]
    assert scan.candidates == len(kept) and scan.excluded == len(left_out)
    for q in range(queries):
        if k is None:
            assert scan.tops == []
        else:
            key = [(-np.nan_to_num(tables[p][q, o], nan=-np.inf), p, o) for p, o in kept]
            want = [(p, o) for _, p, o in sorted(key)[:k]]
            assert [(p, o) for _, p, o in scan.tops[q].items()] == want
        if at_least is None:
            assert scan.at_least == []
        else:
            assert scan.at_least[q] == sum(1 for p, o in kept if tables[p][q, o] >= at_least[q])


def test_scan_partitions_lets_each_partition_go_before_the_next() -> None:
    alive: list[int] = []

    class Rows:
        def __init__(self, part: int) -> None:
            self.part = part
            alive.append(part)

        def __del__(self) -> None:
            alive.remove(self.part)

    def open_partition(part: int) -> tuple[int, Any]:
        rows = Rows(part)
        assert alive == [part], alive  # the previous partition is gone before this one is read
        return 3, lambda start, stop: np.full((1, stop - start), float(rows.part))

    scan = scan_partitions(range(3), open_partition, k=2, block_rows=2)
    assert [(p, o) for _, p, o in scan.tops[0].items()] == [(2, 0), (2, 1)]
    with pytest.raises(ValueError, match="one threshold per query"):
        scan_partitions([0], open_partition, k=1, block_rows=1, queries=2, at_least=[0.0])


# --------------------------------------------------------------------------- brute force


def table(config: Path, entity_type: str, add_global: bool = True) -> tuple[list[str], Floats]:
    """Every name and vector of the type, partition 0 first, as pbgio export writes them."""
    cfg = load_config(config)
    ckpt = CheckpointDir(config.parent / cfg.checkpoint_path)
    names: list[str] = []
    rows = []
    for part in range(cfg.num_partitions(entity_type)):
        names += read_entity_names(config.parent / cfg.entity_path, entity_type, part)
        rows.append(ckpt.read_embeddings(entity_type, part).embeddings)
    values = np.concatenate(rows).astype(np.float64)
    if add_global and cfg.global_emb:
        values = values + ckpt.read_model().params[global_embedding_name(entity_type)]
    return names, values


def brute_force(names: list[str], values: Floats, query: str, k: int, metric: str,
                include_self: bool = False) -> tuple[list[str], Floats]:
    if metric == "cos":
        values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-30)
    q = names.index(query)
    scores = values @ values[q]
    order = [i for i in sorted(range(len(names)), key=lambda i: (-scores[i], i)) if include_self or i != q][:k]
    return [names[i] for i in order], scores[order]


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """user: partitions of 5 and 4 rows (dimension 4); item: 7 rows (dimension 6); global embeddings."""
    return write_layout(tmp_path_factory.mktemp("nb"), small_valid_layout(featurized=False, seed=3))


@pytest.mark.parametrize("metric", ["cos", "dot"])
@pytest.mark.parametrize("add_global", [True, False])
def test_neighbors_are_the_brute_force_ones(layout: Path, metric: str, add_global: bool) -> None:
    for etype in ("user", "item"):
        names, values = table(layout, etype, add_global)
        for k in (3, 100):
            found = nearest_neighbors(layout, etype, names, k=k, metric=metric, add_global=add_global)  # type: ignore[arg-type]
            assert [f.query for f in found] == names
            for result in found:
                want_names, want_scores = brute_force(names, values, result.query, k, metric)
                assert [n.name for n in result.neighbors] == want_names
                np.testing.assert_allclose([n.score for n in result.neighbors], want_scores, rtol=1e-5, atol=1e-6)
                assert [n.rank for n in result.neighbors] == list(range(1, len(want_names) + 1))
                assert result.candidates == len(names) and result.version == 1 and result.metric == metric
                assert result.query not in want_names
    user = nearest_neighbors(layout, "user", ["user-0-2"], k=100, metric=metric, add_global=add_global)[0]  # type: ignore[arg-type]
    assert {n.partition for n in user.neighbors} == {0, 1}  # both partitions searched
    assert len(user.neighbors) == 8


def test_include_self_and_global_embeddings_matter(layout: Path) -> None:
    names, values = table(layout, "user")
    [with_self] = nearest_neighbors(layout, "user", ["user-1-3"], k=4, include_self=True)
    want_names, _ = brute_force(names, values, "user-1-3", 4, "cos", include_self=True)
    assert [n.name for n in with_self.neighbors] == want_names
    assert with_self.neighbors[0].name == "user-1-3" and with_self.neighbors[0].score == pytest.approx(1.0, abs=1e-6)
    [stored] = nearest_neighbors(layout, "user", ["user-1-3"], k=8, metric="dot", add_global=False)
    [exported] = nearest_neighbors(layout, "user", ["user-1-3"], k=8, metric="dot")
    assert [n.score for n in stored.neighbors] != pytest.approx([n.score for n in exported.neighbors])


def test_blocks_and_queries_do_not_change_the_answer(layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queries = ["user-0-4", "user-1-0", "user-0-0"]
    whole = nearest_neighbors(layout, "user", queries, k=5)
    monkeypatch.setattr(nb, "MAX_BLOCK_ROWS", 2)
    blocked = nearest_neighbors(layout, "user", queries, k=5)
    alone = [nearest_neighbors(layout, "user", [q], k=5)[0] for q in queries]
    for a, b, c in zip(whole, blocked, alone, strict=True):  # BLAS may round other shapes in other ways
        places = [[(n.name, n.partition, n.offset) for n in r.neighbors] for r in (a, b, c)]
        assert places[0] == places[1] == places[2]
        for other in (b, c):
            np.testing.assert_allclose([n.score for n in a.neighbors], [n.score for n in other.neighbors], rtol=1e-6)


def test_errors(layout: Path, tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError) as info:
        nearest_neighbors(layout, "user", ["user-0-1", "ghost", "user-1-9"])
    assert info.value.names == ["ghost", "user-1-9"]
    assert str(info.value).startswith(f"no 'user' entity named 'ghost' in {layout.parent / 'entities'}")
    with pytest.raises(NeighborsError, match=r"expected an entity type of the config \['item', 'user'\], found 'usr'"):
        nearest_neighbors(layout, "usr", ["user-0-1"])
    with pytest.raises(NeighborsError, match="k >= 1"):
        nearest_neighbors(layout, "user", ["user-0-1"], k=0)
    with pytest.raises(NeighborsError, match="metric"):
        nearest_neighbors(layout, "user", ["user-0-1"], metric="l2")  # type: ignore[arg-type]
    with pytest.raises(NeighborsError, match="device"):
        nearest_neighbors(layout, "user", ["user-0-1"], device="tpu")
    with pytest.raises(NeighborsError, match="sequence of names"):
        nearest_neighbors(layout, "user", "user-0-1")
    with pytest.raises(MissingArtifactError):
        nearest_neighbors(layout, "user", ["user-0-1"], version=7)
    nameless = write_layout(tmp_path / "nameless", small_valid_layout(featurized=False, names=False))
    with pytest.raises(MissingArtifactError, match=r"entity_names_user_0\.json"):
        nearest_neighbors(nameless, "user", ["user-0-1"])


@pytest.mark.gpu
def test_cuda_gives_the_cpu_answer(layout: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    names = ["user-0-1", "user-1-2"]
    for metric in ("cos", "dot"):
        cpu = nearest_neighbors(layout, "user", names, k=6, metric=metric)
        gpu = nearest_neighbors(layout, "user", names, k=6, metric=metric, device="cuda")
        for a, b in zip(cpu, gpu, strict=True):
            assert [n.name for n in a.neighbors] == [n.name for n in b.neighbors]
            np.testing.assert_allclose([n.score for n in a.neighbors], [n.score for n in b.neighbors], rtol=1e-5)


# --------------------------------------------------------------------------- the command line


def test_cli_neighbors(layout: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["neighbors", str(layout), "--type", "user", "user-0-1", "user-1-1", "-k", "2"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["query", "rank", "name", "score"]
    found = nearest_neighbors(layout, "user", ["user-0-1", "user-1-1"], k=2)
    assert [line.split()[:3] for line in lines[1:]] == [[f.query, str(n.rank), n.name] for f in found
                                                        for n in f.neighbors]
    assert "2 nearest 'user' entities by cos among 9 (checkpoint version 1)" in done.stderr
    done = runner.invoke(app, ["neighbors", str(layout), "-t", "item", "item-0-3", "--metric", "dot", "--json",
                               "--include-self", "--no-global"])
    assert done.exit_code == 0, done.output
    [data] = json.loads(done.stdout)
    names, values = table(layout, "item", add_global=False)
    want_names, _ = brute_force(names, values, "item-0-3", 10, "dot", include_self=True)
    assert [n["name"] for n in data["neighbors"]] == want_names
    assert data["metric"] == "dot" and data["query"] == "item-0-3" and data["candidates"] == 7


def test_cli_exit_codes(layout: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["neighbors", str(layout), "--type", "user", "ghost"])
    assert done.exit_code == 1 and "error: no 'user' entity named 'ghost'" in done.stderr
    for args in (["--type", "user", "user-0-1", "--metric", "l2"], ["--type", "user", "user-0-1", "-k", "0"],
                 ["--type", "user"], ["user-0-1"], ["--type", "user", "user-0-1", "--version", "9"]):
        done = runner.invoke(app, ["neighbors", str(layout), *args])
        assert done.exit_code == 2, (args, done.output)


def test_cli_neighbors_on_cpu_does_not_import_torch(layout: Path) -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom pbgio.cli.commands import app\n"
            f"done = CliRunner().invoke(app, ['neighbors', {str(layout)!r}, '-t', 'user', 'user-0-1'])\n"
            "assert done.exit_code == 0, done.output\n"
            "assert 'torch' not in sys.modules, 'pbgio neighbors on the CPU must not import torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
