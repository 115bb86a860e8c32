"""The harness of the interoperability suite: the original PyTorch-BigGraph in a side virtual
environment, its CLIs and the driver script run by its interpreter, and our side (pbgio,
pbgtrain) called as libraries (the same functions the ``pbgio``/``pbgtrain`` commands call).

The original is a test tool only: it lives in its own environment, created once per pytest
run (or reused through ``PBG_ORIGINAL_VENV``), and is only ever run as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.shared import SHARED

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WHEEL = SHARED / "reference" / "original" / "torchbiggraph-1.0.1.dev0-py3-none-any.whl"  # tests/shared.py
REQUIREMENTS = HERE / "original-requirements.txt"
DRIVER = HERE / "original_driver.py"

CLI_TIMEOUT = 300
"""Seconds any run of the original may take (its trainer starts HOGWILD worker processes)."""


class OriginalFailed(AssertionError):
    """A run of the original failed; the message holds its command, exit status and stderr."""


def _tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def side_env() -> dict[str, str]:
    """The environment of subprocesses of the side interpreter: ours stripped off."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    return env


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def original_importable(venv: Path) -> bool:
    python = venv_python(venv)
    if not python.is_file():
        return False
    done = subprocess.run([str(python), "-c", "import torchbiggraph"], capture_output=True, text=True,
                          env=side_env(), cwd="/", timeout=300, check=False)
    return done.returncode == 0


def create_original_venv(venv: Path) -> None:
    """``python -m venv`` + ``pip install -r original-requirements.txt``; any failure raises."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv_python(venv)), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
    ]
    for cmd in steps:
        # -r paths (the constraints file, the wheel) are relative to tests/interop/.
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=side_env(), timeout=1800,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"creating the original's environment failed: {' '.join(cmd)} exited "
                               f"{done.returncode}\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
    if not original_importable(venv):
        raise RuntimeError(f"{venv}: `import torchbiggraph` fails after installing {REQUIREMENTS}")


def config_py_text(config: dict[str, Any]) -> str:
    """A config file for the original's CLIs: ``get_torchbiggraph_config()`` returns the dict."""
    return ("import json\n\n\ndef get_torchbiggraph_config():\n"
            f"    return json.loads({json.dumps(json.dumps(config))})\n")


@dataclass(frozen=True)
class Original:
    """The original's interpreter and console scripts."""

    venv: Path

    @property
    def python(self) -> Path:
        return venv_python(self.venv)

    def script(self, name: str) -> Path:
        return self.venv / "bin" / name

    def run(self, cmd: list[str], *, cwd: Path, timeout: int = CLI_TIMEOUT, check: bool = True,
            what: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=side_env(), timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise OriginalFailed(f"{what or cmd[0]}: timed out after {timeout} s: {' '.join(cmd)}\n"
                                 f"stderr:\n{_tail(err)}") from None
        if check and done.returncode != 0:
            raise OriginalFailed(f"{what or Path(cmd[0]).name} exited {done.returncode}: {' '.join(cmd)}\n"
                                 f"stderr:\n{_tail(done.stderr)}\nstdout:\n{_tail(done.stdout, 2000)}")
        return done

    def cli(self, tool: str, config: dict[str, Any], args: list[str], *, workdir: Path,
            overrides: list[str] = (), timeout: int = CLI_TIMEOUT, check: bool = True,
            tag: str = "") -> subprocess.CompletedProcess[str]:
        """Run ``torchbiggraph_<tool>`` on a generated Python config file (absolute paths)."""
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / f"tbg_config_{tool}{tag}.py"
        cfg.write_text(config_py_text(config))
        cmd = [str(self.script(f"torchbiggraph_{tool}")), str(cfg), *args]
        for override in overrides:
            cmd += ["-p", override]
        return self.run(cmd, cwd=workdir, timeout=timeout, check=check, what=f"torchbiggraph_{tool}")

    def driver(self, subcommand: str, args: list[str], *, workdir: Path, timeout: int = CLI_TIMEOUT) -> Any:
        """Run a driver subcommand; returns its JSON result."""
        workdir.mkdir(parents=True, exist_ok=True)
        result = workdir / f"driver_{subcommand}_{len(list(workdir.glob('driver_*.json')))}.json"
        self.run([str(self.python), str(DRIVER), subcommand, *args, "--result", str(result)], cwd=workdir,
                 timeout=timeout, what=f"original_driver.py {subcommand}")
        return json.loads(result.read_text())

    def inspect(self, config: dict[str, Any], workdir: Path, *, edge_paths: list[str] | None = None,
                chunks: int | None = None, no_edges: bool = False,
                extra_configs: list[Path] = ()) -> dict[str, Any]:
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "inspect_config.json"
        cfg.write_text(json.dumps(config))
        args = ["--config", str(cfg), "--out", str(workdir / "arrays")]
        for p in edge_paths or []:
            args += ["--edge-path", p]
        if chunks:
            args += ["--chunks", str(chunks)]
        if no_edges:
            args.append("--no-edges")
        for extra in extra_configs:
            args += ["--extra-config", str(extra)]
        result: dict[str, Any] = self.driver("inspect", args, workdir=workdir)
        return result


# --------------------------------------------------------------------------- our side


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def ours_import(config_path: Path, inputs: list[Path], *, weight_col: int | None = None) -> None:
    from pbgio.importers import InputOptions, import_edge_lists

    options = InputOptions(delimiter="\t", weight_col=weight_col)
    import_edge_lists(config_path, inputs, options=options, seed=0)


def ours_fit(config_path: Path, overrides: list[str] = (), seed: int = 0) -> Any:
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    return fit(load_run_config(config_path, list(overrides)), FitOptions(seed=seed))


def ours_validate(path: Path) -> Any:
    from pbgio.validate import validate_path

    return validate_path(path)


def validation_message(report: Any) -> str:
    return "pbgio validate found errors:\n" + "\n".join(str(i) for i in report.errors[:30])


def write_empty_edges(directory: Path, config: dict[str, Any]) -> Path:
    """An edge path whose every bucket is empty: a run over it moves nothing, so the checkpoint it
    commits holds exactly what the run started from (a warm start's source, bit for bit)."""
    from pbgio.config import parse_config
    from pbgio.edges import EdgeBucket, write_bucket

    nl, nr = parse_config(config).bucket_grid()
    empty = np.zeros(0, dtype=np.int64)
    for lhs in range(nl):
        for rhs in range(nr):
            write_bucket(directory / f"edges_{lhs}_{rhs}.h5", EdgeBucket(empty, empty, empty))
    return directory


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a cell's directory, symlinks kept as links (the original's snapshots hold absolute links to
    their version's files: FORMAT-NOTES), a link into ``src`` re-pointed to the same file under ``dst``,
    as :func:`rebase_config` moves the config's paths (left as it was, it would lead out of the copy,
    which pbg refuses: ``layout-link-outside``)."""
    shutil.copytree(src, dst, symlinks=True)
    for link in [p for p in dst.rglob("*") if p.is_symlink()]:
        target = os.readlink(link)
        if os.path.isabs(target) and Path(target).is_relative_to(src):
            link.unlink()
            link.symlink_to(dst / Path(target).relative_to(src))


def rebase_config(config: dict[str, Any], old: Path, new: Path) -> dict[str, Any]:
    """The config with every path under ``old`` moved under ``new``."""
    def move(p: Any) -> Any:
        if isinstance(p, str) and p.startswith(str(old)):
            return str(new) + p[len(str(old)):]
        return p
    out = dict(config)
    for key in ("entity_path", "checkpoint_path", "init_path"):
        out[key] = move(out.get(key))
    out["edge_paths"] = [move(p) for p in config["edge_paths"]]
    return out


def _parse(values: list[str], as_float32: bool) -> np.ndarray:
    """pbgio writes the shortest text that reads back as the float32 (parse it as float32); the
    original writes ``%.9f`` of the float32 (parse it as float64)."""
    if as_float32:
        return np.array([np.float32(v) for v in values], dtype=np.float32).astype(np.float64)
    return np.array([float(v) for v in values], dtype=np.float64)


def read_export_tsv(path: Path, *, as_float32: bool) -> dict[str, np.ndarray]:
    """``name<TAB>v0<TAB>v1…`` lines (both exporters' entity layout) as float64 vectors."""
    rows: dict[str, np.ndarray] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, *values = line.split("\t")
        rows[name] = _parse(values, as_float32)
    return rows


def read_relations_tsv(path: Path, *, as_float32: bool) -> dict[tuple[str, ...], tuple[str, np.ndarray]]:
    """``name side operator param shape values…`` lines keyed by (name, side, operator, param)."""
    out: dict[tuple[str, ...], tuple[str, np.ndarray]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, side, op, param, shape, *values = line.split("\t")
        out[(name, side, op, param)] = (shape, _parse(values, as_float32))
    return out


def failures_text(failures: list[str]) -> str:
    return f"{len(failures)} problem(s):\n- " + "\n- ".join(failures)
