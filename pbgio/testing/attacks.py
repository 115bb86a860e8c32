"""The project's own attack corpus: layouts an attacker hands a user, and the commands the user runs on them.

Why this module is long: it is a catalogue (one builder per attack of issue 54's "Why" list, each
small), like the mutators of :mod:`pbgio.testing.mutations`; the hostile files themselves are
written by :mod:`pbgio.testing.attack_payloads` and each attempt is run and judged by
:mod:`pbgio.testing.attack_judge`.

An :class:`Attack` has a name, a class (:data:`CLASSES`: what the attacker wants), and a builder
``build(root) -> Setup`` that writes the layout under ``root/"layout"``, the user's own files under
``root/"victim"`` (another project's checkpoint, ``secret.txt`` holding a unique secret, an
``authorized_keys``), and the command lines tried on it, one per command that applies (``validate``,
``info``, ``export``, ``convert``, ``fit``, ``eval``, ``predict``, ``neighbors``, ``names``,
``index-build``, ``embed``, ``report``), each with the outcome it must end in: a clear refusal
naming the file (:func:`~pbgio.testing.attack_judge.refused`) or a safe success
(:func:`~pbgio.testing.attack_judge.safe`). :func:`~pbgio.testing.attack_judge.run_attempt` runs one
and judges it; ``tests/test_attacks.py`` runs every attack x command, ``tools/attack_table.py``
prints the table.

>>> sorted({a.klass for a in CATALOGUE}) == sorted(CLASSES)
True
>>> all(a.commands for a in CATALOGUE) and len({a.name for a in CATALOGUE}) == len(CATALOGUE)
True
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pbgio.testing.attack_judge import (
    EITHER,
    Attempt,
    Expect,
    RecordingServer,
    Setup,
    Verdict,
    refused,
    refused_or_safe,
    run_attempt,
    safe,
)
from pbgio.testing.attack_payloads import (
    case_decoy,
    external_link,
    external_storage,
    faiss_claim,
    gzip_bomb_bucket,
    inflated_storage,
    read_member,
    rewrite_pickle,
    unwritten_rows,
    virtual_dataset,
)

__all__ = ["CATALOGUE", "CLASSES", "COMMANDS", "Attack", "Attempt", "Expect", "Scene", "Setup", "Verdict", "argv",
           "attack", "attempts", "by_name", "cases", "run_attempt", "scene", "template"]

CLASSES: Mapping[str, str] = {
    "write-link": "writes through a symbolic link the layout shipped, or a checkpoint_path outside it",
    "legacy-convert": "pbgio convert --from legacy copying another file into its output",
    "hdf5-link": "current readers following HDF5 links or symbolic links out of the layout",
    "code": "running code the user did not ask to run",
    "pickle": "slipping past the pickle allow-list",
    "exhaustion": "exhausting time or memory from a few kilobytes",
    "network": "reaching the network, or leaking credentials in messages",
    "terminal": "writing control sequences or markup to the user's terminal",
}
COMMANDS = ("validate", "info", "export", "convert", "fit", "eval", "predict", "neighbors", "names", "index-build",
            "embed", "report")
SLOW_COMMANDS = frozenset({"fit", "eval", "predict", "convert", "report"})
"""Commands that import torch or matplotlib: seconds each, so their cases are ``slow``."""
SECRET_FILE = "secret.txt"
MARKER = "MARKER"

Builder = Callable[[Path], Setup]


@dataclass(frozen=True)
class Attack:
    """One attack of the corpus: ``build(root)`` writes it and returns the attempts of ``commands``."""

    name: str
    klass: str
    summary: str
    commands: tuple[str, ...]
    build: Builder = field(repr=False)
    slow: frozenset[str] = frozenset()
    """Commands whose case is slow (beyond :data:`SLOW_COMMANDS`): a costly build or a bomb."""

    def is_slow(self, command: str) -> bool:
        return command in SLOW_COMMANDS or command in self.slow or "*" in self.slow


# --------------------------------------------------------------------------- templates

_TEMPLATES: dict[str, Path] = {}
_TEMPLATE_DIR: list[Path] = []


def _template_dir() -> Path:
    if not _TEMPLATE_DIR:
        made = Path(tempfile.mkdtemp(prefix="pbg-attack-templates-"))
        atexit.register(shutil.rmtree, made, True)
        _TEMPLATE_DIR.append(made)
    return _TEMPLATE_DIR[0]


def template(kind: str) -> Path:
    """A layout written once per process and copied into each setup: ``current`` (the rich valid
    layout of :func:`pbgio.testing.small_valid_layout`, with a committed checkpoint), ``plain`` (the
    same without its featurized type, for ``fit --valid``), ``indexed``
    (the same with a flat FAISS index of ``user``), ``legacy`` (a .pt-era layout in torch zips)."""
    if kind not in _TEMPLATES:
        dest = _template_dir() / kind
        if kind in ("current", "plain"):
            from pbgio.testing import small_valid_layout, write_layout

            write_layout(dest, small_valid_layout(featurized=kind == "current"))
        elif kind == "indexed":
            from pbgio.index import build_index

            shutil.copytree(template("current"), dest, symlinks=True)
            build_index(dest / "config.json", "user")
        elif kind == "legacy":
            from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

            write_legacy_layout(dest, LegacySpec(seed=5, zip_container=True, num_partitions=2))
        else:
            raise KeyError(kind)
        _TEMPLATES[kind] = dest
    return _TEMPLATES[kind]


@dataclass
class Scene:
    """A setup under construction: the root, the layout copied from a template, the victim's files."""

    root: Path
    layout: Path
    victim: Path
    secret: str

    @property
    def config(self) -> Path:
        return self.layout / "config.json"

    def other_project(self) -> Path:
        """Another project of the user's, beside the layout: ``victim/other`` (a trained layout);
        returns its checkpoint directory."""
        other = self.victim / "other"
        if not other.exists():
            shutil.copytree(template("current"), other, symlinks=True)
        return other / "checkpoint"

    def edit_config(self, change: Callable[[dict], None], path: Path | None = None) -> None:  # type: ignore[type-arg]
        path = path or self.config
        raw = json.loads(path.read_text())
        change(raw)
        path.write_text(json.dumps(raw, indent=1))

    def link(self, where: str, target: str | Path) -> Path:
        """Replace ``layout/where`` (a file or directory, or nothing) by a symbolic link to ``target``."""
        path = self.layout / where
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        return path


def scene(root: Path, kind: str = "current") -> Scene:
    """Copy the template ``kind`` to ``root/layout`` and write the victim's files."""
    layout = root / "layout"
    shutil.copytree(template(kind), layout, symlinks=True)
    victim = root / "victim"
    (victim / ".ssh").mkdir(parents=True)
    secret = f"SECRET-{uuid.uuid4().hex}"
    (victim / SECRET_FILE).write_text(secret + "\n")
    (victim / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUser user@laptop\n")
    return Scene(root, layout, victim, secret)


# --------------------------------------------------------------------------- command lines


def argv(command: str, root: Path, config: str = "config.json") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The command line of ``command`` on the layout's ``config`` (run from ``root/layout``), and the
    outputs it names outside the layout (relative to ``root``)."""
    out = root / "out"
    lines: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "validate": (("pbgio", "validate", config), ()),
        "info": (("pbgio", "info", config), ()),
        "export": (("pbgio", "export", config, "-t", "user", "-o", str(out / "user.tsv")), ("out",)),
        "export-npy": (("pbgio", "export", config, "-t", "user", "--format", "npy", "-o", str(out / "npy")), ("out",)),
        "convert": (("pbgio", "convert", "--from", "legacy", str(root / "layout"), str(root / "converted")),
                    ("converted",)),
        "fit": (("pbgtrain", "fit", config, "--no-progress", "--max-iterations", "1"), ()),
        "eval": (("pbgtrain", "eval", config, "--no-progress"), ()),
        "predict": (("pbgtrain", "predict", config, "--lhs", "user-0-4", "--rel", "follows", "-k", "9"), ()),
        "neighbors": (("pbgio", "neighbors", config, "-t", "user", "-k", "8", "user-0-4"), ()),
        "names": (("pbgio", "names", config, "-t", "user"), ()),
        "index-build": (("pbgio", "index", "build", config, "-t", "user", "--no-progress"), ()),
        "embed": (("pbgio", "embed", config, str(root / "bags.txt"), "-t", "doc", "--offsets", "-o",
                   str(out / "bags.tsv")), ("out",)),
        "report": (("pbgtrain", "report", config, "-o", str(out / "report.png")), ("out",)),
    }
    return lines[command]


def attempts(root: Path, expects: Mapping[str, Expect], *, config: str = "config.json",
             extra: Mapping[str, tuple[str, ...]] = {}, env: Mapping[str, str] = {},
             lines: Mapping[str, str] = {}) -> dict[str, Attempt]:
    """The attempt of each command of ``expects`` (``extra``: arguments added to a command line;
    ``lines``: the command line of another entry of :func:`argv` for a command, ``export-npy``)."""
    (root / "bags.txt").write_text("0 1\n2\n")
    (root / "out").mkdir(exist_ok=True)
    made = {}
    for command, expect in expects.items():
        line, outputs = argv(lines.get(command, command), root, config)
        made[command] = Attempt(line + extra.get(command, ()), expect, outputs=outputs, env=env)
    return made


# --------------------------------------------------------------------------- the catalogue

CATALOGUE: list[Attack] = []


def attack(name: str, klass: str, commands: tuple[str, ...], *, slow: frozenset[str] = frozenset()
           ) -> Callable[[Builder], Builder]:
    """Register the decorated builder as the attack ``name`` (its docstring is the summary)."""
    def register(build: Builder) -> Builder:
        assert klass in CLASSES, klass
        CATALOGUE.append(Attack(name, klass, (build.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
                                commands, build, slow))
        return build
    return register


def cases() -> list[tuple[Attack, str]]:
    """Every (attack, command) of the catalogue."""
    return [(a, c) for a in CATALOGUE for c in a.commands]


def by_name(name: str) -> Attack:
    """The attack of the catalogue named ``name``."""
    (found,) = [a for a in CATALOGUE if a.name == name]
    return found



# --------------------------------------------------------------------------- write-link


@attack("lock-link-to-victim", "write-link", ("fit", "validate"))
def lock_link_to_victim(root: Path) -> Setup:
    """``checkpoint/.pbg-lock`` shipped as a symbolic link to the user's ``~/.ssh/authorized_keys``:
    fit must neither truncate it nor write the lock's JSON into it."""
    s = scene(root)
    s.link("checkpoint/.pbg-lock", s.victim / ".ssh" / "authorized_keys")
    return Setup(root, attempts(root, {"fit": refused_or_safe(".pbg-lock"), "validate": refused(".pbg-lock")}),
                 secrets=(s.secret,))


@attack("lock-link-dangling", "write-link", ("fit", "validate"))
def lock_link_dangling(root: Path) -> Setup:
    """``checkpoint/.pbg-lock`` shipped as a dangling link into the user's ``~/.ssh``: fit must not
    create the file it names."""
    s = scene(root)
    s.link("checkpoint/.pbg-lock", s.victim / ".ssh" / "created-by-the-lock")
    return Setup(root, attempts(root, {"fit": refused_or_safe(".pbg-lock"), "validate": refused(".pbg-lock")}))


@attack("stats-link-dangling", "write-link", ("fit", "validate"))
def stats_link_dangling(root: Path) -> Setup:
    """``checkpoint/training_stats.json`` shipped as a dangling link: fit must not create and append to
    the file it names."""
    s = scene(root)
    s.link("checkpoint/training_stats.json", s.victim / "appended-by-fit.json")
    expects = {"fit": refused_or_safe("training_stats.json"), "validate": refused("training_stats.json")}
    return Setup(root, attempts(root, expects))


@attack("best-link-to-other-project", "write-link", ("fit", "validate"))
def best_link_to_other_project(root: Path) -> Setup:
    """``checkpoint/best`` shipped as a link to another project's checkpoint: ``fit --valid`` must not
    delete its files or link the attacker's model in."""
    s = scene(root, "plain")
    s.link("checkpoint/best", s.other_project())
    shutil.copytree(s.layout / "edges", s.layout / "valid")
    expects = {"fit": refused_or_safe("best"), "validate": refused("best")}
    return Setup(root, attempts(root, expects, extra={"fit": ("--valid", "valid")}))


@attack("epoch-link-to-other-project", "write-link", ("fit", "validate"))
def epoch_link_to_other_project(root: Path) -> Setup:
    """``checkpoint/epoch_1`` shipped as a link to another project's checkpoint, with
    ``checkpoint_preservation_interval: 1`` in the config: fit must not write its snapshot there."""
    s = scene(root)
    for config in (s.config, s.layout / "checkpoint" / "config.json"):
        s.edit_config(lambda c: c.update(checkpoint_preservation_interval=1), config)
    s.link("checkpoint/epoch_1", s.other_project())
    return Setup(root, attempts(root, {"fit": refused_or_safe("epoch_1"), "validate": refused("epoch_1")}))


def _checkpoint_elsewhere(root: Path, location: Callable[[Scene], str]) -> Setup:
    s = scene(root)
    other = s.other_project()
    s.edit_config(lambda c: c.update(checkpoint_path=location(s)))
    expects = {"fit": refused(str(other), "checkpoint_path", "victim/other"), "validate": safe("layout-path-outside")}
    return Setup(root, attempts(root, expects))


@attack("checkpoint-path-absolute", "write-link", ("fit", "validate"))
def checkpoint_path_absolute(root: Path) -> Setup:
    """``checkpoint_path`` the absolute path of another project's checkpoint: fit must not write there
    unless the user names it; validate warns."""
    return _checkpoint_elsewhere(root, lambda s: str(s.other_project()))


@attack("checkpoint-path-dotdot", "write-link", ("fit", "validate"))
def checkpoint_path_dotdot(root: Path) -> Setup:
    """``checkpoint_path: ../victim/other/checkpoint``: the same, reached with ``..``."""
    return _checkpoint_elsewhere(root, lambda s: "../victim/other/checkpoint")


# --------------------------------------------------------------------------- legacy-convert

LEGACY_BUCKET = "data/train_partitioned/edges_1_1.h5"
LEGACY_EMBEDDINGS = "checkpoint/user_1.pt.1"


def _legacy_bucket(root: Path, change: Callable[[Scene, Path], None], expect: Expect | None = None) -> Setup:
    s = scene(root, "legacy")
    change(s, s.layout / LEGACY_BUCKET)
    return Setup(root, attempts(root, {"convert": expect or refused("edges_1_1.h5")}), secrets=(s.secret,))


def _other_bucket(s: Scene) -> Path:
    """A bucket of another project of the user's, with the legacy bucket's datasets."""
    other = s.victim / "other_edges.h5"
    shutil.copyfile(s.layout / LEGACY_BUCKET, other)
    return other


@attack("legacy-external-storage", "legacy-convert", ("convert",))
def legacy_external_storage(root: Path) -> Setup:
    """A legacy bucket whose ``lhs`` is HDF5 external raw storage over the user's secret file: convert
    must not copy those bytes into the converted bucket."""
    def change(s: Scene, bucket: Path) -> None:
        secrets = s.victim / "passwords.txt"
        secrets.write_text((s.secret + " ") * 4)
        external_storage(bucket, "lhs", secrets, 12)
    return _legacy_bucket(root, change)


@attack("legacy-unwritten-rows", "legacy-convert", ("convert",))
def legacy_unwritten_rows(root: Path) -> Setup:
    """A 2 KB legacy bucket claiming 10^11 edges in chunks never written: convert must not write
    terabytes."""
    return _legacy_bucket(root, lambda s, bucket: unwritten_rows(bucket, ("lhs", "rhs", "rel"), 10**11))


@attack("legacy-external-link", "legacy-convert", ("convert",))
def legacy_external_link(root: Path) -> Setup:
    """A legacy bucket whose ``lhs`` is an HDF5 external link into another project's file: convert must
    not import its edges."""
    return _legacy_bucket(root, lambda s, bucket: external_link(bucket, "lhs", _other_bucket(s), "lhs"))


@attack("legacy-virtual-dataset", "legacy-convert", ("convert",))
def legacy_virtual_dataset(root: Path) -> Setup:
    """A legacy bucket whose ``lhs`` is a virtual dataset over another project's file."""
    return _legacy_bucket(root, lambda s, bucket: virtual_dataset(bucket, "lhs", _other_bucket(s), "lhs", 12))


# --------------------------------------------------------------------------- hdf5-link


OTHER_EDGES = 4242
"""Edges of another project's bucket, the target of the links: a number no layout of the corpus has."""


@attack("bucket-external-link", "hdf5-link", ("validate", "info"))
def bucket_external_link(root: Path) -> Setup:
    """An edge bucket whose ``lhs``, ``rhs`` and ``rel`` are HDF5 external links into another
    project's bucket of 4242 edges: validate must not call it valid, info must not count them."""
    from pbgio.edges import EdgeBucket, write_bucket

    s = _example(root)
    other = s.victim / "other_edges.h5"
    zeros = np.zeros(OTHER_EDGES, dtype=np.int64)
    write_bucket(other, EdgeBucket(rel=zeros, lhs=zeros, rhs=zeros))
    for name in ("lhs", "rhs", "rel"):
        external_link(s.layout / "edges" / "train" / "edges_0_0.h5", name, other, name)
    expects = {"validate": refused("edges_0_0.h5")}
    # info may summarize the rest of the layout, the bucket shown unreadable, never its 4242 edges
    expects["info"] = Expect(EITHER, ("edges_0_0.h5",), hides=(str(OTHER_EDGES), f"{OTHER_EDGES:,}"))
    return Setup(root, attempts(root, expects))


@attack("bucket-lhs-external-link", "hdf5-link", ("fit", "eval"))
def bucket_lhs_external_link(root: Path) -> Setup:
    """An edge bucket whose ``lhs`` is an HDF5 external link into another project's bucket of the
    same shape: fit must not train on its edges, eval must not rank them."""
    s = scene(root)
    other = s.other_project().parent / "edges" / "edges_0_0.h5"
    external_link(s.layout / "edges" / "edges_0_0.h5", "lhs", other, "lhs")
    return Setup(root, attempts(root, dict.fromkeys(("fit", "eval"), refused("edges_0_0.h5"))))


EMBEDDING_COMMANDS = ("validate", "export", "eval", "predict", "neighbors", "index-build", "embed")


@attack("embeddings-external-link", "hdf5-link", EMBEDDING_COMMANDS)
def embeddings_external_link(root: Path) -> Setup:
    """Checkpoint embeddings (``user`` partition 0, ``doc``) that are HDF5 external links into another
    project's checkpoint: export must not write that project's embeddings, and no reader may use them."""
    s = scene(root)
    other = s.other_project()
    for name in ("embeddings_user_0.v1.h5", "embeddings_doc_0.v1.h5"):
        external_link(s.layout / "checkpoint" / name, "embeddings", other / name, "embeddings")
    expects = {c: refused("embeddings_user_0.v1.h5", "embeddings_doc_0.v1.h5") for c in EMBEDDING_COMMANDS}
    return Setup(root, attempts(root, expects))


@attack("bucket-link-to-fifo", "hdf5-link", ("validate", "fit"))
def bucket_link_to_fifo(root: Path) -> Setup:
    """An edge bucket whose ``lhs`` is an external link to a FIFO: opening it blocks forever."""
    s = scene(root)
    fifo = s.victim / "pipe"
    os.mkfifo(fifo)
    external_link(s.layout / "edges" / "edges_0_0.h5", "lhs", fifo, "lhs")
    return Setup(root, attempts(root, dict.fromkeys(("validate", "fit"), refused("edges_0_0.h5"))))


NAMES_FILE = "entity_names_user_0.json"


@attack("names-link-outside", "hdf5-link", ("validate", "export", "names", "neighbors"))
def names_link_outside(root: Path) -> Setup:
    """``entities/entity_names_user_0.json`` a link to another project's names, one of them the user's
    secret: export and names must not show them."""
    s = scene(root)
    other_names = s.victim / "names.json"
    other_names.write_text(json.dumps([s.secret, "alice", "bob", "carol", "dave"]))
    s.link(f"entities/{NAMES_FILE}", other_names)
    expects = dict.fromkeys(("validate", "export", "names", "neighbors"), refused(NAMES_FILE))
    made = attempts(root, expects)
    made["neighbors"] = Attempt(("pbgio", "neighbors", "config.json", "-t", "user", "-k", "8", "alice"),
                                refused(NAMES_FILE))
    return Setup(root, made, secrets=(s.secret,))


COUNT_FILE = "entity_count_user_0.txt"


@attack("count-link-outside", "hdf5-link", ("validate", "export"))
def count_link_outside(root: Path) -> Setup:
    """``entities/entity_count_user_0.txt`` a link to the user's secret file: no message may quote it."""
    s = scene(root)
    s.link(f"entities/{COUNT_FILE}", s.victim / SECRET_FILE)
    expects = dict.fromkeys(("validate", "export"), refused(COUNT_FILE))
    return Setup(root, attempts(root, expects, lines={"export": "export-npy"}), secrets=(s.secret,))


# --------------------------------------------------------------------------- code

JSON_SHIM = '''\
"""An attacker's json.py, shipped in a layout: importing it proves code ran."""
import os, sys
open({marker!r}, "w").close()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if p not in ("", ".", here)]
del sys.modules["json"]
import json as _json
sys.modules["json"] = _json
globals().update({{k: v for k, v in vars(_json).items() if not k.startswith("__")}})
'''


@attack("json-py-beside-config", "code", ("info", "names", "export", "neighbors", "fit", "report"))
def json_py_beside_config(root: Path) -> Setup:
    """The user's own ``config.py`` run from the downloaded folder, which holds an attacker's
    ``json.py``: the config may run (the user named it), the attacker's module must not."""
    s = scene(root)
    config = json.loads(s.config.read_text())
    (s.layout / "config.py").write_text(f"def get_torchbiggraph_config():\n    return {config!r}\n")
    marker = root / MARKER
    (s.layout / "json.py").write_text(JSON_SHIM.format(marker=str(marker)))
    expects = dict.fromkeys(("info", "names", "export", "neighbors", "fit", "report"), safe())
    return Setup(root, attempts(root, expects, config="config.py"), marker=marker)


# --------------------------------------------------------------------------- pickle


@attack("pt-case-decoy", "pickle", ("convert",))
def pt_case_decoy(root: Path) -> Setup:
    """A legacy ``.pt`` zip whose scanned ``archive/decoy/data.pkl`` is genuine while torch loads
    ``archive/DATA.PKL``, which names a global outside the allow-list (``torch.HalfStorage``)."""
    s = scene(root, "legacy")
    target = s.layout / LEGACY_EMBEDDINGS
    loaded = rewrite_pickle(read_member(target, "/data.pkl"), "data/0", storage_type="HalfStorage")
    case_decoy(target, loaded)
    return Setup(root, attempts(root, {"convert": refused("HalfStorage", "DATA.PKL")}))


# --------------------------------------------------------------------------- exhaustion


@attack("count-dev-zero", "exhaustion", ("validate", "info", "export", "fit"))
def count_dev_zero(root: Path) -> Setup:
    """``entities/entity_count_user_0.txt`` a link to ``/dev/zero``: read whole, it never ends."""
    s = scene(root)
    s.link(f"entities/{COUNT_FILE}", "/dev/zero")
    expects = dict.fromkeys(("validate", "info", "export", "fit"), refused(COUNT_FILE))
    return Setup(root, attempts(root, expects, lines={"export": "export-npy"}))


@attack("count-fifo", "exhaustion", ("validate", "info"))
def count_fifo(root: Path) -> Setup:
    """``entities/entity_count_user_0.txt`` a FIFO: opening it blocks until a writer comes."""
    s = scene(root)
    path = s.layout / "entities" / COUNT_FILE
    path.unlink()
    os.mkfifo(path)
    return Setup(root, attempts(root, dict.fromkeys(("validate", "info"), refused(COUNT_FILE))))


@attack("partitions-ten-million", "exhaustion", ("validate", "info", "fit"))
def partitions_ten_million(root: Path) -> Setup:
    """``num_partitions: 10**7``: every check or plan that walks the partitions grows without bound."""
    s = _example(root)
    s.edit_config(lambda c: c["entities"]["user"].update(num_partitions=10**7))
    expects = dict.fromkeys(("validate", "fit"), refused("num_partitions", "10000000"))
    expects["info"] = refused_or_safe("num_partitions", "10000000")  # a summary that stays bounded is fine
    return Setup(root, attempts(root, expects))


def _example(root: Path) -> Scene:
    """A scene on :func:`pbgio.example.build_example` (no checkpoint, plain buckets)."""
    from pbgio.example import build_example

    s = scene(root)
    shutil.rmtree(s.layout)
    build_example(s.layout, num_edges=300)
    return s


@attack("gzip-chunk-2gib", "exhaustion", ("validate", "fit"))
def gzip_chunk_2gib(root: Path) -> Setup:
    """An edge bucket of 2^28 edges whose ``lhs``, ``rhs`` and ``rel`` are each one 2 GiB gzip chunk
    (6 MB on disk): a reader that inflates the chunk for every slice it reads runs for minutes."""
    s = _example(root)
    gzip_bomb_bucket(s.layout / "edges" / "train" / "edges_0_0.h5", 1 << 28)
    return Setup(root, attempts(root, dict.fromkeys(("validate", "fit"), refused("edges_0_0.h5"))))


@attack("pt-storage-4gib", "exhaustion", ("convert",))
def pt_storage_4gib(root: Path) -> Setup:
    """A 4 MB legacy ``.pt`` zip whose storage inflates to 4 GiB."""
    s = scene(root, "legacy")
    inflated_storage(s.layout / LEGACY_EMBEDDINGS, "data/0", 4 << 30)
    return Setup(root, attempts(root, {"convert": refused("user_1.pt.1")}))


INDEX_FILE = "index_user.cos.flat.v1.h5"


@attack("faiss-claims-4gib", "exhaustion", ("neighbors", "predict"), slow=frozenset({"*"}))
def faiss_claims_4gib(root: Path) -> Setup:
    """A 4 KB FAISS payload, stored in chunks, whose header claims 4 GiB of codes (its digest
    recorded): loading it allocates what it claims."""
    s = scene(root, "indexed")
    faiss_claim(s.layout / "checkpoint" / INDEX_FILE, 1 << 30)
    made = attempts(root, dict.fromkeys(("neighbors", "predict"), refused(INDEX_FILE)),
                    extra={"neighbors": ("--index",)})
    # lhs candidates of (?, follows, user-0-4): the side no operator transforms, which an index can rank
    made["predict"] = Attempt(("pbgtrain", "predict", "config.json", "--rhs", "user-0-4", "--rel", "follows", "-k", "9",
                               "--index"), refused(INDEX_FILE))
    return Setup(root, made)


@attack("count-ten-to-fifteen", "exhaustion", ("fit",))
def count_ten_to_fifteen(root: Path) -> Setup:
    """An entity count of 10^15 (``item``, without a names file): fit must refuse it before allocating."""
    s = _example(root)
    (s.layout / "entities" / "entity_names_item_0.json").unlink()
    (s.layout / "entities" / "entity_count_item_0.txt").write_text(f"{10**15}\n")
    expect = refused("entity_count_item_0.txt", str(10**15), f"{10**15:,}")
    return Setup(root, attempts(root, {"fit": expect}))


@attack("dimension-2-33", "exhaustion", ("fit",))
def dimension_2_33(root: Path) -> Setup:
    """``dimension: 2**33``: fit must refuse it before allocating."""
    s = _example(root)
    s.edit_config(lambda c: c.update(dimension=2**33))
    return Setup(root, attempts(root, {"fit": refused("dimension", str(2**33), f"{2**33:,}")}))


# --------------------------------------------------------------------------- network


@attack("http-config-paths", "network", ("validate", "info", "names", "export", "fit", "report"))
def http_config_paths(root: Path) -> Setup:
    """A config whose paths are ``http://`` URLs of the attacker's host: no command may send it a
    request (the host here is a local server that must receive none)."""
    s = scene(root)
    server = RecordingServer()
    base = f"{server.url}/layout"
    s.edit_config(lambda c: c.update(entity_path=f"{base}/entities", edge_paths=[f"{base}/edges"],
                                     checkpoint_path=f"{base}/checkpoint"))
    commands = ("validate", "info", "names", "export", "fit", "report")
    return Setup(root, attempts(root, dict.fromkeys(commands, refused("127.0.0.1", "http://"))), server=server,
                 server_must_stay_silent=True)


def _credentials(root: Path, url: Callable[[RecordingServer], str], secrets: tuple[str, ...],
                 commands: tuple[str, ...]) -> Setup:
    scene(root)
    server = RecordingServer()
    extra = dict.fromkeys(commands, ("-p", f"entity_path={url(server)}"))
    env = {"AWS_ENDPOINT_URL": server.url, "AWS_ACCESS_KEY_ID": "AKIAUNRELATED", "AWS_SECRET_ACCESS_KEY": "unrelated"}
    made = attempts(root, dict.fromkeys(commands, refused()), extra=extra, env=env)
    return Setup(root, made, secrets=secrets, server=server)


@attack("s3-credentials-in-param", "network", ("export", "names", "fit"), slow=frozenset({"*"}))
def s3_credentials_in_param(root: Path) -> Setup:
    """``-p entity_path=s3://KEY:SECRET@bucket/…`` (the user's own storage, with credentials in the
    URL): a clear error, the secret in no message and no traceback."""
    secret = f"wJalrXUtnFEMI{uuid.uuid4().hex}"
    return _credentials(root, lambda _: f"s3://AKIAEXAMPLEKEY:{secret}@bucket/entities", (secret,),
                        ("export", "names", "fit"))


@attack("s3-secret-with-at", "network", ("export", "names"), slow=frozenset({"*"}))
def s3_secret_with_at(root: Path) -> Setup:
    """The same with an ``@`` inside the secret: neither half of it may show."""
    first, second = f"wJal{uuid.uuid4().hex[:16]}", f"{uuid.uuid4().hex[:16]}EMI"
    return _credentials(root, lambda _: f"s3://AKIAEXAMPLEKEY:{first}@{second}@bucket/entities",
                        (f"{first}@{second}", first, second), ("export", "names"))


@attack("signed-url-in-param", "network", ("export", "names"))
def signed_url_in_param(root: Path) -> Setup:
    """``-p entity_path=`` a GCS signed URL (``X-Goog-Signature``): its signature in no message."""
    signature = uuid.uuid4().hex * 4

    def url(server: RecordingServer) -> str:
        return (f"{server.url}/bucket/entities?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential="
                "svc%40proj.iam.gserviceaccount.com%2F20250101%2Fauto%2Fstorage%2Fgoog4_request&X-Goog-Date="
                f"20250101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature={signature}")
    return _credentials(root, url, (signature,), ("export", "names"))


# --------------------------------------------------------------------------- terminal

OSC_NAMES = ["\x1b]0;owned title\x07", "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",
             "\x1b]52;c;cm0gLXJmIH4=\x07", "\x1b[2J\x1b[Hcleared", "user-0-4"]
"""Names of ``user`` partition 0: a window title, a hyperlink, a clipboard write, a screen clear."""


@attack("osc-escapes-in-names", "terminal", ("names", "predict", "neighbors"))
def osc_escapes_in_names(root: Path) -> Setup:
    """Entity names holding OSC and CSI sequences (window title, hyperlink, clipboard, clear screen):
    names, predict and neighbors must show them escaped."""
    from pbgio.entities import write_entity_names

    s = scene(root)
    (s.layout / "entities" / NAMES_FILE).unlink()
    write_entity_names(s.layout / "entities", "user", 0, OSC_NAMES)
    return Setup(root, attempts(root, dict.fromkeys(("names", "predict", "neighbors"), safe())))


@attack("markup-relation-names", "terminal", ("info",))
def markup_relation_names(root: Path) -> Setup:
    """Relations named ``[/]`` and ``[red]likes[/red]`` (rich markup): info must print them as they
    are, never interpret them."""
    from pbgio.entities import write_relation_names

    s = _example(root)
    renamed = ["[/]", "[red]likes[/red]"]

    def rename(c: dict) -> None:  # type: ignore[type-arg]
        for relation, name in zip(c["relations"], renamed, strict=True):
            relation["name"] = name
    s.edit_config(rename)
    write_relation_names(s.layout / "entities", renamed)
    return Setup(root, attempts(root, {"info": safe("[/]", "[red]likes[/red]")}))
