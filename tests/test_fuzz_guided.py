"""Coverage-guided fuzzing (pbgio.testing.guided, ``tools/fuzz.py --guided``): the families cover the
catalogue, the harness reports a broken reader, the coverage replay measures the reader modules, and
(slow) a short atheris run of every family finds nothing and grows its corpus.

atheris and coverage come with the ``fuzz`` extra; without them these tests skip (CI's slow step
installs the extra, and there they fail instead); the tests that need them are slow.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from pbgio.testing import fuzz, fuzz_seeds, guided

# In CI (whose slow step installs the fuzz extra) a missing package fails these tests instead.
STRICT = bool(os.environ.get("CI"))
HAVE_ATHERIS = STRICT or importlib.util.find_spec("atheris") is not None
HAVE_COVERAGE = STRICT or importlib.util.find_spec("coverage") is not None
needs_atheris = pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris is not installed (pip install '.[fuzz]')")
needs_coverage = pytest.mark.skipif(not HAVE_COVERAGE, reason="coverage is not installed (pip install '.[fuzz]')")
SHORT_SECONDS = 20.0  # per family, in CI's slow step


def test_every_catalogue_target_is_in_one_family() -> None:
    seen = [name for family in guided.FAMILIES.values() for name in family.targets]
    assert sorted(seen) == sorted(fuzz.TARGETS)
    for family in guided.FAMILIES.values():
        assert guided.module_files(family), family.name


def test_first_byte_picks_the_target() -> None:
    family = guided.FAMILIES["import"]
    assert guided.family_of(family, b"\x00a\tb\tc\n") == ("import-tsv", b"a\tb\tc\n")
    assert guided.family_of(family, bytes([2 + len(family.targets)]) + b"PAR1") == ("import-parquet", b"PAR1")
    assert guided.family_of(family, b"") == ("import-tsv", b"")


@pytest.mark.slow  # a coverage replay: seconds
@needs_coverage
def test_coverage_replay_measures_the_reader_modules(tmp_path: Path) -> None:
    family = guided.FAMILIES["entities"]
    seeds = guided.write_seeds(family, tmp_path / "corpus")
    empty = guided.measure(family, [tmp_path / "nothing"])
    result = guided.measure(family, [tmp_path / "corpus"])
    assert result["inputs"] == seeds > 0
    entry = result["modules"]["pbgio.entities"]
    assert entry["file"].endswith("pbgio/entities.py")
    assert 0 < entry["covered_branches"] < entry["branches"]
    assert empty["modules"]["pbgio.entities"]["covered_branches"] < entry["covered_branches"]


@pytest.mark.slow  # two coverage replays of seeds: about 40 s
@needs_coverage
def test_a_module_two_families_read_counts_both_corpora(tmp_path: Path) -> None:
    """pbgio.formats.h5: bucket readers reach one half, table readers the other; together more than either."""
    kept = {}
    alone = {}
    for name in ("edges", "checkpoint"):
        family = guided.FAMILIES[name]
        guided.write_seeds(family, tmp_path / name)
        kept[name] = tmp_path / f"{name}.coverage"
        alone[name] = guided.measure(family, [tmp_path / name], data_file=kept[name])["modules"]["pbgio.formats.h5"]
    together = guided.measure_together(kept)
    assert set(together) == set(guided.FAMILIES["edges"].modules) | set(guided.FAMILIES["checkpoint"].modules)
    h5 = together["pbgio.formats.h5"]
    assert h5["branches"] == alone["edges"]["branches"]
    assert h5["covered_branches"] > max(a["covered_branches"] for a in alone.values())
    assert together["pbgio.edges"]["covered_branches"] > 0

@pytest.mark.slow  # 3 s of atheris after the imports: about 15 s
@needs_atheris
@needs_coverage
def test_guided_run_reports_a_broken_reader(tmp_path: Path) -> None:
    family = guided.SELFTEST_FAMILIES["selftest"]
    stats = guided.fuzz_family(family, tmp_path / "corpus", tmp_path / "crashes", 3.0, log=lambda _line: None)
    assert stats["returncode"] == 0, stats
    assert stats["outcomes"]["failure"] == stats["inputs"] > 0, stats
    [(signature, saved)] = stats["findings"].items()
    assert signature.startswith("selftest-raise:exception:ValueError@fuzz.py:")
    assert "ValueError: a deliberately broken reader" in Path(saved).with_suffix(".txt").read_text()


@pytest.mark.slow  # 20 s of atheris per family, then the coverage replay: about 3 minutes on 2 cores
@needs_atheris
@needs_coverage
@pytest.mark.parametrize("name", list(guided.FAMILIES))
def test_short_guided_run_finds_nothing(tmp_path: Path, name: str) -> None:
    family = guided.FAMILIES[name]
    stats = guided.fuzz_family(family, tmp_path / "corpus", tmp_path / "crashes", SHORT_SECONDS,
                               log=lambda _line: None)
    seeds = sum(1 for p in (tmp_path / "corpus").iterdir() if p.name.startswith("seed-"))
    assert stats["returncode"] == 0, stats
    assert stats["findings"] == {}, stats
    assert stats["inputs"] > 0, stats
    assert stats["corpus"] > seeds, f"the corpus did not grow: is pbgio instrumented? {stats}"
    covered = guided.measure(family, [tmp_path / "corpus"])
    for module, entry in covered["modules"].items():
        assert entry["covered_branches"] > 0, module


# --------------------------------------------------------------------------- structure-aware mutation, oracles


def _h5_structure(data: bytes, tmp: Path) -> dict[str, object] | None:
    """Datasets (shape, dtype, storage) and root attributes of an HDF5 file; None when h5py cannot open it."""
    import h5py

    path = tmp / "probe.h5"
    path.write_bytes(data)
    found: dict[str, object] = {}
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: found.__setitem__(name, (getattr(obj, "shape", None),
                                                                     str(getattr(obj, "dtype", "")),
                                                                     getattr(obj, "chunks", None),
                                                                     getattr(obj, "compression", None))))
            found["attrs"] = sorted((k, repr(v)) for k, v in f.attrs.items())
    except Exception:
        return None
    return found


def test_structure_mutator_rewrites_hdf5_keeping_the_target_byte(tmp_path: Path) -> None:
    family = guided.FAMILIES["edges"]
    [seed, *_] = fuzz_seeds.build_corpus(tmp_path / "seeds", ["edges-read"])["edges-read"]
    data = bytes([2]) + seed.read_bytes()
    before = _h5_structure(data[1:], tmp_path)
    assert before is not None
    byte_level: list[bytes] = []

    def fallback(data: bytes, _max_size: int) -> bytes:
        byte_level.append(data)
        return data

    mutator = guided.StructureMutator(family, tmp_path, fallback, rate=1.0)
    changed = 0
    for i in range(12):
        out = mutator(data, 1 << 22, i)
        assert out[:1] == data[:1]  # the target selector stays
        after = _h5_structure(out[1:], tmp_path)
        changed += after is not None and after != before
    assert mutator.applied > 0 and changed >= 3, (mutator.applied, changed)
    assert not byte_level
    plain = guided.StructureMutator(family, tmp_path, lambda d, _m: d[::-1], rate=0.0)
    assert plain(data, 1 << 22, 0) == data[::-1] and plain.applied == 0


def _bucket_input(tmp: Path) -> bytes:
    import numpy as np

    from pbgio.edges import EdgeBucket, FeatureLists, write_bucket

    path = tmp / "edges_0_0.h5"
    write_bucket(path, EdgeBucket(rel=np.array([0, 1, 0, 1]), lhs=np.array([3, 0, 6, 2]), rhs=np.array([1, 1, 0, 2]),
                                  weight=np.array([0.5, 1.0, 2.0, 0.0]),
                                  rhs_features=FeatureLists.from_lists([[1, 2], [], [0], [4, 4, 1]])))
    return path.read_bytes()


def test_bucket_round_trip_oracle_reports_a_planted_writer_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pbgio import edges

    data = _bucket_input(tmp_path)
    target = fuzz.TARGETS["edges-read"]
    fuzz.run_input(target, data, tmp_path / "ok")  # the real writer round-trips
    real = edges._append
    monkeypatch.setattr(edges, "_append",  # a writer that reverses the lhs column
                        lambda ds, values: real(ds, values[::-1] if ds.name == "/lhs" else values))
    with pytest.raises(fuzz.RoundTripMismatch, match="reads back different") as caught:
        fuzz.run_input(target, data, tmp_path / "planted")
    assert fuzz.classify(caught.value) == ("failure", "exception")


def test_checkpoint_round_trip_oracle_reports_a_planted_writer_bug(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from pbgio import checkpoint
    from pbgio.optimizer_state import encode_row_adagrad

    ckpt = checkpoint.CheckpointDir(tmp_path / "source")
    state = checkpoint.EmbeddingsState(np.arange(12, dtype=np.float32).reshape(3, 4),
                                       encode_row_adagrad(np.array([0.5, 1.0, 0.0], np.float32), lr=0.1))
    data = ckpt.write_embeddings("user", 0, 1, state).read_bytes()
    target = fuzz.TARGETS["checkpoint-embeddings"]
    fuzz.run_input(target, data, tmp_path / "ok")
    monkeypatch.setattr(checkpoint, "_write_blob", lambda f, blob: None)  # a writer that drops the optimizer state
    with pytest.raises(fuzz.RoundTripMismatch, match="optimizer blob reads back different"):
        fuzz.run_input(target, data, tmp_path / "planted")


def test_layout_target_reads_the_bucket_against_the_layout(tmp_path: Path) -> None:
    from pbgio.errors import FormatError

    data = _bucket_input(tmp_path)  # valid alone, but lhs 6 of row 2 (rel 0, follows) is past the 5 users of
    target = fuzz.TARGETS["edges-layout"]  # partition 0 in the template layout: the trainer's check refuses it
    with pytest.raises(FormatError, match=r"row 2: .*\[edge-lhs-range\]"):
        fuzz.run_input(target, data, tmp_path / "case")
    assert fuzz.TARGETS["edges-validate"].run(tmp_path / "edges_0_0.h5")  # alone, the same bucket passes
