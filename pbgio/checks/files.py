"""The rules of a layout's files as files: where their links lead, what kind of file they are, how
large a file read whole may be, and where the config's paths point (docs/security.md).

>>> print(link_outside("entities/entity_count_user_0.txt", "/etc/passwd"))
entities/entity_count_user_0.txt: expected a file inside the layout, found a symbolic link leading out of it \
(to /etc/passwd); pbg follows links out of a layout only with PBG_FOLLOW_LINKS=1 [layout-link-outside]
>>> print(not_regular("entities/entity_count_user_0.txt", "a FIFO"))
entities/entity_count_user_0.txt: expected a regular file, found a FIFO [file-not-regular]
"""

from __future__ import annotations

from pbgio.errors import Issue
from pbgio.spec.rules import rule


def link_outside(file: str | None, target: str, *, directory: bool = False) -> Issue:
    """``layout-link-outside``: ``file`` resolves to ``target``, outside every folder the command may read."""
    what = "directory" if directory else "file"
    return rule("layout-link-outside").issue(
        file, None, f"expected a {what} inside the layout, found a symbolic link leading out of it (to {target}); "
                    "pbg follows links out of a layout only with PBG_FOLLOW_LINKS=1")


def not_regular(file: str | None, found: str, dataset: str | None = None) -> Issue:
    """``file-not-regular``: ``file`` is ``found`` (a FIFO, a character device …), not a regular file."""
    return rule("file-not-regular").issue(file, dataset, f"expected a regular file, found {found}")


def too_large(file: str | None, size: int | None, limit: int, what: str) -> Issue:
    """``file-too-large``: ``file``, read whole as ``what``, holds more than ``limit`` bytes (``size``
    when known)."""
    found = f"{size:,} bytes" if size is not None else "more"
    return rule("file-too-large").issue(
        file, None, f"expected {what} of at most {limit:,} bytes, found {found}")


def path_outside(file: str | None, key: str, location: str, folder: str) -> Issue:
    """``layout-path-outside`` (a warning): the config's ``key`` names ``location``, outside ``folder``."""
    return rule("layout-path-outside").issue(
        file, key, f"expected a path inside the config's folder {folder}, found {location}: it is read as "
                   "named, and written only when you name it on the command line or set PBG_WRITE_OUTSIDE=1")


def url_refused(file: str | None, key: str, reason: str) -> Issue:
    """``layout-url-refused``: the config's ``key`` names a URL the command may not contact (``reason``)."""
    return rule("layout-url-refused").issue(file, key, f"expected storage the command line named, found {reason}")


UNREADABLE_BY_DESIGN = frozenset(issue.rule for issue in (link_outside(None, ""), not_regular(None, ""),
                                                          too_large(None, None, 0, "")))
"""The rules of a file that a layout may not make pbg read at all (a link out of it, a FIFO or device, a
file beyond its bound): a command refuses the layout, the file named, rather than work around it."""
