"""Fuzzing of every reader of a user's file: a short campaign per target, the
regression inputs under tests/fuzz_inputs/<target>/, and the harness's own failure detection.

The contract: every input ends in a :class:`~pbgio.errors.PbgioError` or a clean result; no
other exception, no hang, no allocation driven by a claimed size, no pickle payload run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pbgio.testing import fuzz, fuzz_mutators, fuzz_seeds, fuzzrun

INPUTS = Path(__file__).parent / "fuzz_inputs"
SHORT_INPUTS = 50  # per target; the seeds (up to 33 a target) run first, then mutations
LONG_INPUTS = 600  # per target, in CI's slow step
SELFTEST_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-corpus")
    fuzz_seeds.build_corpus(folder, [*fuzz.TARGETS, *fuzz.SELFTEST_TARGETS])
    return folder


def campaign(corpus: Path, crashes: Path, inputs: int) -> dict[str, fuzzrun.TargetStats]:
    """``inputs`` inputs for every target, then its regression inputs."""
    names = list(fuzz.TARGETS)
    results: dict[str, fuzzrun.TargetStats] = {}
    with fuzzrun.Campaign(names, corpus, seed=15, jobs=2, timeout=10.0, memory_mb=1024, crashes=crashes,
                          log=lambda _line: None) as running:
        for name in names:
            tasks = list(fuzzrun.generated(name, inputs))
            regressions = sorted((INPUTS / name).glob("*")) if (INPUTS / name).is_dir() else []
            tasks += fuzzrun.replayed(name, [p for p in regressions if p.is_file()])
            results[name] = running.run(name, tasks)
    return results


@pytest.fixture(scope="module")
def short_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, fuzzrun.TargetStats]:
    return campaign(corpus, tmp_path_factory.mktemp("fuzz-crashes"), SHORT_INPUTS)


@pytest.mark.parametrize("name", list(fuzz.TARGETS))
def test_short_campaign_has_no_failures(short_run: dict[str, fuzzrun.TargetStats], name: str) -> None:
    stats = short_run[name]
    assert stats.inputs >= SHORT_INPUTS
    assert stats.failed == 0, f"{stats.summary()}\n{dict(stats.signatures)}\nsaved: {stats.saved}"


@pytest.mark.slow  # about 10,000 inputs: a minute on 2 cores
def test_long_campaign_has_no_failures(corpus: Path, tmp_path: Path) -> None:
    for name, stats in campaign(corpus, tmp_path, LONG_INPUTS).items():
        assert stats.inputs >= LONG_INPUTS, name
        assert stats.failed == 0, f"{name}: {stats.summary()}\n{dict(stats.signatures)}\nsaved: {stats.saved}"


def test_every_target_has_seeds_that_read_cleanly(short_run: dict[str, fuzzrun.TargetStats]) -> None:
    """The seeds are valid files: each target saw clean results (so mutations start from valid input)."""
    for stats in short_run.values():
        assert stats.outcomes["clean"] > 0, stats.summary()


def test_regression_inputs_name_known_targets() -> None:
    for folder in INPUTS.iterdir() if INPUTS.is_dir() else []:
        if folder.is_dir():
            assert folder.name in fuzz.TARGETS, f"{folder}: no such fuzz target"
            for path in folder.iterdir():
                assert path.stat().st_size <= 64 << 10, f"{path}: regression inputs stay small"


@pytest.mark.parametrize(("name", "kind"), [
    ("selftest-raise", "exception"),
    ("selftest-hang", "hang"),
    ("selftest-memory", "memory"),
    ("selftest-crash", "crash"),
])
def test_harness_reports_a_broken_reader(corpus: Path, tmp_path: Path, name: str, kind: str) -> None:
    with fuzzrun.Campaign([name], corpus, jobs=1, timeout=SELFTEST_TIMEOUT, memory_mb=256,
                          crashes=tmp_path, log=lambda _line: None) as campaign:
        stats = campaign.run(name, fuzzrun.generated(name, 2))
    assert stats.failures == {kind: 2}, stats.summary()
    saved = sorted((tmp_path / name).glob("*.txt"))
    assert saved and f"kind: {kind}" in saved[0].read_text()


def test_harness_detects_an_executed_pickle_payload(corpus: Path, tmp_path: Path) -> None:
    """A loader that unpickles the evil inputs creates the marker: each such input is a failure."""
    name = "selftest-pickle"
    with fuzzrun.Campaign([name], corpus, jobs=1, timeout=5.0, memory_mb=0, crashes=tmp_path,
                          log=lambda _line: None) as campaign:
        stats = campaign.run(name, fuzzrun.generated(name, 60))
    assert stats.failures["pickle-executed"] > 0, stats.summary()


def test_generation_is_deterministic(corpus: Path, tmp_path: Path) -> None:
    target = fuzz.TARGETS["edges-read"]
    seeds = fuzz_seeds.load_corpus(corpus / "edges-read")
    marker = tmp_path / "marker"
    first = [fuzz_mutators.generate(target, seeds, 7, i, tmp_path, marker) for i in range(40, 60)]
    again = [fuzz_mutators.generate(target, seeds, 7, i, tmp_path, marker) for i in range(40, 60)]
    assert first == again
    assert len(set(first)) > 10


def test_classify() -> None:
    from pbgio.errors import CorruptFileError, InputError

    assert fuzz.classify(None) == ("clean", "")
    assert fuzz.classify(InputError("x", 1, "bad")) == ("error", "InputError")
    assert fuzz.classify(CorruptFileError.__new__(CorruptFileError)) == ("error", "CorruptFileError")
    assert fuzz.classify(KeyError("x")) == ("failure", "exception")
    assert fuzz.classify(fuzz.Hang()) == ("failure", "hang")

