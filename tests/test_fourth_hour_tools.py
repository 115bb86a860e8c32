"""Issue 56, a new user's fourth hour, the tools around a graph of their own (points 8–11): names
found by a word rank the name itself and whole-word matches first; a closed pipe ends any command
quietly; ``pbgtrain eval --sample`` ranks a seeded sample (fit's ``--valid-sample`` draw) and says
the cost before it ranks; the report of a run without held-out edges has no empty held-out panel,
scales the validation axis to the data and compares the first validation with the best.

Through the real command lines, on a dependency graph of the tests' own: 12,000 packages in
clusters whose members need one another (planted structure), plus a few named as Debian names
them (``python3-numpy``, ``numpydoc``, ``doc-base`` …), imported from CSV and trained two epochs
with ``--valid`` and no held-out edges (``eval_fraction`` 0)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.cli.finding import LINES_PER_WRITE
from pbgio.entities import read_entity_names
from pbgio.spec.stats import EXTRA_KEY
from pbgtrain.validation_log import RECORD_KEY
from tests.cli import pbgio, pbgtrain

CLUSTERS, MEMBERS = 400, 30
FAMILY = ["numpydoc", "python3-numpy", "numpy-stl", "libnumpy-dev", "NumPy:core", "numpy", "python-numpy-doc",
          "numpyx", "docutils", "doc-base", "docbook", "numpy_groupies"]
VALID_SAMPLE = 300
SEPARATORS = r"[-._: ]"


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The imported and trained graph's config (``data/train``, ``data/test``; two epochs, each
    validated on a sample of the test edges)."""
    root = tmp_path_factory.mktemp("deps")
    rng = random.Random(56)
    members = [[f"python3-lib{c:03d}{m:02d}-utils" for m in range(MEMBERS)] for c in range(CLUSTERS)]
    edges = [(name, rng.choice(("needs", "recommends")), rng.choice([o for o in cluster if o != name]))
             for cluster in members for name in cluster]
    edges += [(name, "needs", rng.choice(members[k])) for k, name in enumerate(FAMILY)]
    rng.shuffle(edges)
    cut = int(0.9 * len(edges))
    for split, part in (("train", edges[:cut]), ("test", edges[cut:])):
        (root / f"{split}.csv").write_text("source,relation,target\n" + "".join(f"{a},{r},{b}\n" for a, r, b in part),
                                           encoding="utf-8")
    config = {"entities": {"item": {"num_partitions": 1}},
              "relations": [{"name": "all_edges", "lhs": "item", "rhs": "item", "operator": "complex_diagonal"}],
              "dynamic_relations": True, "global_emb": False, "dimension": 16, "comparator": "dot",
              "loss_fn": "softmax", "lr": 0.1, "num_epochs": 2, "entity_path": "data",
              "edge_paths": ["data/train", "data/test"], "checkpoint_path": "model"}
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    done = pbgio("import", str(path), str(root / "train.csv"), str(root / "test.csv"), "-d", "comma", "--header")
    assert done.returncode == 0, done.stderr
    done = pbgtrain("fit", str(path), "-p", "edge_paths=data/train", "-p", "eval_fraction=0", "--valid", "data/test",
                    "--valid-sample", str(VALID_SAMPLE), "--no-progress")
    assert done.returncode == 0, done.stderr
    return path


def names(config: Path) -> list[str]:
    return read_entity_names(config.parent / "data", "item", 0)


def best_first(config: Path, word: str) -> list[str]:
    """The names holding ``word`` (case aside) in the order the issue asks: the name itself, then
    those holding it as a whole part between separators (shortest first), then those that start
    with it, then the rest; each kind in the names file's order."""
    found = [n for n in names(config) if word.casefold() in n.casefold()]
    exact = [n for n in found if n == word]
    whole = sorted((n for n in found if n != word and word.casefold() in re.split(SEPARATORS, n.casefold())), key=len)
    rest = [n for n in found if n not in exact and n not in whole]
    return exact + whole + [n for n in rest if n.casefold().startswith(word.casefold())] + \
        [n for n in rest if not n.casefold().startswith(word.casefold())]


# --------------------------------------------------------------------------- 8. names: the one meant first


def test_names_lists_the_name_itself_then_whole_words_then_the_rest(graph: Path) -> None:
    done = pbgio("names", str(graph), "numpy")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.splitlines()
    assert listed == best_first(graph, "numpy")
    assert listed[:6] == ["numpy", "numpy-stl", "NumPy:core", "python3-numpy", "numpy_groupies", "python-numpy-doc"]
    assert listed.index("python3-numpy") < listed.index("numpydoc") < listed.index("libnumpy-dev")
    assert f"{len(listed)} 'item' entity names contain 'numpy'" in done.stderr


def test_an_unknown_names_hint_lists_whole_word_matches_first(graph: Path) -> None:
    expected = best_first(graph, "doc")
    assert expected[:2] == ["doc-base", "python-numpy-doc"] and expected[4:] == ["numpydoc"]  # whole words, … inside
    for done in (pbgio("neighbors", str(graph), "doc"),
                 pbgtrain("predict", str(graph), "--lhs", "doc", "--rel", "needs")):
        assert done.returncode == 1, done.stderr
        assert " ".join(done.stderr.split()).endswith(
            f"5 names contain it: {', '.join(repr(n) for n in expected)}"), done.stderr


# --------------------------------------------------------------------------- 9. a closed pipe ends quietly


def run_into_pipe(args: list[str], *, read_first_line: bool) -> tuple[int, str, bytes]:
    """``python -m ARGS`` writing into a pipe whose reader reads the first line and closes it, or
    (``read_first_line`` False) is closed before the command starts: its exit code, its stderr and
    what was read."""
    read_end, write_end = os.pipe()
    if not read_first_line:
        os.close(read_end)  # no reader: the command's first write finds the pipe closed
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    first = b""
    if read_first_line:
        with os.fdopen(read_end, "rb", buffering=0) as reader:  # unbuffered: it reads no further than the line
            first = reader.readline()
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr.decode(), first


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pipe's capacity is read with F_GETPIPE_SZ")
def test_names_into_a_pipe_closed_after_its_first_line_ends_quietly(graph: Path) -> None:
    import fcntl

    listed = names(graph)
    read_end, write_end = os.pipe()
    capacity = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
    os.close(read_end)
    os.close(write_end)
    # Before the reader closes, the command can have written the pipe's capacity and the first line; the
    # write then under way holds one batch at most; more follows, so a write finds the pipe closed.
    batch = len("\n".join(listed[:LINES_PER_WRITE])) + 1
    assert len("\n".join(listed)) + 1 > capacity + len(listed[0]) + 1 + batch
    code, stderr, first = run_into_pipe(["pbgio", "names", str(graph)], read_first_line=True)
    assert first.decode() == listed[0] + "\n"
    assert (code, stderr) == (0, "")


@pytest.mark.parametrize("command", ["pbgio", "pbgtrain"])
def test_a_command_whose_reader_is_gone_ends_quietly(graph: Path, command: str) -> None:
    args = ["pbgio", "names", str(graph)] if command == "pbgio" else \
        ["pbgtrain", "predict", str(graph), "--lhs", "numpy", "--rel", "needs"]
    code, stderr, _ = run_into_pipe(args, read_first_line=False)
    assert code == 0, stderr
    if command == "pbgio":
        assert stderr == ""
    else:  # predict's line on what it ranks, and nothing else
        assert len(stderr.splitlines()) == 1 and stderr.startswith("top "), stderr


# --------------------------------------------------------------------------- 10. eval --sample, and its cost first


def eval_json(graph: Path, *args: str) -> tuple[dict[str, object], str]:
    done = pbgtrain("eval", str(graph), "--edges", "data/test", "--filter", "data/train", "--filter", "data/test",
                    "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_eval_sample_ranks_the_edges_fits_valid_sample_ranks(graph: Path) -> None:
    """Fit validated its last version on ``--valid-sample 300`` drawn by its seed 0, filtered by
    the training and validation edges: eval ranks the same edges, so its figures are those."""
    records = [line[EXTRA_KEY][RECORD_KEY] for line in CheckpointDir(graph.parent / "model").read_stats()
               if RECORD_KEY in line.get(EXTRA_KEY, {})]
    last = records[-1]
    test_edges = len((graph.parent / "test.csv").read_text().splitlines()) - 1
    assert last["version"] == 2 and last["sample"] == {"edges": VALID_SAMPLE, "of": test_edges}
    result, _ = eval_json(graph, "--sample", str(VALID_SAMPLE))
    assert result["sample"] == {"asked": VALID_SAMPLE, "edges": VALID_SAMPLE, "of": test_edges, "seed": 0}
    assert result["count"] == VALID_SAMPLE
    assert result["metrics"] == pytest.approx(last["metrics"], rel=1e-9)
    again, _ = eval_json(graph, "--sample", str(VALID_SAMPLE))
    assert again["metrics"] == result["metrics"] and again["per_side"] == result["per_side"]  # the same edges
    other, _ = eval_json(graph, "--sample", str(VALID_SAMPLE), "--seed", "7")
    assert other["sample"] == {"asked": VALID_SAMPLE, "edges": VALID_SAMPLE, "of": test_edges, "seed": 7}
    every, _ = eval_json(graph)
    assert "sample" not in every and every["count"] == test_edges


def test_eval_says_the_sample_on_its_line_and_the_cost_before_ranking(graph: Path) -> None:
    test_edges = len((graph.parent / "test.csv").read_text().splitlines()) - 1
    entities = len(names(graph))
    done = pbgtrain("eval", str(graph), "--edges", "data/test", "--filter", "data/train", "--filter", "data/test",
                    "--sample", "200", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert f", a sample of 200 of {test_edges:,} edges (--sample 200, seed 3): MRR " in done.stdout
    scores = f"{200 * entities * 2 / 1e6:.1f}M"  # each edge against every entity, on both sides
    cost = next(line for line in done.stderr.splitlines() if line.startswith(("ranking ", "ranked ")))
    assert re.fullmatch(
        rf"(ranking a sample of 200 of {test_edges:,} edges × {entities:,} candidates, both sides \({scores} scores\): "
        r"expected [\d.]+ (s|min|h) at [\d.]+[KMGT]? scores/s \(measured on the first \d{1,3}(,\d{3})*\)"
        rf"|ranked a sample of 200 of {test_edges:,} edges × {entities:,} candidates, both sides \({scores} scores\) "
        r"in [\d.]+ (s|min|h): [\d.]+[KMGT]? scores/s)", cost), cost
    sampled = pbgtrain("eval", str(graph), "--edges", "data/test")  # the config's sampled candidates
    assert sampled.returncode == 0, sampled.stderr
    assert f"ranking {test_edges:,} edges × " in sampled.stderr or f"ranked {test_edges:,} edges × " in sampled.stderr
    assert "a sample" not in sampled.stdout
    wrong = pbgtrain("eval", str(graph), "--sample", "0")
    assert wrong.returncode == 2 and "--sample" in wrong.stderr


# --------------------------------------------------------------------------- 11. the report of a run of one's own


def test_the_report_leaves_out_the_empty_held_out_panel_and_says_why(graph: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pbgtrain import report
    from tests.test_report import _panel_box, _read_png, _rows_at_points

    done = pbgtrain("report", str(graph), "-o", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    image = _read_png((tmp_path / "r.png").read_bytes())
    size = report.figure_layout(3, notes=1)[0]
    assert image.shape[:2] == (round(size[1] * report.DPI), round(size[0] * report.DPI))  # three panels, a note
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert '<p class="note">No panel of held-out metrics after each bucket: no held-out edges (eval_fraction is 0).' \
        in page
    # the validation panel (now the second): its y axis from the data, not 0 … 1
    records = [line[EXTRA_KEY][RECORD_KEY] for line in CheckpointDir(graph.parent / "model").read_stats()
               if RECORD_KEY in line.get(EXTRA_KEY, {})]
    mrr, r10 = ([r["metrics"][key] for r in records] for key in ("mrr", "r10"))
    assert max(r10) - min(mrr) < 0.5  # on a 0 … 1 axis, the data would fill less than half of the panel
    top, bottom, _, _ = _panel_box(1, image.shape)
    unstarred = 3 - records[-1]["best_version"]  # the best version's star covers its MRR
    rows = [*_rows_at_points(image, 1, report.SERIES_COLOURS["valid_mrr"], [unstarred], span=[1, 2]),
            *_rows_at_points(image, 1, report.SERIES_COLOURS["valid_r10"], [1, 2])]
    assert max(rows) - min(rows) > 0.5 * (bottom - top), (rows, top, bottom)  # the data fill the panel's height
    assert top + 5 < min(rows) and max(rows) < bottom - 5  # and neither lies on its floor or its ceiling


def test_the_reports_summary_compares_the_first_validation_with_the_best(graph: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [line[EXTRA_KEY][RECORD_KEY] for line in CheckpointDir(graph.parent / "model").read_stats()
               if RECORD_KEY in line.get(EXTRA_KEY, {})]
    first, last = records[0], records[-1]
    best = next(r for r in records if r["version"] == last["best_version"])
    said = (f"validation MRR {first['metrics']['mrr']:.4f} (version 1), the best of 2 evaluations" if best is first
            else f"validation MRR {first['metrics']['mrr']:.4f} (version 1) → best {best['metrics']['mrr']:.4f} "
                 f"(version {best['version']}) of 2 evaluations")
    done = pbgtrain("report", str(graph), "-o", str(tmp_path / "r.png"))
    assert done.returncode == 0, done.stderr
    assert f", {said}," in done.stdout, done.stdout
