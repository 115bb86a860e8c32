"""Entity-side files in ``entity_path``: counts, names, dynamic relations.

Count files hold one decimal integer and a newline (the original writes
``f"{n}\\n"`` and reads ``int(text.strip())``); names files are JSON lists of
strings whose index is the entity's offset within its partition.

>>> parse_count_text("42\\n")
42
>>> parse_count_text("-3") is None, parse_count_text("\u0667") is None, parse_count_text("1_0") is None
(True, True, True)
>>> format_count(7)
'7\\n'
"""

from __future__ import annotations

import re

_COUNT_RE = re.compile(r"^[ \t\r\n]*[0-9]+[ \t\r\n]*$")
NAMES_JSON_INDENT = 4


def parse_count_text(text: str) -> int | None:
    """The count a count file holds, or None when it does not hold one."""
    if not _COUNT_RE.match(text):
        return None
    try:
        return int(text.strip())
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return None


def format_count(count: int) -> str:
    if count < 0:
        raise ValueError(f"a count is non-negative, got {count}")
    return f"{count}\n"
