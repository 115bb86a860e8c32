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


EMULATED_BF16 = ("bf16 on a CPU without native bf16 (neither AVX-512 BF16 nor AMX) is emulated and slower than fp32: "
                 "1.7-1.8x on a 2-core AVX2 machine (the FB15k-237 recipe: over 400 s an epoch against 237 s; "
                 "kinship: 6.6k against 12.0k edges/s)")
"""What an explicit ``--precision bf16`` on such a CPU is warned of (measured there)."""


def native_bf16(device: torch.device) -> str | None:
    """What computes bf16 natively on ``device`` (None: nothing, bf16 would be emulated): a GPU
    that supports it, or a CPU with AMX or AVX-512 BF16.

    >>> native_bf16(torch.device("meta")) is None
    True
    """
    if device.type == "cuda":
        return "the GPU" if torch.cuda.is_bf16_supported() else None
    if device.type != "cpu":
        return None
    for name, check in (("AMX", "_is_amx_tile_supported"), ("AVX-512 BF16", "_is_avx512_bf16_supported")):
        supported = getattr(torch.cpu, check, None)  # private helpers of torch.cpu (torch >= 2.5)
        if supported is not None and supported():
            return f"this CPU ({name})"
    return None


def resolve_precision(requested: str | None, config: ConfigSchema, device: torch.device) -> tuple[Precision, str]:
    """The precision of the run and the line that says it (a warning when it will be slow):
    ``requested`` (``--precision``, a checked choice; ``auto``: bf16 where :func:`native_bf16`
    finds it, else fp32), else bf16 on a GPU when the config sets half_precision (on a CPU the
    original ignores it, and so does this), else fp32."""
    if requested == "auto":
        native = native_bf16(device)
        if native is not None:
            return "bf16", f"precision bf16 (--precision auto: {native} computes bf16 natively)"
        kind = "GPU" if device.type == "cuda" else "CPU"
        return "fp32", f"precision fp32 (--precision auto: this {kind} has no native bf16; emulated, it is slower)"
    precision = check_precision(requested or ("bf16" if config.half_precision and device.type == "cuda" else "fp32"))
    if precision == "bf16" and device.type == "cpu" and native_bf16(device) is None:
        return precision, f"warning: --precision bf16: {EMULATED_BF16}; --precision auto picks fp32 here"
    return precision, f"precision {precision}"


def default_threads(cfg: Any, local_trainers: int = 1) -> int:
    """``workers``, else the cores split evenly among the trainers on this machine.

    >>> from types import SimpleNamespace
    >>> default_threads(SimpleNamespace(workers=3), 4), default_threads(SimpleNamespace(workers=None), 10**6)
    (3, 1)
    """
    if cfg.workers:
        return int(cfg.workers)
    return max((os.cpu_count() or 1) // max(local_trainers, 1), 1)
