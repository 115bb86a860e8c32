"""Uniform row ids drawn from a counter: the same numbers on every device, eager or replayed.

A step replayed as a CUDA graph runs the operations it captured with the arguments they had, so
its random draws must keep their state on the device and move it forward there.
:class:`CounterGenerator` keeps ``(seed, draws)`` in one int64 tensor on the step's device; draw
number ``d`` has the key ``mix(seed ^ mix(d))`` and its id at position ``i`` is
``((mix(key ^ 2i) << 31) | (mix(key ^ (2i + 1)) >> 1)) % high``, with ``mix`` a 32-bit integer
avalanche (two words per id, so the modulo's bias is below 2⁻³⁰); each draw adds one to
``draws`` in place. Integer arithmetic is exact, so a CPU, a GPU, an eager and a replayed step
draw the same ids for the same seed; the meta device (shapes only) runs it too. No product
exceeds 2⁶³: the multipliers are below 2³¹ and the words below 2³².

Operations, which a replayed step launches one kernel each (29 a call): a draw hashes its key
(two mixes of a number), then both words of every id in one mix over ``2 · count`` positions, and
joins them; where one mix feeds another their facing xor-shifts cancel (see
:meth:`CounterGenerator.randints`). :meth:`CounterGenerator.randints` makes several consecutive
draws (a step's sides) with one pass of each, the same numbers as one
:meth:`~CounterGenerator.randint` after another.

>>> g = CounterGenerator(torch.device("cpu"))
>>> g.manual_seed(7)
>>> first = g.randint(10, 5)
>>> g.manual_seed(7)
>>> torch.equal(first, g.randint(10, 5)), bool(((0 <= first) & (first < 10)).all())
(True, True)
>>> a, b = g.randints([(10, 5), (10, 5)])  # the two draws after it
>>> g.manual_seed(7)
>>> _ = g.randint(10, 5)
>>> torch.equal(a, g.randint(10, 5)), torch.equal(b, g.randint(10, 5))
(True, True)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_WORD = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)  # odd, below 2³¹ (lowbias32's first, and a second of that kind)


def _mix(x: Tensor) -> Tensor:
    """A 32-bit avalanche of ``x`` (int64 holding values below 2³²): lowbias32's five steps."""
    return _shift_xor(_middle(_shift_xor(x)))


def _shift_xor(x: Tensor) -> Tensor:
    """``x ^ (x >> 16)``: the avalanche's first and last steps."""
    return x ^ (x >> 16)


def _middle(x: Tensor) -> Tensor:
    """The avalanche's three middle steps (multiply, xor-shift by 15, multiply)."""
    x = (x * _MULTIPLIERS[0]) & _WORD
    x = x ^ (x >> 15)
    return (x * _MULTIPLIERS[1]) & _WORD


def _fold(word: int) -> int:
    """``_shift_xor`` of a number (the seed as the draws use it)."""
    return word ^ (word >> 16)


class CounterGenerator:
    """Uniform integers from ``(seed, draws)`` held on ``device`` (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # the seed (32 bits, xor-shifted as the draws use it), the draws so far
        self.state = torch.zeros(2, dtype=torch.int64, device=device)
        # made once per length and kept (a replayed step reads the tensors it was captured with)
        self._positions: dict[int, Tensor] = {}  # per count of ids: their words' positions
        self._offsets: dict[int, Tensor] = {}  # per count of draws: 0, 1, … (the draws of one call)
        self._highs: dict[tuple[int, ...], Tensor] = {}  # the bounds of calls whose draws differ in theirs

    def manual_seed(self, seed: int) -> None:
        """Start the stream of ``seed`` (any integer; its 64 bits are folded into 32)."""
        folded = (seed ^ (seed >> 32)) & _WORD
        self.state.copy_(torch.tensor([_fold(folded), 0], dtype=torch.int64), non_blocking=True)

    def randint(self, high: int, count: int) -> Tensor:
        """``count`` ids drawn uniformly (with replacement) from ``[0, high)``; one draw of the stream."""
        return self.randints([(high, count)])[0]

    def randints(self, draws: Sequence[tuple[int, int]]) -> list[Tensor]:
        """One ``(high, count)`` draw after another (the same ids as :meth:`randint` called for each
        in turn), computed together: the operations of one draw for all of them."""
        if not draws:
            return []
        live = [(high, count) for high, count in draws if high > 0]
        if len(live) < len(draws):  # an empty table draws nothing and takes no draw of the stream
            drawn = iter(self.randints(live))
            return [next(drawn) if high > 0 else torch.zeros(0, dtype=torch.int64, device=self.device)
                    for high, _ in draws]
        number = len(draws)
        widest = max(count for _, count in draws)
        counter = self.state[1:] if number == 1 else self.state[1] + self._cached(self._offsets, number)
        # mix(seed ^ mix(d)) is the key and mix(key ^ p) a word; with x < 2³², (x ^ y) >> 16 is
        # (x >> 16) ^ (y >> 16) and x >> 32 is 0, so each mix's last xor-shift and the next one's
        # first cancel into the other operand: the seed is kept shifted (state[0]) and so are the
        # positions, and the same numbers take four operations fewer
        inner = self.state[0] ^ _middle(_shift_xor(counter & _WORD))  # [draws]
        keys = _middle(inner)  # the keys, but their last xor-shift
        words = _shift_xor(_middle(keys.unsqueeze(1) ^ self._cached(self._positions, widest))).view(number, widest, 2)
        self.state[1:].add_(number)
        joined = torch.add(words[..., 1] >> 1, words[..., 0], alpha=1 << 31)  # high word · 2³¹ + low word's 31 bits
        highs = {high for high, _ in draws}
        ids = joined % (draws[0][0] if len(highs) == 1 else self._bounds(tuple(high for high, _ in draws)))
        return [ids[i, :count] for i, (_, count) in enumerate(draws)]

    def _cached(self, cache: dict[int, Tensor], length: int) -> Tensor:
        """The offsets of ``length`` draws (0, 1, …), or the positions of ``length`` ids' words (0, 1,
        …, 2 · length − 1, xor-shifted: see :meth:`randints`), on the device, made once per length."""
        found = cache.get(length)
        if found is None:
            if cache is self._positions:
                found = _shift_xor(torch.arange(2 * length, dtype=torch.int64, device=self.device))
            else:
                found = torch.arange(length, dtype=torch.int64, device=self.device)
            cache[length] = found
        return found

    def _bounds(self, highs: tuple[int, ...]) -> Tensor:
        found = self._highs.get(highs)
        if found is None:
            found = self._highs[highs] = torch.tensor(highs, dtype=torch.int64, device=self.device).unsqueeze(1)
        return found
