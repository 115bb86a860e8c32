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

from pbgio.testing import fuzz, guided

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
    assert guided.family_of(family, b"\x05PAR1") == ("import-parquet", b"PAR1")
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
