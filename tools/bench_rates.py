"""What a recipe's training rate becomes on other hardware: the same fit, on this machine, with
matrix products in bf16 (``--precision auto`` where the CPU has AVX-512 BF16 or AMX), in fp32, and
in fp32 with every kernel library held to AVX2 (a CPU without AVX-512, as many laptops and cloud
machines are), side by side, so recipes/README.md can state the rate to expect on each.

    python tools/bench_rates.py                        # recipes/own/sampled.json on WN18RR, 2 epochs
    python tools/bench_rates.py --dataset fb15k-237 --config recipes/fb15k-237.json --epochs 1

AVX2 is imposed through the libraries' own switches: ``ATEN_CPU_CAPABILITY=avx2`` (torch's
kernels), ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's). It
prints each mode's edges/s (of the last epoch: the first warms up) and its ratio to the first mode.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO.parent / "shared" / "datasets"
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
MODES: dict[str, tuple[str, dict[str, str]]] = {
    "auto (bf16 where native)": ("auto", {}),
    "fp32": ("fp32", {}),
    "fp32, AVX2 kernels only": ("fp32", AVX2),
}
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+, chunk \d+/\d+ of \S+: ([\d,]+) edges in [\d.]+ s \(([\d,]+) edges/s\)",
                        re.MULTILINE)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def prepare(dataset: str, config: Path, work: Path) -> Path:
    """The dataset unpacked and imported under ``work`` with ``config``; returns the config's path there."""
    archive = DATASETS / f"{dataset}.tar.gz"
    if not archive.exists():
        raise SystemExit(f"{archive}: not found (the benchmark datasets live in ../shared/datasets)")
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    target = work / "config.json"
    shutil.copy(config, target)
    splits = [str(work / dataset / f"{split}.tsv") for split in ("train", "valid", "test")]
    done = subprocess.run([sys.executable, "-m", "pbgio", "import", str(target), *splits, "--no-header"],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"pbgio import failed:\n{done.stdout}{done.stderr}")
    return target


def rate(config: Path, precision: str, env: dict[str, str], epochs: int) -> float:
    """Edges/s of the last of ``epochs`` epochs of a fresh fit."""
    shutil.rmtree(config.parent / "model", ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pbgtrain", "fit", str(config), "-p", "edge_paths=data/train",
                           "-p", f"num_epochs={epochs}", "--precision", precision, "--no-progress"],
                          env={**os.environ, **env}, capture_output=True, text=True, check=True)
    epochs_seen = EPOCH_LINE.findall(done.stdout + done.stderr)
    if not epochs_seen:
        raise SystemExit(f"no epoch line in the fit's output:\n{done.stdout}{done.stderr}")
    return float(epochs_seen[-1][2].replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="wn18rr")
    parser.add_argument("--config", type=Path, default=REPO / "recipes" / "own" / "sampled.json")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode, interleaved; the best is kept")
    args = parser.parse_args(argv)
    import torch

    print(f"{cpu_name()}; torch {torch.__version__}, get_cpu_capability() {torch.backends.cpu.get_cpu_capability()}, "
          f"{os.cpu_count()} cores; {args.dataset} with {args.config}, {args.epochs} epoch(s)")
    with tempfile.TemporaryDirectory() as tmp:
        config = prepare(args.dataset, args.config, Path(tmp))
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for mode, (precision, env) in MODES.items():
                best[mode] = max(best.get(mode, 0.0), rate(config, precision, env, args.epochs))
    first = next(iter(best.values()))
    for mode, value in best.items():
        print(f"{mode:26} {value:>12,.0f} edges/s  {value / first:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
