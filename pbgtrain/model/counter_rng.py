"""Uniform row ids drawn from a counter: the same numbers on every device, eager or replayed.

A step replayed as a CUDA graph runs the operations it captured with the arguments they had, so
its random draws must keep their state on the device and move it forward there.
:class:`CounterGenerator` keeps ``(seed, draws)`` in one int64 tensor on the step's device; each
draw hashes ``(seed, draws, position)`` with a 32-bit integer mixer (two words per id, so the
modulo's bias is below 2⁻³⁰) and adds one to ``draws`` in place. Integer arithmetic is exact, so
a CPU, a GPU, an eager and a replayed step draw the same ids for the same seed; the meta device
(shapes only) runs it too. No product exceeds 2⁶³: the multipliers are below 2³¹ and the words
below 2³².

>>> g = CounterGenerator(torch.device("cpu"))
>>> g.manual_seed(7)
>>> first = g.randint(10, 5)
>>> g.manual_seed(7)
>>> torch.equal(first, g.randint(10, 5)), bool(((0 <= first) & (first < 10)).all())
(True, True)
"""

from __future__ import annotations

import torch
from torch import Tensor

_WORD = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)  # odd, below 2³¹ (lowbias32's first, and a second of that kind)


def _mix(x: Tensor) -> Tensor:
    """A 32-bit avalanche of ``x`` (int64 holding values below 2³²), in place where it can."""
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIERS[0]) & _WORD
    x = x ^ (x >> 15)
    x = (x * _MULTIPLIERS[1]) & _WORD
    return x ^ (x >> 16)


class CounterGenerator:
    """Uniform integers from ``(seed, draws)`` held on ``device`` (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.state = torch.zeros(2, dtype=torch.int64, device=device)  # seed (32 bits), draws so far
        self._positions: dict[int, Tensor] = {}

    def manual_seed(self, seed: int) -> None:
        """Start the stream of ``seed`` (any integer; its 64 bits are folded into 32)."""
        folded = (seed ^ (seed >> 32)) & _WORD
        self.state.copy_(torch.tensor([folded, 0], dtype=torch.int64), non_blocking=True)

    def randint(self, high: int, count: int) -> Tensor:
        """``count`` ids drawn uniformly (with replacement) from ``[0, high)``; one draw of the stream."""
        if high <= 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        positions = self._positions.get(count)
        if positions is None:
            positions = self._positions[count] = torch.arange(count, dtype=torch.int64, device=self.device) * 2
        key = _mix(self.state[0] ^ _mix(self.state[1] & _WORD))
        high_word = _mix(key ^ positions)
        low_word = _mix(key ^ (positions + 1))
        self.state[1:].add_(1)
        return ((high_word << 31) | (low_word >> 1)) % high
