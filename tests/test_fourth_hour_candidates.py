"""Issue 56, a new user's fourth hour, points 5 and 12, through the real command lines.

5. With one entity type (dynamic relations), a category entity came 10th among a library's
   predicted dependencies: ``predict`` and ``neighbors`` had no candidate filter. Now both take
   ``--candidates PREFIX`` (repeatable) and ``--candidates-file FILE`` (exact names), exact and
   through ``--index``; the output and ``--json`` say the filter; through an index the search
   asks for more rows until k pass, or says it could not.
12. A score through ``--index`` printed 6.10065 where the exact one was 6.10064: now the rows a
   search returns are scored once more each alone, whichever way they were found, so the same
   row prints the same score.

The layout: one type ``item`` of 1,200 rows in two partitions, in three tight clusters named by
kind: ``lib-*`` around a centre, ``cat-*`` around the opposite one (what a library is least
like), ``doc-*`` around a third; a relation ``r`` item → item without operator, compared by dot
(so ``predict --index`` searches the index too). A checkpoint is written directly: no training.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import parse_config
from pbgio.edges import EdgeBucket, write_bucket
from pbgio.entities import write_entity_count, write_entity_names
from pbgio.spec import naming
from tests.cli import pbgio, pbgtrain

pytest.importorskip("faiss")

KINDS = ("lib", "cat", "doc")
PER_KIND = 400
DIM = 16


def _layout(root: Path) -> Path:
    """The clustered layout described above (seeded); returns its config."""
    cfg = parse_config({"entities": {"item": {"num_partitions": 2}},
                        "relations": [{"name": "r", "lhs": "item", "rhs": "item", "operator": "none"}],
                        "dimension": DIM, "global_emb": False, "comparator": "dot", "entity_path": "data",
                        "edge_paths": ["data/edges"], "checkpoint_path": "model"})
    (root / "data").mkdir(parents=True)
    (root / "config.json").write_text(cfg.to_json())
    rng = np.random.default_rng(56)
    lib = rng.standard_normal(DIM)
    lib *= 3 / np.linalg.norm(lib)
    doc = rng.standard_normal(DIM)
    doc -= doc @ lib / (lib @ lib) * lib
    doc *= 3 / np.linalg.norm(doc)
    centres = {"lib": lib, "cat": -lib, "doc": doc}
    names = [f"{kind}-{i:04d}" for kind in KINDS for i in range(PER_KIND)]
    table = np.concatenate([centres[kind] + 0.3 * rng.standard_normal((PER_KIND, DIM)) for kind in KINDS])
    order = rng.permutation(len(names))  # kinds mixed over both partitions
    names, table = [names[i] for i in order], table[order].astype(np.float32)
    half = len(names) // 2
    embeddings = {}
    for part, (lo, hi) in enumerate(((0, half), (half, len(names)))):
        write_entity_count(root / "data", "item", part, hi - lo)
        write_entity_names(root / "data", "item", part, names[lo:hi])
        embeddings[("item", part)] = EmbeddingsState(np.ascontiguousarray(table[lo:hi]), None)
    write_checkpoint(CheckpointDir(root / "model"), 1, embeddings=embeddings, model=ModelState({}, None), config=cfg)
    empty = np.zeros(0, np.int64)
    for lhs in range(2):
        for rhs in range(2):
            write_bucket(root / "data" / "edges" / naming.bucket_file(lhs, rhs), EdgeBucket(empty, empty, empty))
    return root / "config.json"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The layout with its flat (exact) index by dot, as ``pbgio index build`` chooses at this size."""
    path = _layout(tmp_path_factory.mktemp("clusters"))
    built = pbgio("index", "build", str(path), "--no-progress")
    assert built.returncode == 0, built.stderr
    assert "faiss flat index of 1,200 'item' rows by dot" in built.stderr
    return path


Done = subprocess.CompletedProcess[str]


def _json(done: Done) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _predict(config: Path, *args: str) -> dict[str, Any]:
    found = _json(pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "--json", *args))
    assert isinstance(found, dict)
    return found


def _neighbors(config: Path, *args: str) -> list[dict[str, Any]]:
    found = _json(pbgio("neighbors", str(config), "lib-0001", "--json", *args))
    assert isinstance(found, list)
    return found


def _ranked(entries: list[dict[str, Any]]) -> list[tuple[str, float]]:
    return [(e["name"], e["score"]) for e in entries]


# --------------------------------------------------------------------------- 5. exact search filters, then takes k


def test_predict_candidates_prefix_ranks_only_the_entities_it_names(config: Path) -> None:
    """The exact top 5 among ``cat-*`` is the first 5 ``cat-*`` of the ranking of every entity."""
    every = _predict(config, "-k", str(3 * PER_KIND))["predictions"]
    wanted = [(n, s) for n, s in _ranked(every) if n.startswith("cat-")][:5]
    found = _predict(config, "-k", "5", "--candidates", "cat-")
    assert _ranked(found["predictions"]) == wanted
    assert found["candidates"] == PER_KIND
    assert found["candidate_filter"] == {"prefixes": ["cat-"], "names_file": None, "names": 0, "names_found": 0,
                                         "entities": PER_KIND}
    human = pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "-k", "5", "--candidates", "cat-")
    assert human.returncode == 0, human.stderr
    assert f"among {PER_KIND} 'item' entities (names starting with 'cat-')" in human.stderr
    assert [line.split()[1] for line in human.stdout.splitlines()[1:]] == [n for n, _ in wanted]


def test_repeated_prefixes_and_a_names_file_keep_any_of_them(config: Path, tmp_path: Path) -> None:
    """``--candidates`` twice keeps either prefix; ``--candidates-file`` adds exact names (a name
    that is only a prefix, or no entity, passes nothing and is counted)."""
    listed = tmp_path / "keep.txt"
    listed.write_text("doc-0007\ncat-00\nnobody\n\ndoc-0123\n")
    every = _neighbors(config, "-k", str(3 * PER_KIND - 1))[0]["neighbors"]
    wanted = [(n, s) for n, s in _ranked(every)
              if n.startswith(("cat-01", "cat-02")) or n in ("doc-0007", "doc-0123")][:8]
    found = _neighbors(config, "-k", "8", "--candidates", "cat-01", "--candidates", "cat-02", "--candidates-file",
                       str(listed))[0]
    assert _ranked(found["neighbors"]) == wanted
    assert found["candidates"] == 200 + 2
    assert found["candidate_filter"] == {"prefixes": ["cat-01", "cat-02"], "names_file": str(listed), "names": 4,
                                         "names_found": 2, "entities": 202}
    human = pbgio("neighbors", str(config), "lib-0001", "-k", "8", "--candidates", "cat-01", "--candidates", "cat-02",
                  "--candidates-file", str(listed))
    assert human.returncode == 0, human.stderr
    assert (f"among 202 (names starting with 'cat-01' or 'cat-02', or the 4 names of {listed} (2 of them 'item' "
            "entities);" in " ".join(human.stderr.split()))


# --------------------------------------------------------------------------- 5. through an index: widen until k pass


def test_index_search_asks_for_more_rows_until_k_pass(config: Path) -> None:
    """The index proposes rows most like a library first; the categories are the least like one,
    so the first request holds none of them and the search widens, then finds the exact answer."""
    for found, exact, key in ((_neighbors(config, "-k", "5", "--candidates", "cat-", "--index")[0],
                               _neighbors(config, "-k", "5", "--candidates", "cat-")[0], "neighbors"),
                              (_predict(config, "-k", "5", "--candidates", "cat-", "--index"),
                               _predict(config, "-k", "5", "--candidates", "cat-"), "predictions")):
        search = found["index_search"]
        assert search["rounds"] > 1 and search["complete"] and search["passed"] >= 5, search
        assert search["asked"] == 3 * PER_KIND  # the last request: every row of the index
        assert _ranked(found[key]) == _ranked(exact[key])
        assert all(n.startswith("cat-") for n, _ in _ranked(found[key]))
        assert found["candidate_filter"]["entities"] == PER_KIND
    human = pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "-k", "5", "--candidates", "cat-",
                     "--index")
    assert human.returncode == 0, human.stderr
    assert "rounds, the model scored the 400 of the 1,200 it proposed that pass the candidate filter" in human.stderr


def test_index_search_says_when_fewer_than_k_pass(config: Path, tmp_path: Path) -> None:
    """Three names pass; k is 5: the index is asked for all its rows and the answer says so."""
    listed = tmp_path / "three.txt"
    listed.write_text("cat-0001\ncat-0002\ndoc-0003\n")
    found = pbgio("neighbors", str(config), "lib-0001", "-k", "5", "--candidates-file", str(listed), "--index")
    assert found.returncode == 0, found.stderr
    assert ("note: lib-0001: only 3 of 5 neighbours pass the filter among the 1,200 rows the index proposed (asked for "
            "1,200 in 1 round: all its rows); without --index every entity is scored") in " ".join(found.stderr.split())
    assert sorted(line.split()[2] for line in found.stdout.splitlines()[1:]) == ["cat-0001", "cat-0002", "doc-0003"]
    answer = _json(pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "-k", "5", "--index",
                            "--candidates-file", str(listed), "--json"))
    assert isinstance(answer, dict)
    assert answer["index_search"] == {"asked": 1200, "proposed": 1200, "rounds": 1, "passed": 3, "complete": False}
    assert len(answer["predictions"]) == 3


def test_an_approximate_index_that_cannot_reach_the_candidates_says_how_far_it_searched(tmp_path: Path) -> None:
    """An IVF index of 3 lists, one list visited: a library's list holds no category, however
    many rows are asked for."""
    config = _layout(tmp_path)
    built = pbgio("index", "build", str(config), "--kind", "ivf", "--nlist", "3", "--nprobe", "1", "--no-progress")
    assert built.returncode == 0, built.stderr
    found = pbgio("neighbors", str(config), "lib-0001", "-k", "5", "--candidates", "cat-", "--index", "--json")
    assert found.returncode == 0, found.stderr
    [answer] = json.loads(found.stdout)
    search = answer["index_search"]
    assert not search["complete"] and search["passed"] == len(answer["neighbors"]) < 5
    assert search["proposed"] < search["asked"] <= 3 * PER_KIND
    assert (f"note: lib-0001: only {search['passed']} of 5 neighbours pass the filter among the "
            f"{search['proposed']:,} rows the index proposed (asked for {search['asked']:,} in {search['rounds']} "
            "rounds: all it could propose at its search settings); without --index every entity is scored"
            in " ".join(found.stderr.split()))


# --------------------------------------------------------------------------- 5. bad filters


def test_a_filter_that_nothing_passes_is_an_error_naming_the_option(config: Path, tmp_path: Path) -> None:
    """As an unknown name, exit 1; a missing or empty file, an empty prefix: usage errors, exit 2.
    Each message names the options given, and no other."""
    strangers = tmp_path / "strangers.txt"
    strangers.write_text("nobody\nno-one\n")
    for command in (pbgio, pbgtrain):
        query = ("neighbors", str(config), "lib-0001") if command is pbgio else (
            "predict", str(config), "--lhs", "lib-0001", "--rel", "r")
        done = command(*query, "--candidates", "zzz")
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("error: --candidates zzz: no 'item' entity has a name starting with 'zzz'")
        done = command(*query, "--candidates-file", str(strangers))
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"error: --candidates-file {strangers}: no 'item' entity has one of the 2 names "
                                      f"of {strangers}")
        done = command(*query, "--candidates-file", str(tmp_path / "absent.txt"))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: --candidates-file {tmp_path / 'absent.txt'}: the file does not exist")
        (tmp_path / "blank.txt").write_text("\n\n")
        done = command(*query, "--candidates-file", str(tmp_path / "blank.txt"))
        assert done.returncode == 2, done.stderr
        assert "no names in it" in done.stderr
        done = command(*query, "--candidates", "")
        assert done.returncode == 2, done.stderr
        assert "expected a non-empty name prefix" in done.stderr and "--candidates-file" not in done.stderr
    triple = pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "--rhs", "cat-0001",
                      "--candidates-file", str(strangers))
    assert triple.returncode == 2, triple.stderr
    assert triple.stderr.startswith("error: --candidates-file applies to top-k queries") and \
        "--candidates " not in triple.stderr


def test_the_rows_an_index_proposes_are_proposals(config: Path) -> None:
    """``--candidates`` names candidates now; the count of rows an index proposes is ``--proposals``."""
    found = _neighbors(config, "-k", "5", "--index", "--proposals", "20")[0]
    assert len(found["neighbors"]) == 5 and "index_search" not in found
    for done in (pbgio("neighbors", str(config), "lib-0001", "--proposals", "20"),
                 pbgtrain("predict", str(config), "--lhs", "lib-0001", "--rel", "r", "--proposals", "20")):
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == "error: --proposals applies to --index searches"
    done = pbgio("neighbors", str(config), "lib-0001", "--candidates", "20")
    assert done.returncode == 1, done.stderr
    assert "--candidates takes a name prefix: the rows an index proposes per query are --proposals N" in done.stderr


def test_the_old_spelling_of_proposals_is_taken_for_one_release_with_a_warning(config: Path) -> None:
    """Scripts of the release before: ``--index --candidates N`` meant N proposals. Taken so, and said."""
    for tool, args in ((pbgio, ("neighbors", str(config), "lib-0001")),
                       (pbgtrain, ("predict", str(config), "--lhs", "lib-0001", "--rel", "r"))):
        old, new = (tool(*args, "-k", "5", "--index", *option, "20", "--json") for option in
                    (["--candidates"], ["--proposals"]))
        assert old.returncode == new.returncode == 0, old.stderr
        assert old.stdout == new.stdout
        assert ("warning: --candidates 20 with --index is the old spelling of --proposals 20 (the rows the index "
                "proposes per query) and is taken so") in old.stderr
        assert "old spelling" not in new.stderr


# --------------------------------------------------------------------------- 12. the same score either way


def test_index_and_exact_searches_print_the_same_scores(config: Path, tmp_path: Path) -> None:
    """Many queries, exact and through the (flat) index: every row both return prints the same
    score string (tables: six significant digits; ``--queries``: the float32 in full), and its
    JSON score is the same float."""
    names = [f"{kind}-{i:04d}" for kind in KINDS for i in range(0, PER_KIND, 10)]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    (tmp_path / "queries.tsv").write_text("".join(f"{name}\tr\t\n" for name in names))

    def rows(done: Done) -> set[tuple[str, ...]]:
        assert done.returncode == 0, done.stderr
        return {tuple(line.split()) for line in done.stdout.splitlines()[1:]}

    neighbors = ("neighbors", str(config), "--names-file", str(tmp_path / "names.txt"), "-k", "10")
    exact, indexed = rows(pbgio(*neighbors)), rows(pbgio(*neighbors, "--index"))
    predicted = ("predict", str(config), "--queries", str(tmp_path / "queries.tsv"), "-k", "10")
    exact_tsv, indexed_tsv = rows(pbgtrain(*predicted)), rows(pbgtrain(*predicted, "--index"))
    for both_exact, both_indexed in ((exact, indexed), (exact_tsv, indexed_tsv)):
        shared = {row[:-1] for row in both_exact} & {row[:-1] for row in both_indexed}
        assert len(shared) >= 0.9 * len(both_exact)  # a flat index: the same rows, ties at the k-th aside
        assert {row for row in both_exact if row[:-1] in shared} == {row for row in both_indexed if row[:-1] in shared}
    exact_json = _json(pbgio(*neighbors, "--json"))
    indexed_json = _json(pbgio(*neighbors, "--index", "--json"))
    assert isinstance(exact_json, list) and isinstance(indexed_json, list)
    for a, b in zip(exact_json, indexed_json, strict=True):
        scores = {n["name"]: n["score"] for n in a["neighbors"]}
        assert all(scores[n["name"]] == n["score"] for n in b["neighbors"] if n["name"] in scores)
