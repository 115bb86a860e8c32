"""Trained embeddings and relation parameters out of a checkpoint: ``pbgio export``.

:func:`export_embeddings` writes TSV (the original's layout), Parquet or .npy with
names; :func:`export_relations` writes operator parameters as TSV or JSON. Global
embeddings are added to the exported rows as the original's exporter adds them (see
:mod:`pbgio.exporters.embeddings`). Names are exported lazily so that commands that
do not export stay free of polars.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pbgio.exporters.common import ExportError, ExportReport, OutputExistsError
    from pbgio.exporters.embeddings import export_embeddings
    from pbgio.exporters.relations import export_relations, relation_parameters

_EXPORTS = {
    "pbgio.exporters.common": ["ExportError", "ExportReport", "OutputExistsError"],
    "pbgio.exporters.embeddings": ["export_embeddings"],
    "pbgio.exporters.relations": ["export_relations", "relation_parameters"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "ExportError",
    "ExportReport",
    "OutputExistsError",
    "export_embeddings",
    "export_relations",
    "relation_parameters",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pbgio.exporters' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
