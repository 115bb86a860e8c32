"""The rule catalogue: every rule the validator checks, with a stable id.

Rule ids never change meaning once published; new rules get new ids. The docs
table ``docs/format/rules.md`` and the meta-test that demands a mutation test
per rule are generated from :data:`RULES`.

>>> RULES["edge-rel-range"].severity
'error'
>>> rule("no-such-rule")
Traceback (most recent call last):
...
KeyError: 'unknown rule id: no-such-rule'
"""

from __future__ import annotations

from dataclasses import dataclass

from pbgio.errors import Issue, Severity


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    artifact: str
    text: str

    def issue(
        self,
        file: str | None,
        dataset: str | None,
        message: str,
        *,
        rows: tuple[int, ...] = (),
        count: int | None = None,
    ) -> Issue:
        return Issue(self.id, self.severity, file, dataset, message, rows, count)


_CATALOGUE: list[tuple[str, Severity, str, str]] = [
    # --- layout ---------------------------------------------------------------------------
    ("path-missing", "error", "layout",
     "A directory named by the config as input exists: entity_path, every edge path, and init_path "
     "when set (checkpoint_path is the output and may not exist before training)."),
    ("layout-unrecognized", "error", "layout",
     "A directory given to `pbgio validate` holds a recognizable PBG artifact."),
    ("legacy-layout", "error", "layout",
     "The directory is in the current layout, not the legacy .pt layout (migrate it with "
     "`pbgio convert --from legacy SRC DST`)."),
    ("entity-type-name-unsafe", "error", "config",
     "An entity type name is usable in file names on every platform and in model dataset names: "
     "not empty, at most 200 bytes, no path separator, control character, dot (the original maps "
     "entities/{type}/global_embedding with [^./]+) or any of <>:\"|?*, and no leading or "
     "trailing space."),
    # --- config ---------------------------------------------------------------------------
    ("config-unreadable", "error", "config", "The config file exists and is a JSON object."),
    ("config-schema", "error", "config",
     "Every key is known and every value has the type and range the schema gives."),
    ("config-relation-entity-unknown", "error", "config",
     "Every relation's lhs and rhs name an entity type of `entities`."),
    ("config-dynamic-relations-count", "error", "config",
     "With dynamic_relations, `relations` holds exactly one relation."),
    ("config-negatives-disabled", "error", "config",
     "disable_lhs_negs and disable_rhs_negs are not both true."),
    ("config-partitions-inconsistent", "error", "config",
     "On each side (lhs, rhs) all partitioned entity types share one num_partitions."),
    ("config-complex-odd-dimension", "error", "config",
     "complex_diagonal relations join entity types of even dimension."),
    ("config-global-emb-dynamic", "error", "config",
     "global_emb is false when dynamic_relations is true (the original fails at run time)."),
    ("config-batch-negs-divide", "error", "config",
     "batch_size is a multiple of num_batch_negs when num_batch_negs > 0."),
    ("config-machines-partitions", "error", "config",
     "num_machines > 1 needs at least one entity type with more than one partition."),
    ("config-featurized-uniform-negs", "error", "config",
     "With a featurized entity type, num_uniform_negs is 0: featurized entities take same-batch "
     "negatives only, so uniform sampling is disabled globally (seed 002)."),
    ("config-featurized-batch-negs", "error", "config",
     "With a featurized entity type, num_batch_negs > 0 (same-batch negatives are the only ones left)."),
    ("config-featurized-all-negs", "error", "config",
     "A relation whose lhs or rhs type is featurized has all_negs false (a featurized type has "
     "features, not a list of entities to rank against)."),
    ("config-featurized-eval-negs", "error", "config",
     "With a featurized entity type and eval_fraction > 0, evaluation takes same-batch negatives "
     "only: eval_num_uniform_negs (or num_uniform_negs when null) is 0 and eval_num_batch_negs (or "
     "num_batch_negs when null) > 0."),
    ("config-logistic-cos", "warning", "config",
     "The logistic loss is not combined with the cos comparator (scores in [-1, 1] train poorly)."),
    # --- entities -------------------------------------------------------------------------
    ("entity-count-missing", "error", "entities",
     "entity_count_{type}_{part}.txt exists for every entity type and partition of the config."),
    ("entity-count-format", "error", "entities",
     "A count file holds one non-negative integer in ASCII digits, optionally surrounded by "
     "whitespace (the original writes it followed by a newline)."),
    ("entity-count-extra", "warning", "entities",
     "No count file names a partition beyond the type's num_partitions or an unknown type."),
    ("entity-names-format", "error", "entities",
     "entity_names_{type}_{part}.json is a JSON list of strings."),
    ("entity-names-count", "error", "entities",
     "An entity names file lists exactly as many names as the partition's count."),
    ("entity-names-duplicate", "warning", "entities",
     "Entity names are unique within a partition."),
    ("dynamic-rel-count-missing", "error", "entities",
     "dynamic_rel_count.txt exists when dynamic_relations is true."),
    ("dynamic-rel-count-format", "error", "entities",
     "dynamic_rel_count.txt holds one non-negative integer in ASCII digits (whitespace around it "
     "allowed)."),
    ("dynamic-rel-names-format", "error", "entities",
     "dynamic_rel_names.json is a JSON list of strings."),
    ("dynamic-rel-names-count", "error", "entities",
     "dynamic_rel_names.json lists as many names as the relation count (dynamic_rel_count.txt, "
     "or the config's relations in static mode)."),
    ("relation-names-mismatch", "error", "entities",
     "In static mode, dynamic_rel_names.json (when present) equals the config's relation names in "
     "order."),
    # --- edges ----------------------------------------------------------------------------
    ("edge-file-missing", "error", "edges",
     "Every bucket edges_{lhs}_{rhs}.h5 of the partition grid exists (empty buckets too)."),
    ("edge-file-extra", "warning", "edges",
     "No bucket file lies outside the partition grid of the config."),
    ("h5-unreadable", "error", "hdf5",
     "An .h5 file opens as HDF5 (not truncated, not another format)."),
    ("h5-format-version", "error", "hdf5",
     "The root attribute format_version exists and equals 1."),
    ("edge-dataset-missing", "error", "edges", "Datasets rel, lhs and rhs exist."),
    ("edge-dataset-dtype", "error", "edges",
     "rel, lhs, rhs, *_offsets and *_data are int64; weight is a float (or, as the original's "
     "buggy importer wrote it, an integer)."),
    ("edge-dataset-shape", "error", "edges", "Every edge dataset is one-dimensional."),
    ("edge-dataset-unknown", "warning", "edges",
     "A bucket holds no dataset beyond rel, lhs, rhs, weight and lhsd_/rhsd_ offsets and data."),
    ("edge-length-mismatch", "error", "edges", "rel, lhs, rhs (and weight) have the same length."),
    ("edge-weight-int", "warning", "edges",
     "weight is stored as a float; an integer weight is what the original's importer wrote after "
     "truncating float weights."),
    ("edge-weight-invalid", "error", "edges", "Every weight is finite and non-negative."),
    ("edge-rel-range", "error", "edges",
     "0 <= rel < number of relations (config relations, or dynamic_rel_count in dynamic mode)."),
    ("edge-lhs-range", "error", "edges",
     "For plain (non-featurized) lhs entities, 0 <= lhs < count of the relation's lhs type in "
     "the bucket's lhs partition."),
    ("edge-rhs-range", "error", "edges",
     "For plain (non-featurized) rhs entities, 0 <= rhs < count of the relation's rhs type in "
     "the bucket's rhs partition."),
    ("edge-offsets-pair", "error", "edges",
     "{side}d_offsets and {side}d_data are both present or both absent."),
    ("edge-offsets-length", "error", "edges", "{side}d_offsets has N + 1 entries for N edges."),
    ("edge-offsets-start", "error", "edges", "{side}d_offsets starts at 0."),
    ("edge-offsets-order", "error", "edges", "{side}d_offsets is non-decreasing."),
    ("edge-offsets-end", "error", "edges", "{side}d_offsets ends at len({side}d_data)."),
    ("edge-feature-range", "error", "edges",
     "Feature ids in {side}d_data lie in [0, feature count of the featurized type's partition)."),
    ("edge-featurized-missing", "error", "edges",
     "A bucket with edges whose lhs (rhs) type is featurized has lhsd_* (rhsd_*) datasets."),
    ("edge-plain-features", "error", "edges",
     "Edges whose entity on a side is not featurized have an empty feature list on that side."),
    ("edge-features-unused", "warning", "edges",
     "A bucket holds lhsd_* (rhsd_*) datasets only when some relation of the config has a "
     "featurized lhs (rhs) type (the original ignores them otherwise)."),
    # --- checkpoint -----------------------------------------------------------------------
    ("checkpoint-version-format", "error", "checkpoint",
     "checkpoint_version.txt holds one non-negative integer in ASCII digits (whitespace around it "
     "allowed; empty means 0)."),
    ("checkpoint-file-missing", "error", "checkpoint",
     "For the version N in checkpoint_version.txt (N > 0), model.vN.h5 and "
     "embeddings_{type}_{part}.vN.h5 exist for every entity type and partition."),
    ("checkpoint-config-missing", "warning", "checkpoint",
     "A checkpoint directory with a committed version holds config.json."),
    ("checkpoint-config-mismatch", "error", "checkpoint",
     "The config/json attribute of every checkpoint file, config.json and the validated config "
     "agree on the keys that define the model (entities, relations, dimension, global_emb, bias, "
     "dynamic_relations, comparator)."),
    ("checkpoint-config-drift", "warning", "checkpoint",
     "The config/json attribute and config.json agree on every other key too."),
    ("checkpoint-attrs", "warning", "checkpoint",
     "A checkpoint file has the root attributes config/json and iteration/* the original writes."),
    ("checkpoint-stale-files", "warning", "checkpoint",
     "No files of versions other than the committed one, v0 and preserved snapshots remain "
     "(leftovers of an interrupted commit)."),
    ("checkpoint-snapshot-broken", "warning", "checkpoint",
     "Every epoch_{k}/ snapshot holds a version file and links that resolve to existing files."),
    ("training-stats-format", "error", "checkpoint",
     "Each line of training_stats.json is a JSON object."),
    ("embeddings-dataset", "error", "checkpoint",
     "An embeddings file holds a dataset `embeddings` of dtype float32 and two dimensions."),
    ("embeddings-shape", "error", "checkpoint",
     "The embeddings have shape (entity count, dimension of the type)."),
    ("embeddings-nonfinite", "error", "checkpoint", "Every embedding value is finite."),
    ("optimizer-blob", "error", "checkpoint",
     "optimizer/state_dict, when present, is a one-dimensional opaque (|V1) blob holding a "
     "torch.save payload (zip or legacy pickle)."),
    ("model-param-name", "error", "checkpoint",
     "Every dataset under model/ is relations/{idx}/operator/{lhs|rhs}/{param} or "
     "entities/{type}/global_embedding, with an index, side, parameter and type the config has."),
    ("model-state-dict-key", "error", "checkpoint",
     "Every model parameter dataset carries the state_dict_key attribute that its name maps to."),
    ("model-param-dtype", "error", "checkpoint", "Model parameters are float32."),
    ("model-param-shape", "error", "checkpoint",
     "Each model parameter has the shape its operator and dimension give."),
    ("model-param-missing", "error", "checkpoint",
     "The model file holds every parameter the config's operators and global embeddings have."),
    ("model-param-nonfinite", "error", "checkpoint", "Every model parameter value is finite."),
]

RULES: dict[str, Rule] = {rid: Rule(rid, sev, art, text) for rid, sev, art, text in _CATALOGUE}


def rule(rule_id: str) -> Rule:
    """The rule with this id; ``KeyError`` for an unknown id (a programming error)."""
    try:
        return RULES[rule_id]
    except KeyError:
        raise KeyError(f"unknown rule id: {rule_id}") from None
