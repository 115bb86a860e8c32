"""What every pbg command line shares: exit codes and the messages on stderr (a base module of
pbgio: ``pbgio`` and ``pbgtrain`` use it).

Exit codes: 0 done (``pbgio validate``: valid, warnings allowed), :data:`EXIT_FAILED` invalid
data or a failed command, :data:`EXIT_USAGE` a usage error, :data:`EXIT_INTERRUPTED` Ctrl-C.
Messages, errors and progress go to stderr; results to stdout; :func:`exit_codes` maps a
command's errors to its exit code and prints its notices (an exception of a storage library
too: one redacted line, never a traceback); :func:`redact` hides the secrets a URL carries in
every message, :func:`printable` escapes the control characters of names (docs/security.md).
Imports only the standard library at import time: rich (and typer, pbgio.errors) are imported
when used, so ``--help`` and small commands start fast.

>>> EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED
(1, 2, 130)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from pbgio.safe_text import REDACTED, printable, redact, redact_foreign, secrets_in

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130



__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USAGE", "REDACTED", "console", "exit_codes", "print_error",
           "printable", "redact", "redact_foreign", "secrets_in", "stderr_console", "widen_help_off_terminal"]


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


def console(*, stderr: bool = False, markup: bool = True) -> Any:
    """A rich console (no syntax highlighting of paths and numbers, no emoji codes). On a terminal,
    text wraps at its width; elsewhere nothing is wrapped, so a log or a pipe gets whole lines (rich
    would otherwise wrap at 80 columns, mid-word in table titles). Every string it prints (a message,
    a table's cells and titles) goes through :func:`redact` and :func:`printable` (newlines and tabs
    kept): no secret of a URL and no control character of a name reaches the terminal, whoever
    built the string. With ``markup=False``, ``[…]`` in the text is shown as it is (names)."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return _safe_console_class()(stderr=stderr, highlight=False, emoji=False, markup=markup,
                                 width=None if terminal else UNWRAPPED_WIDTH, soft_wrap=not terminal)


@functools.cache
def _safe_console_class() -> type:
    """rich's Console, whose strings go through :func:`redact` and :func:`printable` before they
    are rendered (rich imported when the first console is made)."""
    from rich.console import Console

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(redact(text), keep="\n\t"), **kwargs)

    return SafeConsole


def stderr_console() -> Any:
    """:func:`console` on stderr."""
    return console(stderr=True)


def print_error(message: str) -> None:
    """``error: message`` on stderr, the message printed as is (no rich markup), its URLs redacted
    (:func:`redact`) and its control characters escaped (:func:`printable`; its lines kept)."""
    from rich.text import Text

    shown = printable(redact(message), keep="\n")
    stderr_console().print(Text.assemble(("error:", "bold red"), f" {shown}"), soft_wrap=True)


@contextlib.contextmanager
def exit_codes(*, usage: tuple[type[BaseException], ...] = (), note: str = "",
               on_interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a command's work, turning its errors into exit codes and one line on stderr.

    ``usage`` exceptions (a missing input, an output in the way) and every
    :class:`~pbgio.errors.UsageError` exit :data:`EXIT_USAGE`; any other
    :class:`~pbgio.errors.PbgioError` exits :data:`EXIT_FAILED`, its message followed by ``note``
    (e.g. " (nothing was written)"); Ctrl-C exits :data:`EXIT_INTERRUPTED` after ``on_interrupt``
    (by default the line "interrupted"). An exception raised inside a storage library
    (:func:`storage_library_of`: botocore's ``ParamValidationError`` …) that no reader
    turned into a :class:`~pbgio.storage.StorageError` exits :data:`EXIT_FAILED` with one line,
    its secrets hidden (:func:`redact_foreign`), never a traceback. What the work says as a
    :class:`~pbgio.errors.Notice` (a checkpoint read with its own settings …) is printed once, as
    ``note: …`` on stderr.
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
        if closed_standard_pipes(exc):
            raise  # the reader of the output went away: no error (closed_pipe_ends_quietly ends the command)
        from pbgio.errors import describe_os_failure

        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{describe_os_failure(exc)}"
        if storage_library_of(exc) is not None:
            text = redact_foreign(text, _command_line_secrets())
        print_error(f"{text}{note}")
        _exit_at_once(EXIT_FAILED)
    except KeyboardInterrupt:
        if on_interrupt is None:
            stderr_console().print("interrupted")
        else:
            on_interrupt()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:  # the last line of defence: a storage library's own exception, unwrapped
        library = storage_library_of(exc)
        if library is None:
            raise
        print_error(f"{library}: {redact_foreign(_one_line(exc), _command_line_secrets())}{note}")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        sys.unraisablehook, sys.excepthook = previous_hooks


@contextlib.contextmanager
def closed_pipe_ends_quietly() -> Iterator[None]:
    """Run a command (every pbg command runs in it: :class:`pbgio.options.ConfinedGroup`) so that
    its output's reader going away ends it quietly, as ``yes | head`` ends: exit 0, nothing on
    stderr. The first write to a standard output or error whose reader has closed it
    (``pbgio names … | head``) stops the command where it is; that stream is pointed at the null
    device, so that no later write (a ``finally``, the interpreter's last flush) fails again.
    Another broken pipe (an output file that is a FIFO) is no such end: it goes on as raised.
    Whatever was committed stays committed; what a writer had staged is discarded as on any error."""
    import sys

    import typer

    try:
        yield
        for stream in (sys.stdout, sys.stderr):  # what is still buffered meets a closed reader here
            stream.flush()
    except OSError as exc:
        closed = closed_standard_pipes(exc)
        if not closed:
            raise
        _silence(closed)
        raise typer.Exit(0) from None


def closed_standard_pipes(exc: BaseException) -> list[int]:
    """The standard streams (file descriptors 1 and 2) that are pipes (or sockets) whose reader has
    closed them, when ``exc`` is a broken pipe (EPIPE); else none. Asked of the streams themselves
    (``poll``: an error on the writing end), since a broken pipe does not say which file it was."""
    import errno
    import select

    if not isinstance(exc, OSError) or exc.errno != errno.EPIPE or not hasattr(select, "poll"):
        return []
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, 0)  # errors and hang-ups only: they are always reported
    return sorted(fd for fd, events in poller.poll(0) if events & (select.POLLERR | select.POLLHUP)
                  and not events & select.POLLNVAL)


def _silence(fds: list[int]) -> None:
    """Point ``fds`` at the null device: writes to them succeed and go nowhere."""
    import os

    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


STORAGE_LIBRARIES = frozenset({"botocore", "aiobotocore", "boto3", "s3fs", "gcsfs", "adlfs", "fsspec", "upath",
                               "pathlib_abc", "aiohttp", "requests", "urllib3", "google", "azure"})
"""The top-level packages of storage clients: an exception they raise (a class of theirs, or raised
in their code) is a storage failure, reported in one line (:func:`exit_codes`)."""


def storage_library_of(exc: BaseException) -> str | None:
    """The storage library (of :data:`STORAGE_LIBRARIES`) that ``exc`` comes from: the package that
    defines its class, or the one whose code raised it; None when it is no storage library's.

    >>> storage_library_of(ValueError("x")), storage_library_of(type("E", (Exception,),
    ...     {"__module__": "botocore.exceptions"})())
    (None, 'botocore')
    """
    def library(module: object) -> str | None:
        top = module.partition(".")[0] if isinstance(module, str) else None
        return top if top in STORAGE_LIBRARIES else None

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return library(type(exc).__module__) or (library(tb.tb_frame.f_globals.get("__name__")) if tb else None)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (botocore's messages span several)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _command_line_secrets() -> list[str]:
    """The secrets of the URLs on the command line being run (its arguments and options), which a
    storage library may quote without their URL (:func:`secrets_in`)."""
    import sys

    import click

    words = list(sys.argv)
    context = click.get_current_context(silent=True)
    while context is not None:
        for value in context.params.values():
            values = value if isinstance(value, list | tuple) else [value]
            words += [str(v) for v in values if isinstance(v, str)]
        context = context.parent
    return secrets_in(" ".join(words))


def _notices_on_stderr(previous: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints each distinct :class:`~pbgio.errors.Notice` once as
    ``{label}: message`` on stderr (and hands other warnings to ``previous``)."""
    from pbgio.errors import Notice

    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not issubclass(category, Notice):
            previous(message, category, *args, **kwargs)
            return
        text = f"{category.label}: {message}"
        if text not in shown:
            shown.add(text)
            stderr_console().print(text, soft_wrap=True, markup=False)

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

