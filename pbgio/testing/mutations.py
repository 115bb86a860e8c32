"""One mutation per rule: break exactly that rule in a freshly written valid layout.

Every rule id of :data:`pbgio.spec.rules.RULES` has a mutator in :data:`MUTATORS`. A mutator
takes the root of a layout written by :func:`prepare` (the named starting layout of
:data:`LAYOUTS` that its registration declares) and edits the files on disk: ``config.json``,
text files, or HDF5 files through h5py. :func:`target` gives the path to hand to
``pbgio validate`` (``root/config.json`` unless the registration says otherwise).

Why this module is long: it is a catalogue of 67 mutators, one per rule of the catalogue,
each a few lines read on its own; one module keeps the registry and its meta-test in one place.

>>> import tempfile, pathlib
>>> from pbgio.validate import validate_path
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> path = prepare("edge-lhs-range", root)
>>> validate_path(path).ok
True
>>> MUTATORS["edge-lhs-range"](root)
>>> sorted(validate_path(path).rule_ids())
['edge-lhs-range']
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pbgio.config import ConfigSchema, parse_config
from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad, encode_state_dict
from pbgio.spec import naming
from pbgio.spec.checkpoint import (
    CONFIG_JSON_ATTR,
    EMBEDDINGS_DATASET,
    MODEL_GROUP,
    OPTIMIZER_DATASET,
    STATE_DICT_KEY_ATTR,
    TORCH_LEGACY_MAGIC,
    expected_model_params,
    public_to_private,
)
from pbgio.spec.rules import RULES
from pbgio.testing.layouts import LayoutContents, relation_types, small_valid_layout, write_layout

Mutator = Callable[[Path], None]
Target = Callable[[Path], Path]

LAYOUTS: dict[str, Callable[[], LayoutContents]] = {
    "default": small_valid_layout,
    "dynamic": functools.partial(small_valid_layout, dynamic=True),
    "snapshot": functools.partial(small_valid_layout, snapshot=True),
    "plain": functools.partial(small_valid_layout, featurized=False),
}
"""Named starting layouts (all valid); see :func:`pbgio.testing.layouts.small_valid_layout`."""


def config_target(root: Path) -> Path:
    return root / naming.CONFIG_JSON


@dataclass(frozen=True)
class Mutation:
    """How to break one rule: the starting layout, the edit, and the path to validate.

    ``also`` lists other rule ids the broken layout may legitimately report besides ``rule``
    (consequences the edit cannot avoid); the tests demand nothing else is reported.
    """

    rule: str
    mutate: Mutator
    layout: str = "default"
    target: Target = config_target
    also: frozenset[str] = frozenset()


MUTATIONS: dict[str, Mutation] = {}
MUTATORS: dict[str, Mutator] = {}


def mutates(rule_id: str, *, layout: str = "default", target: Target | None = None,
            also: frozenset[str] | set[str] = frozenset()) -> Callable[[Mutator], Mutator]:
    """Register the decorated function as the mutation of ``rule_id``."""
    if rule_id not in RULES:
        raise KeyError(f"unknown rule id: {rule_id}")
    if layout not in LAYOUTS:
        raise KeyError(f"unknown starting layout: {layout}")

    def register(fn: Mutator) -> Mutator:
        if rule_id in MUTATIONS:
            raise ValueError(f"rule {rule_id} has two mutations")
        MUTATIONS[rule_id] = Mutation(rule_id, fn, layout, target or config_target, frozenset(also))
        MUTATORS[rule_id] = fn
        return fn

    return register


def prepare(rule_id: str, root: Path) -> Path:
    """Write the starting layout of ``rule_id``'s mutation under ``root``; return the target."""
    mutation = MUTATIONS[rule_id]
    write_layout(root, LAYOUTS[mutation.layout]())
    return mutation.target(root)


def target(rule_id: str, root: Path) -> Path:
    return MUTATIONS[rule_id].target(root)


# --------------------------------------------------------------------------- helpers


def _config(root: Path) -> ConfigSchema:
    return parse_config(json.loads((root / naming.CONFIG_JSON).read_text(encoding="utf-8")))


@contextlib.contextmanager
def _json(path: Path) -> Iterator[Any]:
    """Edit a JSON file in place: yield the value, write it back (indent 4)."""
    value = json.loads(path.read_text(encoding="utf-8"))
    yield value
    path.write_text(json.dumps(value, indent=4), encoding="utf-8")


def _edit_config(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    with _json(root / naming.CONFIG_JSON) as data:
        edit(data)


@contextlib.contextmanager
def _h5(path: Path) -> Iterator[h5py.File]:
    with h5py.File(path, "r+") as f:
        yield f


def _replace(f: h5py.File | h5py.Group, name: str, data: Any, **kwargs: Any) -> None:
    """Replace dataset ``name`` by ``data``, keeping its attributes."""
    attrs = dict(f[name].attrs)
    del f[name]
    ds = f.create_dataset(name, data=data, **kwargs)
    for key, value in attrs.items():
        ds.attrs[key] = value


def _entities(root: Path) -> Path:
    return root / _config(root).entity_path


def _bucket(root: Path, lhs: int, rhs: int) -> Path:
    return root / _config(root).edge_paths[0] / naming.bucket_file(lhs, rhs)


def _ckpt(root: Path) -> Path:
    return root / _config(root).checkpoint_path


def _featurized_rows(root: Path, rel: np.ndarray[Any, Any], side: int) -> np.ndarray[Any, Any]:
    cfg = _config(root)
    return np.array([cfg.entities[relation_types(cfg, int(r))[side]].featurized for r in rel], bool)


def _count(root: Path, entity_type: str, part: int) -> int:
    path = _entities(root) / naming.entity_count_file(entity_type, part)
    return int(path.read_text(encoding="utf-8"))


# The featurized bucket of the default layout: (0, 0) holds user, item and doc edges.
FEATURIZED_BUCKET = (0, 0)
# A bucket of user→user and user→item edges (lhs partition 1), no feature datasets.
PLAIN_BUCKET = (1, 0)


# --------------------------------------------------------------------------- layout


@mutates("path-missing")
def _path_missing(root: Path) -> None:
    shutil.rmtree(root / _config(root).edge_paths[0])


def _outside(root: Path, name: str) -> Path:
    """A place beside the layout under ``root``, outside it (the victim of a link out of it)."""
    return root.parent / f"{root.name}-outside-{name}"


@mutates("layout-link-outside")
def _layout_link_outside(root: Path) -> None:
    victim = _outside(root, "authorized_keys")
    victim.write_text("ssh-ed25519 AAAA victim\n", encoding="utf-8")
    (_ckpt(root) / naming.CHECKPOINT_LOCK).symlink_to(victim)  # fit would write its lock JSON into it


@mutates("file-not-regular", also={"entity-names-format"})
def _file_not_regular(root: Path) -> None:
    import os

    path = _entities(root) / naming.entity_names_file("item", 0)
    path.unlink()
    os.mkfifo(path)  # reading it would wait for a writer forever


@mutates("file-too-large", also={"entity-count-format"})
def _file_too_large(root: Path) -> None:
    path = _entities(root) / naming.entity_count_file("user", 0)
    path.write_text("3" + " " * (2 << 20) + "\n", encoding="utf-8")  # a count file of 2 MiB


@mutates("layout-path-outside")
def _layout_path_outside(root: Path) -> None:
    moved = _outside(root, "entities")
    shutil.move(str(_entities(root)), moved)
    _edit_config(root, lambda cfg: cfg.update(entity_path=str(moved)))


@mutates("layout-url-refused")
def _layout_url_refused(root: Path) -> None:
    # a host of the layout's choosing: validate must not send it a request (port 9, discard)
    _edit_config(root, lambda cfg: cfg.update(edge_paths=["http://127.0.0.1:9/edges", *cfg["edge_paths"][1:]]))


def _edge_dir(root: Path) -> Path:
    return root / "edges"


@mutates("layout-unrecognized", target=_edge_dir)
def _layout_unrecognized(root: Path) -> None:
    directory = _edge_dir(root)
    for path in directory.iterdir():
        path.unlink()
    (directory / "notes.txt").write_text("nothing PBG wrote lives here\n", encoding="utf-8")


def _checkpoint_dir(root: Path) -> Path:
    return root / "checkpoint"


@mutates("legacy-layout", target=_checkpoint_dir)
def _legacy_layout(root: Path) -> None:
    directory = _checkpoint_dir(root)
    shutil.rmtree(directory)
    directory.mkdir()
    (directory / "CHECKPOINT_VERSION").write_text("1", encoding="utf-8")
    (directory / "METADATA_1.pt.1").write_bytes(TORCH_LEGACY_MAGIC + b"metadata")
    (directory / "entity_count_x_1.pt").write_bytes(TORCH_LEGACY_MAGIC + b"count")
    (directory / "x_1.pt.1").write_bytes(TORCH_LEGACY_MAGIC + b"embeddings")


def _rename_type(root: Path, old: str, new: str, *, everywhere: bool = False) -> None:
    """Rename entity type ``old`` in config.json; ``everywhere``: in its files, the checkpoint's
    config copies and its model parameter names too (a consistent layout under the new name)."""
    def edit(data: dict[str, Any]) -> None:
        data["entities"] = {(new if k == old else k): v for k, v in data["entities"].items()}
        for rel in data["relations"]:
            for side in ("lhs", "rhs"):
                if rel[side] == old:
                    rel[side] = new

    _edit_config(root, edit)
    if not everywhere:
        return
    ckpt = _checkpoint_dir(root)
    with _json(ckpt / naming.CONFIG_JSON) as data:
        edit(data)
    for directory, prefixes in ((root / "entities", ("entity_count_", "entity_names_")), (ckpt, ("embeddings_",))):
        for path in sorted(directory.iterdir()):
            for prefix in prefixes:
                if path.name.startswith(f"{prefix}{old}_"):
                    path.rename(directory / f"{prefix}{new}_{path.name[len(prefix) + len(old) + 1:]}")
    for path in sorted(ckpt.glob("*.h5")):
        _edit_config_attr(path, edit)
        with _h5(path) as f:
            if f"model/entities/{old}" in f:
                f.move(f"model/entities/{old}", f"model/entities/{new}")
                for dataset in f[f"model/entities/{new}"].values():
                    dataset.attrs[STATE_DICT_KEY_ATTR] = public_to_private(
                        dataset.name.removeprefix(f"/{MODEL_GROUP}/"))


@mutates("entity-type-name-unsafe")
def _entity_type_name_unsafe(root: Path) -> None:
    _rename_type(root, "item", "item.v1")


@mutates("entity-type-name-unportable")
def _entity_type_name_unportable(root: Path) -> None:
    _rename_type(root, "item", "item?", everywhere=True)


# --------------------------------------------------------------------------- config


@mutates("config-unreadable")
def _config_unreadable(root: Path) -> None:
    (root / naming.CONFIG_JSON).write_text('{"entities": {"user": ', encoding="utf-8")


@mutates("config-schema")
def _config_schema(root: Path) -> None:
    _edit_config(root, lambda d: d.update(learning_rate=0.1))


@mutates("config-relation-entity-unknown")
def _config_relation_entity_unknown(root: Path) -> None:
    _edit_config(root, lambda d: d["relations"][1].update(rhs="product"))


@mutates("config-dynamic-relations-count")
def _config_dynamic_relations_count(root: Path) -> None:
    _edit_config(root, lambda d: d.update(dynamic_relations=True, global_emb=False))


@mutates("config-negatives-disabled")
def _config_negatives_disabled(root: Path) -> None:
    _edit_config(root, lambda d: d.update(disable_lhs_negs=True, disable_rhs_negs=True))


@mutates("config-partitions-inconsistent")
def _config_partitions_inconsistent(root: Path) -> None:
    # rhs types user (2 partitions) and item (1) become user (2) and item (3)
    _edit_config(root, lambda d: d["entities"]["item"].update(num_partitions=3))


@mutates("config-complex-odd-dimension")
def _config_complex_odd_dimension(root: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["relations"][0]["operator"] = "complex_diagonal"  # user → user
        data["entities"]["user"]["dimension"] = 5

    _edit_config(root, edit)


@mutates("config-global-emb-dynamic", layout="dynamic")
def _config_global_emb_dynamic(root: Path) -> None:
    _edit_config(root, lambda d: d.update(global_emb=True))


@mutates("config-batch-negs-divide")
def _config_batch_negs_divide(root: Path) -> None:
    _edit_config(root, lambda d: d.update(batch_size=1000, num_batch_negs=7))


@mutates("config-key-mixedcase")
def _config_key_mixedcase(root: Path) -> None:
    _edit_config(root, lambda d: d.update(numEpochs=d.pop("num_epochs")))


@mutates("config-unusual-value")
def _config_unusual_value(root: Path) -> None:
    _edit_config(root, lambda d: d.update(regularization_coef=-0.1))


@mutates("config-relation-dimensions")
def _config_relation_dimensions(root: Path) -> None:
    _edit_config(root, lambda d: d["relations"][1].update(lhs="user"))  # likes: user (4) → item (6)


@mutates("config-no-negatives", layout="plain")
def _config_no_negatives(root: Path) -> None:
    _edit_config(root, lambda d: d.update(num_batch_negs=0, num_uniform_negs=0))


@mutates("config-eval-batch-negs", layout="plain")
def _config_eval_batch_negs(root: Path) -> None:
    _edit_config(root, lambda d: d.update(eval_num_batch_negs=None))


@mutates("config-featurized-uniform-negs")
def _config_featurized_uniform_negs(root: Path) -> None:
    _edit_config(root, lambda d: d.update(num_uniform_negs=50))


@mutates("config-featurized-batch-negs")
def _config_featurized_batch_negs(root: Path) -> None:
    _edit_config(root, lambda d: d.update(num_batch_negs=0, num_uniform_negs=10))


@mutates("config-featurized-all-negs")
def _config_featurized_all_negs(root: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        featurized = {name for name, e in data["entities"].items() if e.get("featurized")}
        next(r for r in data["relations"] if {r["lhs"], r["rhs"]} & featurized)["all_negs"] = True

    _edit_config(root, edit)


@mutates("config-machines-partitions")
def _config_machines_partitions(root: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        for entity in data["entities"].values():
            entity["num_partitions"] = 1
        data["num_machines"] = 2

    _edit_config(root, edit)


@mutates("config-logistic-cos")
def _config_logistic_cos(root: Path) -> None:
    _edit_config(root, lambda d: d.update(loss_fn="logistic", comparator="cos"))


# --------------------------------------------------------------------------- entities


@mutates("entity-count-missing")
def _entity_count_missing(root: Path) -> None:
    (_entities(root) / naming.entity_count_file("user", 1)).unlink()


@mutates("entity-count-format")
def _entity_count_format(root: Path) -> None:
    (_entities(root) / naming.entity_count_file("user", 1)).write_text("4.0\n", encoding="utf-8")


@mutates("entity-count-extra")
def _entity_count_extra(root: Path) -> None:
    (_entities(root) / naming.entity_count_file("user", 2)).write_text("3\n", encoding="utf-8")


@mutates("entity-names-format")
def _entity_names_format(root: Path) -> None:
    path = _entities(root) / naming.entity_names_file("item", 0)
    path.write_text('{"names": ["a", "b"]}', encoding="utf-8")


@mutates("entity-names-count")
def _entity_names_count(root: Path) -> None:
    with _json(_entities(root) / naming.entity_names_file("user", 0)) as names:
        names.pop()


@mutates("entity-names-duplicate")
def _entity_names_duplicate(root: Path) -> None:
    with _json(_entities(root) / naming.entity_names_file("item", 0)) as names:
        names[2] = names[0]


@mutates("dynamic-rel-count-missing", layout="dynamic")
def _dynamic_rel_count_missing(root: Path) -> None:
    (_entities(root) / naming.DYNAMIC_REL_COUNT).unlink()


@mutates("dynamic-rel-count-format", layout="dynamic")
def _dynamic_rel_count_format(root: Path) -> None:
    (_entities(root) / naming.DYNAMIC_REL_COUNT).write_text("three\n", encoding="utf-8")


@mutates("dynamic-rel-names-format")
def _dynamic_rel_names_format(root: Path) -> None:
    (_entities(root) / naming.DYNAMIC_REL_NAMES).write_text('"follows"', encoding="utf-8")


@mutates("dynamic-rel-names-count")
def _dynamic_rel_names_count(root: Path) -> None:
    with _json(_entities(root) / naming.DYNAMIC_REL_NAMES) as names:
        names.append("extra")


@mutates("relation-names-mismatch")
def _relation_names_mismatch(root: Path) -> None:
    with _json(_entities(root) / naming.DYNAMIC_REL_NAMES) as names:
        names[0], names[1] = names[1], names[0]


# --------------------------------------------------------------------------- edges


@mutates("edge-file-missing")
def _edge_file_missing(root: Path) -> None:
    _bucket(root, 1, 1).unlink()


@mutates("edge-file-extra")
def _edge_file_extra(root: Path) -> None:
    shutil.copyfile(_bucket(root, 0, 1), _bucket(root, 2, 0))


@mutates("h5-unreadable")
def _h5_unreadable(root: Path) -> None:
    path = _bucket(root, 0, 1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@mutates("h5-format-version")
def _h5_format_version(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        f.attrs["format_version"] = np.int64(2)


@mutates("h5-external-link")
def _h5_external_link(root: Path) -> None:
    # A bucket's lhs read from another file: the link is refused as the bucket opens, never followed.
    with _h5(_bucket(root, 0, 1)) as f:
        del f["lhs"]
        f["lhs"] = h5py.ExternalLink(str(_outside(root, "edges.h5")), "/lhs")


@mutates("h5-size-bound")
def _h5_size_bound(root: Path) -> None:
    # lhs compressed in one chunk that inflates to 2 GiB: each read would inflate it whole.
    with _h5(_bucket(root, 0, 1)) as f:
        values = f["lhs"][...]
        del f["lhs"]
        ds = f.create_dataset("lhs", shape=values.shape, maxshape=(None,), dtype=values.dtype,
                              chunks=((2 << 30) // values.dtype.itemsize,), compression="gzip")
        ds.id.write_direct_chunk((0,), deflated_zeros(values.tobytes(), 2 << 30))


DEFLATE_BLOCK = 1 << 20
"""Bytes of zeros :func:`deflated_zeros` compresses once and repeats."""


def deflated_zeros(head: bytes, size: int) -> bytes:
    """A zlib stream (what HDF5's deflate filter reads) of ``head`` followed by zeros, ``size`` bytes in
    all (a multiple of :data:`DEFLATE_BLOCK`, ``head`` at most one block), built in milliseconds whatever
    ``size``: each block of zeros compresses to the same bytes after a full flush, so it is compressed once.

    >>> import zlib
    >>> data = zlib.decompress(deflated_zeros(b"pbg", 4 << 20))
    >>> len(data), data[:4], data.count(0)
    (4194304, b'pbg\\x00', 4194301)
    """
    if size % DEFLATE_BLOCK or len(head) > DEFLATE_BLOCK or size < DEFLATE_BLOCK:
        raise ValueError(f"expected a size in whole blocks of {DEFLATE_BLOCK} bytes and a head of at most one")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the zlib header and checksum are added here
    first = deflate.compress(head + bytes(DEFLATE_BLOCK - len(head))) + deflate.flush(zlib.Z_FULL_FLUSH)
    zeros = deflate.compress(bytes(DEFLATE_BLOCK)) + deflate.flush(zlib.Z_FULL_FLUSH)
    checksum = zlib.adler32(head)
    low, high = checksum & 0xFFFF, checksum >> 16
    high = (high + (size - len(head)) * low) % 65521  # Adler-32 over zeros: the low sum stays, the high grows
    return (b"\x78\xda" + first + zeros * (size // DEFLATE_BLOCK - 1) + deflate.flush()
            + ((high << 16) | low).to_bytes(4, "big"))


@mutates("edge-dataset-missing")
def _edge_dataset_missing(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        del f["rhs"]


@mutates("edge-dataset-dtype")
def _edge_dataset_dtype(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        _replace(f, "rel", f["rel"][...].astype(np.int32))


@mutates("edge-dataset-shape")
def _edge_dataset_shape(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        _replace(f, "lhs", f["lhs"][...].reshape(-1, 1))


@mutates("edge-dataset-unknown")
def _edge_dataset_unknown(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        f.create_dataset("timestamp", data=np.arange(len(f["rel"]), dtype=np.int64))


@mutates("edge-length-mismatch")
def _edge_length_mismatch(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        f["rhs"].resize((f["rhs"].shape[0] - 1,))


@mutates("edge-weight-int")
def _edge_weight_int(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        _replace(f, "weight", np.floor(f["weight"][...]).astype(np.int64))


@mutates("edge-weight-invalid")
def _edge_weight_invalid(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        f["weight"][2] = -1.0


@mutates("edge-rel-range")
def _edge_rel_range(root: Path) -> None:
    # Row 3 of bucket (0, 1) (all user → user, relation 0) gets a relation id past the end.
    with _h5(_bucket(root, 0, 1)) as f:
        f["rel"][3] = len(_config(root).relations) + 5


@mutates("edge-lhs-range")
def _edge_lhs_range(root: Path) -> None:
    lhs_part = PLAIN_BUCKET[0]
    with _h5(_bucket(root, *PLAIN_BUCKET)) as f:
        f["lhs"][3] = _count(root, "user", lhs_part)


@mutates("edge-rhs-range")
def _edge_rhs_range(root: Path) -> None:
    with _h5(_bucket(root, 0, 1)) as f:
        f["rhs"][3] = -1


def _featurized_side_rows(root: Path, f: h5py.File) -> np.ndarray[Any, Any]:
    """Which rows of an open bucket have a featurized lhs type."""
    return _featurized_rows(root, f["rel"][...], 0)


@mutates("edge-offsets-pair")
def _edge_offsets_pair(root: Path) -> None:
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        del f["lhsd_data"]


@mutates("edge-offsets-length")
def _edge_offsets_length(root: Path) -> None:
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        off = f["lhsd_offsets"][...]
        data = f["lhsd_data"][...]
        # one entry short, still ending at len(data)
        _replace(f, "lhsd_offsets", np.concatenate([off[:-2], off[-1:]]))
        assert off[-1] == len(data)


@mutates("edge-offsets-start")
def _edge_offsets_start(root: Path) -> None:
    # Every offset shifted by one over a data array with one leading (valid) feature id:
    # bags unchanged, offsets non-decreasing, ending at len(data), but starting at 1.
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        off = f["lhsd_offsets"][...]
        data = f["lhsd_data"][...]
        _replace(f, "lhsd_offsets", off + 1)
        _replace(f, "lhsd_data", np.concatenate([np.zeros(1, np.int64), data]))


@mutates("edge-offsets-order")
def _edge_offsets_order(root: Path) -> None:
    # Featurized rows i-1 and i with a non-empty bag after them: offsets[i] := offsets[i+1] + 1
    # makes offsets decrease at i+1, while every bag stays within lhsd_data and only
    # featurized rows change.
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        featurized = _featurized_side_rows(root, f)
        off = f["lhsd_offsets"][...]
        size = len(f["lhsd_data"])
        i = next(i for i in range(1, len(featurized))
                 if featurized[i - 1] and featurized[i] and off[i + 1] < size)
        off[i] = off[i + 1] + 1
        f["lhsd_offsets"][...] = off


@mutates("edge-offsets-end")
def _edge_offsets_end(root: Path) -> None:
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        data = f["lhsd_data"][...]
        _replace(f, "lhsd_data", np.concatenate([data, np.zeros(1, np.int64)]))


@mutates("edge-feature-range")
def _edge_feature_range(root: Path) -> None:
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        f["lhsd_data"][0] = _count(root, "doc", 0)


@mutates("edge-featurized-missing")
def _edge_featurized_missing(root: Path) -> None:
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        del f["lhsd_offsets"]
        del f["lhsd_data"]


@mutates("edge-features-unused")
def _edge_features_unused(root: Path) -> None:
    # No relation of the default layout has a featurized rhs type: empty rhs bags are ignored data.
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        n = f["rel"].shape[0]
        f.create_dataset("rhsd_offsets", data=np.zeros(n + 1, dtype=np.int64))
        f.create_dataset("rhsd_data", data=np.zeros(0, dtype=np.int64))


@mutates("edge-plain-features")
def _edge_plain_features(root: Path) -> None:
    # Give the first plain-lhs row of the featurized bucket one (valid) feature.
    with _h5(_bucket(root, *FEATURIZED_BUCKET)) as f:
        featurized = _featurized_side_rows(root, f)
        i = int(np.flatnonzero(~featurized)[0])
        off = f["lhsd_offsets"][...]
        data = f["lhsd_data"][...]
        at = int(off[i])
        off[i + 1:] += 1
        _replace(f, "lhsd_offsets", off)
        _replace(f, "lhsd_data", np.insert(data, at, 0))


# --------------------------------------------------------------------------- checkpoint


def _model(root: Path) -> Path:
    return _ckpt(root) / naming.model_file(1)


def _embeddings(root: Path, entity_type: str, part: int) -> Path:
    return _ckpt(root) / naming.embeddings_file(entity_type, part, 1)


def _edit_config_attr(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    with _h5(path) as f:
        data = json.loads(f.attrs[CONFIG_JSON_ATTR])
        edit(data)
        f.attrs[CONFIG_JSON_ATTR] = json.dumps(data, indent=4)


@mutates("checkpoint-version-format")
def _checkpoint_version_format(root: Path) -> None:
    (_ckpt(root) / naming.CHECKPOINT_VERSION).write_text("v1\n", encoding="utf-8")


@mutates("checkpoint-file-missing")
def _checkpoint_file_missing(root: Path) -> None:
    _embeddings(root, "item", 0).unlink()


@mutates("checkpoint-config-missing")
def _checkpoint_config_missing(root: Path) -> None:
    (_ckpt(root) / naming.CONFIG_JSON).unlink()


@mutates("checkpoint-config-mismatch")
def _checkpoint_config_mismatch(root: Path) -> None:
    _edit_config_attr(_model(root), lambda d: d.update(bias=True))


@mutates("checkpoint-config-drift")
def _checkpoint_config_drift(root: Path) -> None:
    _edit_config_attr(_embeddings(root, "user", 1),
                      lambda d: d.update(num_epochs=d["num_epochs"] + 7))


@mutates("checkpoint-attrs")
def _checkpoint_attrs(root: Path) -> None:
    with _h5(_model(root)) as f:
        del f.attrs["iteration/edge_path"]


@mutates("checkpoint-stale-files")
def _checkpoint_stale_files(root: Path) -> None:
    # an interrupted commit of version 2: its model file is written, the version file still says 1
    shutil.copyfile(_model(root), _ckpt(root) / naming.model_file(2))


@mutates("checkpoint-snapshot-broken", layout="snapshot")
def _checkpoint_snapshot_broken(root: Path) -> None:
    link = _ckpt(root) / naming.snapshot_dir(1) / naming.model_file(1)
    link.unlink()
    link.symlink_to((_ckpt(root) / "gone" / naming.model_file(1)).resolve())


@mutates("training-stats-format")
def _training_stats_format(root: Path) -> None:
    with (_ckpt(root) / naming.TRAINING_STATS).open("a", encoding="utf-8") as out:
        out.write("[1, 2, 3]\n")


@mutates("training-stats-index")
def _training_stats_index(root: Path) -> None:
    with (_ckpt(root) / naming.TRAINING_STATS).open("a", encoding="utf-8") as out:
        out.write(json.dumps({"stats": {"count": 3, "metrics": {"loss": 0.5}}}) + "\n")


@mutates("training-stats-object")
def _training_stats_object(root: Path) -> None:
    # what pbgtrain wrote before 0.1: the protocol inside the stats object
    line = {"index": 9, "eval_stats_after": {"count": 3, "metrics": {"mrr": 0.5}, "protocol": "raw"}}
    with (_ckpt(root) / naming.TRAINING_STATS).open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


@mutates("embeddings-dataset")
def _embeddings_dataset(root: Path) -> None:
    with _h5(_embeddings(root, "user", 0)) as f:
        _replace(f, EMBEDDINGS_DATASET, f[EMBEDDINGS_DATASET][...].astype(np.float64))


@mutates("embeddings-shape")
def _embeddings_shape(root: Path) -> None:
    with _h5(_embeddings(root, "item", 0)) as f:
        _replace(f, EMBEDDINGS_DATASET, f[EMBEDDINGS_DATASET][:-1])


@mutates("embeddings-nonfinite")
def _embeddings_nonfinite(root: Path) -> None:
    with _h5(_embeddings(root, "user", 1)) as f:
        f[EMBEDDINGS_DATASET][2, 1] = np.nan


@mutates("optimizer-blob")
def _optimizer_blob(root: Path) -> None:
    with _h5(_embeddings(root, "user", 0)) as f:
        _replace(f, OPTIMIZER_DATASET, np.frombuffer(b"not a torch payload", dtype="V1"))


def _replace_blob(path: Path, blob: bytes) -> None:
    with _h5(path) as f:
        _replace(f, OPTIMIZER_DATASET, np.frombuffer(blob, dtype="V1"))


@mutates("optimizer-state-embeddings")
def _optimizer_state_embeddings(root: Path) -> None:
    # what pbgtrain wrote before 0.1: a param group without lr_decay and weight_decay
    import torch

    count = len(_embeddings_array(root, "user", 0))
    _replace_blob(_embeddings(root, "user", 0), encode_state_dict(
        {"state": {0: {"sum": torch.zeros(count)}}, "param_groups": [{"lr": 0.01, "params": [0]}]}))


@mutates("optimizer-state-model")
def _optimizer_state_model(root: Path) -> None:
    # the accumulators listed in another order than the original's parameter order
    with _h5(_model(root)) as f:
        shapes = [f[_param(name)].shape for name in _model_param_order(root)]
    _replace_blob(_model(root), encode_adagrad([np.ones(s, np.float32) for s in reversed(shapes)], lr=0.01))


@mutates("optimizer-state-values")
def _optimizer_state_values(root: Path) -> None:
    sums = np.ones(len(_embeddings_array(root, "item", 0)), np.float32)
    sums[3] = np.nan
    _replace_blob(_embeddings(root, "item", 0), encode_row_adagrad(sums, lr=0.01))


def _embeddings_array(root: Path, etype: str, part: int) -> np.ndarray[Any, Any]:
    with h5py.File(_embeddings(root, etype, part), "r") as f:
        return np.asarray(f[EMBEDDINGS_DATASET][...])


def _model_param_order(root: Path) -> list[str]:
    cfg = _config(root)
    dynamic = None
    if cfg.dynamic_relations:
        dynamic = int((_entities(root) / naming.DYNAMIC_REL_COUNT).read_text(encoding="utf-8"))
    return list(expected_model_params(cfg, dynamic))


def _param(name: str) -> str:
    return f"{MODEL_GROUP}/{name}"


@mutates("model-param-name")
def _model_param_name(root: Path) -> None:
    # relation index 9 does not exist in the config (which has 3 relations)
    with _h5(_model(root)) as f:
        ds = f.create_dataset(_param("relations/9/operator/rhs/diagonal"),
                              data=np.ones(4, np.float32))
        ds.attrs[STATE_DICT_KEY_ATTR] = "rhs_operators.9.diagonal"


@mutates("model-state-dict-key")
def _model_state_dict_key(root: Path) -> None:
    with _h5(_model(root)) as f:
        f[_param("relations/0/operator/rhs/translation")].attrs[STATE_DICT_KEY_ATTR] = (
            "rhs_operators.1.translation")


@mutates("model-param-dtype")
def _model_param_dtype(root: Path) -> None:
    with _h5(_model(root)) as f:
        name = _param("relations/0/operator/rhs/translation")
        _replace(f, name, f[name][...].astype(np.float64))


@mutates("model-param-shape")
def _model_param_shape(root: Path) -> None:
    with _h5(_model(root)) as f:
        name = _param("entities/user/global_embedding")
        _replace(f, name, np.concatenate([f[name][...], np.zeros(1, np.float32)]))


@mutates("model-param-missing")
def _model_param_missing(root: Path) -> None:
    with _h5(_model(root)) as f:
        del f[_param("relations/1/operator/rhs/diagonal")]


@mutates("model-param-nonfinite")
def _model_param_nonfinite(root: Path) -> None:
    with _h5(_model(root)) as f:
        f[_param("relations/2/operator/rhs/linear_transformation")][1, 1] = np.inf


# --------------------------------------------------------------------------- nearest-neighbour indexes


def _built_index(root: Path) -> Path:
    """Build the index of 'user' for the committed version; return its file."""
    from pbgio.index import build_index

    return Path(str(build_index(root / naming.CONFIG_JSON, "user", kind="flat").path))


def _edit_index_meta(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    from pbgio.spec.index import META_ATTR

    with _h5(path) as f:
        meta = json.loads(f.attrs[META_ATTR])
        edit(meta)
        f.attrs[META_ATTR] = json.dumps(meta)


@mutates("index-foreign", layout="plain")
def _index_foreign(root: Path) -> None:
    # an index file that lost its metadata: not recognizably pbgio's
    from pbgio.spec.index import META_ATTR

    with _h5(_built_index(root)) as f:
        del f.attrs[META_ATTR]


@mutates("index-version-mismatch", layout="plain")
def _index_version_mismatch(root: Path) -> None:
    # an index of version 0 renamed to version 1 (its metadata still says 0)
    _edit_index_meta(_built_index(root), lambda meta: meta.update(version=0))


@mutates("index-damaged", layout="plain")
def _index_damaged(root: Path) -> None:
    from pbgio.spec.index import PAYLOAD_DATASET

    with _h5(_built_index(root)) as f:
        payload = f[PAYLOAD_DATASET][()]
        payload[len(payload) // 2] ^= 0xFF
        f[PAYLOAD_DATASET][...] = payload


@mutates("index-stale", layout="plain")
def _index_stale(root: Path) -> None:
    # the table changed after the index was built (a row rewritten in place)
    _built_index(root)
    with _h5(_ckpt(root) / naming.embeddings_file("user", 0, 1)) as f:
        f[EMBEDDINGS_DATASET][0] = f[EMBEDDINGS_DATASET][0] + np.float32(1.0)
