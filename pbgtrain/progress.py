"""What the trainer tells the user while it runs: plain lines, or rich progress bars on a TTY.

The training loop calls one :class:`Reporter`; :func:`make_reporter` picks the kind.
Plain lines go to stderr (one per bucket and one per committed version), so logs of
non-interactive runs stay readable; bars show the epoch, the bucket, edges/s and the loss.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO


class Reporter:
    """Plain-text reporting (also the base of the rich one)."""

    def __init__(self, stream: TextIO | None = None, verbose: int = 0, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self.prefix = prefix  # "[rank R] " in a distributed run

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def log(self, message: str) -> None:
        print("\n".join(self.prefix + line for line in message.splitlines()), file=self.stream, flush=True)

    def iteration_started(self, description: str, num_buckets: int, num_edges: int) -> None:
        if self.verbose:
            self.log(f"{description}: {num_buckets} bucket(s), {num_edges:,} edges")

    def edges_done(self, count: int, loss: float) -> None:
        """Called after each batch (bars only)."""

    def bucket_done(self, line: str) -> None:
        if self.verbose:
            self.log(line)

    def committed(self, line: str) -> None:
        self.log(line)


class RichReporter(Reporter):
    """Two bars: the whole run (iterations) and the current iteration's edges, with edges/s and loss."""

    def __init__(self, total_iterations: int, done_iterations: int, verbose: int = 0) -> None:
        super().__init__(verbose=verbose)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from pbgio.console import stderr_console

        self.console = stderr_console()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                 console=self.console, transient=False)
        self.run_task: Any = self.progress.add_task("iterations", total=total_iterations,
                                                    completed=done_iterations, rate="")
        self.edge_task: Any = None
        self._started = 0.0
        self._edges = 0

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()

    def log(self, message: str) -> None:
        self.progress.console.print(message, markup=False, highlight=False)

    def iteration_started(self, description: str, num_buckets: int, num_edges: int) -> None:
        if self.edge_task is not None:
            self.progress.remove_task(self.edge_task)
        self.edge_task = self.progress.add_task(description, total=num_edges, rate="")
        self._started, self._edges = time.perf_counter(), 0

    def edges_done(self, count: int, loss: float) -> None:
        self._edges += count
        rate = self._edges / max(time.perf_counter() - self._started, 1e-9)
        self.progress.update(self.edge_task, advance=count, rate=f"{rate:,.0f} edges/s  loss {loss:.4g}")

    def bucket_done(self, line: str) -> None:
        if self.verbose:
            self.log(line)

    def committed(self, line: str) -> None:
        self.progress.advance(self.run_task)
        self.log(line)


def make_reporter(interactive: bool, total_iterations: int, done_iterations: int, verbose: int,
                  prefix: str = "") -> Reporter:
    """Bars on a terminal, else plain lines (each starting with ``prefix``)."""
    if interactive:
        return RichReporter(total_iterations, done_iterations, verbose)
    return Reporter(verbose=verbose, prefix=prefix)
