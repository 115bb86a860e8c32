"""``pbgio names``: the names of an entity type (or the relation names) that contain a pattern,
to find ``dog.n.02084071`` from ``dog``. Imports only typer at import time."""

from __future__ import annotations

from typing import Annotated

import typer

from pbgio.console import EXIT_FAILED, exit_codes, print_error, printable, stderr_console
from pbgio.options import BaseOption, ConfigArg, Overrides

LINES_PER_WRITE = 4096
"""Names written to stdout at once (the list is streamed, never held whole)."""


def names(
    config: ConfigArg,
    pattern: Annotated[str, typer.Argument(
        help="Part of the names to find, case aside (dog finds dog.n.02084071 and hotdog.n.07697537): the name "
        "itself comes first, then those holding it as a whole word (between -, ., _, :, spaces or the ends), "
        "shortest first, then those that start with it, then the rest. Without it: every name.",
        show_default=False)] = "",
    entity_type: Annotated[str | None, typer.Option(
        "--type", "-t", help="The entity type whose names to search (default: the config's only type).",
        show_default=False)] = None,
    relations: Annotated[bool, typer.Option(
        "--relations", help="Search the relation names instead (the config's, or dynamic_rel_names.json with "
        "dynamic relations).")] = False,
    param: Overrides = None,
    base: BaseOption = None,
) -> None:
    """List the names that contain PATTERN, one a line: an entity type's (from its names files,
    streamed) or the relations'. Exit 1 when none does. Control characters in a name are shown
    escaped (as \\x1b, \\n …): a name is data, never terminal control."""
    from rich.markup import escape

    from pbgio.errors import MissingArtifactError
    from pbgio.layout import Layout
    from pbgio.names import close_names_in, dictionary, iter_name_matches, suggestion

    count = 0
    with exit_codes(usage=(MissingArtifactError,), on_interrupt=lambda: None):
        layout = Layout.load(config, base=base, overrides=param or [])
        found = dictionary(layout.config, layout.entity_path, entity_type, relations=relations)
        batch: list[str] = []
        for name in iter_name_matches(found.chunks, pattern):
            batch.append(name)
            if len(batch) == LINES_PER_WRITE:
                typer.echo(_lines(batch))
                count += len(batch)
                batch = []
        if batch:
            typer.echo(_lines(batch))
            count += len(batch)
        close = [] if count or not pattern else close_names_in(found.chunks(), pattern)
    what = f"{found.what} names"
    if not count:
        hint = suggestion(close)
        print_error(f"no {what[:-1]} contains {pattern!r}" + (f"; {hint}" if hint else "") if pattern
                    else f"there are no {what}")
        raise typer.Exit(EXIT_FAILED)
    which = f" contain {pattern!r}" if pattern else ""
    stderr_console().print(escape(f"{count:,} {what}{which}"), soft_wrap=True)


def _lines(names: list[str]) -> str:
    r"""``names`` one a line, each :func:`~pbgio.console.printable` (a name holding a line break
    stays on its line).

    >>> print(_lines(["dog", "\x1b]0;title\x07", "two\nlines"]))
    dog
    \x1b]0;title\x07
    two\nlines
    """
    text = "\n".join(names)
    if printable(text, keep="\n") is text and text.count("\n") == len(names) - 1:
        return text  # nothing to escape (the usual case: one pass over the batch)
    return "\n".join(printable(name) for name in names)
