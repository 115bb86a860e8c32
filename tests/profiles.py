"""The hypothesis profiles of the test suite (see tests/conftest.py, which loads one)."""

from __future__ import annotations

import os

from hypothesis import settings

HYPOTHESIS_DEFAULT_EXAMPLES = 100
"""hypothesis' own default ``max_examples``: what a property's stated count is relative to."""

settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True, database=None, print_blob=True)
settings.register_profile("thorough", max_examples=200, deadline=None, print_blob=True)


def load_profile() -> None:
    """``$HYPOTHESIS_PROFILE``, else ``ci`` when ``$CI`` is set, else ``dev``."""
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def examples(stated: int) -> int:
    """A property's own ``max_examples``, ``stated`` for hypothesis' default of 100 examples,
    scaled to the profile in use: 300 is 30 in ``dev`` and ``ci``, 600 in ``thorough``; at least
    ``min(stated, 5)``.

    >>> examples(100) == settings.default.max_examples
    True
    """
    scaled = round(stated * settings.default.max_examples / HYPOTHESIS_DEFAULT_EXAMPLES)
    return max(scaled, min(stated, 5))
