"""Ctrl-C inside a finalizer: remembered for check(), and not printed as an "ignored" traceback."""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator

import pytest

from pbgio import interrupts


class _InterruptsWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the finalizer


class _FailsWhenCollected:
    def __del__(self) -> None:
        raise ValueError("a finalizer's own bug")


@pytest.fixture(autouse=True)
def python_default_sigint() -> Iterator[None]:
    """A background job (nohup, CI) may start with SIGINT ignored; noticed() then does nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _unraisables(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """What reaches ``sys.unraisablehook`` from here on. Called in the test itself, not a fixture:
    pytest before 8.4 sets a hook of its own at the start of each test phase, over a fixture's."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


def test_interrupt_in_a_finalizer_is_kept_for_check_and_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    unraisables = _unraisables(monkeypatch)
    with interrupts.noticed():
        obj = _InterruptsWhenCollected()
        del obj
        gc.collect()
        assert unraisables == []
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.check()  # raised once only
    assert unraisables == []


def test_other_finalizer_errors_still_reach_the_previous_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    unraisables = _unraisables(monkeypatch)
    previous = sys.unraisablehook
    with interrupts.noticed():
        obj = _FailsWhenCollected()
        del obj
        gc.collect()
    assert [type(e) for e in unraisables] == [ValueError]
    assert sys.unraisablehook is previous


def test_outside_noticed_the_default_handler_is_back() -> None:
    with interrupts.noticed():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_noticed_leaves_an_ignored_sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts.noticed():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        interrupts.check()
