"""Progress of long jobs (imports, exports): a silent base class and a rich progress bar.

Library functions take a :class:`Progress` and report stages to it; the base class
reports nothing. Commands show :class:`RichProgress` on stderr, and only when stderr is
a terminal and ``CI`` is not set (:func:`progress_wanted`).

>>> progress = Progress()
>>> progress.start("reading", total=3)
>>> progress.advance(3)
>>> progress.stop()
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any


class Progress:
    """One stage at a time: ``start`` a stage, ``advance`` it, ``start`` the next one."""

    def start(self, description: str, total: float | None = None) -> None:
        """Begin a stage of ``total`` steps (None: unknown); ends the stage before it."""

    def describe(self, description: str) -> None:
        """Change the current stage's description (e.g. the file being read)."""

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` steps of the current stage as done."""

    def stop(self) -> None:
        """End the current stage."""


def progress_wanted(no_progress: bool = False) -> bool:
    """Show progress bars: not asked off, stderr is a terminal, and not under CI."""
    return not no_progress and sys.stderr.isatty() and not os.environ.get("CI")


class RichProgress(Progress):
    """Progress bars on stderr with rich; use as a context manager (bars vanish at the end)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # descriptions name files (an input's, a layout's): plain text, their control characters escaped
        self._progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console or Console(stderr=True),
                                  transient=True)
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        self._progress.stop()

    def start(self, description: str, total: float | None = None) -> None:
        from pbgio.console import printable

        self.stop()
        self._task = self._progress.add_task(printable(description), total=total)

    def describe(self, description: str) -> None:
        from pbgio.console import printable

        if self._task is not None:
            self._progress.update(self._task, description=printable(description))

    def advance(self, amount: float = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, amount)

    def stop(self) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
