"""The rules of a checkpoint directory: versions, files, configs, attributes, embeddings, model
parameters, snapshots and training stats (the optimizer blob: :mod:`pbgio.checks.optimizer`;
the version file's text: :func:`pbgio.checks.entities.count_format`).

>>> print(embeddings_dataset("embeddings_user_0.v1.h5", "Dataset", 1, np.dtype("float64")))
embeddings_user_0.v1.h5: embeddings: expected a 2-D float32 dataset, found 1-D float64 [embeddings-dataset]
>>> [i.rule for i in stats_line("training_stats.json", 0, {"stats": {"count": 1, "metrics": {}}})]
['training-stats-index']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.checks import RowProblem, is_float32, row_problem
from pbgio.errors import Issue
from pbgio.spec.checkpoint import (
    CONFIG_JSON_ATTR,
    EMBEDDINGS_DATASET,
    GROWN_LAYOUT_HINT,
    MODEL_DEFINING_KEYS,
    MODEL_GROUP,
    STATE_DICT_KEY_ATTR,
)
from pbgio.spec.naming import CHECKPOINT_VERSION
from pbgio.spec.rules import rule
from pbgio.spec.stats import STATS_KEYS, is_int, stats_object_problem

Shape = tuple[int, ...]


# --------------------------------------------------------------------------- the directory


def file_missing(file: str | None, version: int, *, total: int = 1) -> Issue:
    """``checkpoint-file-missing``: a file of the committed ``version`` is absent (with ``total`` > 1:
    the first of ``total`` absent files, one issue for them all)."""
    if total <= 1:
        return rule("checkpoint-file-missing").issue(
            file, None, f"expected this file of committed version {version}, found none")
    return rule("checkpoint-file-missing").issue(
        file, None, f"expected this file of committed version {version}, found none (and {total - 1:,} more "
                    f"missing)", count=total)


def config_missing(file: str | None, version: int) -> Issue | None:
    """``checkpoint-config-missing``: no config.json beside committed ``version`` (> 0)."""
    if version <= 0:
        return None
    return rule("checkpoint-config-missing").issue(
        file, None, f"expected config.json beside committed version {version}, found none")


def stale_files(file: str | None, version: int, stale: int, count: int) -> Issue:
    """``checkpoint-stale-files``: ``count`` files of version ``stale`` beside committed ``version``."""
    return rule("checkpoint-stale-files").issue(
        file, None, f"expected only files of version {version} (and v0 or snapshots), found {count} "
        f"file(s) of version {stale}, likely left by an interrupted checkpoint write")


def snapshot_broken(file: str | None, *, dangling: object = None, version: int | None = None,
                    missing: Sequence[str] = (), total: int | None = None) -> Issue | None:
    """``checkpoint-snapshot-broken`` of an ``epoch_{k}/`` (or ``best/``) snapshot: a link ``dangling`` to a
    missing target; a version file naming ``version`` 0 or absent (None); ``missing`` files of
    its version (the first few of ``total``, when given)."""
    if dangling is not None:
        message = f"expected the link to resolve, found it points to missing {dangling}"
    elif version is None or version == 0:
        message = (f"expected {CHECKPOINT_VERSION} naming the preserved version, found "
                   f"{'none' if version is None else 'version 0'}")
    elif missing:
        message = (f"expected this file of preserved version {version} in the snapshot, found none"
                   + (f" (and {(total or len(missing)) - 1:,} more missing)" if (total or len(missing)) > 1 else ""))
    else:
        return None
    return rule("checkpoint-snapshot-broken").issue(file, None, message)


def config_mismatch(file: str | None, reference: Mapping[str, Any], found: Mapping[str, Any], what: str, *,
                    dataset: str | None = None, each_key: bool = False, keys: Sequence[str] = MODEL_DEFINING_KEYS,
                    fix: str = "use a new checkpoint_path or the same model settings") -> list[Issue]:
    """``checkpoint-config-mismatch``: ``found`` (a config as a dict) agrees with ``reference``,
    the config of ``what``, on ``keys`` (by default those that define the model). One issue for
    the first key (sorted) that differs; with ``each_key`` (a trainer resuming ``what``, a reader
    of it), one per key, each naming its key, both values and ``fix``.

    >>> [str(i) for i in config_mismatch("model/config.json", {"dimension": 100}, {"dimension": 200},
    ...                                  "the checkpoint", each_key=True, keys=("dimension",))]
    ['model/config.json: dimension: expected dimension as in the checkpoint (100), found 200; use a new \
checkpoint_path or the same model settings [checkpoint-config-mismatch]']
    """
    if each_key:
        return [rule("checkpoint-config-mismatch").issue(
            file, key, f"expected {key} as in {what} ({reference.get(key)!r}), found {found.get(key)!r}; {fix}")
            for key in keys if reference.get(key) != found.get(key)]
    defining = [k for k in _differ(reference, found) if k in keys]
    if not defining:
        return []
    key = defining[0]
    return [rule("checkpoint-config-mismatch").issue(
        file, dataset, f"expected {key} = {json.dumps(reference.get(key))} as in {what}, found "
        f"{json.dumps(found.get(key))}" + (f" (and {len(defining) - 1} more keys)" if len(defining) > 1 else ""))]


def config_drift(file: str | None, reference: Mapping[str, Any], found: Mapping[str, Any], what: str, *,
                 dataset: str | None = None) -> Issue | None:
    """``checkpoint-config-drift``: ``found`` agrees with ``reference`` on the other keys too."""
    others = [k for k in _differ(reference, found) if k not in MODEL_DEFINING_KEYS]
    if not others:
        return None
    return rule("checkpoint-config-drift").issue(
        file, dataset, f"expected the same config as {what}, found different {', '.join(others[:5])}")


def _differ(reference: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(reference) | set(found) if reference.get(k) != found.get(k))


def file_attrs(file: str | None, missing: Sequence[str] = (), bad_config: str | None = None) -> Issue | None:
    """``checkpoint-attrs``: the root attributes a checkpoint file lacks (``missing``), or the
    first line of why its config/json attribute is no valid config (``bad_config``)."""
    if missing:
        return rule("checkpoint-attrs").issue(file, None, f"expected root attributes {', '.join(missing)}, found none")
    if bad_config is not None:
        return rule("checkpoint-attrs").issue(
            file, CONFIG_JSON_ATTR, f"expected a valid config in attribute {CONFIG_JSON_ATTR}, found one that "
            f"fails: {bad_config}")
    return None


# --------------------------------------------------------------------------- embeddings


def embeddings_dataset(file: str | None, kind: str | None, ndim: int | None = None,
                       dtype: np.dtype[Any] | None = None) -> Issue | None:
    """``embeddings-dataset``: the member ``embeddings`` (a ``kind``: Dataset, Group …; None:
    absent) is a 2-D float32 dataset."""
    if kind == "Dataset" and ndim == 2 and dtype is not None and is_float32(dtype):
        return None
    found = "none" if kind is None else (f"{ndim}-D {dtype}" if kind == "Dataset" else f"a {kind.lower()}")
    return rule("embeddings-dataset").issue(file, EMBEDDINGS_DATASET, f"expected a 2-D float32 dataset, found {found}")


def embeddings_shape(file: str | None, entity_type: str, shape: Shape, expected: Shape, *,
                     grown: bool = False, source: str | None = None) -> Issue | None:
    """``embeddings-shape``: a table of ``shape`` has the ``expected`` (entity count, dimension)
    of ``entity_type`` (``source`` says where they come from); ``grown`` adds the hint that the
    layout grew since the table was written."""
    if tuple(shape) == tuple(expected):
        return None
    where = f"from {source}" if source else f"(entity count x dimension of {entity_type!r})"
    hint = f"; {GROWN_LAYOUT_HINT}" if grown else ""
    return rule("embeddings-shape").issue(
        file, EMBEDDINGS_DATASET, f"expected shape {tuple(expected)} {where}, found {tuple(shape)}{hint}")


def nonfinite(rule_id: str, dataset: str, values: NDArray[Any]) -> RowProblem | None:
    """Rows (first axis) of ``values`` holding a non-finite number; a 0-D value is one row."""
    if values.ndim == 0:
        return row_problem(rule_id, dataset, ~np.isfinite(values.reshape(1)),
                           lambda _: f"expected a finite value, found {values}")
    block = values.reshape(len(values), -1)
    return row_problem(rule_id, dataset, ~np.isfinite(block).all(axis=1),
                       lambda i: f"expected finite values, found {block[i][~np.isfinite(block[i])].ravel()[0]}")


def embeddings_nonfinite(values: NDArray[Any]) -> RowProblem | None:
    """``embeddings-nonfinite``: embedding rows (a block of them) hold finite values only."""
    return nonfinite("embeddings-nonfinite", EMBEDDINGS_DATASET, values)


# --------------------------------------------------------------------------- the model


def param_name(file: str | None, name: str, *, known: bool) -> Issue | None:
    """``model-param-name``: parameter dataset ``name`` (under model/) has a name that maps to a
    state-dict key and names an index, side, parameter and type the config has (``known``)."""
    if known:
        return None
    return _param_name(file, f"{MODEL_GROUP}/{name}", "expected relations/{idx}/operator/{side}/{param} or "
                       "entities/{type}/global_embedding for an index, side, parameter and type the config has, "
                       "found this dataset")


def param_member(file: str | None, where: str, kind: str, *, group: bool) -> Issue | None:
    """``model-param-name`` of a member ``where`` of the model group that is a ``kind`` (a type
    name: Dataset, Group, Datatype): the model member itself is a group (``group``), the members
    below it datasets or groups."""
    if group:
        return None if kind == "Group" else _param_name(file, where, f"expected a group, found a {kind}")
    if kind in ("Dataset", "Group"):
        return None
    return _param_name(file, where, f"expected a dataset or a group, found a {kind}")


def param_names(file: str | None, dataset: str | None, found: Sequence[str], expected: Sequence[str]) -> Issue | None:
    """``model-param-name`` of a whole set of parameters: those ``found`` (in a file) are those
    ``expected`` (of a model)."""
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if not missing and not unexpected:
        return None
    return _param_name(file, dataset, f"expected the parameters {sorted(expected)}, found {sorted(found)} "
                       f"(missing {missing}, unexpected {unexpected})")


def _param_name(file: str | None, dataset: str | None, message: str) -> Issue:
    return rule("model-param-name").issue(file, dataset, message)


def state_dict_key(file: str | None, name: str, private: str, key: str | None) -> Issue | None:
    """``model-state-dict-key``: parameter ``name`` carries the state_dict_key ``private``."""
    if key == private:
        return None
    return rule("model-state-dict-key").issue(
        file, f"{MODEL_GROUP}/{name}", f"expected attribute {STATE_DICT_KEY_ATTR} = {private!r}, found {key!r}")


def param_dtype(file: str | None, name: str, dtype: np.dtype[Any]) -> Issue | None:
    """``model-param-dtype``: parameter ``name`` is float32."""
    if is_float32(dtype):
        return None
    return rule("model-param-dtype").issue(file, f"{MODEL_GROUP}/{name}", f"expected float32, found {dtype}")


def param_shape(file: str | None, name: str, shape: Shape, expected: Shape | None, *,
                source: str | None = None) -> Issue | None:
    """``model-param-shape``: parameter ``name`` has the ``expected`` shape (None: unknown)
    that its operator and dimension give (``source`` says where that comes from)."""
    if expected is None or tuple(shape) == tuple(expected):
        return None
    where = f" from {source}" if source else ""
    return rule("model-param-shape").issue(
        file, f"{MODEL_GROUP}/{name}", f"expected shape {tuple(expected)}{where}, found {tuple(shape)}")


def param_missing(file: str | None, names: Sequence[str]) -> list[Issue]:
    """``model-param-missing``: each parameter of ``names`` (the config's, sorted) the file lacks."""
    return [rule("model-param-missing").issue(
        file, f"{MODEL_GROUP}/{name}", "expected this parameter (from the config's operators and global_emb), "
        "found none") for name in names]


def param_nonfinite(name: str, values: NDArray[Any]) -> RowProblem | None:
    """``model-param-nonfinite``: a parameter (a block of its rows) holds finite values only."""
    return nonfinite("model-param-nonfinite", f"{MODEL_GROUP}/{name}", values)


# --------------------------------------------------------------------------- training stats


def stats_format(file: str | None, index: int, message: str) -> Issue:
    """``training-stats-format``: line ``index`` (0-based) is no JSON object (``message``: what is)."""
    return rule("training-stats-format").issue(file, None, f"line {index + 1}: {message}", rows=(index,), count=1)


def stats_line(file: str | None, index: int, value: Any) -> list[Issue]:
    """The issues of line ``index`` (0-based) of training_stats.json, parsed as ``value``
    (``training-stats-format``, ``training-stats-index``, ``training-stats-object``)."""
    if not isinstance(value, dict):
        return [stats_format(file, index, f"expected a JSON object, found a JSON {type(value).__name__}")]
    problems = []
    if not (is_int(value.get("index")) and value["index"] >= 0):
        found = "none" if "index" not in value else repr(value["index"])
        problems.append(("training-stats-index",
                         f"expected an integer index ≥ 0 (the original reads it from every line), found {found}"))
    for name in STATS_KEYS:
        if name in value:
            problem = stats_object_problem(name, value[name])
            if problem:
                problems.append(("training-stats-object", problem))
    return [rule(rule_id).issue(file, None, f"line {index + 1}: {message}", rows=(index,), count=1)
            for rule_id, message in problems]
