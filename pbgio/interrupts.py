"""Ctrl-C that is never lost (pbgtrain fit, pbgio convert).

Python raises ``KeyboardInterrupt`` in whatever code runs when SIGINT arrives; if that is a
finalizer or a weakref callback, the exception is printed as "ignored" (with a traceback) and the
work would go on. While :func:`noticed` is active, SIGINT is also remembered, and :func:`check`
(called by the training loop after every batch, by a migration after every block it writes)
raises it again where it cannot be swallowed; a ``KeyboardInterrupt`` swallowed that way is not
printed (it is not lost: :func:`check` raises it), other unraisable exceptions still are.

>>> with noticed():
...     check()  # nothing pending: returns
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

UnraisableHook = Callable[["sys.UnraisableHookArgs"], object]

_pending = threading.Event()


def _handler(signum: int, frame: FrameType | None) -> None:
    _pending.set()
    signal.default_int_handler(signum, frame)


def _quiet_about_interrupts(previous_hook: UnraisableHook) -> UnraisableHook:
    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _pending.is_set():
            return
        previous_hook(unraisable)
    return hook


@contextlib.contextmanager
def noticed() -> Iterator[None]:
    """Remember SIGINT for :func:`check` (main thread, default handler only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _pending.clear()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_about_interrupts(previous_hook)
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _pending.clear()


def check() -> None:
    """Raise ``KeyboardInterrupt`` if SIGINT arrived since :func:`noticed` began (once)."""
    if _pending.is_set():
        _pending.clear()
        raise KeyboardInterrupt
