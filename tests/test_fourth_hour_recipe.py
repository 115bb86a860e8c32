"""Issue 56, points 7 and 6: the own-graph recipes' command runs at the precision their rate tables
were measured at (the table's figures are ``--precision auto``'s; the command ran fp32 whatever the
CPU), the sampled recipe and the sparse-graph recipe alike.
The command is read from recipes/README.md as written and run through the real command line,
shrunk (a WordNet-like graph of the tests' own, two epochs)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.cli import pbgio, pbgtrain
from tests.wordnet_like import write_wordnet_like

REPO = Path(__file__).resolve().parents[1]
README = REPO / "recipes" / "README.md"


def _own_fit_command() -> list[str]:
    """The words of the own-graph recipe's ``pbgtrain fit`` command, its continued lines joined."""
    lines = README.read_text(encoding="utf-8")
    words: list[str] = []
    for line in lines[lines.index("pbgtrain fit own/config.json"):].splitlines():
        words += line.removesuffix("\\").split()
        if not line.endswith("\\"):
            return words
    raise AssertionError("the own recipe's fit command does not end")


def _rate_table_precision(recipe: str) -> str:
    """The ``--precision`` option the rate table row of ``own/{recipe}.json`` was measured with (the
    first figure column's header of its table names it)."""
    header = ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("| fit ("):
            header = line
        elif not line.startswith("|"):
            header = ""
        elif header and f"[own/{recipe}.json](own/{recipe}.json)" in line.split("|")[1]:
            found = re.search(r"`(--precision \w+)`", header.split("|")[2])
            assert found, header
            return found.group(1)
    raise AssertionError(f"recipes/README.md has no rate table row of own/{recipe}.json")


@pytest.mark.parametrize("recipe", ["sampled", "sparse"])
def test_the_own_recipes_command_runs_at_the_precision_of_its_rate_table(recipe: str, tmp_path: Path) -> None:
    """Both own-graph recipes (issue 56 point 6 added ``sparse``) share the command; each has a row
    in a rate table whose precision is the command's."""
    command = _own_fit_command()
    table = _rate_table_precision(recipe)
    given = [f"--precision {command[i + 1]}" for i, word in enumerate(command) if word == "--precision"]
    assert given == [table], f"the command gives {given or 'no --precision (fp32)'}; its rate table: {table}"

    write_wordnet_like(tmp_path)
    config = tmp_path / "config.json"
    shutil.copy(REPO / "recipes" / "own" / f"{recipe}.json", config)
    assert pbgio("import", str(config), *(str(tmp_path / s) for s in ("train.csv", "valid.csv", "test.csv")),
                 "-d", "comma", "--header").returncode == 0
    options = command[3:]  # after `pbgtrain fit own/config.json`: the paths are relative to the config
    options[options.index("--valid-sample") + 1] = "20"
    done = pbgtrain("fit", str(config), *options, "-p", "dimension=8", "-p", "num_epochs=2", "-p", "batch_size=100",
                    "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"precision (bf16|fp32) \(--precision auto: ", done.stderr), done.stderr
