"""A deadline for a test's body: a command that would hang (a FIFO opened for reading waits for a
writer; a link followed round a loop) fails the test instead.

>>> with deadline(5):
...     pass
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class Hung(BaseException):
    """A body still running at its deadline (a BaseException: no handler of the command's takes it for
    an error of its own and goes on)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hung` when the body runs past ``seconds``, and every half second after it until
    the body gives up (a command that catches the first goes on to the next read)."""
    def expire(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
