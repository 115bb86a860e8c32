"""The original's Python config files: ``get_torchbiggraph_config()`` run in a subprocess.

Users of the original PyTorch-BigGraph write their config as a ``config.py`` whose
``get_torchbiggraph_config()`` returns the config dict. Loading one **executes the file**:
:func:`run_python_config` runs it in a child Python process (``sys.executable`` started isolated,
:data:`CHILD_FLAGS`: nothing of the current directory or of ``PYTHON*`` variables is imported; the
file's directory first on ``sys.path`` as for a script; the current directory unchanged), calls the
function, and brings the dict back as JSON through a temporary file, so whatever the config
prints cannot corrupt it (its output is passed on to ``echo``, by default stderr). Values
that are not plain JSON are read as the original's schema reads them: an enum member
(``BucketOrder.INSIDE_OUT``) becomes its lowercase name, a tuple a list, and anything else is
an error naming its key path. mixedCase keys become snake_case, as the original's loader
makes them.

>>> import pathlib, tempfile
>>> cfg_py = pathlib.Path(tempfile.mkdtemp()) / "config.py"
>>> _ = cfg_py.write_text('''
... def get_torchbiggraph_config():
...     print("hello from the config")  # goes to echo, not into the dict
...     return dict(entities={"user": {"num_partitions": 1}},
...                 relations=[{"name": "follows", "lhs": "user", "rhs": "user"}],
...                 dimension=16, entity_path="data", edge_paths=("data/train",),
...                 checkpoint_path="model")
... ''')
>>> raw = run_python_config(cfg_py, echo=None)
>>> raw["edge_paths"], raw["relations"][0]["name"]
(['data/train'], 'follows')

Overrides (``-p key.path=value``) are applied to the dict by :mod:`pbgio.layout` (as to a JSON
config's): :func:`pbgio.layout.load_python_config` and :func:`pbgio.layout.config_from_python`,
and every command through :meth:`pbgio.layout.Layout.load`.

Relative paths: the original resolves ``entity_path``, ``edge_paths``, ``checkpoint_path``
and ``init_path`` against the current directory; pbgio and pbgtrain resolve those of a JSON
config against the JSON file's directory. :func:`rebase_paths` rewrites them for a JSON file
written elsewhere so they still name the same directories.

Running a file is said first, as a :class:`~pbgio.errors.Notice` (``note: running the Python config
…``, :func:`running_notice`): the commands run a ``.py`` config only when the user names it on the
command line, never one found in a layout (a convert source, a checkpoint: those are read as data).

Every failure is a :class:`~pbgio.errors.ConfigError` naming the file: ``config-unreadable``
for the file itself (missing, a syntax error, no ``get_torchbiggraph_config``, the function
raising or returning something other than a dict, a timeout), ``config-schema`` for a value
that is not JSON, with the key it concerns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbgio.checks.config import schema_issue, unreadable
from pbgio.config import ConfigSchema, snake_case_keys
from pbgio.errors import ConfigError, Notice

CONFIG_FUNCTION = "get_torchbiggraph_config"
"""The function a config file defines; it returns the config dict."""

OLD_CONFIG_FUNCTIONS = ("get_torchbiggraph_conf", "get_conf")
"""Names older PyTorch-BigGraph versions used for :data:`CONFIG_FUNCTION` (named in the error)."""

DEFAULT_TIMEOUT = 60.0
"""Seconds the file may take to run and return its config."""

CHILD_FLAGS = ("-I", "-B", "-u")
"""How the child Python starts: isolated (``-I``: no current directory or user site-packages on
``sys.path``, no ``PYTHON*`` environment variable honoured: a ``json.py`` in the current directory or a
``PYTHONPATH`` never runs), writing no bytecode (``-B``), unbuffered (``-u``, so that what the file printed
before a timeout is shown)."""

PATH_KEYS = ("entity_path", "edge_paths", "checkpoint_path", "init_path")
"""Keys holding paths, which the original resolves against the current directory."""

Echo = Callable[[str], object]


def is_python_config(path: str | Path) -> bool:
    """Whether ``path`` names a Python config file (``.py``) rather than a JSON one.

    >>> is_python_config("configs/fb15k_config_cpu.py"), is_python_config("config.json")
    (True, False)
    """
    return Path(path).suffix == ".py"


def echo_to_stderr(text: str) -> None:
    """Where a Python config's output goes by default."""
    sys.stderr.write(text)
    sys.stderr.flush()


# --------------------------------------------------------------------------- running the file

# Runs in the child process, started isolated (``python -I``: neither the current directory nor the
# user's site-packages on sys.path, no PYTHON* variable read), so nothing of the current directory
# runs. Every module the runner uses is imported first; only then is the config's own folder put
# first on sys.path (for the config's imports, as for a script); then the file runs as a module
# (not as __main__), then the function; the answer goes to the result file as {"config": ...} or
# {"error": {...}}.
_RUNNER = r"""
import enum, json, json.decoder, json.encoder, linecache, os, sys, tokenize, traceback, types

config_path, result_path, function, *old_names = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.realpath(config_path)))


def answer(obj):
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no waiting on threads or exit handlers the config started


def fail(kind, message, **extra):
    answer({"error": {"kind": kind, "message": message, **extra}})


def type_name(value):
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def describe(exc):
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type_name(exc)}: {text}" if text else type_name(exc)


def line_of(exc):
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == config_path]
    return lines[-1] if lines else None


class NotJson(Exception):
    pass


def join(where, key):
    return f"{where}.{key}" if where else str(key)


def plain(value, where):
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str) or isinstance(key, enum.Enum):
                raise NotJson(where or "<root>", f"expected str keys, found the {type_name(key)} key {key!r}")
            out[str(key)] = plain(v, join(where, key))
        return out
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise NotJson(where or "<root>", "expected a JSON value (str, number, bool, None, list, tuple, dict) "
                  f"or an enum member, found {type_name(value)} {shown}")


try:
    with open(config_path, "rb") as f:
        source = f.read()
except OSError as exc:
    fail("unreadable", f"expected a readable file, found {describe(exc)}")
try:
    code = compile(source, config_path, "exec", dont_inherit=True)
except SyntaxError as exc:
    fail("syntax", exc.msg, line=exc.lineno)
except ValueError as exc:
    fail("unreadable", f"expected Python source, found {describe(exc)}")
module = types.ModuleType("pbg_python_config")
module.__file__ = config_path
sys.modules[module.__name__] = module
try:
    exec(code, module.__dict__)
except BaseException as exc:
    fail("exec", describe(exc), line=line_of(exc),
         missing=getattr(exc, "name", None) if isinstance(exc, ImportError) else None)
get_config = module.__dict__.get(function)
if get_config is None:
    fail("no-function", "", found=[n for n in old_names if callable(module.__dict__.get(n))])
if not callable(get_config):
    fail("not-callable", type_name(get_config))
try:
    value = get_config()
except BaseException as exc:
    fail("call", describe(exc), line=line_of(exc))
if not isinstance(value, dict):
    fail("not-dict", type_name(value))
try:
    data = plain(value, "")
except NotJson as exc:
    fail("not-json", exc.args[1], key=exc.args[0])
answer({"config": data})
"""


def _unreadable(source: str, message: str) -> ConfigError:
    return ConfigError(source, [unreadable(source, message)])


def _error_from_child(source: str, error: dict[str, Any]) -> ConfigError:
    kind, message = error["kind"], error["message"]
    at = f" at line {error['line']}" if error.get("line") else ""
    call = f"{CONFIG_FUNCTION}()"
    if kind == "syntax":
        return _unreadable(source, f"expected Python source, found a syntax error{at}: {message}")
    if kind == "exec":
        hint = ""
        if (error.get("missing") or "").split(".")[0] == "torchbiggraph":
            hint = (" (the file imports the original PyTorch-BigGraph: install it in this Python "
                    "environment, or write its enum values as strings, e.g. bucket_order=\"inside_out\")")
        return _unreadable(source, f"running the file raised {message}{at}{hint}")
    if kind == "no-function":
        found = error.get("found") or []
        hint = (f" (the file defines {found[0]}(), the name older PyTorch-BigGraph versions used; "
                f"rename it to {CONFIG_FUNCTION})" if found else "")
        return _unreadable(source, f"expected a function {call} returning the config dict, found none{hint}")
    if kind == "not-callable":
        return _unreadable(source, f"expected {CONFIG_FUNCTION} to be a function, found {message}")
    if kind == "call":
        return _unreadable(source, f"{call} raised {message}{at}")
    if kind == "not-dict":
        return _unreadable(source, f"expected {call} to return a dict, found {message}")
    if kind == "not-json":
        return ConfigError(source, [schema_issue(source, error["key"], message)])
    return _unreadable(source, message)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the file's own child processes too
    except (AttributeError, OSError):
        proc.kill()
    proc.wait()


def _run_file(path: Path, timeout: float, echo: Echo | None) -> dict[str, Any]:
    source = str(path)
    with tempfile.TemporaryDirectory(prefix="pbg-pyconfig-") as tmp:
        result, out, err = Path(tmp) / "result.json", Path(tmp) / "stdout", Path(tmp) / "stderr"
        args = [sys.executable, *CHILD_FLAGS, "-c", _RUNNER, str(path.absolute()), str(result),
                CONFIG_FUNCTION, *OLD_CONFIG_FUNCTIONS]
        timed_out = False
        with out.open("wb") as fout, err.open("wb") as ferr:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill(proc)
        printed = out.read_text(encoding="utf-8", errors="replace")
        errors = err.read_text(encoding="utf-8", errors="replace")
        if echo is not None and (printed or errors):
            echo(printed + errors)
        if timed_out:
            raise _unreadable(source, f"expected {CONFIG_FUNCTION}() to return within {timeout:g} s, found the "
                              "file still running (it was stopped; allow it more time with a longer timeout)")
        try:
            data = result.read_bytes()
        except OSError:
            last = next((line for line in reversed(errors.splitlines()) if line.strip()), "no message")
            raise _unreadable(source, f"the Python process running the file exited with status "
                              f"{proc.returncode} before returning a config: {last.strip()}") from None
    return read_answer(source, data)


_ERROR_FIELDS: dict[str, tuple[type, ...]] = {"kind": (str,), "message": (str,), "line": (int, type(None)),
                                             "missing": (str, type(None)), "key": (str,), "found": (list,)}
"""The fields of an error answer and their types (``key`` only for ``not-json``, ``found`` a list of names)."""


def _wrong_field(error: dict[str, Any], name: str, types: tuple[type, ...]) -> str:
    found = type(error[name]).__name__ if name in error else "nothing"
    return f"{name!r}: expected {' or '.join(t.__name__ for t in types)}, found {found}"


def read_answer(source: str, data: bytes) -> dict[str, Any]:
    """The config dict in the answer ``data`` the child process wrote for the file ``source``:
    ``{"config": {...}}``, or ``{"error": {...}}`` raised as its ConfigError. The file runs with
    the answer's path in its ``sys.argv`` and can write over it, so every other answer is a
    ``config-unreadable`` ConfigError saying what was found (found by the guided fuzzer)."""
    try:
        answer = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _unreadable(source, f"expected the Python process running the file to answer with JSON, found "
                          f"unreadable bytes ({type(exc).__name__}: {str(exc)[:120]}); did the file write over "
                          "its answer?") from None
    if isinstance(answer, dict) and set(answer) == {"config"} and isinstance(answer["config"], dict):
        config: dict[str, Any] = answer["config"]
        return config
    error = answer.get("error") if isinstance(answer, dict) and set(answer) == {"error"} else None
    if isinstance(error, dict):
        wrong = next((_wrong_field(error, name, types) for name, types in _ERROR_FIELDS.items()
                      if (name in error or name in ("kind", "message")) and not isinstance(error.get(name), types)),
                     None)
        if wrong is None and error["kind"] == "not-json" and not isinstance(error.get("key"), str):
            wrong = "'key': expected str, found nothing"
        if wrong is None and not all(isinstance(n, str) for n in error.get("found") or []):
            wrong = "'found': expected a list of names"
        if wrong is None:
            raise _error_from_child(source, error)
        raise _unreadable(source, f"expected the Python process running the file to answer with an error "
                          f"{{\"kind\": ..., \"message\": ...}}, found one whose field {wrong}; did the file write "
                          "over its answer?")
    shown = type(answer).__name__ if not isinstance(answer, dict) else f"a dict with the keys {sorted(answer)[:5]}"
    raise _unreadable(source, "expected the Python process running the file to answer with {\"config\": {...}} or "
                      f"{{\"error\": {{...}}}}, found {shown}; did the file write over its answer?")


def run_python_config(path: str | Path, *, timeout: float = DEFAULT_TIMEOUT,
                      echo: Echo | None = echo_to_stderr) -> dict[str, Any]:
    """The dict ``get_torchbiggraph_config()`` of ``path`` returns, as JSON values, its keys in
    snake_case (no overrides: :func:`pbgio.layout.load_python_config` applies them).

    The file is **executed** in a subprocess (see the module doc) and stopped after ``timeout``
    seconds. What it prints goes to ``echo`` (default: stderr; ``None`` drops it). Raises
    :class:`~pbgio.errors.ConfigError` naming the file for every problem.
    """
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise _unreadable(source, "expected a Python config file, found nothing at this path")
    if path.is_dir():
        raise _unreadable(source, "expected a Python config file, found a directory")
    warnings.warn(Notice(running_notice(source)), stacklevel=2)
    return snake_case_keys(_run_file(path, timeout, echo))


def running_notice(source: str) -> str:
    """What a command says first when it runs the Python config ``source`` (printed ``note: …``): pbg
    runs a ``.py`` config only when the user names it, never one it finds in a layout.

    >>> running_notice("configs/fb15k.py")
    'running the Python config configs/fb15k.py: its code runs with your permissions'
    """
    return f"running the Python config {source}: its code runs with your permissions"


# --------------------------------------------------------------------------- relative paths

def _is_relative_path(location: str) -> bool:
    return "://" not in location and not os.path.isabs(location)


def rebase_paths(cfg: ConfigSchema, from_dir: str | Path, to_dir: str | Path
                 ) -> tuple[ConfigSchema, dict[str, tuple[str, str]]]:
    """``cfg`` with its relative paths rewritten from ``from_dir`` to ``to_dir``; and what changed.

    A path relative to ``from_dir`` (for the original: the current directory) becomes the
    path relative to ``to_dir`` (for a JSON config: its directory) of the same directory.
    Absolute paths and URLs (anything with ``://``) are kept. The changes map each key path
    to its old and new value.

    >>> from pbgio.config import parse_config
    >>> cfg = parse_config({"entities": {"e": {"num_partitions": 1}},
    ...     "relations": [{"name": "r", "lhs": "e", "rhs": "e"}], "dimension": 8,
    ...     "entity_path": "data", "edge_paths": ["data/train", "/abs/edges", "s3://bucket/edges"],
    ...     "checkpoint_path": "out/model"})
    >>> rebased, changed = rebase_paths(cfg, "/work/run", "/work/run/out")
    >>> rebased.entity_path, rebased.edge_paths, rebased.checkpoint_path
    ('../data', ['../data/train', '/abs/edges', 's3://bucket/edges'], 'model')
    >>> for key, (old, new) in changed.items():
    ...     print(f"{key}: {old} -> {new}")
    entity_path: data -> ../data
    edge_paths[0]: data/train -> ../data/train
    checkpoint_path: out/model -> model
    """
    src, dst = os.path.realpath(from_dir), os.path.realpath(to_dir)
    changed: dict[str, tuple[str, str]] = {}

    def rebase(key: str, location: str) -> str:
        if not _is_relative_path(location):
            return location
        new = os.path.relpath(os.path.join(src, location), dst)
        if new != location:
            changed[key] = (location, new)
        return new

    update: dict[str, Any] = {}
    for key in PATH_KEYS:
        value = getattr(cfg, key)
        if isinstance(value, list):
            update[key] = [rebase(f"{key}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, str):
            update[key] = rebase(key, value)
    return cfg.model_copy(update=update), changed
