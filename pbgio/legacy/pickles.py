"""Load the legacy pickled ``.pt`` files without running code.

Every legacy artifact is a pickle, and unpickling can call any importable
function. This loader never does that for an untrusted file:

1. **Scan.** The pickle opcodes are read with :mod:`pickletools` (which parses and
   never executes) and every global the file names is listed. Any global outside
   :data:`ALLOWED_GLOBALS`, the few things genuine legacy files contain, is refused
   with an :class:`~pbgio.errors.UnsafePickleError` naming the file and the global.
2. **Load.** ``torch.load(weights_only=True, map_location="cpu")``, torch's own
   restricted unpickler, as a second layer; its refusals become the same error.
   A bare pickle (``pickle.dump`` output renamed ``.pt``) goes through a
   :class:`pickle.Unpickler` whose ``find_class`` allows only :data:`BARE_PICKLE_GLOBALS`.

``trust=True`` is the only way to ``torch.load(weights_only=False)`` / ``pickle.load``.

>>> import io, os, tempfile, pathlib, torch
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> torch.save(13, d / "entity_count_user_1.pt")
>>> load_pickle(d / "entity_count_user_1.pt")
13
>>> class Payload:
...     def __reduce__(self):
...         return (os.system, ("echo pwned",))
>>> torch.save(Payload(), d / "METADATA_1.pt")
>>> load_pickle(d / "METADATA_1.pt")
Traceback (most recent call last):
...
pbgio.errors.UnsafePickleError: ...METADATA_1.pt: refused to unpickle: ... the global posix.system, ...
"""

from __future__ import annotations

import _compat_pickle
import lzma
import pickle
import pickletools
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

from pbgio.errors import FormatError, UnsafePickleError
from pbgio.formats.torch_payload import BoundedReader, PayloadError, check_pickle_claims
from pbgio.legacy.spec import legacy_error
from pbgio.spec.checkpoint import TORCH_LEGACY_MAGIC, TORCH_ZIP_MAGIC

Container = Literal["zip", "legacy", "pickle"]
"""``zip``: torch.save since torch 1.6; ``legacy``: the pre-1.6 container (a header of
pickles, then raw storages); ``pickle``: a bare pickle."""

ALLOWED_GLOBALS: frozenset[str] = frozenset({
    "collections.OrderedDict",          # state dicts
    "torch._utils._rebuild_tensor_v2",  # every tensor (torch >= 1.0)
    "torch._utils._rebuild_parameter",  # embeddings pickled as nn.Parameter
    "torch.FloatStorage",               # float32 data (embeddings, parameters, optimizer sums)
    "torch.DoubleStorage",
    "torch.LongStorage",
})
"""Globals a genuine legacy file may name (verified on the reference samples, which use
the first four). Plain tuples, dicts, lists, ints, floats, strings and None need none."""

BARE_PICKLE_GLOBALS: frozenset[str] = frozenset({"collections.OrderedDict"})
"""Globals a bare pickle may name: it cannot hold tensors safely (torch pickles those
through ``torch.load`` itself), so only plain data is accepted."""

LEGACY_CONTAINER_PICKLES = 5  # magic, protocol, sys_info, the object, storage keys
LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # the first pickle of the pre-1.6 container

_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
               "BINUNICODE8"}
_TORCH_GLOBAL_RES = (
    re.compile(r"unsupported GLOBAL (?P<name>[\w.]+) whose module"),
    re.compile(r"Unsupported global: GLOBAL (?P<name>[\w.]+) was not an allowed global"),
)


@dataclass(frozen=True)
class PickleInfo:
    """What a pickled file is, read without unpickling it."""

    container: Container
    globals: tuple[str, ...]

    def refused(self) -> list[str]:
        allowed = BARE_PICKLE_GLOBALS if self.container == "pickle" else ALLOWED_GLOBALS
        return [g for g in self.globals if g not in allowed]


def container_of(head: bytes) -> Container | None:
    """The container kind from a file's first bytes; None when it is no pickle at all."""
    if head.startswith(TORCH_ZIP_MAGIC):
        return "zip"
    if head.startswith(TORCH_LEGACY_MAGIC):
        return "legacy"
    if head[:1] == b"\x80" or head[:1] in (b"(", b"}", b"]", b"K", b"I", b"N", b"c", b"X", b"\x8a"):
        return "pickle"
    return None


_MEMO_SLACK = 1 << 16


def _globals_in(stream: IO[bytes]) -> list[str]:
    """Globals named by the pickle at the stream position; stops after its STOP opcode."""
    found: list[str] = []
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    for op, arg, _pos in pickletools.genops(stream):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            found.append(_python3_name(module, attr))
            last = None
        elif name == "STACK_GLOBAL":
            found.append(_python3_name(strings[-2], strings[-1]) if len(strings) >= 2 else "<STACK_GLOBAL>")
            last = None
        elif name in ("EXT1", "EXT2", "EXT4"):
            found.append(f"<copyreg extension {arg}>")
            last = None
        elif name in _STRING_OPS:
            last = arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)
            strings.append(last)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            if int(cast(int, arg)) > len(memo) + _MEMO_SLACK:  # picklers number the memo 0, 1, 2 …; the
                raise ValueError(f"memo index {arg} after {len(memo)} entries")  # unpickler would allocate it
            memo[int(cast(int, arg))] = last
        elif name == "MEMOIZE":
            memo[len(memo)] = last
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            last = memo.get(int(cast(int, arg)))
            if isinstance(last, str):
                strings.append(last)
        else:
            last = None
    return found


def _python3_name(module: str, name: str) -> str:
    """The global Python 3 imports for a pickled name (protocol 0-2 pickles use Python 2 names)."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


def check_pickle(path: Path, *, trust: bool = False) -> PickleInfo:
    """Scan a file and raise :class:`~pbgio.errors.UnsafePickleError` for a refused global."""
    info = inspect_pickle(path)
    if not trust:
        refused = info.refused()
        if refused:
            raise UnsafePickleError(str(path), refused[0], _more(refused))
    return info


def inspect_pickle(path: Path) -> PickleInfo:
    """The container and the globals of a ``.pt`` file; nothing is unpickled."""
    try:
        with path.open("rb") as raw:
            f: Any = BoundedReader(raw)  # reads never allocate more than the file holds
            head = f.read(len(TORCH_LEGACY_MAGIC))
            container = container_of(head)
            if container is None:
                raise legacy_error("legacy-pickle-unreadable", str(path),
                                   f"expected a torch.save payload or a pickle, found bytes {head[:8]!r}")
            f.seek(0)
            if container == "pickle" and _is_legacy_header(f):
                container = "legacy"  # the old container, written with another pickle protocol
            f.seek(0)
            if container == "zip":
                names = _zip_globals(path)
            elif container == "legacy":
                names = []
                for _ in range(LEGACY_CONTAINER_PICKLES):
                    names += _globals_in(f)
            else:
                names = _globals_in(f)
    except FileNotFoundError:
        raise legacy_error("legacy-pickle-unreadable", str(path),
                           "expected this file, found nothing") from None
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, UnicodeDecodeError, IndexError,
            NotImplementedError, RuntimeError, OverflowError, zlib.error, lzma.LZMAError, struct.error) as exc:
        # NotImplementedError, RuntimeError: a zip of a version, compression or encryption zipfile lacks
        raise legacy_error("legacy-pickle-unreadable", str(path),
                           f"expected a complete pickle, found an unreadable one ({exc})") from None
    return PickleInfo(container, tuple(dict.fromkeys(names)))


def _is_legacy_header(f: IO[bytes]) -> bool:
    """Whether the first pickle is the legacy container's magic number (a plain int)."""
    if _globals_in(f):
        return False
    f.seek(0)
    # Read the opcodes, build nothing: a damaged pickle may claim a memo slot or a size that
    # building it would allocate (LONG_BINPUT 2**32-1).
    values = []
    try:
        for opcode, arg, _pos in pickletools.genops(f):
            if opcode.name == "STOP":
                break
            if opcode.name not in ("PROTO", "FRAME"):
                values.append(arg if opcode.name in _INT_OPCODES else None)
    except (ValueError, EOFError, struct.error, UnicodeDecodeError, OverflowError):
        return False
    return values == [LEGACY_MAGIC_NUMBER]


_INT_OPCODES = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4")


def _zip_globals(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise ValueError(f"expected one data.pkl in the archive, found {len(pickles)}")
        with archive.open(pickles[0]) as member:
            return _globals_in(member)


class _BarePickleUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in BARE_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {qualified}")
        return super().find_class(module, name)


def load_pickle(path: Path, *, trust: bool = False) -> Any:
    """Unpickle a legacy ``.pt`` file safely (see the module doc); tensors land on the CPU.

    Raises :class:`~pbgio.errors.UnsafePickleError` for a refused global and a
    :class:`~pbgio.errors.FormatError` for a file that is no readable pickle.
    """
    info = check_pickle(path, trust=trust)
    if info.container == "pickle":
        return _load_bare(path, trust)
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        if trust:
            raise _unreadable(path, exc) from None
        name = _torch_refused_global(str(exc), info.globals)
        raise UnsafePickleError(str(path), name, None if name else _torch_refusal_reason(str(exc))) from None
    except (RuntimeError, ValueError, EOFError, OSError, KeyError, IndexError, TypeError,
            AttributeError, AssertionError, struct.error, UnicodeDecodeError) as exc:
        # torch.load asserts on some malformed payloads (e.g. "saved_id must be a tuple")
        raise _unreadable(path, exc) from None


def _load_bare(path: Path, trust: bool) -> Any:
    with path.open("rb") as f:
        try:
            check_pickle_claims(f)  # a size it claims is allocated before it is read
        except PayloadError as exc:
            raise _unreadable(path, exc) from None
        try:
            return pickle.load(f) if trust else _BarePickleUnpickler(f).load()
        except pickle.UnpicklingError as exc:
            m = re.match(r"refused global (\S+)", str(exc))
            if m and not trust:
                raise UnsafePickleError(str(path), m[1]) from None
            raise _unreadable(path, exc) from None
        except (ValueError, EOFError, KeyError, IndexError, TypeError, AttributeError, OverflowError) as exc:
            raise _unreadable(path, exc) from None


def _more(refused: list[str]) -> str | None:
    return f"and {len(refused) - 1} more: {', '.join(refused[1:4])}" if len(refused) > 1 else None


def _torch_refused_global(message: str, scanned: Iterable[str]) -> str | None:
    """The global torch's weights_only unpickler refused, qualified from our scan when it can be."""
    for pattern in _TORCH_GLOBAL_RES:
        m = pattern.search(message)
        if m:
            short = m["name"]
            for full in scanned:
                if full == short or full.endswith(f".{short}"):
                    return full
            return short
    return None


def _torch_refusal_reason(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if "Unsupported" in line), lines[-1] if lines else "refused")[:200]


def _unreadable(path: Path, exc: BaseException) -> FormatError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return legacy_error("legacy-pickle-unreadable", str(path),
                        f"expected a readable torch.save payload, found an unreadable file ({text[:200]})")
