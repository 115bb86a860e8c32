"""The fuzz catalogue's layout-level targets (an entity file, a config or an index file inside a
small valid layout, validated whole), the importer's options picked by a byte, their round-trip
oracles, and the reader bugs they found (kept under tests/fuzz_inputs/)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from pbgio import entities
from pbgio.errors import FormatError, PbgioError
from pbgio.testing import fuzz, fuzz_mutators, fuzz_seeds


def _run(name: str, data: bytes, tmp_path: Path) -> Path:
    return fuzz.run_input(fuzz.get_target(name), data, tmp_path)


def _rules(name: str, data: bytes, tmp_path: Path) -> set[str]:
    """The rules the validator reports when target ``name`` runs ``data``."""
    from pbgio.validate import validate_path

    path = _run(name, data, tmp_path)
    return validate_path(path.parent / "layout" / "config.json").rule_ids()


def _slot(name: str, *, dynamic: bool = False, delete: bool = False) -> int:
    return fuzz.ENTITY_SLOTS.index(name) << 2 | int(dynamic) | int(delete) << 1


def test_entities_layout_reaches_the_rules_across_entity_files(tmp_path: Path) -> None:
    assert _rules("entities-layout", bytes([_slot("entity_count_user_0.txt")]) + b"5\n", tmp_path) == set()
    missing = bytes([_slot("entity_count_user_0.txt", delete=True)])
    assert "entity-count-missing" in _rules("entities-layout", missing, tmp_path)
    extra = bytes([_slot("entity_count_ghost_0.txt")]) + b"3\n"
    assert "entity-count-extra" in _rules("entities-layout", extra, tmp_path)
    across = bytes([_slot("entity_names_user_1.json")]) + json.dumps([f"user-0-{i}" for i in range(4)]).encode()
    assert "entity-names-duplicate" in _rules("entities-layout", across, tmp_path)
    dynamic = bytes([_slot("dynamic_rel_count.txt", dynamic=True, delete=True)])
    assert "dynamic-rel-count-missing" in _rules("entities-layout", dynamic, tmp_path)
    order = bytes([_slot("dynamic_rel_names.json")]) + b'["likes", "follows", "describes"]'
    assert "relation-names-mismatch" in _rules("entities-layout", order, tmp_path)


def test_layout_targets_never_change_their_template(tmp_path: Path) -> None:
    """Files are hard-linked from the template: a target replaces one by unlinking it first."""
    _run("entities-layout", bytes([_slot("entity_count_user_0.txt")]) + b"99\n", tmp_path)
    template = tmp_path / "_template-entities" / "entities" / "entity_count_user_0.txt"
    assert template.read_text() == "5\n"
    _run("entities-layout", bytes([_slot("entity_count_user_0.txt", delete=True)]), tmp_path)
    assert template.read_text() == "5\n"


def test_entity_reader_round_trip_reports_a_writer_that_differs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    names = b'[\n    "a",\n    "b"\n]'
    _run("entity-names", names, tmp_path)  # the real writer: what was read comes back
    real = entities.write_name_list
    monkeypatch.setattr(entities, "write_name_list", lambda path, items: real(path, list(items)[:-1]))
    with pytest.raises(AssertionError, match="wrote it and read back"):
        _run("entity-names", names, tmp_path)


def test_a_count_beyond_int64_is_a_format_error(tmp_path: Path) -> None:
    """Found by the guided fuzzer (entities-layout): 2^64 in a count file reached the edge checks'
    int64 arrays (OverflowError); the count file's format rule refuses it now."""
    (tmp_path / "entity_count_user_0.txt").write_text(f"{2**64}\n")
    with pytest.raises(FormatError, match=r"at most 9223372036854775807") as caught:
        entities.read_entity_count(tmp_path, "user", 0)
    assert caught.value.issue.rule == "entity-count-format"
    (tmp_path / "entity_count_user_0.txt").write_text(f"{2**63 - 1}\n")
    assert entities.read_entity_count(tmp_path, "user", 0) == 2**63 - 1
    regression = Path(__file__).parent / "fuzz_inputs" / "entities-layout" / "count-above-int64.bin"
    assert "entity-count-format" in _rules("entities-layout", regression.read_bytes(), tmp_path)


def test_config_paths_too_long_to_look_up_are_reported(tmp_path: Path) -> None:
    """Found by the guided fuzzer (config-layout): an init_path longer than the file system allows
    raised OSError out of validate_path; each such path is a path-missing issue now."""
    from pbgio.validate import validate_path

    regression = Path(__file__).parent / "fuzz_inputs" / "config-layout" / "init-path-name-too-long.json"
    path = _run("config-layout", regression.read_bytes(), tmp_path)
    report = validate_path(path.parent / "layout" / "config.json")
    found = [i for i in report.issues if i.rule == "path-missing"]
    assert len(found) == 3  # an edge path, checkpoint_path and init_path
    assert all("cannot look up" in i.message for i in found)


def test_config_paths_with_a_nul_are_reported(tmp_path: Path) -> None:
    """Found by the guided fuzzer (config-layout): entity_path "\\x00/.." raised ValueError (embedded
    null byte) out of validate_path while the path-missing issue was being worded."""
    from pbgio.validate import validate_path

    regression = Path(__file__).parent / "fuzz_inputs" / "config-layout" / "entity-path-with-nul.json"
    path = _run("config-layout", regression.read_bytes(), tmp_path)
    report = validate_path(path.parent / "layout" / "config.json")
    found = [i.message for i in report.issues if i.rule == "path-missing"]
    assert len(found) == 2 and all("a NUL character" in m for m in found), found


def test_config_layout_round_trip_and_default_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pbgio.config import ConfigSchema

    template = fuzz.layout_template(tmp_path, "static") / "config.json"
    _run("config-layout", template.read_bytes(), tmp_path)
    monkeypatch.setattr(ConfigSchema, "to_json", lambda self: json.dumps({**json.loads(
        self.model_dump_json()), "dimension": self.dimension + 1}))
    with pytest.raises(AssertionError, match="read back from its own JSON differs"):
        _run("config-layout", template.read_bytes(), tmp_path)


def test_index_layout_reports_stale_and_misnamed_indexes(tmp_path: Path) -> None:
    seeds = fuzz_seeds.build_corpus(tmp_path / "seeds", ["index-layout"])["index-layout"]
    found: set[str] = set()
    for seed in seeds:
        data = seed.read_bytes()
        with contextlib.suppress(PbgioError):  # a file that is no index at all: the reader refuses it first
            found |= _rules("index-layout", data, tmp_path / "run")
    assert {"index-stale", "index-version-mismatch", "index-foreign"} <= found


def test_index_round_trip_reports_a_writer_that_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from pbgio import index_file

    seeds = fuzz_seeds.build_corpus(tmp_path / "seeds", ["index"])["index"]
    loads = next(seed.read_bytes() for seed in seeds if b"IxFI" in seed.read_bytes())  # a payload FAISS may read
    _run("index", loads, tmp_path)
    real = index_file.write_index_file
    monkeypatch.setattr(index_file, "write_index_file",
                        lambda path, meta, write: real(path, replace(meta, dimension=meta.dimension + 1), write))
    with pytest.raises(AssertionError, match="wrote and read back"):
        _run("index", loads, tmp_path)


def test_import_options_follow_the_first_byte(tmp_path: Path) -> None:
    config, options = fuzz.import_options(0b100_01_001)  # named columns, a header, comma-separated
    assert config == "plain" and options["lhs_col"] == "src" and options["delimiter"] == ","
    text = b"src,rel,dst\na,r,b\nb,r,c\n"
    _run("import-options", bytes([0b100_01_001]) + text, tmp_path)
    with pytest.raises(PbgioError):  # the same file read tab-separated: no column named src
        _run("import-options", bytes([0b100_01_000]) + text, tmp_path)


def test_slot_mutation_keeps_or_moves_the_slot(tmp_path: Path) -> None:
    import random

    ctx = fuzz_mutators.MutationContext(random.Random(3), [b"\x05[\n\"a\"\n]"], tmp_path, tmp_path / "marker")
    outs = [fuzz_mutators.slot_mutate(ctx, b"\x05[\n\"a\"\n]") for _ in range(50)]
    assert any(o[:1] == b"\x05" and o[1:] != b'[\n"a"\n]' for o in outs)  # the file mutated, same slot
    assert any(o[:1] != b"\x05" and o[1:] == b'[\n"a"\n]' for o in outs)  # another slot, same file
