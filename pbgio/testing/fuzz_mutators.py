"""The fuzz campaigns' mutators (guide: docs/guides/fuzzing.md).

:func:`generate` derives input ``i`` of a campaign from the seed corpus
(:mod:`pbgio.testing.fuzz_seeds`), deterministically from ``(seed, target, i)``: the seeds
themselves first, then one to three stacked mutations of a seed, byte-level
(:data:`BYTE_MUTATORS`) or structure-level for the kind of the target's file
(:data:`STRUCTURE_MUTATORS`: JSON, text, pickle, HDF5, Parquet, and :func:`slot_mutate` for the
layout targets' slotted inputs).

Why this module is long: it is the catalogue of every mutator, by file kind (bytes, JSON and
text, pickles, HDF5, Parquet, slotted layout inputs); each mutator is short and read on its own.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import pickle
import random
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pbgio.testing.fuzz import MARKER_ENV, Target

# --------------------------------------------------------------------------- byte-level mutators


Mutator = Callable[["MutationContext", bytes], bytes]

INTERESTING = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**32, 2**40, 10**12, 2**62, 2**63 - 1, -(2**63), 2**64 - 1]


@dataclass
class MutationContext:
    """What a mutator may use: the random source, the corpus (for splicing), a scratch folder
    and the marker file an executed pickle payload would create."""

    rng: random.Random
    corpus: list[bytes]
    scratch: Path
    marker: Path
    damaged: bool = False  # a byte-level mutation was applied: HDF5 may misbehave editing the result


def _pos(ctx: MutationContext, data: bytes | bytearray) -> int:
    return ctx.rng.randrange(len(data)) if data else 0


def bit_flip(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return b"\x00"
    buf = bytearray(data)
    for _ in range(ctx.rng.choice([1, 1, 2, 4, 8])):
        i = _pos(ctx, buf)
        buf[i] ^= 1 << ctx.rng.randrange(8)
    return bytes(buf)


def byte_set(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return bytes([ctx.rng.randrange(256)])
    buf = bytearray(data)
    for _ in range(ctx.rng.choice([1, 2, 4, 16])):
        buf[_pos(ctx, buf)] = ctx.rng.choice([0, 0xFF, 0x7F, 0x80, ctx.rng.randrange(256)])
    return bytes(buf)


def byte_insert(ctx: MutationContext, data: bytes) -> bytes:
    i = _pos(ctx, data)
    n = ctx.rng.choice([1, 1, 4, 64, 1024])
    fill = bytes(ctx.rng.randrange(256) for _ in range(min(n, 64))) * max(1, n // 64)
    return data[:i] + fill[:n] + data[i:]


def byte_delete(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    i = _pos(ctx, data)
    n = ctx.rng.choice([1, 1, 4, 64, 1024])
    return data[:i] + data[i + n:]


def truncate(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    return data[:ctx.rng.choice([0, 1, 8, ctx.rng.randrange(len(data)), len(data) - 1, len(data) // 2])]


def splice(ctx: MutationContext, data: bytes) -> bytes:
    other = ctx.rng.choice(ctx.corpus)
    return data[:_pos(ctx, data)] + other[_pos(ctx, other):]


def interesting_int(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    width = ctx.rng.choice([1, 2, 4, 8])
    value = ctx.rng.choice(INTERESTING) % (1 << (8 * width))
    raw = value.to_bytes(width, ctx.rng.choice(["little", "big"]))
    i = ctx.rng.randrange(max(1, len(data) - width + 1))
    return data[:i] + raw + data[i + width:]


def duplicate_range(ctx: MutationContext, data: bytes) -> bytes:
    if not data:
        return data
    i = _pos(ctx, data)
    j = min(len(data), i + ctx.rng.choice([1, 16, 256, 4096]))
    return data[:j] + data[i:j] * ctx.rng.choice([1, 2, 8]) + data[j:]


BYTE_MUTATORS: list[Mutator] = [bit_flip, byte_set, byte_insert, byte_delete, truncate, splice,
                                interesting_int, duplicate_range]


# --------------------------------------------------------------------------- JSON and text


_RAW = "\u0000RAW{}\u0000"


def _hostile_json(ctx: MutationContext) -> tuple[Any, str | None]:
    """A hostile value, or a raw JSON text to splice in (returned as the second item)."""
    rng = ctx.rng
    choice = rng.randrange(16)
    if choice == 0:
        return None, "9" * rng.choice([20, 400, 5000, 100_000])  # huge integer literals
    if choice == 1:
        return None, "[" * rng.choice([1000, 100_000]) + "]" * rng.choice([0, 1000, 100_000])
    if choice == 2:
        return None, rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0"])
    if choice == 3:
        return None, '{"a":' * rng.choice([1000, 50_000]) + "1" + "}" * 50_000
    if choice == 4:
        return None, '"\\ud800"'
    values: list[Any] = [-1, 0, 2**63, -(2**63) - 1, 10**30, 1.5, True, False, None, "", "x" * 100_000,
                         "\u0000/..", [], {}, [1, "a", None], {"": 1}, "é" * 10]
    return rng.choice(values), None


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from _paths(v, (*prefix, i))


def _set_path(root: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return root


def json_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Replace, delete or add a node of a JSON document with a hostile value."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    paths = list(_paths(doc))
    path = rng.choice(paths)
    op = rng.randrange(5)
    raw: str | None = None
    if op == 0 and path:  # delete
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    elif op == 1 and isinstance(doc, dict):  # an unknown or camelCase key
        doc[rng.choice(["unknownKey", "numEpochs", "entities ", "dimension", "__proto__"])] = rng.choice(
            [1, "x", None, {"a": 1}])
    else:
        value, raw = _hostile_json(ctx)
        doc = _set_path(doc, path, _RAW if raw is not None else value)
    text = json.dumps(doc, allow_nan=True, ensure_ascii=rng.random() < 0.5)
    if raw is not None:
        text = text.replace(json.dumps(_RAW), raw, 1)
    return text.encode("utf-8", "surrogatepass")


def json_wrap(ctx: MutationContext, data: bytes) -> bytes:
    """The whole document as another JSON type, duplicated keys, or garbage around it."""
    text = data.decode("utf-8", "replace")
    choice = ctx.rng.randrange(6)
    if choice == 0:
        return f"[{text}]".encode()
    if choice == 1:
        return f'{{"a": {text}, "a": {text}}}'.encode()
    if choice == 2:
        return ("\ufeff" + text).encode()
    if choice == 3:
        return (text + "\n" + text).encode()
    if choice == 4:
        return json.dumps(text).encode()
    return text.encode("utf-16")


def count_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Hostile contents of a one-integer text file."""
    return ctx.rng.choice([
        b"9" * 5000, b"9" * 100_000, b"-1\n", b" 3 \n", b"3\n4\n", b"0x10", "\u0663\n".encode(),
        "\uff13".encode(), b"3.0", b"1e3", b"", b"\n", b"\x00", b"\xef\xbb\xbf3\n", b"\xff\xfe3\x00",
        b"\xc3\x28", b"+3", b"3_000", b"00000000000000000000003", b"3\r\n", b"NaN", b"18446744073709551616",
    ])


def jsonl_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """A hostile line among the lines of a JSON-lines file."""
    lines = data.split(b"\n")
    i = ctx.rng.randrange(len(lines))
    lines[i] = json_mutate(ctx, lines[i]) if ctx.rng.random() < 0.7 else ctx.rng.choice(
        [b"", b"\x00", b"{", b"\xff\xfe", b"[" * 100_000, b"9" * 5000])
    return b"\n".join(lines)


def table_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Malformed rows of a delimited text file: fields, NUL, huge fields, bad UTF-8, line ends."""
    rng = ctx.rng
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    line = lines[i]
    choice = rng.randrange(14)
    if choice == 0:
        lines[i] = line + rng.choice([b"\t", b","]) + b"extra"
    elif choice == 1:
        lines[i] = line.rsplit(rng.choice([b"\t", b","]), 1)[0]
    elif choice == 2:
        lines[i] = line[:len(line) // 2] + b"\x00" + line[len(line) // 2:]
    elif choice == 3:
        lines[i] = line + b"x" * rng.choice([1 << 16, 1 << 20])
    elif choice == 4:
        lines[i] = line + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
    elif choice == 5:
        return data.replace(b"\n", b"\r\n")
    elif choice == 6:
        return data.replace(b"\n", b"\r")
    elif choice == 7:
        return b"\xef\xbb\xbf" + data
    elif choice == 8:
        lines[i] = rng.choice([b"\t\t\t", b",,,", b'"a,b",c,d', b"\t", b" ", b"a\tb\tc\td\te\tf\tg"])
    elif choice == 9:
        lines[i] = line.replace(b",", b",nan,", 1).replace(b"\t", b"\t\t", 1)
    elif choice == 10:
        field = rng.choice([b"nan", b"inf", b"-1", b"1e999", b"-0", b"", b"0x1", b"1_0", b"\xe2\x80\x8b"])
        parts = line.split(b",")
        parts[-1] = field
        lines[i] = b",".join(parts)
    elif choice == 11:
        lines = lines * rng.choice([2, 50])
    elif choice == 12:
        return b"\n" * rng.choice([1, 1000])
    else:
        lines[i] = b"a\tb\tc" * rng.choice([1, 10_000])
    return b"\n".join(lines)


# --------------------------------------------------------------------------- pickles


def _evil_commands(marker: Path) -> list[tuple[str, str, str]]:
    """(module, name, argument): calls that would create ``marker`` if a loader ran them."""
    m = str(marker)
    return [
        ("os", "system", f"touch {m}"),
        ("posix", "system", f"touch {m}"),
        ("builtins", "exec", f"open({m!r}, 'w').close()"),
        ("builtins", "eval", f"open({m!r}, 'w').close()"),
        ("__builtin__", "eval", f"open({m!r}, 'w').close()"),
        ("subprocess", "getoutput", f"touch {m}"),
        ("pathlib", "Path.touch", m),
        ("torch.serialization", "os.system", f"touch {m}"),
        ("collections", "OrderedDict.__class__.__subclasses__", m),
    ]


def evil_pickle(ctx: MutationContext) -> bytes:
    """A pickle that creates the marker file when unpickled by a loader that trusts it."""
    rng = ctx.rng
    module, name, arg = rng.choice(_evil_commands(ctx.marker))
    style = rng.randrange(5)
    if style == 0:  # protocol 0: GLOBAL + REDUCE
        return f"c{module}\n{name}\n(V{arg}\ntR.".encode()
    if style == 1:  # INST
        return f"(V{arg}\ni{module}\n{name}\n.".encode()
    if style == 2:  # protocol 4: STACK_GLOBAL
        return pickle.dumps(None, protocol=4)[:2] + _stack_global(module, name) + _unicode(arg) + \
            b"\x85R."  # TUPLE1, REDUCE, STOP
    if style == 3:  # STACK_GLOBAL with memoized names that a naive scanner reads as an allowed global
        return (b"\x80\x04" + _unicode(module) + b"\x94" + _unicode(name) + b"\x94" + b"00"  # memo 0, 1
                + _unicode("collections") + _unicode("OrderedDict") + b"00"
                + b"h\x00h\x01\x93" + _unicode(arg) + b"\x85R.")
    # a dict with an evil value inside: the state dict shape, with a payload as one leaf
    inner = f"c{module}\n{name}\n(V{arg}\ntR".encode()
    return b"(dp0\nVstate\np1\n" + inner + b"s."


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def _stack_global(module: str, name: str) -> bytes:
    return _unicode(module) + _unicode(name) + b"\x93"


def pickle_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Put an evil pickle where the loader will read one: bare, inside a zip payload (data.pkl)
    or in place of the legacy container's object pickle."""
    evil = evil_pickle(ctx)
    where = ctx.rng.randrange(3)
    if where == 1 and data.startswith(b"PK\x03\x04"):
        try:
            return _zip_replace(data, evil)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError,
                zlib.error, lzma.LZMAError):
            return evil
    if where == 2 and data.startswith(b"\x80\x02\x8a\x0al"):
        return _legacy_replace(data, evil, ctx.rng)
    return evil


def _zip_replace(data: bytes, evil: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            body = evil if info.filename.endswith("data.pkl") else source.read(info)
            target.writestr(info.filename, body)
    return out.getvalue()


def _legacy_replace(data: bytes, evil: bytes, rng: random.Random) -> bytes:
    """Replace one of the legacy container's five pickles (found by parsing them)."""
    import pickletools

    stream = io.BytesIO(data)
    bounds = []
    try:
        for _ in range(5):
            start = stream.tell()
            for _op in pickletools.genops(stream):
                pass
            bounds.append((start, stream.tell()))
    except (ValueError, EOFError):
        return evil
    start, end = bounds[rng.choice([0, 3, 3, 4])]
    return data[:start] + evil + data[end:]


def payload_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """Rewrite a torch.save zip payload's structure: member sizes, storage shapes, extra members."""
    if not data.startswith(b"PK\x03\x04"):
        return pickle_mutate(ctx, data)
    try:
        source = zipfile.ZipFile(io.BytesIO(data))
        members = {info.filename: source.read(info) for info in source.infolist()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, OverflowError, RuntimeError):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    names = list(members)
    name = rng.choice(names)
    choice = rng.randrange(5)
    if choice == 0:
        members[name] = members[name][: rng.randrange(len(members[name]) + 1)]
    elif choice == 1:
        del members[name]
    elif choice == 2:
        members[name.rsplit("/", 1)[0] + "/data.pkl" if "/" in name else "data.pkl"] = evil_pickle(ctx)
    elif choice == 3:
        pkl = next((n for n in names if n.endswith("data.pkl")), None)
        if pkl is not None:  # bump the sizes the pickle claims: long ints and shape tuples
            members[pkl] = _bump_ints(members[pkl], rng)
    else:
        members[f"{name}.extra"] = b"\x00" * rng.choice([0, 8, 1 << 16])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for member, body in members.items():
            target.writestr(member, body)
    return out.getvalue()


def _bump_ints(pkl: bytes, rng: random.Random) -> bytes:
    """Change BININT1/BININT/LONG1 arguments of a pickle (shapes, strides, offsets, sizes)."""
    buf = bytearray(pkl)
    spots = [i for i, b in enumerate(buf[:-1]) if b in (0x4B, 0x4A)]  # BININT1 K, BININT J
    for i in rng.sample(spots, min(len(spots), rng.choice([1, 2, 4]))):
        if buf[i] == 0x4B:
            buf[i + 1] = rng.choice([0, 1, 255, rng.randrange(256)])
        elif i + 5 <= len(buf):
            buf[i + 1:i + 5] = struct.pack("<i", rng.choice([-1, 0, 2**31 - 1, -(2**31), 10**9]))
    return bytes(buf)


# --------------------------------------------------------------------------- HDF5


_HUGE = [10**12, 2**40, 2**31, 2**33 + 1, 10**9]


def _h5_edit(ctx: MutationContext, data: bytes, edit: Callable[[random.Random, Any], None]) -> bytes:
    """``edit`` applied to the file through h5py, in a forked child: HDF5 editing a file that an
    earlier byte mutation damaged may crash, loop or corrupt its own memory, which must not be
    blamed on (or carried into) the reader that runs next in the same process."""
    import h5py

    path = ctx.scratch / "mutate.h5"
    path.write_bytes(data)
    edit_rng = random.Random(ctx.rng.getrandbits(64))

    def work() -> None:
        with h5py.File(path, "r+") as f:
            edit(edit_rng, f)

    try:
        if not ctx.damaged:  # a file HDF5 itself wrote: edited in this process (no fork to pay)
            try:
                work()
                return path.read_bytes()
            except Exception:
                pass
        elif _in_child(work):
            return path.read_bytes()
        ctx.damaged = True
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)  # a file h5py cannot edit: fall back to bytes
    finally:
        path.unlink(missing_ok=True)


def _in_child(work: Callable[[], None], timeout: float = 10.0) -> bool:
    """Whether ``work()`` returned in a forked child within ``timeout`` seconds."""
    import signal
    import time

    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.0005)


def _datasets(f: Any) -> list[str]:
    import h5py

    found: list[str] = []
    f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
    return found


def _known_names(f: Any) -> list[str]:
    names = ["rel", "lhs", "rhs", "weight", "lhs_offsets", "lhsd_data", "rhs_offsets", "rhsd_data",
             "embeddings", "optimizer/state_dict", "model/relations/0/operator/rhs/translation"]
    try:
        from pbgio.spec.edges import SIDES, data_name, offsets_name

        names += [offsets_name(s) for s in SIDES] + [data_name(s) for s in SIDES]
    except ImportError:
        pass
    return names


def _pick(rng: random.Random, f: Any, existing: float = 0.8) -> str:
    present = _datasets(f)
    if present and rng.random() < existing:
        return rng.choice(present)
    return rng.choice(_known_names(f))


def _delete(f: Any, name: str) -> None:
    if name in f:
        del f[name]


MAX_EDIT_ELEMENTS = 1 << 20


def _values(f: Any, name: str) -> Any:
    """All of dataset ``name``, or None when it claims more elements than an edit reads whole (an
    earlier :func:`h5_huge` made it claim 10^12 rows)."""
    if getattr(f[name], "size", 0) > MAX_EDIT_ELEMENTS:
        return None
    return f[name][...]


def _picked_values(rng: random.Random, f: Any, accept: Callable[[Any], bool] = lambda ds: True
                   ) -> tuple[str, Any] | None:
    """An existing dataset, picked as every mutator picks (:func:`_pick`), that ``accept`` takes,
    with all its values (:func:`_values`); None when the pick is not in the file, is refused, or
    claims too many elements to read whole."""
    name = _pick(rng, f, existing=1.0)
    if name not in f or not accept(f[name]):
        return None
    values = _values(f, name)
    return None if values is None else (name, values)


def h5_huge(rng: random.Random, f: Any) -> None:
    """A dataset claiming a huge size with (almost) nothing written."""
    import numpy as np

    name = _pick(rng, f)
    old = f[name] if name in f and hasattr(f[name], "dtype") else None
    dtype = old.dtype if old is not None and rng.random() < 0.7 else rng.choice(
        [np.int64, np.float32, np.dtype("V1"), np.int32, np.float64])
    _delete(f, name)
    ndim = old.ndim if old is not None and old.ndim else 1
    huge = rng.choice(_HUGE)
    shape = (huge,) if ndim == 1 else (huge // 1000 or 1, 1000)
    chunks = (1 << 16,) if ndim == 1 else (64, 1000)
    if rng.random() < 0.8:
        ds = f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks,
                              maxshape=(None,) * len(shape))
        if rng.random() < 0.5 and ndim == 1:  # the first chunk written, the rest never
            ds[: 1 << 10] = np.ones(1 << 10, dtype=dtype) if dtype != np.dtype("V1") else np.zeros(
                1 << 10, dtype)
    else:
        f.create_dataset(name, shape=shape, dtype=dtype)  # contiguous, never allocated


def h5_dtype(rng: random.Random, f: Any) -> None:
    """A dataset rewritten with another dtype (same values where they convert)."""
    import numpy as np

    picked = _picked_values(rng, f)
    if picked is None:
        return
    name, values = picked
    dtype: Any = rng.choice([np.int32, np.uint64, np.float32, np.float64, np.bool_, ">i8", ">f4", np.int8,
                        "S8", np.dtype([("a", np.int64), ("b", np.float32)]), np.complex64, np.float16])
    _delete(f, name)
    try:
        f.create_dataset(name, data=values.astype(dtype) if np.dtype(dtype).names is None
                         else np.zeros(values.shape, dtype))
    except (TypeError, ValueError):
        f.create_dataset(name, data=np.zeros(values.shape, dtype))


def h5_shape(rng: random.Random, f: Any) -> None:
    """A dataset reshaped: scalar, 2-D, empty, one element more or less."""
    import numpy as np

    picked = _picked_values(rng, f)
    if picked is None:
        return
    name, values = picked
    flat = values.reshape(-1)
    choice = rng.randrange(6)
    new: Any
    if choice == 0:
        new = flat[:1].reshape(()) if flat.size else np.zeros((), values.dtype)
    elif choice == 1:
        new = flat.reshape(1, -1) if flat.size else np.zeros((0, 3), values.dtype)
    elif choice == 2:
        new = flat[:0]
    elif choice == 3:
        new = flat[:-1]
    elif choice == 4:
        new = np.concatenate([flat, flat[:1]]) if flat.size else np.zeros(1, values.dtype)
    else:
        new = np.zeros((2, 2, 2), values.dtype)
    _delete(f, name)
    f.create_dataset(name, data=new)


def h5_values(rng: random.Random, f: Any) -> None:
    """Hostile values in a dataset: negative, huge, NaN, unsorted offsets."""
    import numpy as np

    picked = _picked_values(rng, f, lambda ds: bool(ds.shape) and ds.size > 0 and ds.dtype.kind in "iuf")
    if picked is None:
        return
    name, values = picked
    ds = f[name]
    flat = values.reshape(-1)
    i = rng.randrange(flat.size)
    if ds.dtype.kind == "f":
        flat[i] = rng.choice([np.nan, np.inf, -np.inf, -1.0, 3.4e38])
    elif rng.random() < 0.3:
        flat[:] = flat[::-1]
    else:
        info = np.iinfo(ds.dtype)
        flat[i] = rng.choice([info.min, info.max, -1, 10**12 % info.max, 0])
    ds[...] = values


def h5_attrs(rng: random.Random, f: Any) -> None:
    """Root attributes: format_version, config/json and iteration/* of wrong types and values."""
    import h5py
    import numpy as np

    from pbgio.spec import FORMAT_VERSION_ATTR
    from pbgio.spec.checkpoint import CONFIG_JSON_ATTR, ITERATION_ATTRS

    key = rng.choice([FORMAT_VERSION_ATTR, FORMAT_VERSION_ATTR, CONFIG_JSON_ATTR, *ITERATION_ATTRS])
    sequence = np.empty(1, dtype=h5py.vlen_dtype(np.int32))
    sequence[0] = np.array([1, 2], np.int32)
    value = rng.choice([
        None, "1", np.int64(2), np.int64(-1), np.float64(1.0), np.array([1, 1]), np.array([], np.int64),
        b"\xff\xfe", "{" * 10_000, "9" * 5000, np.int64(2**62), np.bool_(True), np.array([[1]]),
        '{"entities": 1}', "", np.uint64(1), np.int8(1),
        np.array([(1, 2.0)], dtype=[("a", np.int64), ("b", np.float32)]),  # compound: a foreign type
        np.array([1, 2], dtype=h5py.enum_dtype({"a": 1, "b": 2}, basetype="i1")),  # enum
        sequence,  # a variable-length sequence
    ])
    if value is None:
        if key in f.attrs:
            del f.attrs[key]
    else:
        f.attrs[key] = value


def h5_links(rng: random.Random, f: Any) -> None:
    """Datasets replaced by groups, soft links (dangling or cyclic) or external links."""
    import h5py

    name = _pick(rng, f)
    _delete(f, name)
    choice = rng.randrange(4)
    if choice == 0:
        f.create_group(name)
    elif choice == 1:
        f[name] = h5py.SoftLink("/no/such/thing")
    elif choice == 2:
        f[name] = h5py.ExternalLink(rng.choice(["/etc/passwd", "missing.h5", "/dev/zero"]), "/x")
    else:
        f[name] = h5py.SoftLink("/" + name)


def h5_filters(rng: random.Random, f: Any) -> None:
    """A dataset rewritten compressed, checksummed, or with a corrupt-prone layout."""
    picked = _picked_values(rng, f, lambda ds: bool(ds.shape))
    if picked is None:
        return
    name, values = picked
    _delete(f, name)
    choice = rng.randrange(4)
    chunks = tuple(max(1, min(8, n)) for n in values.shape) if values.size else None
    if choice == 0:
        f.create_dataset(name, data=values, compression="gzip", chunks=chunks)
    elif choice == 1:
        f.create_dataset(name, data=values, fletcher32=True, chunks=chunks)
    elif choice == 2:
        f.create_dataset(name, data=values, shuffle=True, compression="lzf", chunks=chunks)
    else:
        f.create_dataset(name, data=values, scaleoffset=0 if values.dtype.kind in "iu" else None,
                         chunks=chunks)


def h5_extra(rng: random.Random, f: Any) -> None:
    """Unknown datasets, groups, and a model group holding odd names."""
    import numpy as np

    name = rng.choice(["extra", "model/entities/user/global_embedding", "model/relations/9/operator/x/y",
                       "model/a.b", "model/relations/-1/operator/rhs/diagonal", "optimizer", "lhs_offsets"])
    _delete(f, name)
    f.create_dataset(name, data=np.zeros(rng.choice([0, 3, 5]), rng.choice([np.float32, np.int64])))


def h5_evil_blob(rng: random.Random, f: Any) -> None:
    """The optimizer blob replaced by an evil pickle (bare or in a zip payload)."""
    import numpy as np

    from pbgio.spec.checkpoint import OPTIMIZER_DATASET

    ctx = MutationContext(rng, [], Path("."),
                          Path(os.environ.get(MARKER_ENV) or Path(tempfile.gettempdir()) / "pbgio-fuzz-marker"))
    found = _values(f, OPTIMIZER_DATASET) if OPTIMIZER_DATASET in f else None
    old = found.tobytes() if found is not None else b""
    evil = pickle_mutate(ctx, old) if rng.random() < 0.7 else payload_mutate(ctx, old)
    _delete(f, OPTIMIZER_DATASET)
    f.create_dataset(OPTIMIZER_DATASET, data=np.frombuffer(evil, dtype=np.dtype("V1")))


def h5_storage(rng: random.Random, f: Any) -> None:
    """A dataset rewritten with the same values in another storage: compact (in the object header),
    external (in a raw file beside it, missing or not), virtual (mapping another dataset), or
    chunked in the other byte order."""
    import h5py
    import numpy as np

    picked = _picked_values(rng, f, lambda ds: isinstance(ds, h5py.Dataset) and bool(ds.shape))
    if picked is None:
        return
    name, values = picked
    _delete(f, name)
    choice = rng.randrange(4)
    if choice == 0 and values.nbytes < 60_000:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        f.create_dataset(name, data=values, dcpl=dcpl)
    elif choice == 1:
        raw = Path(f.filename).with_name(rng.choice(["raw.bin", "missing.bin"]))
        if raw.name == "raw.bin":
            raw.write_bytes(values.tobytes())
        f.create_dataset(name, shape=values.shape, dtype=values.dtype, external=[(raw.name, 0, h5py.h5f.UNLIMITED)])
    elif choice == 2:
        source = f.create_dataset(f"{name}_source", data=values)
        layout = h5py.VirtualLayout(shape=values.shape, dtype=values.dtype)
        layout[...] = h5py.VirtualSource(source)
        f.create_virtual_dataset(name, layout)
    else:
        swapped = values.dtype.newbyteorder()
        f.create_dataset(name, data=values.astype(swapped), chunks=tuple(max(1, min(4, n)) for n in values.shape)
                         if values.size else None)
        if rng.random() < 0.5:
            f[name].attrs["note"] = np.int64(1)


H5_EDITS: list[Callable[[random.Random, Any], None]] = [
    h5_huge, h5_huge, h5_dtype, h5_shape, h5_values, h5_attrs, h5_links, h5_filters, h5_extra, h5_evil_blob,
    h5_storage,
]


def h5_mutate(ctx: MutationContext, data: bytes) -> bytes:
    return _h5_edit(ctx, data, ctx.rng.choice(H5_EDITS))


# --------------------------------------------------------------------------- Parquet


def parquet_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """A table rewritten with wrong column types, nulls, lists, or no rows."""
    import polars as pl

    from pbgio.importers.parquet_check import check_parquet

    try:  # polars aborts the worker on some false claims (the reader checks them the same way)
        check_parquet(io.BytesIO(data), "input")
        frame = pl.read_parquet(io.BytesIO(data))
    except (Exception, pl.exceptions.PanicException):  # a panic is a BaseException
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    rng = ctx.rng
    column = rng.choice(frame.columns) if frame.columns else "x"
    n = frame.height
    choice = rng.randrange(9)
    try:
        if choice == 0:
            frame = frame.with_columns(pl.Series(column, [rng.random() for _ in range(n)]))
        elif choice == 1:
            frame = frame.with_columns(pl.Series(column, [rng.random() < 0.5 for _ in range(n)]))
        elif choice == 2:
            frame = frame.with_columns(pl.Series(column, [None] * n, dtype=pl.String))
        elif choice == 3:
            frame = frame.with_columns(pl.Series(column, [[["a"]]] * n))
        elif choice == 4:
            frame = frame.with_columns(pl.Series(column, [b"\xff\x00"] * n, dtype=pl.Binary))
        elif choice == 5:
            frame = frame.with_columns(pl.Series(column, [{"a": 1}] * n))
        elif choice == 6:
            frame = frame.head(0)
        elif choice == 7:
            frame = frame.with_columns(pl.Series(column, [["x", None, ""]] * n))
        else:
            frame = frame.select(frame.columns[:rng.randrange(len(frame.columns) + 1)])
    except (Exception, pl.exceptions.PanicException):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    out = io.BytesIO()
    try:
        frame.write_parquet(out, row_group_size=rng.choice([1, 7, 1000]))
    except (Exception, pl.exceptions.PanicException):
        return ctx.rng.choice(BYTE_MUTATORS)(ctx, data)
    return out.getvalue()


# --------------------------------------------------------------------------- generation


def slot_mutate(ctx: MutationContext, data: bytes) -> bytes:
    """A layout-level input (its first byte picks the file, see :func:`entity_slot`): another pick, or
    its file mutated as its kind is (Parquet, HDF5, JSON, a count, else delimited text)."""
    if not data or ctx.rng.random() < 0.2:
        return bytes([ctx.rng.randrange(256)]) + data[1:]
    body = data[1:]
    mutate: Mutator = table_mutate
    if body.startswith(b"PAR1"):
        mutate = parquet_mutate
    elif body.startswith(b"\x89HDF"):
        mutate = h5_mutate
    elif body.lstrip()[:1] in (b"[", b"{"):
        mutate = json_mutate
    elif body.strip().isdigit() or not body:
        mutate = count_mutate
    return data[:1] + mutate(ctx, body)


STRUCTURE_MUTATORS: dict[str, list[Mutator]] = {
    "json": [json_mutate, json_mutate, json_wrap],
    "count": [count_mutate],
    "jsonl": [jsonl_mutate],
    "h5": [h5_mutate],
    "pickle": [pickle_mutate, payload_mutate],
    "text-table": [table_mutate],
    "parquet": [parquet_mutate],
    "slotted": [slot_mutate],
}


def generate(target: Target, corpus: list[bytes], seed: int, index: int, scratch: Path,
             marker: Path) -> bytes:
    """Input ``index`` of a campaign: the seeds themselves first, then stacked mutations of them."""
    if index < len(corpus):
        return corpus[index]
    rng = random.Random(f"{seed}/{target.name}/{index}")
    ctx = MutationContext(rng, corpus, scratch, marker)
    data = rng.choice(corpus)
    structural = STRUCTURE_MUTATORS.get(target.kind, [])
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if structural and rng.random() < 0.55:
            data = rng.choice(structural)(ctx, data)
        else:
            data = rng.choice(BYTE_MUTATORS)(ctx, data)
            ctx.damaged = True
    return data[: 8 << 20]
