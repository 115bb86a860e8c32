"""The card kit (``tools/card_kit.py``), the card's script (``tools/card_run.py``) and the check it
runs (``tools/gpu_check.py``), on a CPU: what the kit asks for and refuses, the script starting
with the standard library only, the check's CPU smoke going through the replay driver (the step
``--step auto`` never takes on a CPU), the runner's notes reaching the check from ``fit``'s output,
and the MRR line judged at the minute it states. The whole dry run is the slow test at the end."""

from __future__ import annotations

import importlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pbgtrain.progress import Reporter
from tests.shared import shared_path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
CPU = torch.device("cpu")


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The tools folder on the path (the tools import each other, and ``_benchutil``, by name)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    return importlib.import_module("gpu_check")


def _tool(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_the_kit_asks_for_every_runtime_dependency_but_torch_and_the_tests_each_pinned(tools: ModuleType) -> None:
    kit = _tool("card_kit")
    runtime = kit.runtime_dependencies()
    pins = kit.pinned_versions()
    asked = kit.kit_requirements(runtime, pins, kit.installed_versions(), with_optional=False)
    names = [kit.requirement_name(r) for r in asked]
    assert set(names) == (set(runtime) - {"torch", "polars"}) | {"pytest", "hypothesis"}
    assert all(r.count("==") == 1 for r in asked)
    assert f"rapidfuzz=={pins['rapidfuzz']}" in asked  # constraints/dev.txt's pin wins
    with_polars = kit.kit_requirements(runtime, pins, kit.installed_versions(), with_optional=True)
    assert "polars" in {kit.requirement_name(r) for r in with_polars}
    with pytest.raises(kit.KitError, match="no version to pin"):
        kit.kit_requirements(["numpy"], {}, {}, with_optional=False)


def test_a_kit_over_its_limit_is_refused_saying_both_sizes(tools: ModuleType, tmp_path: Path) -> None:
    kit = _tool("card_kit")
    with (tmp_path / "big.whl").open("wb") as f:
        f.truncate(65 * kit.MIB)
    with pytest.raises(kit.KitError, match=r"65\.0 MiB, over the limit of 64 MiB"):
        kit.check_size(tmp_path, 64)
    assert kit.check_size(tmp_path, 66) == 65 * kit.MIB


def test_the_card_script_starts_with_the_standard_library_only_and_refuses_a_kit_without_its_manifest(
        tmp_path: Path) -> None:
    """A torch-only image has none of pbg's dependencies: the script must get as far as its own
    checks without them (here they cannot be imported at all)."""
    blocked = ["numpy", "h5py", "pydantic", "typer", "rich", "rapidfuzz", "polars", "pytest", "hypothesis", "torch"]
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            f"sys.argv = ['card_run.py', '--kit', {str(tmp_path)!r}, '--out', {str(tmp_path / 'out')!r}]\n"
            f"import runpy; runpy.run_path({str(TOOLS / 'card_run.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "kit.json is missing: make the kit with tools/card_kit.py prepare" in done.stderr


def test_the_card_runs_every_test_file_that_marks_a_gpu_test(tools: ModuleType) -> None:
    card_run = _tool("card_run")
    files = card_run.gpu_test_files()
    assert REPO / "tests" / "test_gpu_step.py" in files  # pytestmark = [pytest.mark.gpu, …]
    assert REPO / "tests" / "test_train_featurized.py" in files  # @pytest.mark.gpu
    assert Path(__file__) not in files  # names the mark, marks nothing
    naming = {f for f in (REPO / "tests").glob("test_*.py") if "pytest.mark.gpu" in f.read_text(encoding="utf-8")}
    assert naming - set(files) == {Path(__file__)}  # no other way of marking a test gpu goes unseen


def test_the_checks_cpu_smoke_runs_the_replay_driver(tools: ModuleType) -> None:
    """Issue 55, point 4: on a CPU ``--step auto`` never takes the replay driver; the check's step
    (``check_step``) takes it there with its stand-in, for a static and a dynamic relation."""
    for relations, operator in ((1, "none"), (7, "complex_diagonal")):
        measured = tools.step_rate(entities=500, edges=1200, relations=relations, operator=operator, batch_size=100,
                                   negatives=10, device=CPU, seconds=0.01)
        assert measured["capture"] == "stand-in"
        assert "through the replay driver" in measured["step"]
        assert measured["notes"] == []
        assert measured["peak_gpu_bytes"] is None
        assert measured["edges_per_s"] > 0


def test_a_partitioned_check_fit_reads_ahead_through_the_replay_driver_and_notes_nothing(
        tools: ModuleType, tmp_path: Path) -> None:
    line, raw = tools.partitioned(tmp_path, CPU, 0.0005, parts=2)  # 4 buckets: one swap reads ahead
    assert raw["replayed"] and "through the replay driver" in raw["step"]
    assert raw["notes"] == [] and line.notes == ()
    assert raw["movement"]["partitions_read_ahead"] > 0
    assert raw["edges"] == raw["edges_in_graph"]  # one epoch: every training edge once
    assert math.isfinite(raw["loss"])
    assert line.met is None  # a CPU judges no target


def test_what_fit_prints_of_its_notes_reaches_the_check(tools: ModuleType) -> None:
    """``fit`` says its runner's notes through its :class:`~pbgtrain.progress.Reporter`, made
    inside the run: one made under :func:`heard` writes to the collector."""
    echo = io.StringIO()
    with tools.heard(echo) as said:
        reporter = Reporter()
        reporter.log("step: softmax over negatives as attention, replayed as a CUDA graph per batch shape")
        reporter.log("note: the step could not be captured as a CUDA graph (RuntimeError: x)")
        reporter.log("note: relation 1 uncaptured\n  caused by: CUDA error: operation not permitted")
        reporter.log("iteration 1 of 1 committed")
    assert said.notes == ["the step could not be captured as a CUDA graph (RuntimeError: x)",
                          "relation 1 uncaptured\n  caused by: CUDA error: operation not permitted"]
    assert said.step.startswith("softmax over negatives as attention, replayed")
    assert echo.getvalue().count("\n") == 5  # everything passed on


def test_the_mrr_line_is_judged_at_the_minute_it_states(tools: ModuleType) -> None:
    verdict = tools.mrr_verdict
    assert verdict(0.38, 2.5) is True  # reached by 2.5 min: within 10
    assert verdict(0.30, 2.5) is None  # not yet at 2.5 min: the target allows 10
    assert verdict(0.30, 10.0) is False  # not by 10 min
    assert verdict(0.38, 12.0) is None  # reached only after 10 min: when, unknown
    line = tools.Line("MRR", "0.3000 after 2.5 min", "≥ 0.37 within 10 min, judged at 2.5", None,
                      "undecided at 2.5 min")
    assert line.cells()[-1] == "undecided at 2.5 min"
    assert tools.Line("x", "y", "z", None).cells()[-1] == "-"
    assert tools.Line("x", "y", "z", False, peak_gpu_bytes=3 << 30).cells()[-2:] == ["3.0", "NOT met"]


def test_the_lines_take_the_targets_shapes_at_full_size(tools: ModuleType) -> None:
    """``--scale`` shrinks the batch and the negatives with the graph; at full size every line is
    issue 44's shape."""
    assert tools.batch_shape(10_000, tools.LIVEJOURNAL["edges"]) == (10_000, 1000)
    assert tools.batch_shape(50_000, tools.LIVEJOURNAL["edges"]) == (50_000, 1000)
    assert tools.batch_shape(50_000, tools.FREEBASE86M["edges"]) == (50_000, 1000)
    parts = tools.PARTITIONED["partitions"]
    assert tools.batch_shape(10_000, tools.PARTITIONED["edges"] // parts ** 2, per=4) == (10_000, 1000)
    batch, negatives = tools.batch_shape(10_000, 68_993)
    assert batch % negatives == 0 and batch < 1000


@pytest.mark.slow  # the whole dry run: about a minute on 2 cores
def test_the_card_scripts_dry_run_passes_on_a_cpu(tools: ModuleType, tmp_path: Path) -> None:
    """``card_run.py --device cpu --no-install``: every stage runs, every line of the check goes
    through the replay driver and notes nothing."""
    shared_path("datasets", "fb15k-237.tar.gz")
    kit = tmp_path / "kit"
    tools.prepare(kit / "layouts")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(TOOLS / "card_run.py"), "--kit", str(kit), "--device", "cpu",
                           "--no-install", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["environment", "pytest", "check"]
    lines = summary["check"]["lines"]
    assert len(lines) == 6
    assert all("through the replay driver" in line["step"] and line["notes"] == [] for line in lines)
    assert all(line["met"] is None for line in lines)  # a CPU judges nothing
    assert (out / "card-run.log").is_file() and (out / "check.json").is_file()
