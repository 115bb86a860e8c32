"""Every rule of the catalogue has a mutation test: valid layout → break one rule → reported.

The starting layouts are valid with no issue at all; each mutation must make the validator
report its rule (an error-severity rule makes the report fail), and nothing beyond the
consequences its registration declares.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from pbgio.errors import Issue, Report
from pbgio.spec import naming
from pbgio.spec.rules import RULES
from pbgio.testing.layouts import write_layout
from pbgio.testing.mutations import LAYOUTS, MUTATIONS, MUTATORS, prepare
from pbgio.validate import validate_path


def test_every_rule_has_a_mutation() -> None:
    missing = sorted(set(RULES) - set(MUTATORS))
    unknown = sorted(set(MUTATORS) - set(RULES))
    assert not missing, f"rules without a mutation test: {missing}"
    assert not unknown, f"mutations of rules that are not in the catalogue: {unknown}"


_PACKAGES = Path(__file__).resolve().parent.parent
_CATALOGUE = Path("pbgio/spec/rules.py")
_MUTATORS = Path("pbgio/testing")
_CHECKS = Path("pbgio/checks")


def _rule_id_places() -> dict[str, set[tuple[str, str]]]:
    """Where each rule id is written as a string constant: ``{rule id: {(module, function)}}``.

    Every module of ``pbgio`` and ``pbgtrain`` is parsed, except the catalogue
    (``pbgio/spec/rules.py``) and ``pbgio/testing/`` (which breaks files rule by rule); a string
    constant equal to a rule id counts wherever it stands (a call, a comparison, a dict, a
    default argument, a module-level constant). A docstring or an f-string that mentions an id is
    not equal to it, so an id assembled at run time (``f"edge-{side}-range"``) is found nowhere,
    which the test refuses too. The function is the outermost ``def`` holding the constant (methods
    as ``Class.method``); ``<module>`` for one outside every function.
    """
    places: dict[str, set[tuple[str, str]]] = {rule_id: set() for rule_id in RULES}

    def visit(node: ast.AST, module: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and function == "<module>":
                inner = child.name
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and "." in function \
                    and function.endswith(".<class>"):
                inner = function.replace("<class>", child.name)
            elif isinstance(child, ast.ClassDef) and function == "<module>":
                inner = f"{child.name}.<class>"
            if isinstance(child, ast.Constant) and isinstance(child.value, str) and child.value in places:
                places[child.value].add((module, inner))
            visit(child, module, inner)

    for package in ("pbgio", "pbgtrain"):
        for path in sorted((_PACKAGES / package).rglob("*.py")):
            module = path.relative_to(_PACKAGES)
            if module == _CATALOGUE or module.is_relative_to(_MUTATORS):
                continue
            visit(ast.parse(path.read_text(encoding="utf-8")), module.as_posix(), "<module>")
    return places


def test_every_rule_is_coded_once() -> None:
    """Every rule id of the catalogue is implemented in exactly one place: all the string
    constants equal to it (found as :func:`_rule_id_places` says) lie in one function of one
    module under ``pbgio/checks/`` (the predicate that decides the rule and builds its issue), and
    there is at least one. Readers, the validator, importers and the trainer reach a rule only by
    calling that function, so its decision and its message exist once."""
    places = _rule_id_places()
    nowhere = sorted(r for r, found in places.items() if not found)
    assert not nowhere, f"rules no code names as a constant (an id built at run time?): {nowhere}"
    outside = {r: sorted(f"{m}:{f}" for m, f in found if not Path(m).is_relative_to(_CHECKS))
               for r, found in places.items()}
    outside = {r: where for r, where in outside.items() if where}
    assert not outside, "rule ids named outside pbgio/checks/:\n" + "\n".join(
        f"  {r}: {', '.join(where)}" for r, where in sorted(outside.items()))
    several = {r: sorted(f"{m}:{f}" for m, f in found) for r, found in places.items() if len(found) > 1}
    assert not several, "rule ids named in more than one function:\n" + "\n".join(
        f"  {r}: {', '.join(where)}" for r, where in sorted(several.items()))


def test_checks_import_only_errors_spec_and_numpy() -> None:
    """The checks are the bottom layer above the spec: no reader, storage helper or validator
    (imports inside functions count too), so that every layer above can call them."""
    allowed = ("pbgio.errors", "pbgio.spec", "pbgio.checks")
    found = []
    for path in sorted((_PACKAGES / _CHECKS).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}: {n}" for n in names
                      if (n.split(".")[0] == "pbgio" and not n.startswith(allowed)) or n == "pbgio"]
    assert not found, found


def _show(report: Report) -> str:
    return "\n".join(str(i) for i in report.issues) or "(no issues)"


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_mutation_breaks_exactly_its_rule(rule_id: str, tmp_path: Path) -> None:
    mutation = MUTATIONS.get(rule_id)
    if mutation is None:
        pytest.fail(f"rule {rule_id} has no mutation in pbgio.testing.mutations")
    path = prepare(rule_id, tmp_path)

    before = validate_path(path)
    assert before.ok, f"starting layout {mutation.layout!r} is invalid:\n{_show(before)}"
    assert rule_id not in before.rule_ids()
    assert before.issues == [], f"starting layout {mutation.layout!r} has issues:\n{_show(before)}"

    mutation.mutate(tmp_path)
    after = validate_path(path)
    found = [i for i in after.issues if i.rule == rule_id]
    assert found, f"mutation of {rule_id} not reported; the report has:\n{_show(after)}"
    rule = RULES[rule_id]
    assert all(i.severity == rule.severity for i in found)
    assert all(i.file for i in found), f"issues of {rule_id} name no file: {found}"
    if rule.severity == "error":
        assert not after.ok
    elif not any(RULES[r].severity == "error" for r in mutation.also):
        assert after.ok, _show(after)
    unexpected = after.rule_ids() - {rule_id} - mutation.also
    assert not unexpected, f"mutation of {rule_id} also reported {sorted(unexpected)}:\n{_show(after)}"


def test_issue_severities_follow_the_catalogue(tmp_path: Path) -> None:
    path = prepare("edge-dataset-unknown", tmp_path)
    MUTATORS["edge-dataset-unknown"](tmp_path)
    MUTATORS["edge-weight-invalid"](tmp_path)
    for issue in validate_path(path):
        assert issue.severity == RULES[issue.rule].severity


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_starting_layouts_are_valid(name: str, tmp_path: Path) -> None:
    report = validate_path(write_layout(tmp_path, LAYOUTS[name]()))
    assert report.issues == [], _show(report)
    assert report.checked.get("bucket files", 0) > 0
    assert report.checked.get("model files", 0) == 1


# --------------------------------------------------------------------------- precise locations


def _default(tmp_path: Path, name: str = "default") -> Path:
    return write_layout(tmp_path, LAYOUTS[name]())


def _edit(path: Path, edit: Callable[[h5py.File], Any]) -> None:
    with h5py.File(path, "r+") as f:
        edit(f)


def _only(report: Report, rule_id: str) -> Issue:
    found = [i for i in report.issues if i.rule == rule_id]
    assert len(found) == 1, _show(report)
    return found[0]


def _bucket(tmp_path: Path, lhs: int, rhs: int) -> Path:
    return tmp_path / "edges" / naming.bucket_file(lhs, rhs)


def test_lhs_range_names_file_dataset_and_row(tmp_path: Path) -> None:
    config = _default(tmp_path)
    # bucket (1, 0): user partition 1 (4 entities) on the lhs; lhs = count is one past the end
    _edit(_bucket(tmp_path, 1, 0), lambda f: f["lhs"].__setitem__(3, 4))
    issue = _only(validate_path(config), "edge-lhs-range")
    assert issue.file == "edges/edges_1_0.h5"
    assert issue.dataset == "lhs"
    assert issue.rows == (3,)
    assert issue.count == 1
    assert "4" in issue.message


def test_lhs_range_last_entity_is_valid(tmp_path: Path) -> None:
    config = _default(tmp_path)
    _edit(_bucket(tmp_path, 1, 0), lambda f: f["lhs"].__setitem__(3, 3))
    assert validate_path(config).issues == []


def test_range_counts_every_broken_row(tmp_path: Path) -> None:
    config = _default(tmp_path)
    broken = [1, 3, 5, 7, 9, 10, 11]

    def edit(f: h5py.File) -> None:
        rhs = f["rhs"][...]
        rhs[broken] = -5
        f["rhs"][...] = rhs

    _edit(_bucket(tmp_path, 0, 1), edit)
    issue = _only(validate_path(config), "edge-rhs-range")
    assert issue.count == len(broken)
    assert issue.rows
    assert list(issue.rows) == broken[: len(issue.rows)]
    assert issue.dataset == "rhs"
    assert issue.file == "edges/edges_0_1.h5"


def test_featurized_side_index_is_ignored(tmp_path: Path) -> None:
    config = _default(tmp_path)

    def edit(f: h5py.File) -> None:
        rel, lhs = f["rel"][...], f["lhs"][...]
        lhs[rel == 2] = 10**12  # doc → item: doc is featurized, lhs is ignored
        f["lhs"][...] = lhs

    _edit(_bucket(tmp_path, 0, 0), edit)
    assert validate_path(config).issues == []


def test_rel_range_boundary_static(tmp_path: Path) -> None:
    config = _default(tmp_path)
    # 3 relations: rel 2 is the last valid id, 3 the first invalid one
    def edit(f: h5py.File) -> None:
        f["rel"][4] = 3
        f["rel"][6] = -1

    _edit(_bucket(tmp_path, 1, 0), edit)
    issue = _only(validate_path(config), "edge-rel-range")
    assert issue.rows == (4, 6)
    assert issue.count == 2


def test_rel_range_uses_dynamic_rel_count(tmp_path: Path) -> None:
    config = _default(tmp_path, "dynamic")  # 3 dynamic relation ids, 1 relation in the config
    _edit(_bucket(tmp_path, 1, 0), lambda f: f["rel"].__setitem__(5, 2))
    assert validate_path(config).issues == []
    _edit(_bucket(tmp_path, 1, 0), lambda f: f["rel"].__setitem__(5, 3))
    issue = _only(validate_path(config), "edge-rel-range")
    assert issue.rows == (5,)
    assert issue.dataset == "rel"


def test_weight_invalid_counts_nan_inf_and_negative(tmp_path: Path) -> None:
    config = _default(tmp_path)

    def edit(f: h5py.File) -> None:
        w = f["weight"][...]
        w[[2, 5, 8]] = [np.nan, np.inf, -0.5]
        w[9] = 0.0  # zero is a valid weight
        f["weight"][...] = w

    _edit(_bucket(tmp_path, 0, 1), edit)
    issue = _only(validate_path(config), "edge-weight-invalid")
    assert issue.rows == (2, 5, 8)
    assert issue.count == 3


def test_feature_range_locates_data_entries(tmp_path: Path) -> None:
    config = _default(tmp_path)

    def edit(f: h5py.File) -> None:
        data = f["lhsd_data"][...]
        data[1] = 9  # doc has 9 features: 0..8
        data[-1] = -1
        f["lhsd_data"][...] = data

    with h5py.File(_bucket(tmp_path, 0, 0), "r") as f:
        size = len(f["lhsd_data"])
    _edit(_bucket(tmp_path, 0, 0), edit)
    issue = _only(validate_path(config), "edge-feature-range")
    assert issue.dataset == "lhsd_data"
    assert issue.rows == (1, size - 1)
    assert issue.count == 2


def test_embeddings_nonfinite_rows(tmp_path: Path) -> None:
    config = _default(tmp_path)
    path = tmp_path / "checkpoint" / naming.embeddings_file("item", 0, 1)

    def edit(f: h5py.File) -> None:
        emb = f["embeddings"][...]
        emb[1, 0] = np.nan
        emb[4, 5] = -np.inf
        f["embeddings"][...] = emb

    _edit(path, edit)
    issue = _only(validate_path(config), "embeddings-nonfinite")
    assert issue.file == "checkpoint/embeddings_item_0.v1.h5"
    assert issue.dataset == "embeddings"
    assert issue.rows == (1, 4)
    assert issue.count == 2


def test_plain_features_row(tmp_path: Path) -> None:
    path = prepare("edge-plain-features", tmp_path)
    MUTATORS["edge-plain-features"](tmp_path)
    issue = _only(validate_path(path), "edge-plain-features")
    assert issue.file == "edges/edges_0_0.h5"
    assert issue.rows == (0,)  # the first plain row of the featurized bucket
    assert issue.count == 1


def test_bucket_alone_validates_without_config(tmp_path: Path) -> None:
    _default(tmp_path)
    report = validate_path(_bucket(tmp_path, 0, 0))
    assert report.issues == [], _show(report)
    _edit(_bucket(tmp_path, 0, 0), lambda f: f["lhsd_offsets"].__setitem__(0, 1))
    assert "edge-offsets-start" in validate_path(_bucket(tmp_path, 0, 0)).rule_ids()


def test_rows_with_a_bad_rel_are_not_checked_as_another_relation(tmp_path: Path) -> None:
    config = _default(tmp_path)
    bucket = _bucket(tmp_path, 0, 0)
    with h5py.File(bucket, "r") as f:
        rel, rhs = f["rel"][...], f["rhs"][...]
    # a likes (user → item, 7 items) row whose rhs is no user offset (user partition 0 has 5)
    row = int(next(i for i in range(len(rel)) if rel[i] == 1 and rhs[i] >= 5))
    _edit(bucket, lambda f: f["rel"].__setitem__(row, -1))
    report = validate_path(config)
    issue = _only(report, "edge-rel-range")
    assert issue.rows == (row,)
    assert report.rule_ids() == {"edge-rel-range"}, _show(report)


# Rules a reader decides on what it reads, with the predicate the validator applies.
READER_RULES = (
    "h5-format-version", "edge-dataset-missing", "edge-dataset-dtype", "edge-dataset-shape", "edge-length-mismatch",
    "edge-offsets-pair", "edge-offsets-length", "edge-offsets-order", "edge-offsets-end", "embeddings-dataset",
    "model-param-dtype", "training-stats-format", "training-stats-index", "training-stats-object",
    "checkpoint-version-format", "entity-count-format", "entity-names-format", "dynamic-rel-count-format",
    "dynamic-rel-names-format",
)


def _read(file: Path) -> Any:
    """Read ``file`` with the reader of its kind (as a trainer or exporter would)."""
    from pbgio import entities
    from pbgio.checkpoint import CheckpointDir
    from pbgio.edges import read_bucket

    name, directory = file.name, CheckpointDir(file.parent)
    if naming.parse_bucket_file(name):
        return read_bucket(file)
    if (versioned := naming.parse_versioned_file(name)) is not None:
        kind, etype, part, version = versioned
        if kind == "model":
            return directory.read_model(version)
        assert etype is not None and part is not None
        return directory.read_embeddings(etype, part, version)
    if name == naming.TRAINING_STATS:
        return directory.read_stats()
    if name == naming.CHECKPOINT_VERSION:
        return directory.read_version()
    if (count := naming.parse_entity_count_file(name)) is not None:
        return entities.read_entity_count(file.parent, *count)
    if (names := naming.parse_entity_names_file(name)) is not None:
        return entities.read_entity_names(file.parent, *names)
    if name == naming.DYNAMIC_REL_COUNT:
        return entities.read_dynamic_rel_count(file.parent)
    assert name == naming.DYNAMIC_REL_NAMES, name
    return entities.read_relation_names(file.parent)


@pytest.mark.parametrize("rule_id", READER_RULES)
def test_reader_raises_what_the_validator_reports(rule_id: str, tmp_path: Path) -> None:
    """The reader of a file broken for ``rule_id`` raises an issue of that rule, with the dataset
    and message the validator reports: both ask the one predicate of :mod:`pbgio.checks`."""
    from pbgio.errors import FormatError

    path = prepare(rule_id, tmp_path)
    MUTATIONS[rule_id].mutate(tmp_path)
    reported = [i for i in validate_path(path).issues if i.rule == rule_id]
    assert reported
    root = path if path.is_dir() else path.parent
    for file in sorted({root / i.file for i in reported if i.file}):
        with pytest.raises(FormatError) as raised:
            _read(file)
        issue = raised.value.issue
        assert (issue.rule, issue.dataset, issue.message) in {(i.rule, i.dataset, i.message) for i in reported}
