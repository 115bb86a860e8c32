"""Load the legacy pickled ``.pt`` files without running code.

Every legacy artifact is a pickle, and unpickling can call any importable
function. This loader never does that for an untrusted file:

1. **Scan.** The file is opened once, as every input is (:func:`pbgio.formats.files.open_input`:
   a regular file whose links stay inside the layout; a count file read whole within a size
   cap). The pickle opcodes are read with :mod:`pickletools` (which parses and never executes)
   and every global the file names is listed: in a zip, those of the ``data.pkl`` torch's own
   reader loads (:func:`pbgio.formats.torch_payload.torch_zip`: found ignoring ASCII case, two
   members it would confuse refused). Any global outside :data:`ALLOWED_GLOBALS`, the few things
   genuine legacy files contain, is refused with an :class:`~pbgio.errors.UnsafePickleError`
   naming the file and the global.
2. **Bound.** What the file declares is bounded by what it holds before anything could
   allocate it: each zip member's size, each storage a pickle declares
   (:mod:`pbgio.formats.torch_claims`), each pickle's memo, frames and counted strings.
3. **Load.** ``torch.load(weights_only=True, map_location="cpu")`` on the same open file, torch's
   own restricted unpickler, as a second layer; its refusals become the same error.
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
import io
import lzma
import os
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

from pbgio.errors import FormatError, MissingArtifactError, UnsafePickleError
from pbgio.formats import files
from pbgio.formats.torch_claims import check_legacy_storages, check_zip_storages, storage_claims
from pbgio.formats.torch_payload import BoundedReader, PayloadError, TorchZip, check_pickle_claims, torch_zip
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
    """Globals named by the pickle at the stream position; stops after its STOP opcode.

    The walk bounds what an unpickler would allocate before reading it, as
    :func:`pbgio.formats.torch_payload.check_pickle_claims` does: each counted argument is read (one
    that claims more than the stream holds fails the walk), a memo slot far past those filled and a
    frame longer than the bytes left are refused. The stream is a :class:`BoundedReader` or a
    :class:`io.BytesIO`."""
    found: list[str] = []
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    size = stream.size if isinstance(stream, BoundedReader) else len(cast(io.BytesIO, stream).getbuffer())
    for op, arg, pos in pickletools.genops(stream):
        name = op.name
        if name == "FRAME" and isinstance(arg, int) and arg > size - stream.tell():
            raise ValueError(f"the pickle's FRAME at byte {pos} claims {arg:,} bytes, {size - stream.tell():,} "
                             "are left")
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


def check_pickle(path: Path, *, trust: bool = False, limit: int | None = None) -> PickleInfo:
    """Scan a file (:func:`inspect_pickle`) and raise :class:`~pbgio.errors.UnsafePickleError` for a
    refused global (before its sizes are checked, unless ``trust``)."""
    with _open(path, limit) as f:
        return _inspect(f, path, trust=trust)


def inspect_pickle(path: Path, *, limit: int | None = None) -> PickleInfo:
    """The container and the globals of a ``.pt`` file; nothing is unpickled. The file is opened as every
    input is (:func:`pbgio.formats.files.open_input`: a regular file, its links inside the layout; read
    whole only within ``limit`` bytes when one is given), and what it declares is bounded by what it
    holds before anything could allocate it: the members of a zip as torch's reader finds them
    (:func:`pbgio.formats.torch_payload.torch_zip`), the storages every pickle declares
    (:mod:`pbgio.formats.torch_claims`), each pickle's own claims
    (:func:`pbgio.formats.torch_payload.check_pickle_claims`)."""
    with _open(path, limit) as f:
        return _inspect(f, path, trust=None)


_WHAT = "legacy .pt file"


def _open(path: Path, limit: int | None) -> IO[bytes]:
    """``path`` opened for the scan and the load (one open file for both, so both read the same bytes)."""
    try:
        if limit is None:
            return files.open_input(path, _WHAT)
        return io.BytesIO(files.read_bytes(path, _WHAT, limit=limit))
    except MissingArtifactError:
        if os.path.lexists(path):
            raise
        raise legacy_error("legacy-pickle-unreadable", str(path), "expected this file, found nothing") from None


def _inspect(raw: IO[bytes], path: Path, *, trust: bool | None) -> PickleInfo:
    """:func:`inspect_pickle` on the open file ``raw``; ``trust=False`` refuses a global first."""
    try:
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
        zipped = None
        if container == "zip":
            zipped = torch_zip(raw)
            pickled = _zip_pickle(zipped)
            names = _globals_in(io.BytesIO(pickled))
        elif container == "legacy":
            names = []
            for _ in range(LEGACY_CONTAINER_PICKLES):
                names += _globals_in(f)
        else:
            names = _globals_in(f)
        info = PickleInfo(container, tuple(dict.fromkeys(names)))
        if trust is False:
            refused = info.refused()
            if refused:
                raise UnsafePickleError(str(path), refused[0], _more(refused))
        if zipped is not None:  # the walks of _globals_in bound every pickle's own claims
            check_zip_storages(zipped, storage_claims(io.BytesIO(pickled), legacy=False, walked=True))
        elif container == "legacy":
            check_legacy_storages(raw, walked=True)
    except PayloadError as exc:
        raise legacy_error("legacy-pickle-unreadable", str(path), f"refused before unpickling: {exc}") from None
    except (FormatError, MissingArtifactError):
        raise
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, UnicodeDecodeError, IndexError,
            NotImplementedError, RuntimeError, OverflowError, zlib.error, lzma.LZMAError, struct.error) as exc:
        # NotImplementedError, RuntimeError: a zip of a version, compression or encryption zipfile lacks
        raise legacy_error("legacy-pickle-unreadable", str(path),
                           f"expected a complete pickle, found an unreadable one ({exc})") from None
    return info


def _zip_pickle(zipped: TorchZip) -> bytes:
    """The bytes of the ``data.pkl`` torch loads (bounded by the file's size: :func:`torch_zip`)."""
    info = zipped.record("data.pkl")
    if info is None:
        raise PayloadError(f"expected {zipped.prefix}/data.pkl in the archive, found none")
    return zipped.archive.read(info)


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


class _BarePickleUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in BARE_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {qualified}")
        return super().find_class(module, name)


def load_pickle(path: Path, *, trust: bool = False, limit: int | None = None) -> Any:
    """Unpickle a legacy ``.pt`` file safely (see the module doc); tensors land on the CPU.

    The file is opened once (:func:`inspect_pickle`: a regular file inside the layout, read whole
    only within ``limit`` bytes when one is given), scanned and bounded, and the same open file is
    loaded. Raises :class:`~pbgio.errors.UnsafePickleError` for a refused global and a
    :class:`~pbgio.errors.FormatError` for a file that is no readable pickle or that claims more
    than it holds.
    """
    with _open(path, limit) as f:
        info = _inspect(f, path, trust=trust)
        f.seek(0)
        if info.container == "pickle":
            return _load_bare(f, path, trust)
        import torch

        try:
            return torch.load(f, map_location="cpu", weights_only=not trust)
        except pickle.UnpicklingError as exc:
            if trust:
                raise _unreadable(path, exc) from None
            name = _torch_refused_global(str(exc), info.globals)
            raise UnsafePickleError(str(path), name, None if name else _torch_refusal_reason(str(exc))) from None
        except (RuntimeError, ValueError, EOFError, OSError, KeyError, IndexError, TypeError,
                AttributeError, AssertionError, struct.error, UnicodeDecodeError) as exc:
            # torch.load asserts on some malformed payloads (e.g. "saved_id must be a tuple")
            raise _unreadable(path, exc) from None


def _load_bare(f: IO[bytes], path: Path, trust: bool) -> Any:
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
