"""Bounds before allocation (issue 54): a layout of a few kilobytes cannot make a command read
forever, grow without bound or ask the allocator for more than the machine has.

- a count file that is a link to ``/dev/zero`` or a FIFO: refused at once, the file named
  (``layout-link-outside``, ``file-not-regular``) by ``pbgio validate``, ``pbgio info`` and
  ``pbgtrain fit`` (the old reader read /dev/zero until a ``MemoryError``, and waited forever on
  the FIFO);
- ``num_partitions: 10**7``: ``validate`` and ``info`` compare the files they find with the files
  the config expects, and report the missing ones as one issue with their count (the old code
  walked every partition and the P² buckets);
- an entity count of 10^15, ``dimension: 2**33``, a ``linear`` operator of dimension 2^20:
  ``pbgtrain fit`` refuses before it allocates, naming the entity type (or the relation), the
  count, the dimension and the bytes (the old code died in torch's allocator, a traceback).

Commands run in this process (tests/cli.py), each under a deadline (SIGALRM: a hang fails the test)
and with its memory measured (tracemalloc for pbgio's commands; the process's peak for fit).
"""

from __future__ import annotations

import json
import os
import resource
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pbgio.spec import naming
from pbgio.testing import small_valid_layout, write_layout
from tests.cli import pbgio, pbgtrain
from tests.deadline import deadline as _deadline

MIB = 1 << 20


def _layout(root: Path, *, checkpoint: bool = False, **config: Any) -> Path:
    """A small valid layout (``user`` in 2 partitions, ``item`` in 1), its config changed by ``config``;
    without ``checkpoint`` no checkpoint directory, so that fit starts from scratch."""
    path = write_layout(root, small_valid_layout(checkpoint=checkpoint, featurized=False))
    if not checkpoint:
        for file in (root / "checkpoint").iterdir():
            file.unlink()
        (root / "checkpoint").rmdir()
    raw = json.loads(path.read_text(encoding="utf-8"))
    for key, value in config.items():
        if key == "user_partitions":
            raw["entities"]["user"]["num_partitions"] = value
        elif key == "relations":
            raw["relations"] = value
        else:
            raw[key] = value
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def _timed(command: Any, *args: str, seconds: int = 20) -> tuple[Any, float]:
    started = time.perf_counter()
    with _deadline(seconds):
        done = command(*args)
    return done, time.perf_counter() - started


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Imports done once (torch for fit), so that the timings below are the commands' own."""
    import pbgtrain.train  # noqa: F401
    from pbgio.cli import app  # noqa: F401


# --------------------------------------------------------------------------- count files


def _count_file(root: Path) -> Path:
    return root / "entities" / naming.entity_count_file("item", 0)


def _link_to_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


SPECIAL: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "a link to /dev/zero": (_link_to_zero, "layout-link-outside", "symbolic link leading out of it (to /dev/zero)"),
    "a FIFO": (_fifo, "file-not-regular", "expected a regular file, found a FIFO"),
}


@pytest.mark.parametrize("command", ["pbgio validate", "pbgio info", "pbgtrain fit"])
@pytest.mark.parametrize("case", list(SPECIAL))
def test_a_count_file_that_never_ends_is_refused_at_once(tmp_path: Path, case: str, command: str) -> None:
    config = _layout(tmp_path)
    make, rule, found = SPECIAL[case]
    _count_file(tmp_path).unlink()
    make(_count_file(tmp_path))
    program, verb = command.split()
    done, _ = _timed(pbgio if program == "pbgio" else pbgtrain, verb, str(config))  # a hang: Hung at 20 s
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "entity_count_item_0.txt" in output and rule in output and found in output, output
    assert "Traceback" not in output


def test_a_count_file_is_read_through_the_guarded_reader(tmp_path: Path) -> None:
    """The reader itself (no command, no scope): a FIFO or a device is no count file, refused at once."""
    from pbgio.entities import read_dynamic_rel_count, read_entity_count
    from pbgio.errors import FormatError

    os.mkfifo(tmp_path / naming.entity_count_file("node", 0))
    (tmp_path / naming.DYNAMIC_REL_COUNT).symlink_to("/dev/zero")
    with _deadline(10):
        with pytest.raises(FormatError, match=r"entity_count_node_0\.txt: expected a regular file, found a FIFO"):
            read_entity_count(tmp_path, "node", 0)
        with pytest.raises(FormatError, match=r"dynamic_rel_count\.txt: expected a regular file, found a character"):
            read_dynamic_rel_count(tmp_path)


# --------------------------------------------------------------------------- num_partitions


def _traced(command: Any, *args: str) -> tuple[Any, float, int]:
    """``command(*args)``, its seconds and the peak of what Python and numpy allocated meanwhile."""
    tracemalloc.start()
    try:
        done, seconds = _timed(command, *args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return done, seconds, peak


def test_ten_million_partitions_validate_in_bounded_time_and_memory(tmp_path: Path) -> None:
    config = _layout(tmp_path, checkpoint=True, user_partitions=10**7)
    done, seconds, peak = _traced(pbgio, "validate", "--json", str(config))
    assert done.returncode == 1, done.stderr
    assert seconds < 10 and peak < 100 * MIB, (seconds, peak)
    report = json.loads(done.stdout)
    issues: dict[str, list[dict[str, Any]]] = {}
    for issue in report["issues"]:
        issues.setdefault(issue["rule"], []).append(issue)
    assert len(report["issues"]) < 10 and len(done.stdout) < 20_000, report["issues"]
    (counts,) = issues["entity-count-missing"]  # one issue for the 9,999,998 count files missing
    assert counts["count"] == 10**7 - 2 and counts["file"] == "entities/entity_count_user_2.txt"
    assert "partitions 2, 3, 4, 5, 6 and 9,999,993 more" in counts["message"]
    (buckets,) = issues["edge-file-missing"]  # and one for the 10^14 - 4 buckets
    assert buckets["count"] == 10**14 - 4 and buckets["file"] == "edges/edges_0_2.h5"
    (embeddings,) = issues["checkpoint-file-missing"]  # and one for the checkpoint's embeddings files
    assert embeddings["count"] == 10**7 - 2 and "(and 9,999,997 more missing)" in embeddings["message"]


def test_ten_million_partitions_are_summarized_in_bounded_time_and_memory(tmp_path: Path) -> None:
    config = _layout(tmp_path, user_partitions=10**7)
    done, seconds, peak = _traced(pbgio, "info", "--json", str(config))
    assert done.returncode == 0, done.stderr
    assert seconds < 10 and peak < 100 * MIB, (seconds, peak)
    user = json.loads(done.stdout)["entities"]["user"]
    assert user["num_partitions"] == 10**7
    assert user["counts"] == [5, 4, None, None, None, None, None]  # those found, then the first missing ones
    assert user["count_files_missing"] == 10**7 - 2
    done, seconds = _timed(pbgio, "info", str(config))
    assert done.returncode == 0 and seconds < 10
    assert "5, 4, missing, missing, missing, missing, missing, … (9,999,998 count files missing in all)" in done.stdout


def test_an_import_into_ten_million_partitions_is_refused_before_a_file_is_made(tmp_path: Path) -> None:
    """Every bucket of the grid is a file (empty ones too): a config's 10^7 partitions would make an
    import write 10^14 files; it refuses at once (the old import made files until the disk or the
    deadline ran out)."""
    config = _layout(tmp_path, user_partitions=10**7)
    for directory in ("entities", "edges"):
        for file in (tmp_path / directory).iterdir():
            file.unlink()
    edges = tmp_path / "in.tsv"
    edges.write_text("a\tf\tb\n", encoding="utf-8")
    done, seconds = _timed(pbgio, "import", str(config), str(edges))
    assert done.returncode == 2 and seconds < 10, done.stderr
    assert "num_partitions: expected a partition grid of at most 1,048,576 buckets" in done.stderr, done.stderr
    assert not any((tmp_path / "entities").iterdir()) and not any((tmp_path / "edges").iterdir())


def test_one_missing_file_is_reported_as_before_several_as_one_issue(tmp_path: Path) -> None:
    """One missing count file: the issue of old, word for word (no count); five missing buckets: one
    issue that lists them (all five: as many as an issue lists) with their count."""
    config = _layout(tmp_path, user_partitions=3)
    done = pbgio("validate", "--json", str(config))
    issues = {i["rule"]: i for i in json.loads(done.stdout)["issues"] if i["rule"].endswith("-missing")}
    assert issues["entity-count-missing"]["message"] == "expected the entity count of 'user' partition 2, found no file"
    assert issues["entity-count-missing"]["count"] is None
    assert issues["edge-file-missing"]["message"] == "expected buckets (0, 2), (1, 2), (2, 0), (2, 1), (2, 2) of the " \
        "3x3 grid (5 bucket files missing), found no file"


def test_the_missing_keys_are_found_from_the_present_ones() -> None:
    from pbgio.validate.context import absent

    present = {0, 1, 3, 7}
    first, total = absent(iter(range(10**15)), present, 10**15, (10**15).__gt__)
    assert (first, total) == ([2, 4, 5, 6, 8], 10**15 - 4)
    assert absent(iter(range(4)), {0, 1, 2, 3, 9}, 4, (4).__gt__) == ([], 0)


# --------------------------------------------------------------------------- fit's memory


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _refused_fit(config: Path) -> str:
    before = _peak_rss()
    done, seconds = _timed(pbgtrain, "fit", str(config), seconds=60)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert seconds < 10, seconds
    assert _peak_rss() - before < 512 * MIB  # nothing of the size asked for was allocated
    assert "Traceback" not in output and "refused before allocating anything" in output, output
    assert not (config.parent / "checkpoint").exists()  # refused before the checkpoint's lock
    return " ".join(output.split())


def test_fit_refuses_an_entity_count_the_machine_cannot_hold(tmp_path: Path) -> None:
    config = _layout(tmp_path)
    _count_file(tmp_path).write_text("1000000000000000\n", encoding="utf-8")  # legal by the format
    (tmp_path / "entities" / naming.entity_names_file("item", 0)).unlink()  # names are optional
    assert pbgio("validate", str(config)).returncode == 0
    output = _refused_fit(config)
    assert "entity type 'item' partition 0: 1,000,000,000,000,000 rows of dimension 6" in output
    assert "72,000,000,000,000,000 bytes" in output and "available" in output


def test_fit_refuses_a_dimension_the_machine_cannot_hold(tmp_path: Path) -> None:
    config = _layout(tmp_path)
    raw = json.loads(config.read_text(encoding="utf-8"))
    raw["dimension"] = 2**33
    raw["entities"]["item"]["dimension"] = None
    config.write_text(json.dumps(raw), encoding="utf-8")
    assert pbgio("validate", str(config)).returncode == 0
    output = _refused_fit(config)
    assert "entity type 'item' partition 0: 7 rows of dimension 8,589,934,592" in output and "bytes" in output


def test_fit_refuses_a_linear_operator_the_machine_cannot_hold(tmp_path: Path) -> None:
    """Tables of 2^20 floats a row fit; the operator, (2^20)² parameters, does not."""
    relations = [{"name": "follows", "lhs": "user", "rhs": "user", "operator": "linear"},
                 {"name": "likes", "lhs": "item", "rhs": "item", "operator": "diagonal"}]
    config = _layout(tmp_path, dimension=2**20, relations=relations)
    raw = json.loads(config.read_text(encoding="utf-8"))
    raw["entities"]["item"]["dimension"] = 4
    config.write_text(json.dumps(raw), encoding="utf-8")
    output = _refused_fit(config)
    assert "relation 'follows': operator 'linear' of dimension 1,048,576 (1,099,511,627,776 parameters)" in output


# --------------------------------------------------------------------------- after training


def _checkpoint_with_a_huge_count(root: Path) -> Path:
    """A trained layout whose count file then claims 10^15 entities of ``item`` (its checkpoint has 7)."""
    config = _layout(root, checkpoint=True)
    _count_file(root).write_text("1000000000000000\n", encoding="utf-8")
    (root / "entities" / naming.entity_names_file("item", 0)).unlink()
    return config


def test_eval_holds_what_the_edges_name_not_what_a_count_claims(tmp_path: Path) -> None:
    """eval's count of edges no training edge names (pbgio.leakage) holds a bool per entity, or, for a
    count past a billion, the ids the edges name: never an array of 10^15 (a MemoryError before)."""
    config = _checkpoint_with_a_huge_count(tmp_path)
    before = _peak_rss()
    done, seconds = _timed(pbgtrain, "eval", str(config), seconds=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert seconds < 10 and _peak_rss() - before < 512 * MIB, seconds


def test_export_to_npy_sizes_nothing_by_a_count_the_checkpoint_lacks(tmp_path: Path) -> None:
    """The .npy is sized from the counts: compared with the checkpoint's rows first (before: a 24 PB
    file asked of the file system, and an EINVAL)."""
    config = _checkpoint_with_a_huge_count(tmp_path)
    done, seconds = _timed(pbgio, "export", str(config), "-f", "npy", "-t", "item", "-o", str(tmp_path / "out"))
    assert done.returncode == 1 and seconds < 10, done.stdout + done.stderr
    assert "expected 1,000,000,000,000,000 rows for 'item' (entity counts), found 7 in the checkpoint's " \
        "embeddings (version 1)" in " ".join(done.stderr.split())
    assert not any(f.stat().st_size > MIB for f in tmp_path.rglob("*") if f.is_file())


@pytest.mark.parametrize(("operator", "named"), [
    ("affine", "relation 'interacts': operator 'affine' of dimension 4 for each of 1,000,000,000,000,000 relation "
               "types (40,000,000,000,000,000 parameters)"),
    ("none", "dynamic relation types: 1,000,000,000,000,000 (dynamic_rel_count.txt)"),
])
def test_a_dynamic_relation_count_is_validated_and_refused_by_fit(tmp_path: Path, operator: str, named: str) -> None:
    """10^15 relation types (a legal count, no names file): validate holds the limits of the one
    relation once (before: a list and arrays of 10^15, a MemoryError); fit refuses their operators
    and the state it holds per relation type."""
    config = write_layout(tmp_path, small_valid_layout(checkpoint=False, dynamic=True, featurized=False))
    for file in (tmp_path / "checkpoint").iterdir():
        file.unlink()
    (tmp_path / "checkpoint").rmdir()
    raw = json.loads(config.read_text(encoding="utf-8"))
    raw["relations"][0]["operator"] = operator
    config.write_text(json.dumps(raw), encoding="utf-8")
    (tmp_path / "entities" / naming.DYNAMIC_REL_COUNT).write_text("1000000000000000\n", encoding="utf-8")
    (tmp_path / "entities" / naming.DYNAMIC_REL_NAMES).unlink()
    done, seconds, peak = _traced(pbgio, "validate", str(config))
    assert done.returncode == 0 and seconds < 10 and peak < 100 * MIB, (done.stdout, seconds, peak)
    assert named in _refused_fit(config)
