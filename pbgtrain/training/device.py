"""Where ``pbgtrain fit`` runs: the device, the numeric precision and the number of threads.

Each is the option given, else the config's, else a default for this machine; a choice that
cannot run here is a one-line usage error (:func:`option_error`) before anything is read.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from pbgio.checks.config import schema_issue
from pbgio.errors import FormatError
from pbgtrain.config import RunConfig, default_device
from pbgtrain.model.precision import Precision, check_precision


def option_error(run: RunConfig, where: str, message: str) -> FormatError:
    """A usage error of a fit option (``where``: the option, or the config key it overrides)."""
    return FormatError(schema_issue(run.source, where, message))


def resolve_device(requested: str | None, run: RunConfig, local_index: int | None = None) -> torch.device:
    """The device to run on: ``requested`` (``--device``), else the config's (``num_gpus``); a CUDA
    device that is not usable here is a one-line :class:`ConfigError`. ``local_index``: which GPU
    a bare ``cuda`` means for this process (one GPU per trainer of a machine in a distributed run)."""
    try:
        device = torch.device(requested or default_device(run.config))
    except RuntimeError as exc:
        raise option_error(run, "--device", f"expected cpu, cuda or cuda:N, found {requested!r} ({exc})") from None
    if local_index is not None and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_index)
    if device.type == "cuda":
        why = _cuda_unusable(device)
        if why:
            where = f"--device {requested}" if requested else f"num_gpus={run.config.num_gpus}"
            raise option_error(run, where, f"{why}; train with --device cpu")
    return device


def _cuda_unusable(device: torch.device) -> str | None:
    """Why ``device`` cannot run CUDA kernels here (None when it can)."""
    if not torch.cuda.is_available():
        built = "this torch build has no CUDA support" if torch.version.cuda is None else \
            "no usable CUDA GPU is visible (driver, CUDA_VISIBLE_DEVICES)"
        return f"no CUDA device: {built}"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"{device} does not exist: {count} CUDA device(s) are visible"
    return None


def resolve_precision(requested: str | None, run: RunConfig, device: torch.device) -> Precision:
    """``requested`` (``--precision``), else bf16 on a GPU when the config sets half_precision (on a
    CPU the original ignores it, and so does this), else fp32."""
    try:
        return check_precision(requested or ("bf16" if run.config.half_precision and device.type == "cuda"
                                             else "fp32"))
    except ValueError as exc:
        raise option_error(run, "--precision", str(exc)) from None


def default_threads(cfg: Any, local_trainers: int = 1) -> int:
    """``workers``, else the cores split evenly among the trainers on this machine.

    >>> from types import SimpleNamespace
    >>> default_threads(SimpleNamespace(workers=3), 4), default_threads(SimpleNamespace(workers=None), 10**6)
    (3, 1)
    """
    if cfg.workers:
        return int(cfg.workers)
    return max((os.cpu_count() or 1) // max(local_trainers, 1), 1)
