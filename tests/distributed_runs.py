"""Start real distributed pbgtrain runs on localhost (gloo): one process per trainer.

Used by the distributed tests and the interop test that hands a distributed checkpoint to
the original. ``start_trainers`` starts ``world`` processes with ``pbgtrain fit --rank R``
meeting at ``tcp://127.0.0.1:PORT`` (the original's way); ``start_torchrun`` uses torchrun.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def trainer_env(threads: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


@dataclass
class Finished:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    ended_at: float  # time.monotonic() when the process was seen to end


def start_trainers(config: Path, world: int, *, overrides: Sequence[str] = (), peer_timeout: float = 20,
                   extra: Sequence[str] = (), port: int | None = None) -> list[subprocess.Popen[str]]:
    """``world`` trainers of ``config`` (``num_machines`` and the init method set by ``-p``)."""
    port = port or free_port()
    args = [*(a for o in overrides for a in ("-p", o)), "-p", f"num_machines={world}",
            "-p", f"distributed_init_method=tcp://127.0.0.1:{port}", "-p", "workers=1",
            "--no-progress", "--peer-timeout", str(peer_timeout), *extra]
    return [subprocess.Popen([sys.executable, "-m", "pbgtrain", "fit", str(config), "--rank", str(rank), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=trainer_env())
            for rank in range(world)]


def start_torchrun(config: Path, nproc: int, *, overrides: Sequence[str] = (),
                   extra: Sequence[str] = ()) -> subprocess.Popen[str]:
    args = [*(a for o in overrides for a in ("-p", o)), "-p", "workers=1", "--no-progress", *extra]
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                             str(nproc), "--master-port", str(free_port()), "-m", "pbgtrain", "fit", str(config),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=trainer_env())


def wait_all(procs: Sequence[subprocess.Popen[str]], timeout: float = 300) -> list[Finished]:
    """Wait for every process, reading their output as they run (all are killed past ``timeout``)."""
    results: dict[int, Finished] = {}

    def collect(rank: int, proc: subprocess.Popen[str]) -> None:
        stdout, stderr = proc.communicate()
        results[rank] = Finished(rank, proc.returncode, stdout, stderr, time.monotonic())

    threads = [threading.Thread(target=collect, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0.1))
    if any(thread.is_alive() for thread in threads):
        for proc in procs:
            proc.kill()
        for thread in threads:
            thread.join()
        stuck = [r for r, p in enumerate(procs) if results[r].returncode < 0]
        raise AssertionError(f"rank(s) {stuck} still running after {timeout} s:\n"
                             + "\n".join(results[r].stderr[-3000:] for r in stuck))
    return [results[r] for r in range(len(procs))]


def run_trainers(config: Path, world: int, *, timeout: float = 300, **kwargs: object) -> list[Finished]:
    """Start ``world`` trainers, wait, and fail with their stderr unless all exit 0."""
    done = wait_all(start_trainers(config, world, **kwargs), timeout)  # type: ignore[arg-type]
    failed = [f for f in done if f.returncode != 0]
    assert not failed, "\n".join(f"rank {f.rank} exit {f.returncode}:\n{f.stderr[-4000:]}" for f in failed)
    return done
