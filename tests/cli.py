"""The ``pbgio`` and ``pbgtrain`` commands run in this process (typer's ``CliRunner``), for CLI tests
whose point is a command's arguments, output and exit code rather than a new process: no
interpreter start-up and no torch import per call.

Tests whose point is the process itself keep a subprocess: the real entry point's exit codes
(tests/test_cli.py), start-up time and import laziness, signals and Ctrl-C, kill -9, LD_PRELOAD
fault injection.
"""

from __future__ import annotations

import subprocess
from unittest import mock

import typer
from typer.testing import CliRunner


def invoke(app: typer.Typer, *args: str) -> subprocess.CompletedProcess[str]:
    """``app`` run on ``args`` in this process, as a finished process: exit code, stdout, stderr.

    An exception that escapes the command (a traceback, in a real process) is raised here, so that
    a test cannot mistake it for the exit code 1 of a handled error. The commands' exit that skips
    the interpreter's exit handlers after a failed write (``os._exit``) is an ordinary exit here."""
    def exit_at_once(code: int) -> None:
        raise typer.Exit(code)

    with mock.patch("pbgio.console._exit_at_once", exit_at_once):
        result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def pbgio(*args: str) -> subprocess.CompletedProcess[str]:
    """``pbgio ARGS`` in this process."""
    from pbgio.cli import app

    return invoke(app, *args)


def pbgtrain(*args: str) -> subprocess.CompletedProcess[str]:
    """``pbgtrain ARGS`` in this process."""
    from pbgtrain.cli import app

    return invoke(app, *args)
