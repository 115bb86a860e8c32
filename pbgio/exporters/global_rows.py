"""The global embeddings a checkpoint's model file holds, added to exported rows as the original's
exporter adds them: float32 + float32 (``pbgio export``, ``pbgio embed``, ``pbgio neighbors``).

Free of polars, so the commands that read embeddings without writing tables import none.

>>> import numpy as np
>>> add_global_embedding(np.ones((2, 3), dtype=np.float32), np.arange(3, dtype=np.float32), "user").tolist()
[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from pbgio.exporters.common import ExportError
from pbgio.layout import CheckpointVersion
from pbgio.spec.checkpoint import global_embedding_name

Floats = NDArray[np.float32]


def global_embeddings(source: CheckpointVersion, types: list[str]) -> dict[str, Floats]:
    """The global embedding of each of ``types`` in the model file of the exported version."""
    model = source.checkpoint.read_model(source.version)
    found = {}
    for entity_type in types:
        value = model.params.get(global_embedding_name(entity_type))
        if value is None:
            raise ExportError(f"{source.checkpoint.model_path(source.version)}: expected "
                              f"model/{global_embedding_name(entity_type)} (global_emb is true), found none; "
                              "export without global embeddings (--no-global) to skip them")
        found[entity_type] = np.asarray(value, dtype=np.float32)
    return found



def add_global_embedding(values: Floats, shift: Floats | None, entity_type: str) -> Floats:
    """Rows as exported: float32, C-contiguous, plus the global embedding ``shift`` when given."""
    if shift is not None:
        if shift.shape != (values.shape[1],):
            raise ExportError(f"expected a global embedding of shape ({values.shape[1]},) for {entity_type!r}, "
                              f"found {shift.shape}")
        values = values + shift  # float32 + float32, as the original adds them
    return np.ascontiguousarray(values, dtype=np.float32)
