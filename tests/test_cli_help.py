"""Every command's ``--help`` prints its help texts as written: an install hint such as
``pip install 'pbg[ann]'`` keeps its brackets (rich reads ``[ann]`` as a markup tag and drops it
unless it is escaped)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from pbgio.cli import app as pbgio_app
from pbgtrain.cli import app as pbgtrain_app

EXTRA = re.compile(r"pbg\\?\[[a-z,]+\]")


def _commands(app: typer.Typer, name: str) -> Iterator[tuple[list[str], Any]]:
    """Every command and group of ``app`` with its path (typer's own click objects: duck-typed)."""
    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for sub_name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, sub_name])

    yield from walk(get_command(app), [name])


COMMANDS = [*_commands(pbgio_app, "pbgio"), *_commands(pbgtrain_app, "pbgtrain")]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_prints_install_hints_as_written(path: list[str], command: Any) -> None:
    declared = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params),
                *((sub.help or "").split("\n\n")[0] for sub in getattr(command, "commands", {}).values())]  # listed
    hints = {m.replace("\\", "") for text in declared for m in EXTRA.findall(text)}
    app = pbgio_app if path[0] == "pbgio" else pbgtrain_app
    done = CliRunner().invoke(app, [*path[1:], "--help"], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    for hint in hints:
        assert hint in done.output, f"{' '.join(path)} --help drops the brackets of {hint!r}:\n{done.output}"
    assert "pip install 'pbg'" not in done.output


def test_the_install_hints_are_there() -> None:
    """The commands that need an extra say which (so the test above has something to check)."""
    texts = {" ".join(p): (c.help or "") for p, c in COMMANDS}
    assert "pbg\\[ann]" in texts["pbgio index"] and "pbg\\[report]" in texts["pbgtrain report"]
