"""Where ``pbgtrain fit`` runs: the device, the numeric precision and the number of threads.

Each is the option given, else the config's, else a default for this machine; a choice that
cannot run here is a one-line :class:`~pbgio.errors.UsageError` before anything is read
(:func:`pbgtrain.training.fit_plan.resolve_fit` asks once, at the entry point).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from pbgio.checks.config import schema_issue
from pbgio.config import ConfigSchema
from pbgio.errors import ConfigError, UsageError
from pbgio.layout import Layout
from pbgtrain.config import default_device
from pbgtrain.model.precision import Precision, check_precision


def resolve_device(requested: str | None, layout: Layout) -> torch.device:
    """The device to run on: ``requested`` (``--device``), else the config's (``num_gpus``). A
    device that cannot run here is a :class:`~pbgio.errors.UsageError` for ``--device`` and a
    :class:`~pbgio.errors.ConfigError` for the config's ``num_gpus``, with the fix. A bare ``cuda``
    stays bare: :func:`local_device` gives it the GPU of this process."""
    try:
        device = torch.device(requested or default_device(layout.config))
    except RuntimeError as exc:
        raise UsageError(f"--device: expected cpu, cuda or cuda:N, found {requested!r} ({exc})") from None
    why = _cuda_unusable(device) if device.type == "cuda" else None
    if why and requested:
        raise UsageError(f"--device {requested}: {why}; train with --device cpu")
    if why:
        raise ConfigError(layout.source, [schema_issue(layout.source, f"num_gpus={layout.config.num_gpus}",
                                                       f"{why}; train with --device cpu")])
    return device


def local_device(device: torch.device, local_index: int | None) -> torch.device:
    """``device``, a bare ``cuda`` made the GPU ``local_index`` (one GPU per trainer of a machine in
    a distributed run; None: torch's current one)."""
    if local_index is not None and device.type == "cuda" and device.index is None:
        return torch.device("cuda", local_index)
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


def resolve_precision(requested: str | None, config: ConfigSchema, device: torch.device) -> Precision:
    """``requested`` (``--precision``, a checked choice), else bf16 on a GPU when the config sets
    half_precision (on a CPU the original ignores it, and so does this), else fp32."""
    return check_precision(requested or ("bf16" if config.half_precision and device.type == "cuda" else "fp32"))


def default_threads(cfg: Any, local_trainers: int = 1) -> int:
    """``workers``, else the cores split evenly among the trainers on this machine.

    >>> from types import SimpleNamespace
    >>> default_threads(SimpleNamespace(workers=3), 4), default_threads(SimpleNamespace(workers=None), 10**6)
    (3, 1)
    """
    if cfg.workers:
        return int(cfg.workers)
    return max((os.cpu_count() or 1) // max(local_trainers, 1), 1)
