"""The original's Python config files loaded by the original too: ``pbgio.python_config`` gives the same
config as the original's ``ConfigFileLoader``, for the same files and overrides (the rest of
``pbgio config from-py`` is tested in tests/test_config_from_py.py)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from interop_harness import Original, side_env

from pbgio.layout import config_from_python
from tests.test_config_from_py import FB15K_CONFIG, returning

pytestmark = pytest.mark.interop


def _original_config(original: Original, path: Path, overrides: list[str]) -> dict[str, object]:
    code = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\n"
            "from torchbiggraph.config import ConfigFileLoader\n"
            "cfg = ConfigFileLoader().load_config(sys.argv[1], [sys.argv[2:]])\n"
            "print(json.dumps(cfg.to_dict()))\n")
    done = subprocess.run([str(original.python), "-c", code, str(path), *overrides], capture_output=True,
                          text=True, env=side_env(), check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(("config", "overrides"), [
    ("fb15k", ["relations.0.all_negs=true", "edge_paths=a,b", "entities.all.num_partitions=4", "num_epochs=7",
               "lr=0.5", "max_norm=2", "bucket_order=outside_in", "checkpoint_preservation_interval=3"]),
    ("fb15k", []),
    ("mixed_case", ["num_epochs=4"]),
])
def test_same_config_as_the_original(original: Original, tmp_path: Path, config: str, overrides: list[str]) -> None:
    path = _write(tmp_path / "configs" / "fb15k_config_cpu.py", FB15K_CONFIG) if config == "fb15k" else _write(
        tmp_path / "mixed.py", returning(
            'dict(entities={"user": {"numPartitions": 2}}, relations=[{"name": "r", "lhs": "user", "rhs": "user", '
            '"allNegs": True}], dimension=8, entityPath="data", edgePaths=["e1", "e2"], checkpointPath="model", '
            'numEpochs=3, batchSize=500)'))
    assert config_from_python(path, overrides, echo=None).to_dict() == _original_config(original, path, overrides)


def test_the_originals_example_configs(original: Original) -> None:
    examples = sorted(original.venv.glob("lib/python3*/site-packages/torchbiggraph/examples/configs/*.py"))
    assert examples, f"no example configs in the original's environment {original.venv}"
    for example in examples:
        assert config_from_python(example, echo=None).to_dict() == _original_config(original, example, []), example
