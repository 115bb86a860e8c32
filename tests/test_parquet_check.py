"""The Parquet structure check run before polars decodes a user's file.

polars aborts the process on some false claims of a Parquet file (a page claiming a negative
number of values: a 2^61-byte allocation, and Rust aborts when it fails). Files polars writes in
every shape pass; one mutation per rule is refused with an InputError naming file, row group,
column and byte offset; the inputs that aborted fuzz workers end in that error.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest

from pbgio.errors import InputError
from pbgio.importers import import_edge_lists
from pbgio.importers.parquet_check import check_parquet

ABORTED = sorted((Path(__file__).parent / "fuzz_inputs" / "import-parquet").glob("*-abort.bin"))


def parquet_bytes(frame: pl.DataFrame, **options: object) -> bytes:
    buffer = io.BytesIO()
    frame.write_parquet(buffer, **options)  # type: ignore[arg-type]
    return buffer.getvalue()


def one_type_config(root: Path) -> Path:
    config = root / "config.json"
    config.write_text(json.dumps({
        "entities": {"e": {"num_partitions": 1}}, "relations": [{"name": "r", "lhs": "e", "rhs": "e"}],
        "dimension": 4, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model"}))
    return config


def check(data: bytes) -> int:
    return check_parquet(io.BytesIO(data), "edges.parquet")


FRAMES = {
    "edges": pl.DataFrame({"lhs": [f"e{i % 97}" for i in range(3000)], "rel": ["r"] * 3000,
                           "rhs": [str(i) for i in range(3000)]}),
    "nulls": pl.DataFrame({"a": [None if i % 3 else "x" for i in range(3000)],
                           "w": [None if i % 5 else 1.5 for i in range(3000)]}),
    "lists": pl.DataFrame({"a": [[f"f{j}" for j in range(i % 4)] for i in range(3000)],
                           "b": [[] if i % 2 else None for i in range(3000)]}),
    "categorical": pl.DataFrame({"a": pl.Series([f"c{i % 7}" for i in range(3000)], dtype=pl.Categorical)}),
    "booleans": pl.DataFrame({"a": [i % 2 == 0 for i in range(3000)]}),
    "all-null": pl.DataFrame({"a": pl.Series([None] * 3000, dtype=pl.String)}),
    "empty": pl.DataFrame({"a": pl.Series([], dtype=pl.String)}),
}


@pytest.mark.parametrize("compression", ["uncompressed", "snappy", "gzip", "lz4", "zstd", "brotli"])
@pytest.mark.parametrize("name", list(FRAMES))
def test_files_polars_writes_pass(name: str, compression: str) -> None:
    frame = FRAMES[name]
    for row_group_size, page_size in [(None, None), (7, None), (1000, 512)]:
        data = parquet_bytes(frame, compression=compression, row_group_size=row_group_size,
                             data_page_size=page_size)
        assert check(data) == frame.height


# A 5-row file, one row group, no compression: dictionary page (3 values), data page (5 values).
SMALL = pl.DataFrame({"lhs": ["a", "b", "c", "a", "b"]})


def small_file() -> bytes:
    return parquet_bytes(SMALL, compression="uncompressed", statistics=False)


def mutated(old: bytes, new: bytes, data: bytes | None = None) -> bytes:
    data = small_file() if data is None else data
    assert data.count(old) == 1, f"{old!r} appears {data.count(old)} times: polars changed its layout"
    return data.replace(old, new)


# Thrift compact: 0x2C opens the data page header (field 5, a struct), 0x4C the dictionary page
# header (field 7); 0x15 is an i32 field (field 1 here) followed by its zigzag varint (5 -> 0x0A).
RULES = [
    ("negative data page values", b",\x15\x0a", b",\x15\x09", r"claiming -5 values"),
    ("data page beyond its chunk's values", b",\x15\x0a", b",\x15\x0c", r"claiming 6 values \(at most 5 fit\)"),
    ("data pages short of the chunk's values", b",\x15\x0a", b",\x15\x08", r"data pages holding 4 values in a "
     r"column chunk of 5"),
    ("negative dictionary values", b"L\x15\x06", b"L\x15\x05", r"claiming -3 values"),
    ("page beyond its chunk", b"\x15\x14\x15\x14,", b"\x15\x14\x15\x78,", r"outside its column chunk"),
]


def test_the_small_file_passes() -> None:
    assert check(small_file()) == 5


@pytest.mark.parametrize(("old", "new", "message"), [rule[1:] for rule in RULES], ids=[rule[0] for rule in RULES])
def test_a_mutation_per_page_rule_is_refused(old: bytes, new: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        check(mutated(old, new))
    assert "edges.parquet" in str(info.value) and "row group 0, column lhs" in str(info.value)


def test_a_page_claiming_more_than_its_codec_can_produce_is_refused() -> None:
    frame = pl.DataFrame({"lhs": [f"name-{i}" for i in range(100)]})
    data = parquet_bytes(frame, compression="uncompressed", statistics=False, use_pyarrow=False)
    # The first page (the dictionary, ~1,100 bytes) states its size twice as a 2-byte varint; claim
    # 8,191 decompressed bytes: uncompressed pages hold what they hold.
    from pbgio.importers.parquet_check import _Reader

    footer = data[len(data) - 8 - int.from_bytes(data[-8:-4], "little"):-8]
    chunk = _Reader(footer).struct()[4][0][1][0][3]
    start = chunk.get(11) or chunk[9]
    header = _Reader(data, start).struct()
    size = header[3]
    assert header[2] == size and 1024 < size < 8191
    varint = bytes([((2 * size) & 0x7F) | 0x80, (2 * size) >> 7])
    page = data[start:start + 12]
    assert page[2:].startswith(b"\x15" + varint + b"\x15" + varint)  # after the page type (2 bytes)
    bad = data[:start] + page[:3] + b"\xfe\x7f" + page[5:] + data[start + 12:]
    with pytest.raises(InputError, match=r"claiming 8191 decompressed bytes from \d+ compressed ones"):
        check(bad)


def test_framing_rules() -> None:
    data = small_file()
    with pytest.raises(InputError, match="fewer than a Parquet file's 12 bytes"):
        check(data[:10])
    with pytest.raises(InputError, match="no PAR1 marker"):
        check(data[:-1])
    with pytest.raises(InputError, match=r"a footer of 4294967295 bytes"):
        check(data[:-8] + b"\xff\xff\xff\xffPAR1")
    with pytest.raises(InputError, match="a damaged footer"):
        check(_short_footer(data))


def _short_footer(data: bytes) -> bytes:
    """The file with its footer cut short by 20 bytes (and the length field saying so)."""
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[len(data) - 8 - length:-8]
    return data[:len(data) - 8 - length] + footer[:-20] + (length - 20).to_bytes(4, "little") + b"PAR1"


@pytest.mark.parametrize("path", ABORTED, ids=[p.name for p in ABORTED])
def test_inputs_that_aborted_the_fuzz_workers_are_refused(path: Path, tmp_path: Path) -> None:
    """Each made polars abort the process (a failed 2^61-byte allocation) before the check existed."""
    config = one_type_config(tmp_path)
    edges = tmp_path / "edges.parquet"
    edges.write_bytes(path.read_bytes())
    with pytest.raises(InputError, match=r"claiming -\d+ values") as info:
        import_edge_lists(config, [edges])
    assert str(info.value).startswith(f"{edges}: expected a Parquet file")
    assert not (tmp_path / "data").exists()


def test_the_fuzz_mutator_falls_back_on_a_file_polars_would_abort_on(tmp_path: Path) -> None:
    import random

    from pbgio.testing import fuzz_mutators

    data = ABORTED[0].read_bytes()
    ctx = fuzz_mutators.MutationContext(random.Random(0), [data], tmp_path, tmp_path / "marker")
    assert isinstance(fuzz_mutators.parquet_mutate(ctx, data), bytes)  # an abort would take pytest down


def test_damaged_page_data_behind_sound_headers_is_an_input_error(tmp_path: Path) -> None:
    """Headers that hold together over page data that does not: polars panics (an exception, not an
    abort), and the import says the data is damaged, naming the file."""
    data = (Path(__file__).parent / "fuzz_inputs" / "import-parquet" / "damaged-page-data-panics.bin").read_bytes()
    assert check(data) >= 0
    config = one_type_config(tmp_path)
    edges = tmp_path / "edges.parquet"
    edges.write_bytes(data)
    with pytest.raises(InputError, match=r"expected data that decodes, found damaged data \(polars stopped: ") as info:
        import_edge_lists(config, [edges])
    assert str(info.value).startswith(f"{edges}: ")
