"""``tools/output_digest.py``, the proof that a redesign changed no byte: two runs of the same outputs
compare equal (timings and the run's own folder aside), and any other change is reported."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[1] / "tools" / "output_digest.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("output_digest", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs(root: Path, loss: float, seconds: float) -> None:
    (root / "model").mkdir(parents=True)
    (root / "model" / "embeddings_user_0.v1.h5").write_bytes(b"\x89HDF rows")
    line = {"index": 0, "stats": {"count": 3, "metrics": {"loss": loss}},
            "pbgtrain": {"rank": 0, "trained_from": seconds, "trained_until": seconds + 1}}
    (root / "model" / "training_stats.json").write_text(json.dumps(line) + "\n")
    (root / "eval.json").write_text(json.dumps({"edge_paths": [str(root / "edges")], "seconds": seconds,
                                                "metrics": {"mrr": 0.5}}))


def test_timings_and_the_folder_differ_the_outputs_do_not(tmp_path: Path) -> None:
    tool = _tool()
    for name, seconds in (("before", 1.0), ("after", 99.0)):
        _outputs(tmp_path / name / "run", loss=0.25, seconds=seconds)
        tool.write_digest(tmp_path / name / "run")
    assert tool.compare(tmp_path / "before", tmp_path / "after") == 0


def test_a_changed_byte_or_figure_is_reported(tmp_path: Path) -> None:
    tool = _tool()
    _outputs(tmp_path / "before" / "run", loss=0.25, seconds=1.0)
    tool.write_digest(tmp_path / "before" / "run")
    shutil.copytree(tmp_path / "before", tmp_path / "after")
    (tmp_path / "after" / "run" / "model" / "embeddings_user_0.v1.h5").write_bytes(b"\x89HDF other")
    tool.write_digest(tmp_path / "after" / "run")
    assert tool.compare(tmp_path / "before", tmp_path / "after") == 1
    shutil.rmtree(tmp_path / "after")
    _outputs(tmp_path / "after" / "run", loss=0.5, seconds=1.0)  # a training figure, not a timing
    tool.write_digest(tmp_path / "after" / "run")
    assert tool.compare(tmp_path / "before", tmp_path / "after") == 1
