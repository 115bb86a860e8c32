"""Keep freed memory in the process between steps (glibc malloc), so large step temporaries
reuse warm pages instead of page-faulting fresh ones every batch.

A training step allocates and frees tens of megabytes of score matrices and row blocks. With
glibc's defaults the top of the heap is given back to the kernel after each step and every
new block is touched through page faults (about 900 per FB15k step, ~5% of its time). Raising
the trim threshold (and fixing the mmap threshold at its maximum) removes them. Blocks over
glibc's 32 MiB mmap cap (a [10,000 × 1,000] score matrix is 40 MB) are always mmapped and
faulted in afresh unless mmap is turned off (``heap_only``): with it, a step of the 10M-entity
benchmark shape spends 6 ms instead of 17 ms on each such matrix. Call
:func:`keep_freed_memory` once at the start of a training process; it is a no-op where glibc's
``mallopt`` is unavailable. The process keeps up to the peak of its temporaries reserved;
:func:`release_freed_memory` returns what large frees left (the trainer calls it after a swap).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's cap on 64-bit


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, looked up once (``find_library`` runs ``ldconfig``: milliseconds a call)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc's, absent from other C libraries)
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory(trim_threshold: int = 1 << 30, mmap_threshold: int = _MMAP_THRESHOLD_MAX,
                      heap_only: bool = True) -> bool:
    """Set glibc's malloc trim and mmap thresholds (``heap_only``: no mmap at all, so blocks over
    the 32 MiB threshold are reused too); True when all were applied."""
    libc = _libc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    return bool(applied and (not heap_only or mallopt(_M_MMAP_MAX, 0) == 1))


def release_freed_memory() -> bool:
    """Give the free pages of the heap back to the kernel (glibc's ``malloc_trim``): called after
    large tables are freed (a partition swapped out), so the kept heap holds step temporaries,
    not the freed partition. True when glibc did it."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim(0)
    return True
