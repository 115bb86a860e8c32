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
    ("layout-link-outside", "error", "layout",
     "Symbolic links inside a layout stay inside it: a file or directory pbg reads resolves under the "
     "config's folder, a folder the config names or a path of the command line; a link out of it (to "
     "another project, /etc, a device) is followed only with PBG_FOLLOW_LINKS=1, and a layout is never "
     "written through a link."),
    ("file-not-regular", "error", "layout",
     "Every file pbg reads (counts, names, version files, configs, buckets, checkpoints, legacy .pt "
     "files) is a regular file: not a FIFO, a device, a socket or a directory (reading one could hang "
     "or never end)."),
    ("file-too-large", "error", "layout",
     "A file pbg reads whole (an entity count, a version file, a config, a legacy count) is within its "
     "size bound (docs/security.md); larger files are refused before they are read."),
    ("layout-path-outside", "warning", "config",
     "The paths a config names lie inside its folder. One outside it (absolute, or leading up with ..) "
     "is read as named, but it is where a layout from someone else would reach into your files; a "
     "config writes outside its folder only when you name the path on the command line or set "
     "PBG_WRITE_OUTSIDE=1."),
    ("layout-url-refused", "error", "config",
     "A URL a config names is on storage the command line named (the same scheme and bucket or host), "
     "or PBG_ALLOW_REMOTE lists it: a layout may not make pbg contact a host or bucket of its choosing."),
    ("entity-type-name-unsafe", "error", "config",
     "An entity type name can be part of the layout's file names and of model dataset names, as "
     "the original needs: not empty, no '/' or NUL (file names), no dot (the original's model "
     "maps entities/{type}/global_embedding with [^./]+ and cannot register a dotted name), and "
     "embeddings_{type}_{part}.v999999.h5 at most 255 bytes for its last partition."),
    ("entity-type-name-unportable", "warning", "config",
     "An entity type name is portable across file systems: at most 200 bytes in UTF-8, no "
     "backslash, control character or any of <>:\"|?*, no leading or trailing space (Linux, "
     "and the original there, accept them; Windows and some object stores do not)."),
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
    ("config-key-mixedcase", "warning", "config",
     "Keys are snake_case. The original converts legacy mixedCase keys (numEpochs -> num_epochs, in "
     "the config, its entities and relations; a later key wins over an earlier one that converts "
     "to the same name), and so does pbgio; config.json files are written in snake_case."),
    ("config-unusual-value", "warning", "config",
     "A value the original accepts but that rarely means what was intended: a negative "
     "regularization_coef (it rewards large embeddings), a regularizer other than N3 while "
     "regularization_coef is 0 (unused), a negative checkpoint_preservation_interval (the "
     "original's epoch % interval keeps a snapshot every |interval| epochs), num_partition_servers "
     "below -1 (the same as -1)."),
    ("config-relation-dimensions", "error", "config",
     "A relation's lhs and rhs entity types have the same dimension (the comparator compares their "
     "embeddings; the original fails on the first batch otherwise)."),
    ("config-no-negatives", "error", "config",
     "num_batch_negs and num_uniform_negs are not both 0 while a relation has all_negs false (the "
     "original's chunk size is then 0 and it fails with a division by zero)."),
    ("config-eval-batch-negs", "error", "config",
     "eval_num_batch_negs is an integer > 0: the original rounds its evaluation batch size up to "
     "a multiple of it before training each bucket (eval_fraction 0 included) and fails on 0 or "
     "null."),
    ("config-featurized-uniform-negs", "warning", "config",
     "With uniform negatives (num_uniform_negs, or eval_num_uniform_negs while evaluating, > 0), a "
     "featurized side still takes same-batch negatives only: the original, and pbgtrain, skip "
     "uniform sampling for it (a featurized type has no table to sample) while plain sides take "
     "their uniform negatives (docs/guides/featurized.md)."),
    ("config-featurized-batch-negs", "error", "config",
     "A featurized side whose negatives are enabled gets same-batch negatives: num_batch_negs > 0 "
     "(eval_num_batch_negs > 0 to evaluate) unless its relation has all_negs. With 0 the original "
     "samples uniform negatives only, which a featurized type cannot give, and fails."),
    ("config-featurized-all-negs", "error", "config",
     "A relation whose lhs or rhs type is featurized, with negatives enabled on that side, has "
     "all_negs false (a featurized type has features, not a list of entities to rank against; the "
     "original fails)."),
    ("config-logistic-cos", "warning", "config",
     "The logistic loss is not combined with the cos comparator (scores in [-1, 1] train poorly)."),
    # --- entities -------------------------------------------------------------------------
    ("entity-count-missing", "error", "entities",
     "entity_count_{type}_{part}.txt exists for every entity type and partition of the config."),
    ("entity-count-format", "error", "entities",
     "A count file holds one non-negative integer in ASCII digits, at most 2^63 - 1, optionally "
     "surrounded by whitespace (the original writes it followed by a newline)."),
    ("entity-count-extra", "warning", "entities",
     "No count file names a partition beyond the type's num_partitions or an unknown type."),
    ("entity-names-format", "error", "entities",
     "entity_names_{type}_{part}.json is a JSON list of strings."),
    ("entity-names-count", "error", "entities",
     "An entity names file lists exactly as many names as the partition's count."),
    ("entity-names-duplicate", "error", "entities",
     "A name maps to one entity: names are unique within an entity type, across its partitions (export, "
     "embedding and lookup by name would otherwise be ambiguous)."),
    ("dynamic-rel-count-missing", "error", "entities",
     "dynamic_rel_count.txt exists when dynamic_relations is true."),
    ("dynamic-rel-count-format", "error", "entities",
     "dynamic_rel_count.txt holds one non-negative integer in ASCII digits, at most 2^63 - 1 "
     "(whitespace around it allowed)."),
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
     "An .h5 file opens as HDF5 and stores every element its datasets claim (not truncated, no "
     "unwritten chunks, not another format)."),
    ("h5-format-version", "error", "hdf5",
     "The root attribute format_version exists and equals 1."),
    ("h5-external-link", "error", "hdf5",
     "An .h5 file reads nothing outside itself: no external link or user-defined link (soft links stay "
     "inside the file), no dataset with external raw storage, no virtual dataset. Checked as the file "
     "opens, before any link is followed, naming the link's path and where it points."),
    ("h5-size-bound", "error", "hdf5",
     "A filtered (compressed or checksummed) chunked dataset stays within what its file can hold: a chunk "
     "inflates to at most 64 MiB (MAX_FILTERED_CHUNK_BYTES; unfiltered chunks are not bounded), and the "
     "bytes the dataset claims are at most its stored bytes x 1032 (DEFLATE_MAX_RATIO, deflate's "
     "greatest ratio) per compressing filter of its pipeline (shuffle and fletcher32 do not compress)."),
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
     "checkpoint_version.txt holds one non-negative integer in ASCII digits, at most 2^63 - 1 "
     "(whitespace around it allowed; empty means 0)."),
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
    ("checkpoint-snapshot-broken", "error", "checkpoint",
     "Every epoch_{k}/ snapshot (and best/, the version pbgtrain fit --valid kept) is a loadable checkpoint:"
     " it holds a version file naming a version N > 0 "
     "and, for N, the model file and the embeddings of every entity type and partition, as files or "
     "links that resolve (the original writes absolute symlinks, which dangle when the directory "
     "moves or the linked files are deleted)."),
    ("training-stats-format", "error", "checkpoint",
     "Each line of training_stats.json is a JSON object."),
    ("training-stats-index", "error", "checkpoint",
     "Each line of training_stats.json has an integer index >= 0 (the original reads it from every "
     "line when it resumes)."),
    ("training-stats-object", "error", "checkpoint",
     "stats, eval_stats_before, eval_stats_after and eval_stats_chunk_avg, where a line has them, hold "
     "exactly the keys count (an integer >= 0) and metrics (an object of numbers): the original's "
     "Stats.from_dict refuses any other key, so extra facts go in sibling keys of the line."),
    ("embeddings-dataset", "error", "checkpoint",
     "An embeddings file holds a dataset `embeddings` of dtype float32 and two dimensions."),
    ("embeddings-shape", "error", "checkpoint",
     "The embeddings have shape (entity count, dimension of the type). Those of an init_path may have "
     "fewer rows (the layout grew by pbgio import --append; a warm start initialises the new rows)."),
    ("embeddings-nonfinite", "error", "checkpoint", "Every embedding value is finite."),
    ("optimizer-blob", "error", "checkpoint",
     "optimizer/state_dict, when present, is a one-dimensional opaque (|V1) blob holding a complete "
     "torch.save payload (zip or legacy container) that names no global beyond the tensors, storages "
     "and OrderedDict that torch.load(weights_only=True) allows."),
    ("optimizer-state-embeddings", "error", "checkpoint",
     "The optimizer state of an embeddings file is the original's RowAdagrad state of the partition: "
     "one param group with lr >= 0, lr_decay 0, weight_decay 0 and params [0], and state[0]['sum'] a "
     "float32 tensor of one accumulator per embedding row."),
    ("optimizer-state-model", "error", "checkpoint",
     "The optimizer state of a model file is the original's Adagrad state of the model parameters in "
     "its parameter order: one param group with lr, lr_decay, weight_decay, eps and params [0 … P-1], "
     "and for each parameter a 'step' and a float32 'sum' of the parameter's shape; {} when the model "
     "has no parameters."),
    ("optimizer-state-values", "error", "checkpoint",
     "Every Adagrad accumulator ('sum') in an optimizer state is finite and non-negative."),
    ("model-param-name", "error", "checkpoint",
     "Every dataset under model/ is relations/{idx}/operator/{lhs|rhs}/{param} or "
     "entities/{type}/global_embedding, with an index, side, parameter and type the config has."),
    ("model-state-dict-key", "error", "checkpoint",
     "Every model parameter dataset carries the state_dict_key attribute that its name maps to."),
    ("model-param-dtype", "error", "checkpoint", "Model parameters are float32."),
    ("model-param-shape", "error", "checkpoint",
     "Each model parameter has the shape its operator and dimension give. In an init_path, dynamic "
     "relation operators may hold fewer relations than dynamic_rel_count (a warm start adds the new ones)."),
    ("model-param-missing", "error", "checkpoint",
     "The model file holds every parameter the config's operators and global embeddings have."),
    ("model-param-nonfinite", "error", "checkpoint", "Every model parameter value is finite."),
    # --- nearest-neighbour indexes --------------------------------------------------------
    ("index-foreign", "error", "index",
     "An index file index_{type}.{metric}.{kind}.v{version}.h5 (or pbgio 0.1's index_{type}.v{version}.h5) "
     "holds the 1-D uint8 dataset `index` and the root attribute "
     "pbg_index/json: a JSON object with every metadata key, each of its type, a metric, library and kind "
     "pbgio knows, and an entity type of the config that is not featurized."),
    ("index-version-mismatch", "error", "index",
     "The metadata's entity_type, version, metric and kind are those of the file name (an index renamed to "
     "another version, type, metric or kind is not that index)."),
    ("index-damaged", "error", "index",
     "The payload's SHA-256 is the metadata's payload_sha256, and the payload is a FAISS index of the type its "
     "kind is built as (flat IxFI, ivf IwSq, hnsw IHNf) whose header and size fields claim no more than its bytes "
     "hold and agree with the metadata's kind, rows, dimension and nlist (a damaged file is never loaded: its "
     "header is read before the library allocates what it claims)."),
    ("index-stale", "error", "index",
     "The index was built from the tables of its version: partition_rows are the rows of each partition's "
     "embeddings of that version, dimension is the type's, and the fingerprint is that of those embeddings "
     "(global embedding added when add_global). A stale index is never used: rebuild it."),
]

RULES: dict[str, Rule] = {rid: Rule(rid, sev, art, text) for rid, sev, art, text in _CATALOGUE}


def rule(rule_id: str) -> Rule:
    """The rule with this id; ``KeyError`` for an unknown id (a programming error)."""
    try:
        return RULES[rule_id]
    except KeyError:
        raise KeyError(f"unknown rule id: {rule_id}") from None
