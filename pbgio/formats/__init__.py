"""Low-level file formats under the artifacts (a layer of :mod:`pbgio`): HDF5 opened with
guards against hostile files (:mod:`~pbgio.formats.h5`, :mod:`~pbgio.formats.h5guard`,
:mod:`~pbgio.formats.h5heap`), torch's zip payloads read without unpickling
(:mod:`~pbgio.formats.torch_payload`), and what a FAISS index payload's header claims, bounded by
its bytes (:mod:`~pbgio.formats.faiss_claims`). Internal: the artifact modules (:mod:`pbgio.edges`,
:mod:`pbgio.checkpoint` …) are the API over them.
"""
