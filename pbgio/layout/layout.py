"""The :class:`Layout`: a run config, the folder its relative paths resolve against, and where it
came from; and a checkpoint version read as what it is (:class:`CheckpointVersion`).

Every command that takes a config builds one Layout (:meth:`Layout.load`: a JSON file, the
original's Python config, or a :class:`~pbgio.config.ConfigSchema` in memory, with ``-p``
overrides) and hands it down; nothing below rebuilds the config or guesses its folder again.

**One rule for paths.** The config's paths (``entity_path``, ``edge_paths``, ``checkpoint_path``,
``init_path``) resolve against :attr:`Layout.base`. A path named on a command line (``--edges``,
``--filter``, ``--valid``, ``--checkpoint`` …) follows the same rule: relative to the config's
folder, whatever the current directory; ``./`` or ``../`` in front means the current directory;
absolute paths and URLs are taken as written (:meth:`Layout.argument_path`).

**A checkpoint is read as what it is.** :meth:`Layout.open_checkpoint` compares what the stored
model depends on between the config as passed and the checkpoint's own ``config.json`` (what it
was trained with), once, for every reader (export, neighbours, indexes, eval, predict, report):

- settings that only describe the stored model (``dimension``, ``comparator``, ``global_emb``,
  ``bias``, each relation's ``operator``, an entity type's ``dimension``) are read from the
  checkpoint, and a :class:`~pbgio.errors.StoredSettingsNote` says so on one line;
- settings that tie the model to the layout's files must agree: the entity types the config
  names, their partitions and featurization; for a reader that builds the model (eval, predict,
  the export of relation parameters), the relations' names and types and ``dynamic_relations``
  too. Otherwise a ``checkpoint-config-mismatch`` error names both values and the fix.

A resumed fit is stricter (:meth:`Layout.check_resumable`): every model setting, and the plan of
edge paths its versions count, must be the checkpoint's.

>>> import tempfile, pathlib
>>> from pbgio.example import build_example
>>> layout = Layout.load(build_example(pathlib.Path(tempfile.mkdtemp()), num_edges=100),
...                      overrides=["num_epochs=2"])
>>> layout.config.num_epochs, layout.entity_path.name, layout.checkpoint_path == layout.base / "checkpoint"
(2, 'entities', True)
>>> layout.argument_path("edges/test") == layout.base / "edges" / "test"
True
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pbgio import confinement, storage
from pbgio.checkpoint import CheckpointDir
from pbgio.checks.checkpoint import config_mismatch
from pbgio.checks.files import link_outside
from pbgio.config import ConfigSchema, parse_config, read_config_json
from pbgio.errors import ConfigError, FormatError, MissingArtifactError, PbgioError, StoredSettingsNote
from pbgio.layout.overrides import config_from_python, override_config_dict
from pbgio.layout.paths import infer_base, is_here
from pbgio.python_config import is_python_config
from pbgio.spec import naming
from pbgio.storage import AnyPath

IN_MEMORY = "<config>"
"""The :attr:`Layout.source` of a config given as a :class:`~pbgio.config.ConfigSchema`."""

STORED_MODEL_KEYS = ("dimension", "comparator", "global_emb", "bias")
"""Top-level settings that only describe the stored model: a reader takes the checkpoint's."""


@dataclass(frozen=True)
class Layout:
    """A validated config (``-p`` overrides applied), the folder its relative paths resolve
    against (:attr:`base`), and where it came from (:attr:`source`, for messages; :attr:`file`,
    None for a config in memory)."""

    config: ConfigSchema
    base: AnyPath
    source: str = IN_MEMORY
    file: AnyPath | None = None
    overrides: tuple[str, ...] = ()

    @classmethod
    def load(cls, location: str | AnyPath | ConfigSchema, *, base: str | AnyPath | None = None,
             overrides: Sequence[str] = ()) -> Layout:
        """The layout of a config file (a path or URL: JSON, or the original's ``.py``, which is
        executed in a subprocess) or of a config in memory, with ``overrides`` applied.

        ``base`` (default): the config file's folder (for a checkpoint's own ``config.json``, the
        folder holding ``checkpoint_path``: :func:`~pbgio.layout.infer_base`); the current
        directory for a ``.py`` config (as the original resolves its paths) or one in memory.
        """
        given_base = None if base is None else storage.resolve(base)
        if isinstance(location, ConfigSchema):
            config = location if not overrides else parse_config(
                override_config_dict(location.to_dict(), overrides, IN_MEMORY), IN_MEMORY)
            return cls(config, given_base or Path.cwd(), IN_MEMORY, None, tuple(overrides)).admitted()
        confinement.admit(location if isinstance(location, str) else str(location))
        path = storage.resolve(location)
        _check_config_link(path)
        source = storage.display(path)
        if not is_python_config(path.name):
            return cls.from_json(path, read_config_json(path), base=given_base, overrides=overrides)
        config = config_from_python(storage.local_path(str(path)), overrides)
        return cls(config, given_base or Path.cwd(), source, path, tuple(overrides)).admitted()

    @classmethod
    def from_json(cls, location: str | AnyPath, raw: Any, *, base: str | AnyPath | None = None,
                  overrides: Sequence[str] = ()) -> Layout:
        """The layout of the JSON config file at ``location`` whose value, ``raw``, was already
        read (:func:`~pbgio.config.read_config_json`), built as :meth:`load` builds it: for a
        reader that needs the JSON itself too (the validator checks its keys' case), so that the
        file is read and parsed once."""
        given_base = None if base is None else storage.resolve(base)
        path = storage.resolve(location)
        source = storage.display(path)
        config = parse_config(override_config_dict(raw, overrides, source) if isinstance(raw, dict) else raw, source)
        return cls(config, given_base or infer_base(path, config.checkpoint_path), source, path,
                   tuple(overrides)).admitted()

    @classmethod
    def of(cls, config: Layout | ConfigSchema | str | AnyPath, *, base: str | AnyPath | None = None) -> Layout:
        """``config`` itself when it is a Layout (``base`` must then be None), else loaded
        (:meth:`load`): what the library functions that take a config as a path, a schema or a
        layout call first."""
        if isinstance(config, Layout):
            if base is not None:
                raise ValueError("give base with a config file or schema, not with a Layout (it has its base)")
            return config
        return cls.load(config, base=base)

    def admitted(self) -> Layout:
        """This layout, its folders admitted to the command's :func:`pbgio.confinement.scope` (nothing
        happens outside one): the config's folder for reading and writing; each directory the
        config names outside it for reading (it shows them; the validator warns,
        ``layout-path-outside``); a path set by a ``-p`` override for reading and writing (the
        user named it). A URL the config names is not admitted: only storage the command line
        names is contacted (:func:`pbgio.confinement.url_refusal`)."""
        if confinement.active() is None:
            return self
        if not storage.is_remote(self.base):
            confinement.admit(str(self.base), write=True)
        overridden = {o.split("=", 1)[0].strip() for o in self.overrides if "=" in o}
        for key, values in self.config_paths().items():
            named = key in overridden
            for value in values:
                if confinement.split_url(value) is not None:
                    if named:
                        confinement.admit(value)
                    continue
                path = self.path(value)  # local, or relative to a remote config: its own storage, admitted
                if storage.is_remote(path):
                    continue
                if named or not self.inside(path):
                    confinement.admit(str(path), write=named)
        return self

    def config_paths(self) -> dict[str, list[str]]:
        """The locations the config names, by key (``entity_path``, ``edge_paths``, ``checkpoint_path``,
        ``init_path``), as written."""
        cfg = self.config
        found = {"entity_path": [cfg.entity_path], "edge_paths": list(cfg.edge_paths),
                 "checkpoint_path": [cfg.checkpoint_path]}
        if cfg.init_path is not None:
            found["init_path"] = [cfg.init_path]
        return found

    def inside(self, path: AnyPath) -> bool:
        """Whether local ``path`` lies inside the config's folder, as named (``..`` resolved, links not)."""
        if storage.is_remote(path) or storage.is_remote(self.base):
            return False
        base, named = os.path.abspath(self.base), os.path.abspath(path)
        return named == base or named.startswith(base.rstrip(os.sep) + os.sep)

    @property
    def file_name(self) -> str | None:
        """The config file as messages and reports name it; None for a config in memory."""
        return None if self.file is None else self.source

    # ---- paths
    def path(self, location: str) -> AnyPath:
        """A location of the config (a path or URL), a relative one against :attr:`base`."""
        return storage.resolve(location, self.base)

    @property
    def entity_path(self) -> AnyPath:
        return self.path(self.config.entity_path)

    @property
    def edge_paths(self) -> list[AnyPath]:
        return [self.path(p) for p in self.config.edge_paths]

    @property
    def checkpoint_path(self) -> AnyPath:
        return self.path(self.config.checkpoint_path)

    def checkpoint_path_found(self) -> str | None:
        """What stands at :attr:`checkpoint_path` (:func:`pbgio.storage.found_at`: nothing, a
        directory, a file, a broken link …), for the rule
        :func:`pbgio.checks.layout.checkpoint_path_occupied`; None on a remote store."""
        path = self.checkpoint_path
        return None if storage.is_remote(path) else storage.found_at(path)

    @property
    def init_path(self) -> AnyPath | None:
        return None if self.config.init_path is None else self.path(self.config.init_path)

    def argument_path(self, text: str) -> AnyPath:
        """A part of the layout named on the command line (``--edges``, ``--filter``, ``--valid``,
        ``--checkpoint`` …), absolute, by the one rule of the module doc.

        >>> layout = Layout(None, Path("/work/demo"), "cfg.json")  # type: ignore[arg-type]
        >>> str(layout.argument_path("edges/test")), str(layout.argument_path("/data/test"))
        ('/work/demo/edges/test', '/data/test')
        >>> layout.argument_path("./edges/test") == Path.cwd() / "edges" / "test"
        True
        """
        path = storage.absolute(storage.resolve(text)) if is_here(text) else storage.absolute(self.path(text))
        confinement.admit(text if storage.is_remote(path) else str(path))
        return path

    def existing_dir(self, text: str, option: str) -> AnyPath:
        """:meth:`argument_path` of a directory that must exist; a missing one is a
        :class:`~pbgio.errors.MissingArtifactError` naming it in full, and the rule, with the
        directory the current directory would give when that one exists."""
        path = self.argument_path(text)
        with storage.remote_errors(path, f"{option} directory"):
            exists = path.is_dir()
        if exists:
            return path
        what = f"{option} directory"
        if is_here(text) or storage.is_remote(path) or Path(text).is_absolute():
            raise MissingArtifactError(storage.display(path), what)
        found = f"nothing (a relative path is relative to the config's folder, {storage.display(self.base)})"
        here = storage.absolute(storage.resolve(text))
        if not storage.is_remote(here) and here.is_dir():
            found += f"; from the current directory it is {here}: write ./{text} to name that one"
        raise MissingArtifactError(storage.display(path), what, found=found)

    def with_checkpoint(self, location: str | AnyPath | None) -> Layout:
        """This layout with ``checkpoint_path`` named on the command line (``--checkpoint``, by
        :meth:`argument_path`); itself for None."""
        if location is None:
            return self
        located = str(self.argument_path(str(location)))
        confinement.admit(located, write=True)
        return dataclasses.replace(self, config=self.config.model_copy(update={"checkpoint_path": located}))

    # ---- the checkpoint
    def open_checkpoint(self, version: int | None = None, *, model: bool = False) -> CheckpointVersion:
        """A version of ``checkpoint_path`` (default: the committed one) read as what it is (see
        the module doc): the layout's config with the stored model's settings, the directory and
        the version. ``model``: the reader builds the model (its relations must be the
        checkpoint's); otherwise it reads entity tables only (the entity types it names must be the
        checkpoint's). A missing directory is a :class:`~pbgio.errors.MissingArtifactError`; a
        checkpoint trained for other entity or relation files, a ``checkpoint-config-mismatch``
        :class:`~pbgio.errors.ConfigError`."""
        checkpoint = CheckpointDir(self.checkpoint_path)
        with storage.remote_errors(checkpoint.path, "checkpoint directory"):
            found = checkpoint.path.is_dir()
        if not found:
            raise MissingArtifactError(storage.display(checkpoint.path), "checkpoint_path directory",
                                       found="nothing (train first with pbgtrain fit, or name the checkpoint "
                                             "with --checkpoint or -p checkpoint_path=…)")
        chosen = checkpoint.read_version() if version is None else version
        stored = stored_config(checkpoint)
        config = self.config if stored is None else self._as_stored(checkpoint, stored, model)
        return CheckpointVersion(dataclasses.replace(self, config=config), checkpoint, chosen, stored)

    def _as_stored(self, checkpoint: CheckpointDir, stored: ConfigSchema, model: bool) -> ConfigSchema:
        where = storage.display(checkpoint.path / naming.CONFIG_JSON)
        passed, kept = self.config.to_dict(), stored.to_dict()
        mine, theirs = _binding(passed, model), _binding(kept, model, only=passed["entities"])
        issues = config_mismatch(where, theirs, mine, "the config the checkpoint was trained with", each_key=True,
                                 keys=tuple(mine), fix="read it with the config it was trained with (or -p the "
                                 "key): its tables cannot be read against this layout's entity and relation files")
        if issues:
            raise ConfigError(where, issues)
        adopted, taken = _adopt(passed, kept, relations=_relations(passed) == _relations(kept))
        if not taken:
            return self.config
        warnings.warn(f"{where} (the config the checkpoint was trained with) has {', '.join(taken)}: the "
                      "checkpoint is read with its own settings", StoredSettingsNote, stacklevel=3)
        return parse_config(adopted, self.source)

    def check_resumable(self, checkpoint: CheckpointDir) -> None:
        """Refuse to resume ``checkpoint`` with this config once it has committed a version: every
        model setting, and the plan of edge paths its versions count iterations over, must be the
        checkpoint's (:class:`~pbgio.errors.ConfigError`, ``checkpoint-config-mismatch``, one issue
        per key). The plan is the edge paths' number, order and names (their last component): a
        layout moved elsewhere, or named by absolute paths where it was relative, resumes; another
        split does not. Nothing committed, or files it cannot read (the validator reports those):
        nothing to refuse here.

        >>> plan_of(["data/train"]) == plan_of(["/moved/run/data/train/"]), plan_of(["data/train", "data/valid"])
        (True, ['train', 'valid'])
        """
        try:
            committed = checkpoint.read_version()
        except (PbgioError, OSError):
            return
        stored = stored_config(checkpoint) if committed > 0 else None
        if stored is None:
            return
        path = storage.display(checkpoint.path / naming.CONFIG_JSON)
        issues = config_mismatch(path, stored.to_dict(), self.config.to_dict(), "the checkpoint being resumed",
                                 each_key=True)
        if plan_of(stored.edge_paths) != plan_of(self.config.edge_paths):
            issues += config_mismatch(
                path, {"edge_paths": stored.edge_paths}, {"edge_paths": self.config.edge_paths},
                "the checkpoint being resumed", each_key=True, keys=("edge_paths",),
                fix=f"its versions count iterations over those edge paths: resume with -p edge_paths="
                    f"{','.join(stored.edge_paths)}, or train into a new checkpoint_path")
        if issues:
            raise ConfigError(path, issues)



@dataclass(frozen=True)
class CheckpointVersion:
    """One version of a checkpoint and the layout to read it against (:meth:`Layout.open_checkpoint`:
    the config as passed, with the stored model's settings)."""

    layout: Layout
    checkpoint: CheckpointDir
    version: int
    trained_with: ConfigSchema | None = None
    """The checkpoint's own ``config.json`` as read when it was opened (None: it has none readable)."""

    @property
    def config(self) -> ConfigSchema:
        return self.layout.config

    @property
    def entity_path(self) -> AnyPath:
        return self.layout.entity_path

    def at(self, version: int) -> CheckpointVersion:
        """The same checkpoint at another version (a commit may have replaced the one opened)."""
        return dataclasses.replace(self, version=version)


def open_checkpoint(config: CheckpointVersion | Layout | ConfigSchema | str | AnyPath, *,
                    base: str | AnyPath | None = None, checkpoint: str | AnyPath | None = None,
                    version: int | None = None, model: bool = False) -> CheckpointVersion:
    """A checkpoint version read as what it is, from a config (a layout, a schema, or a file: see
    :meth:`Layout.of`), the checkpoint named on the command line (``--checkpoint``, by the one
    rule: :meth:`Layout.with_checkpoint`; default the config's ``checkpoint_path``) and a version
    (default: the committed one): :meth:`Layout.open_checkpoint`. A version already opened is
    taken as it is (at ``version`` when given): what was read and said when it was opened is not
    read or said again."""
    if isinstance(config, CheckpointVersion):
        if base is not None or checkpoint is not None:
            raise ValueError("give base and checkpoint with a config, not with a checkpoint version already opened")
        return config if version is None else config.at(version)
    layout = Layout.of(config, base=base).with_checkpoint(checkpoint)
    return layout.open_checkpoint(version, model=model)


def _check_config_link(path: AnyPath) -> None:
    """Refuse a local config file that is a symbolic link out of the folder it was named in (its
    folder becomes the layout's, so a layout could hand over another project's config and folder),
    inside a :func:`pbgio.confinement.scope`, unless links may be followed."""
    scope = confinement.active()
    if scope is None or scope.follow_links or storage.is_remote(path):
        return
    named = os.path.abspath(path)
    real, folder = os.path.realpath(named), os.path.realpath(os.path.dirname(named))
    if os.path.dirname(real) != folder and os.path.exists(real):
        raise FormatError(link_outside(storage.display(path), real))


def plan_of(edge_paths: Sequence[str]) -> list[str]:
    """The plan of edge paths a checkpoint's versions count iterations over: their names, in order."""
    return [p.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] for p in edge_paths]


def stored_config(checkpoint: CheckpointDir) -> ConfigSchema | None:
    """The config a checkpoint was trained with (its ``config.json``), or None when it has no
    readable one (the validator reports that)."""
    try:
        return checkpoint.read_config()
    except (PbgioError, OSError):
        return None


def _binding(config: dict[str, Any], model: bool, only: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ties a stored model to a layout's files, key by key: each entity type (of ``only``'s
    types, when given: the types a reader names) with its partitions and featurization; with
    ``model``, the relations (names and types) and ``dynamic_relations`` too."""
    entities = config["entities"]
    bound: dict[str, Any] = {
        f"entities.{name}": None if name not in entities else
        {"num_partitions": entities[name]["num_partitions"], "featurized": entities[name]["featurized"]}
        for name in (entities if only is None else only)}
    return {**bound, **_relations(config)} if model else bound


def _relations(config: dict[str, Any]) -> dict[str, Any]:
    """What ties a stored model's relation operators to the relations of a layout."""
    return {"relations": [{"name": r["name"], "lhs": r["lhs"], "rhs": r["rhs"]} for r in config["relations"]],
            "dynamic_relations": config["dynamic_relations"]}


def _adopt(passed: dict[str, Any], stored: dict[str, Any], *, relations: bool) -> tuple[dict[str, Any], list[str]]:
    """``passed`` with the settings that describe the stored model taken from ``stored`` (the
    entity types it names agree; ``relations``: so do the relations, whose operators are taken
    too), and each taken one in words."""
    adopted = copy.deepcopy(passed)
    taken = []

    def take(target: dict[str, Any], source: dict[str, Any], key: str, shown: str) -> None:
        if target.get(key) != source.get(key):
            taken.append(f"{shown} = {source.get(key)!r} (the config says {target.get(key)!r})")
            target[key] = source.get(key)

    for key in STORED_MODEL_KEYS:
        take(adopted, stored, key, key)
    if relations:
        for i, (mine, theirs) in enumerate(zip(adopted["relations"], stored["relations"], strict=True)):
            take(mine, theirs, "operator", f"relations.{i}.operator")
    for name, entity in adopted["entities"].items():
        take(entity, stored["entities"][name], "dimension", f"entities.{name}.dimension")
    return adopted, taken
