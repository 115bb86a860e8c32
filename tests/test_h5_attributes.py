"""Text attributes of HDF5 files (pbgio.formats.h5.attr_str): bytes that are not UTF-8 read as
U+FFFD, so what a reader returns can be written again (a guided fuzzer's find: h5py gives such a
variable-length string as a ``str`` of lone surrogates, which h5py then refuses to write)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from pbgio.checkpoint import CheckpointDir, EmbeddingsState
from pbgio.formats.h5 import attr_str
from pbgio.spec.checkpoint import CONFIG_JSON_ATTR


def test_text_attribute_that_is_not_utf8_reads_as_replacement_and_writes_again(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path / "a")
    path = ckpt.write_embeddings("user", 0, 1, EmbeddingsState(np.zeros((2, 3), np.float32)))
    with h5py.File(path, "r+") as f:
        f.attrs.create(CONFIG_JSON_ATTR, np.array(b'{"x": "\xff"}', dtype=h5py.string_dtype("utf-8")))
    with h5py.File(path, "r") as f:
        assert isinstance(f.attrs[CONFIG_JSON_ATTR], str)  # h5py's surrogateescape'd text
        assert attr_str(f, CONFIG_JSON_ATTR) == '{"x": "\ufffd"}'
    metadata = ckpt.read_metadata(path)
    copy = CheckpointDir(tmp_path / "b")
    written = copy.write_embeddings("user", 0, 1, EmbeddingsState(np.zeros((2, 3), np.float32)), metadata)
    assert copy.read_metadata(written) == metadata
