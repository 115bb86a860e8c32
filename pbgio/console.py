"""What every pbg command line shares: exit codes and the messages on stderr (a base module of
pbgio: ``pbgio`` and ``pbgtrain`` use it).

Exit codes: 0 done (``pbgio validate``: valid, warnings allowed), :data:`EXIT_FAILED` invalid
data or a failed command, :data:`EXIT_USAGE` a usage error, :data:`EXIT_INTERRUPTED` Ctrl-C.
Messages, errors and progress go to stderr; results to stdout; :func:`exit_codes` maps a
command's errors to its exit code and prints its notices; :func:`redact` hides the secrets a URL
carries in every message. Imports only the standard library at import time: rich
(and typer, pbgio.errors) are imported when used, so ``--help`` and small commands start fast.

>>> EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED
(1, 2, 130)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


_USERINFO_RE = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]+://)[^/\s@'\"]+@")
_SECRET_PARAM_RE = re.compile(
    r"(?P<key>[?&](?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|token|"
    r"access_token|secret|password|key|sas)=)[^&\s'\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the user info of URLs and secret query parameters replaced by ``***``: every
    message that may name a URL goes through it.

    >>> redact("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/graph")
    's3://***@bucket/graph'
    """
    text = _USERINFO_RE.sub(lambda m: f"{m['scheme']}***@", text)
    return _SECRET_PARAM_RE.sub(lambda m: f"{m['key']}***", text)


UNWRAPPED_WIDTH = 100_000
"""The width of a console that is not a terminal: lines keep their length (logs, CI, pipes)."""


HELP_WIDTH_OFF_TERMINAL = 120
"""The columns of ``--help`` (and of a usage error) printed to a pipe or a file."""


def widen_help_off_terminal() -> None:
    """Lay ``--help`` out at :data:`HELP_WIDTH_OFF_TERMINAL` columns when standard output is no terminal
    (``pbgtrain fit --help | less``, a log) and neither ``COLUMNS`` nor ``TERMINAL_WIDTH`` says a width:
    rich would squeeze it into 80, an option's help into a narrow column of many lines. Through the
    environment typer reads (``TERMINAL_WIDTH``), so rich is imported only when help is printed."""
    import os
    import sys

    if not sys.stdout.isatty() and not os.environ.get("COLUMNS") and not os.environ.get("TERMINAL_WIDTH"):
        os.environ["TERMINAL_WIDTH"] = str(HELP_WIDTH_OFF_TERMINAL)


def console(*, stderr: bool = False) -> Any:
    """A rich console (no syntax highlighting of paths and numbers). On a terminal, text wraps
    at its width; elsewhere nothing is wrapped, so a log or a pipe gets whole lines (rich would
    otherwise wrap at 80 columns, mid-word in table titles)."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(stderr=stderr, highlight=False, width=None if terminal else UNWRAPPED_WIDTH,
                   soft_wrap=not terminal)


def stderr_console() -> Any:
    """:func:`console` on stderr."""
    return console(stderr=True)


def print_error(message: str) -> None:
    """``error: message`` on stderr, the message printed as is (no rich markup)."""
    from rich.markup import escape

    stderr_console().print(f"[bold red]error:[/] {escape(redact(message))}", soft_wrap=True)


@contextlib.contextmanager
def exit_codes(*, usage: tuple[type[BaseException], ...] = (), note: str = "",
               on_interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a command's work, turning its errors into exit codes and one line on stderr.

    ``usage`` exceptions (a missing input, an output in the way) and every
    :class:`~pbgio.errors.UsageError` exit :data:`EXIT_USAGE`; any other
    :class:`~pbgio.errors.PbgioError` exits :data:`EXIT_FAILED`, its message followed by ``note``
    (e.g. " (nothing was written)"); Ctrl-C exits :data:`EXIT_INTERRUPTED` after ``on_interrupt``
    (by default the line "interrupted"). What the work says as a :class:`~pbgio.errors.Notice`
    (a checkpoint read with its own settings …) is printed once, as ``note: …`` on stderr.
    """
    import sys
    import warnings

    import typer

    from pbgio.errors import Notice, OutputError, PbgioError, UsageError

    usage_errors: tuple[type[BaseException], ...] = (*usage, UsageError)
    previous_hooks = sys.unraisablehook, sys.excepthook
    sys.unraisablehook = _quiet_failed_h5_writes(previous_hooks[0])
    sys.excepthook = _quiet_failed_h5_writes(previous_hooks[1])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", Notice)
            warnings.showwarning = _notices_on_stderr(warnings.showwarning)
            yield
    except usage_errors as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except OutputError as exc:
        print_error(f"{exc}{note}")
        _exit_at_once(EXIT_FAILED)
    except PbgioError as exc:
        print_error(f"{exc}{note}")
        raise typer.Exit(EXIT_FAILED) from None
    except OSError as exc:  # an operating-system failure no writer turned into an OutputError
        from pbgio.errors import describe_os_failure

        where = f"{exc.filename}: " if exc.filename else ""
        print_error(f"{where}{describe_os_failure(exc)}{note}")
        _exit_at_once(EXIT_FAILED)
    except KeyboardInterrupt:
        if on_interrupt is None:
            stderr_console().print("interrupted")
        else:
            on_interrupt()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        sys.unraisablehook, sys.excepthook = previous_hooks


def _notices_on_stderr(previous: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints each distinct :class:`~pbgio.errors.Notice` once as
    ``{label}: message`` on stderr (and hands other warnings to ``previous``)."""
    from pbgio.errors import Notice

    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not issubclass(category, Notice):
            previous(message, category, *args, **kwargs)
            return
        from rich.markup import escape

        text = f"{category.label}: {message}"
        if text not in shown:
            shown.add(text)
            stderr_console().print(escape(text), soft_wrap=True)

    return show


def _quiet_failed_h5_writes(previous: Callable[..., object]) -> Callable[..., object]:
    """A hook (for ``sys.unraisablehook`` or ``sys.excepthook``) that drops what h5py reports
    while freeing the objects of a file whose write failed ("Exception ignored in
    ObjectID.__dealloc__ ... file write failed", printed through both hooks): the writer already
    raised that failure as an OutputError, which is reported once."""
    def hook(*args: Any) -> object:
        error = args[0].exc_value if len(args) == 1 else args[1]
        if isinstance(error, RuntimeError) and "file write failed" in str(error):
            return None
        return previous(*args)
    return hook


def _exit_at_once(code: int) -> NoReturn:
    """Exit now, skipping the interpreter's exit handlers: after a write failed, HDF5 may still
    hold a file it can neither flush nor close (the disk is full), and its own exit handler then
    crashes the process (SIGSEGV) instead of exiting with ``code``. Every output was already
    discarded or left uncommitted by the writers."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

