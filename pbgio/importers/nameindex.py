"""Distinct names and their occurrence counts, in memory proportional to the distinct names.

A :class:`NameIndex` gives every distinct name a dense id and counts its occurrences.
Polars hashes a batch of names with two seeds, so that a name is keyed by 128 bits;
numpy looks the keys up in an open-addressing table (linear probing, at most half
full), one vectorized probe at a time over the keys still probing. Memory is about 30
bytes per distinct name plus the names themselves, whatever the number of occurrences;
a lookup costs a few random memory reads per name, with no per-row Python work and no
hash table rebuilt per batch (as a polars join against a large dictionary would).

Two names are told apart unless both of their 64-bit hashes collide (odds about
``n² / 2¹²⁹`` for ``n`` names: below 10⁻²⁰ for a billion names).

>>> index = NameIndex()
>>> index.add(pl.Series(["ann", "bob", "ann"]))
>>> index.add(pl.Series(["cy", "ann"]))
>>> sorted(zip(index.names().to_list(), index.counts.tolist()))
[('ann', 3), ('bob', 1), ('cy', 1)]
>>> ids = index.lookup(pl.Series(["cy", "dan", "ann"]))
>>> [None if i < 0 else index.names()[int(i)] for i in ids]
['cy', None, 'ann']
"""

from __future__ import annotations

import numpy as np
import polars as pl
from numpy.typing import NDArray

SEEDS = (0x5EED_0001, 0x5EED_0002)
_EMPTY = -1
_MIN_SLOTS = 1 << 10
MAX_NAMES = (1 << 31) - 1  # slots hold int32 ids
# A batch this many times larger than the names known so far is counted per distinct name
# first (polars group_by); otherwise every name is looked up and only new ones are grouped.
REPEATS_LIKELY = 8
PLACE_BLOCK = 1 << 20
"""Ids placed at a time when the table grows: the probing arrays stay a few MB, not a few bytes per name."""

Ids = NDArray[np.int64]
Keys = NDArray[np.uint64]  # shape (n, 2): the two hashes of each name


def name_hashes(names: pl.Series) -> Keys:
    """The two 64-bit hashes of each name, one row per name."""
    keys = np.empty((len(names), 2), dtype=np.uint64)
    keys[:, 0] = names.hash(SEEDS[0]).to_numpy()
    keys[:, 1] = names.hash(SEEDS[1]).to_numpy()
    return keys


class NameIndex:
    """Ids and occurrence counts of distinct names (ids are dense, in no particular order)."""

    def __init__(self) -> None:
        self._slots = np.full(_MIN_SLOTS, _EMPTY, dtype=np.int32)  # the id held in each slot
        self._keys: Keys = np.zeros((_MIN_SLOTS // 2, 2), np.uint64)  # by id (spare capacity at the end)
        self._size = 0
        self._names: list[pl.Series] = []  # by id, one chunk per batch that added names
        self.counts: Ids = np.zeros(0, np.int64)  # occurrences by id

    def __len__(self) -> int:
        return self._size

    def names(self) -> pl.Series:
        """Every name, by id (in chunks, as they were added)."""
        if not self._names:
            return pl.Series("name", [], dtype=pl.String)
        if len(self._names) > 1:
            self._names = [pl.concat(self._names, rechunk=False)]
        return self._names[0].rename("name")

    def compact(self) -> None:
        """Once counting is over: drop the counts and the spare capacity."""
        self.counts = np.zeros(0, np.int64)
        self._keys.resize((max(self._size, 1), 2), refcheck=False)  # in place: never held twice

    def drop_names(self) -> None:
        """Keep only what :meth:`lookup` needs."""
        self._names = []

    def add(self, names: pl.Series) -> None:
        """Count one occurrence of each name (adding the names not seen before)."""
        if names.is_empty():
            return
        names = names.rename("name")
        if len(names) > REPEATS_LIKELY * len(self):  # far more names than known ones: most repeat
            distinct = names.to_frame().group_by("name").agg(n=pl.len())
            names, weights = distinct.get_column("name"), distinct.get_column("n").to_numpy().astype(np.int64)
        else:
            weights = np.ones(len(names), dtype=np.int64)
        keys = name_hashes(names)
        ids = self._find(keys)
        missing = ids < 0
        new_ids, new_counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        if missing.any():  # new names: once each, with their number of occurrences
            new = (pl.DataFrame({"name": names.filter(missing), "row": np.flatnonzero(missing), "n": weights[missing]})
                   .group_by("name").agg(pl.col("n").sum(), pl.col("row").first()))
            new_ids = self._insert(keys[new.get_column("row").to_numpy()])
            new_counts = new.get_column("n").to_numpy()
            self._names.append(new.get_column("name"))
        if len(self.counts) < self._size:  # in place, zeros after (no view of the counts outlives a call)
            self.counts.resize(self._size, refcheck=False)
        np.add.at(self.counts, ids[~missing], weights[~missing])
        self.counts[new_ids] += new_counts

    def lookup(self, names: pl.Series) -> Ids:
        """The id of each name, -1 where the name was never added."""
        if names.is_empty():
            return np.zeros(0, np.int64)
        return self._find(name_hashes(names))

    def _find(self, keys: Keys) -> Ids:
        """Ids of the keys, -1 for absent ones. Most keys sit in their home slot: the first probe
        works on whole arrays, the later ones on the keys still probing."""
        mask = np.int64(len(self._slots) - 1)
        pos = keys[:, 0].view(np.int64) & mask
        ids, probing = self._probe(pos, keys)
        found = ids.astype(np.int64)
        todo = np.flatnonzero(probing)
        while len(todo):
            pos = (pos[probing] + 1) & mask
            ids, probing = self._probe(pos, keys[todo])
            found[todo] = ids
            todo = todo[probing]
        return found

    def _probe(self, pos: Ids, keys: Keys) -> tuple[NDArray[np.int32], NDArray[np.bool_]]:
        """One probe: the id where the slot holds the key (else -1), and where to probe on
        (the slot holds another key; an empty slot means the key is absent)."""
        ids = self._slots[pos]
        occupied = ids >= 0
        held = np.take(self._keys, ids, axis=0)  # an empty slot's -1 reads the last row: masked below
        hit = (held[:, 0] == keys[:, 0]) & (held[:, 1] == keys[:, 1]) & occupied
        return np.where(hit, ids, np.int32(_EMPTY)), occupied & ~hit

    def _insert(self, keys: Keys) -> Ids:
        """Add keys that are distinct and absent; return their new ids."""
        start, end = self._size, self._size + len(keys)
        if end > MAX_NAMES:
            raise ValueError(f"expected at most {MAX_NAMES:,} distinct names, found more")
        if end > len(self._keys):  # grown in place (a remap of its pages, zeros after): never held twice
            self._keys.resize((max(end, len(self._keys) * 3 // 2), 2), refcheck=False)
        self._keys[start:end] = keys
        self._size = end
        if 2 * end > len(self._slots):  # keep the table at most half full
            slots = len(self._slots)
            while 2 * end > slots:
                slots *= 2
            self._slots = np.full(slots, _EMPTY, dtype=np.int32)
            for first in range(0, end, PLACE_BLOCK):  # a block at a time: its probing arrays are 8 bytes an id
                self._place(np.arange(first, min(end, first + PLACE_BLOCK), dtype=np.int64))
        else:
            self._place(np.arange(start, end, dtype=np.int64))
        return np.arange(start, end, dtype=np.int64)

    def _place(self, ids: Ids) -> None:
        """Put ids into free slots, probing linearly from each one's home slot."""
        mask = np.int64(len(self._slots) - 1)
        pos = self._keys[ids, 0].view(np.int64) & mask
        while len(ids):
            free = self._slots[pos] == _EMPTY
            self._slots[pos[free]] = ids[free]  # where several ids want one slot, one of them wins
            placed = np.zeros(len(ids), dtype=bool)
            placed[free] = self._slots[pos[free]] == ids[free]
            ids, pos = ids[~placed], (pos[~placed] + 1) & mask
