"""The original's Python config files: ``get_torchbiggraph_config()`` run in a subprocess.

Users of the original PyTorch-BigGraph write their config as a ``config.py`` whose
``get_torchbiggraph_config()`` returns the config dict. Loading one **executes the file**:
:func:`load_python_config` runs it in a child Python process (``sys.executable``, the file's
directory first on ``sys.path`` as for a script, the current directory unchanged), calls the
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
>>> raw = load_python_config(cfg_py, ["num_epochs=3", "relations.0.all_negs=true"], echo=None)
>>> raw["edge_paths"], raw["num_epochs"], raw["relations"][0]["all_negs"]
(['data/train'], 3, 'true')
>>> config_from_python(cfg_py, echo=None).relations[0].name
'follows'

Overrides (``-p key.path=value``) follow the original's ``override_config_dict``, with field
types taken from :class:`pbgio.config.ConfigSchema`: see :func:`override_config_dict`.

Relative paths: the original resolves ``entity_path``, ``edge_paths``, ``checkpoint_path``
and ``init_path`` against the current directory; pbgio and pbgtrain resolve those of a JSON
config against the JSON file's directory. :func:`rebase_paths` rewrites them for a JSON file
written elsewhere so they still name the same directories.

Every failure is a :class:`~pbgio.errors.ConfigError` naming the file: ``config-unreadable``
for the file itself (missing, a syntax error, no ``get_torchbiggraph_config``, the function
raising or returning something other than a dict, a timeout), ``config-schema`` for a value
that is not JSON or a bad override, each with the key it concerns.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pbgio.checks.config import schema_issue, unreadable
from pbgio.config import ConfigSchema, did_you_mean, parse_config, snake_case_keys
from pbgio.errors import ConfigError, Issue

CONFIG_FUNCTION = "get_torchbiggraph_config"
"""The function a config file defines; it returns the config dict."""

OLD_CONFIG_FUNCTIONS = ("get_torchbiggraph_conf", "get_conf")
"""Names older PyTorch-BigGraph versions used for :data:`CONFIG_FUNCTION` (named in the error)."""

DEFAULT_TIMEOUT = 60.0
"""Seconds the file may take to run and return its config."""

PATH_KEYS = ("entity_path", "edge_paths", "checkpoint_path", "init_path")
"""Keys holding paths, which the original resolves against the current directory."""

Echo = Callable[[str], object]


def is_python_config(path: str | Path) -> bool:
    """Whether ``path`` names a Python config file (``.py``) rather than a JSON one.

    >>> is_python_config("configs/fb15k_config_cpu.py"), is_python_config("config.json")
    (True, False)
    """
    return Path(path).suffix == ".py"


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


# --------------------------------------------------------------------------- running the file

# Runs in the child process: stdlib imports first (before the config's directory can shadow
# them), then the file as a module (not as __main__), then the function; the answer goes to
# the result file as {"config": ...} or {"error": {...}}.
_RUNNER = r"""
import enum, json, os, sys, traceback, types

config_path, result_path, function, *old_names = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.realpath(config_path))


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
        args = [sys.executable, "-B", "-c", _RUNNER, str(path.absolute()), str(result),
                CONFIG_FUNCTION, *OLD_CONFIG_FUNCTIONS]
        timed_out = False
        with out.open("wb") as fout, err.open("wb") as ferr:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
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
            answer = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last = next((line for line in reversed(errors.splitlines()) if line.strip()), "no message")
            raise _unreadable(source, f"the Python process running the file exited with status "
                              f"{proc.returncode} before returning a config: {last.strip()}") from None
    if "error" in answer:
        raise _error_from_child(source, answer["error"])
    config: dict[str, Any] = answer["config"]
    return config


def load_python_config(path: str | Path, overrides: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
                       echo: Echo | None = _to_stderr) -> dict[str, Any]:
    """The dict ``get_torchbiggraph_config()`` of ``path`` returns, as JSON values, overrides applied.

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
    raw = snake_case_keys(_run_file(path, timeout, echo))
    return override_config_dict(raw, overrides, source)


def config_from_python(path: str | Path, overrides: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
                       echo: Echo | None = _to_stderr) -> ConfigSchema:
    """:func:`load_python_config` validated by :func:`pbgio.config.parse_config` (every problem, with rule ids)."""
    return parse_config(load_python_config(path, overrides, timeout=timeout, echo=echo), str(path))


# --------------------------------------------------------------------------- keys and overrides

class _BadOverride(Exception):
    pass


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``tp`` without ``Annotated`` and ``Optional``; and whether it was optional."""
    optional = False
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union or origin is types.UnionType:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            if len(args) != 1:
                return tp, optional
            tp = args[0]
        else:
            return tp, optional


def _override_type(keys: list[str]) -> tuple[Any, bool]:
    """The type of the field at ``keys`` in :class:`ConfigSchema` (the original's ``extract_nested_type``)."""
    tp: Any = ConfigSchema
    optional = False
    for i, key in enumerate(keys):
        tp, _ = _unwrap(tp)
        where = ".".join(keys[:i]) or "the config"
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if key not in tp.model_fields:
                raise _BadOverride(f"{where} has no key {key!r}{did_you_mean(key, list(tp.model_fields))}")
            tp = tp.model_fields[key].annotation
        elif typing.get_origin(tp) is list:
            if not key.isdigit():
                raise _BadOverride(f"expected an index into the list {where}, found {key!r}")
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            raise _BadOverride(f"{where} is a single value, it has no key {key!r}")
        tp, optional = _unwrap(tp)
    return tp, optional


def _convert(value: str, tp: Any, optional: bool) -> Any:
    if optional and value.strip().lower() in ("null", "none"):
        return None
    if typing.get_origin(tp) is list:
        return value.split(",")
    if tp is int or tp is float:
        try:
            return tp(value)
        except ValueError:
            raise _BadOverride(f"expected {'an int' if tp is int else 'a number'}, found {value!r}") from None
    return value  # str, bool, enum-like: the schema parses the string


def _inject(data: Any, keys: list[str], value: Any) -> None:
    """The original's ``inject_nested_value``: every key but the last must exist."""
    node = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(keys[:i]) or "the config"
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise _BadOverride(f"expected an index below {len(node)} into {where}, found {key!r}")
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            elif key not in node:
                raise _BadOverride(f"{where} has no key {key!r} in this config")
            else:
                node = node[key]
        else:
            raise _BadOverride(f"expected {where} to be a dict or a list, found {type(node).__name__}")


def override_config_dict(data: dict[str, Any], overrides: Iterable[str], source: str = "<config>") -> dict[str, Any]:
    """A copy of ``data`` with ``key.path=value`` overrides applied as the original applies them.

    Dotted paths go into dicts and lists (``relations.0.all_negs``, ``entities.user.num_partitions``);
    the value of a list field is split on commas, of an int or float field converted, of any
    other field left as a string for the schema to parse. Field types come from
    :class:`pbgio.config.ConfigSchema`. One addition to the original: ``null`` or ``none`` sets
    a field that may be null to null. Every bad override is reported, by its key:

    >>> raw = {"entities": {"user": {"num_partitions": 1}}, "edge_paths": ["a"],
    ...        "relations": [{"name": "r", "lhs": "user", "rhs": "user"}]}
    >>> out = override_config_dict(raw, ["edge_paths=a,b", "entities.user.num_partitions=4",
    ...                                  "relations.0.all_negs=true", "lr=0.5", "max_norm=null"])
    >>> out["edge_paths"], out["entities"]["user"], out["relations"][0]["all_negs"], out["lr"], out["max_norm"]
    (['a', 'b'], {'num_partitions': 4}, 'true', 0.5, None)
    >>> try:
    ...     override_config_dict(raw, ["relations.3.name=x", "numEpochs=3", "dimension=big", "lr"])
    ... except ConfigError as e:
    ...     for issue in e.issues:
    ...         print(issue.dataset, "|", issue.message)
    relations.3.name | bad override 'relations.3.name=x': expected an index below 1 into relations, found '3'
    numEpochs | bad override 'numEpochs=3': the config has no key 'numEpochs' (did you mean 'num_epochs'?)
    dimension | bad override 'dimension=big': expected an int, found 'big'
    lr | bad override 'lr': expected key=value, found no '='
    """
    data = copy.deepcopy(data)
    issues: list[Issue] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        keys = key.split(".")
        try:
            if not sep or not key:
                raise _BadOverride("expected key=value, found no '='")
            tp, optional = _override_type(keys)
            _inject(data, keys, _convert(value, tp, optional))
        except _BadOverride as exc:
            issues.append(schema_issue(source, key or override, f"bad override {override!r}: {exc}"))
    if issues:
        raise ConfigError(source, issues)
    return data


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
