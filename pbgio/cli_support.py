"""What every pbg command line shares: exit codes and the messages on stderr.

Exit codes: 0 done (``pbgio validate``: valid, warnings allowed), :data:`EXIT_FAILED` invalid
data or a failed command, :data:`EXIT_USAGE` a usage error, :data:`EXIT_INTERRUPTED` Ctrl-C.
Messages, errors and progress go to stderr; results to stdout. Imports only the standard
library at import time: rich is imported when the first message is printed, so ``--help`` and
small commands start fast.

>>> EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED
(1, 2, 130)
"""

from __future__ import annotations

from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def stderr_console() -> Any:
    """A rich console on stderr (no syntax highlighting of paths and numbers)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """``error: message`` on stderr, the message printed as is (no rich markup)."""
    from rich.markup import escape

    stderr_console().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
