"""The import's dictionaries in bounded pieces: names sorted a range at a time, the name table grown
and re-placed in place, with the same results as sorting and growing at once."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbgio.importers import dictionary, nameindex
from pbgio.importers.dictionary import name_order
from pbgio.importers.nameindex import NameIndex


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.text(max_size=6), unique=True, max_size=300), block=st.integers(1, 40))
def test_names_sorted_a_range_at_a_time_are_sorted_as_a_whole(names: list[str], block: int) -> None:
    series = pl.Series("name", names, dtype=pl.String)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dictionary, "SORT_BLOCK", block)
        got = name_order(series)
    assert np.array_equal(got, series.arg_sort().to_numpy())


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.sampled_from([f"n{i}" for i in range(400)]), max_size=120), max_size=8),
       block=st.integers(1, 64))
def test_a_name_table_placed_in_blocks_finds_every_name_with_its_count(batches: list[list[str]], block: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nameindex, "PLACE_BLOCK", block)
        index = NameIndex()
        for batch in batches:
            index.add(pl.Series(batch, dtype=pl.String))
        names = index.names().to_list()
        counts = dict(zip(names, index.counts.tolist(), strict=True))
        index.compact()
        found = index.lookup(pl.Series([*names, "absent"], dtype=pl.String))
    seen = [name for batch in batches for name in batch]
    assert counts == {name: seen.count(name) for name in set(seen)}
    assert found.tolist() == [*range(len(names)), -1]
