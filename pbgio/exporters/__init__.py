"""Trained embeddings and relation parameters out of a checkpoint: ``pbgio export``.

:func:`export_embeddings` writes TSV (the original's layout), Parquet or .npy with
names; :func:`export_relations` writes operator parameters as TSV or JSON;
:func:`embed_bags` embeds new bags of features of a featurized type (``pbgio embed``). Global
embeddings are added to the exported rows as the original's exporter adds them (see
:mod:`pbgio.exporters.embeddings`). Names are exported lazily so that commands that
do not export stay free of polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pbgio.lazy import lazy_exports

if TYPE_CHECKING:
    from pbgio.exporters.bags import embed_bags
    from pbgio.exporters.common import ExportError, ExportReport, OutputExistsError
    from pbgio.exporters.embeddings import export_embeddings
    from pbgio.exporters.relations import export_relations, relation_parameters

__all__, __getattr__ = lazy_exports("pbgio.exporters", {
    "pbgio.exporters.bags": ["embed_bags"],
    "pbgio.exporters.common": ["ExportError", "ExportReport", "OutputExistsError"],
    "pbgio.exporters.embeddings": ["export_embeddings"],
    "pbgio.exporters.relations": ["export_relations", "relation_parameters"],
})
