"""Edge lists in, PBG layouts out: ``pbgio import`` and :func:`import_edge_lists`.

TSV, CSV, whitespace-separated text and Parquet edge lists become a complete layout
for a config: entity dictionaries per type (names and counts), seeded partitions,
every bucket (empty ones too), static or dynamic relations, float weights, feature
lists of featurized types, with several input sets (train/valid/test) sharing one
dictionary. Both passes read the files block by block, so memory is bounded by the
dictionaries and the write buffers, not by the number of edges. :func:`append_edge_lists`
(``pbgio import --append``) adds edges, and the entities they name, to an existing layout,
leaving every known entity where it was (:mod:`~pbgio.importers.append`).

Submodules: :mod:`~pbgio.importers.read` (input formats, blocks), :mod:`~pbgio.importers.plan`
(what the config asks, row checks), :mod:`~pbgio.importers.nameindex` (hash-keyed name
ids and counts), :mod:`~pbgio.importers.dictionary` (counting and dictionaries),
:mod:`~pbgio.importers.partition`, :mod:`~pbgio.importers.mapping` (names to offsets),
:mod:`~pbgio.importers.write` (staging, bucket writers), :mod:`~pbgio.importers.summary`
and :mod:`~pbgio.cli.importing`. Names are exported lazily so that ``pbgio`` commands
that do not import stay free of polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pbgio.lazy import lazy_exports

if TYPE_CHECKING:
    from pbgio.importers.append import append_edge_lists
    from pbgio.importers.importer import import_edge_lists
    from pbgio.importers.plan import ImportSetupError
    from pbgio.importers.read import InputOptions
    from pbgio.importers.summary import AppendInfo, FileReport, ImportReport, Problem
    from pbgio.importers.write import LayoutExistsError

__all__, __getattr__ = lazy_exports("pbgio.importers", {
    "pbgio.importers.append": ["append_edge_lists"],
    "pbgio.importers.importer": ["import_edge_lists"],
    "pbgio.importers.plan": ["ImportSetupError"],
    "pbgio.importers.read": ["InputOptions"],
    "pbgio.importers.summary": ["AppendInfo", "FileReport", "ImportReport", "Problem"],
    "pbgio.importers.write": ["LayoutExistsError"],
})
