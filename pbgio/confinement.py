"""What a command may touch: the folders of the layout it was given, and the paths its user named.

A layout is input from a stranger (docs/security.md). While a pbg command runs, a *scope* is open
(every command line opens one: :func:`pbgio.console.exit_codes`), and each local file the command
reads, each file or directory it writes and each URL it contacts is checked against it. A scope
holds *roots*, admitted as the command learns them (:func:`admit`):

- the config's folder, for reading and writing (:meth:`pbgio.layout.Layout.load` admits it);
- each directory the config names outside its folder (an absolute ``entity_path``, ``../data``), for
  reading only: the config shows them, and ``pbgio validate`` warns about each
  (``layout-path-outside``);
- every path the user named on the command line (the config itself, ``--edges``, ``--checkpoint``,
  ``-o``, ``-p checkpoint_path=…``, convert's SRC and DST …), for reading, and for writing where the
  command writes it.

The rules (each decision is a function here; readers and writers raise their own errors with it):

- **Reads** (:func:`read_escape`): a file's real path, symbolic links followed, lies under the real
  path of a root. A link that leads out of the layout is refused (``layout-link-outside``) unless
  ``PBG_FOLLOW_LINKS=1``.
- **Writes** (:func:`check_write`): only under a root admitted for writing, and never through a
  symbolic link: every directory from that root down to the file is a real directory. A config that
  names an output outside its folder needs the user's word: the path on the command line, or
  ``PBG_WRITE_OUTSIDE=1``.
- **Remote storage** (:func:`url_refusal`): a URL is contacted only on storage the user named (the
  same scheme and bucket or host as a URL of the command line), or one ``PBG_ALLOW_REMOTE`` lists
  (``s3://bucket,https://host`` or ``*``).

Outside a scope (pbgio used as a library) nothing is checked here: the caller names its own paths,
and ``with scope(): admit(...)`` applies the same rules to a library call. Scopes belong to the
thread that opened them (a stack, so that scopes nest): another thread of the program, a library
call beside a command, is not confined by it; a thread a command starts to work for it (reading
ahead, renewing a lease) runs its work through :func:`inherited` and is.

>>> import os, tempfile
>>> layout, elsewhere = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> os.symlink(os.path.join(elsewhere, "secret"), os.path.join(layout, "count.txt"))
>>> with scope(follow_links=False, write_outside=False, allow_remote=""):
...     admit(layout, write=True)
...     read_escape(os.path.join(layout, "count.txt")) == os.path.realpath(os.path.join(elsewhere, "secret"))
...     read_escape(os.path.join(layout, "names.json")) is None
True
True
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from pbgio.errors import RemoteRefusedError, UnsafeWriteError

FOLLOW_LINKS_ENV = "PBG_FOLLOW_LINKS"
"""``PBG_FOLLOW_LINKS=1``: symbolic links inside a layout may lead anywhere, for reading and writing
(the user's own layouts, whose links the user made)."""
WRITE_OUTSIDE_ENV = "PBG_WRITE_OUTSIDE"
"""``PBG_WRITE_OUTSIDE=1``: a config may name outputs outside its own folder."""
ALLOW_REMOTE_ENV = "PBG_ALLOW_REMOTE"
"""``PBG_ALLOW_REMOTE``: storage a config may name beside the storage of the command line: a comma-separated
list of ``scheme://bucket-or-host`` (``s3://graphs,https://data.example.org``), or ``*`` for any."""

_SCHEME_RE = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]+)://(?P<rest>.*)$", re.DOTALL)
_LOCAL_SCHEMES = frozenset({"file", "local"})


@dataclass(frozen=True)
class Root:
    """A directory (or file) a command may reach: as named (absolute, lexical) and as it really is."""

    named: str
    real: str
    write: bool


@dataclass
class Scope:
    """The roots of one command, and the user's opt-ins (read from the environment when it opens)."""

    follow_links: bool
    write_outside: bool
    allow_remote: str
    roots: list[Root] = field(default_factory=list)
    remotes: set[tuple[str, str]] = field(default_factory=set)

    def describe_roots(self, *, write: bool = False) -> str:
        from pbgio.safe_text import redact

        shown = sorted({redact(r.named) for r in self.roots if r.write or not write})
        return ", ".join(shown) if shown else "none"


T = TypeVar("T")

_THREAD = threading.local()  # .scopes: the scopes this thread opened or inherited, innermost last
_GUARD = threading.Lock()  # a scope's roots: admitted by its thread, read by the threads it started


def _stack() -> list[Scope]:
    stack: list[Scope] | None = getattr(_THREAD, "scopes", None)
    if stack is None:
        stack = _THREAD.scopes = []
    return stack


@contextlib.contextmanager
def _entered(opened: Scope) -> Iterator[Scope]:
    stack = _stack()
    stack.append(opened)
    try:
        yield opened
    finally:
        del stack[max(i for i, s in enumerate(stack) if s is opened)]


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def scope(*, follow_links: bool | None = None, write_outside: bool | None = None,
          allow_remote: str | None = None) -> Iterator[Scope]:
    """A scope for one command, in this thread: nothing is reachable until admitted. Opt-ins not
    given are read from the environment (:data:`FOLLOW_LINKS_ENV`, :data:`WRITE_OUTSIDE_ENV`,
    :data:`ALLOW_REMOTE_ENV`)."""
    opened = Scope(
        follow_links=_flag(FOLLOW_LINKS_ENV) if follow_links is None else follow_links,
        write_outside=_flag(WRITE_OUTSIDE_ENV) if write_outside is None else write_outside,
        allow_remote=os.environ.get(ALLOW_REMOTE_ENV, "") if allow_remote is None else allow_remote)
    with _entered(opened):
        yield opened


def active() -> Scope | None:
    """This thread's innermost scope, or None (pbgio used as a library: nothing is checked)."""
    stack = _stack()
    return stack[-1] if stack else None


def inherited(work: Callable[[], T]) -> Callable[[], T]:
    """``work`` made to run, in whichever thread, within the calling thread's scope (none: as it is):
    what a command hands to a thread of its own (a read ahead, a lease's renewal).

    >>> import threading
    >>> seen = []
    >>> with scope(follow_links=False, write_outside=False, allow_remote="") as mine:
    ...     worker = threading.Thread(target=inherited(lambda: seen.append(active() is mine)))
    ...     worker.start(); worker.join()
    >>> seen, active()
    ([True], None)
    """
    opened = active()
    if opened is None:
        return work

    def within() -> T:
        with _entered(opened):
            return work()

    return within


def split_url(location: str) -> tuple[str, str] | None:
    """``(scheme, bucket or host)`` of a URL of remote storage, lower case; None for a local path.

    >>> split_url("s3://KEY:SECRET@Graphs/fb15k/config.json"), split_url("/data/x"), split_url("file:///x")
    (('s3', 'graphs'), None, None)
    """
    found = _SCHEME_RE.match(location)
    if found is None or found["scheme"].lower() in _LOCAL_SCHEMES:
        return None
    authority = re.split(r"[/?#]", found["rest"], maxsplit=1)[0]
    host = authority.rpartition("@")[2]  # user info (a secret with '@' in it too) is not part of the host
    return found["scheme"].lower(), host.lower()


def admit(location: str | os.PathLike[str], *, write: bool = False) -> None:
    """Make ``location`` (a path or a URL the user named, or a folder of the layout) reachable in the
    active scope: for reading, and for writing when ``write``. Nothing happens outside a scope."""
    current = active()
    if current is None:
        return
    text = os.fspath(location)
    remote = split_url(text)
    if remote is not None:
        with _GUARD:
            current.remotes.add(remote)
        return
    if text.startswith(("file://", "local://")):
        text = "/" + text.split("://", 1)[1].lstrip("/")
    named = os.path.abspath(text)
    root = Root(named, _real(named), write)
    with _GUARD:
        if root not in current.roots:
            current.roots.append(root)


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError, RuntimeError):  # a loop on an old Python, a NUL
        return os.path.abspath(path)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def read_escape(path: str | os.PathLike[str]) -> str | None:
    """Where ``path`` really leads when that lies outside every root of the active scope (the real
    path, for the message); None when it may be read: inside a root, no scope, or links may be
    followed (``PBG_FOLLOW_LINKS=1``)."""
    current = active()
    if current is None or current.follow_links:
        return None
    real = _real(os.fspath(path))
    if any(_under(real, root.real) for root in current.roots):
        return None
    return real


def link_on_the_way(path: str, root: Root, *, directory: bool = False) -> tuple[str, str] | None:
    """The first symbolic link (and where it leads) between ``root`` and ``path`` (``path`` itself
    included when it is a ``directory`` to write in); None when every directory between them is a
    real one."""
    relative = os.path.relpath(path if directory else os.path.dirname(path), root.named)
    current = root.named
    for part in ([] if relative == os.curdir else relative.split(os.sep)):
        current = os.path.join(current, part)
        if _is_link(current):
            try:
                target = os.readlink(current)
            except OSError:
                target = "?"
            return current, target
    if _real(root.named) != root.real:  # the root itself was swapped for a link since it was admitted
        return root.named, _real(root.named)
    return None


def _is_link(path: str) -> bool:
    try:
        return os.path.islink(path)
    except ValueError:  # a NUL: the system cannot look it up, nor write it
        return False


def check_write(path: str | os.PathLike[str], what: str, *, directory: bool = False) -> None:
    """Raise :class:`~pbgio.errors.UnsafeWriteError` unless ``path`` may be written (created,
    replaced, appended to or removed) in the active scope: under a root admitted for writing, every
    directory on the way a real one (``path`` too, for a ``directory`` to create or write in). No
    scope: nothing is checked. A file itself may be a link only for writers that replace it (an
    atomic rename never writes through a link); writers that open it in place refuse a link on their
    own (``O_NOFOLLOW``)."""
    current = active()
    if current is None:
        return
    named = os.path.abspath(os.fspath(path))
    if directory and any(r.write and _under(r.named, named) for r in current.roots):
        return  # a folder on the way to a path the user named: made as the user's path says
    roots = sorted((r for r in current.roots if r.write and _under(named, r.named)),
                   key=lambda r: len(r.named), reverse=True)
    if not roots:
        if current.write_outside:
            return
        raise UnsafeWriteError(
            named, f"the {what} lies outside the folders this command may write "
                   f"({current.describe_roots(write=True)}): a config writes only inside its own folder. Name "
                   f"it on the command line (-p checkpoint_path=PATH, -o PATH …), or set {WRITE_OUTSIDE_ENV}=1 "
                   "for a config you trust")
    if current.follow_links:
        return
    found = link_on_the_way(named, roots[0], directory=directory)
    if found is not None:
        link, target = found
        raise UnsafeWriteError(
            named, f"the {what} would be written through the symbolic link {link} (to {target}); pbg never "
                   f"writes through a link a layout holds: replace the link by a directory, or set "
                   f"{FOLLOW_LINKS_ENV}=1 for links you made yourself")


def url_refusal(url: str) -> str | None:
    """Why the active scope may not contact ``url`` (a sentence), or None when it may: no scope, local
    storage, storage the user named, or storage :data:`ALLOW_REMOTE_ENV` lists."""
    current = active()
    remote = split_url(url)
    if current is None or remote is None or remote in current.remotes:
        return None
    allowed = [a.strip() for a in current.allow_remote.split(",") if a.strip()]
    if "*" in allowed or any(split_url(a) == remote for a in allowed):
        return None
    scheme, host = remote
    named = ", ".join(sorted(f"{s}://{h}" for s, h in current.remotes)) or "none"
    return (f"{scheme}://{host} is storage the command line did not name (named: {named}); a layout may not "
            f"make pbg contact a host or bucket of its choosing. Set {ALLOW_REMOTE_ENV}={scheme}://{host} "
            f"(or '*') to allow it")


def check_url(url: str) -> None:
    """Raise :class:`~pbgio.errors.RemoteRefusedError` when :func:`url_refusal` refuses ``url``."""
    reason = url_refusal(url)
    if reason is not None:
        raise RemoteRefusedError(url, reason)
