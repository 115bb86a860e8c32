"""Ctrl-C in awkward places: inside a finalizer (remembered for check(), not printed as an "ignored"
traceback) and between any two lines of a small file's read (a KeyboardInterrupt, no descriptor lost)."""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from pbgio import interrupts

if TYPE_CHECKING:
    from _typeshed import TraceFunction


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


def _open_descriptors() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def _interrupt_at(step: int) -> TraceFunction:
    """A trace function that raises ``KeyboardInterrupt`` at the ``step``-th call, line or return."""
    seen = 0

    def trace(frame: FrameType, event: str, arg: Any) -> TraceFunction:
        nonlocal seen
        seen += 1
        if seen == step:
            raise KeyboardInterrupt
        return trace

    return trace


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc/self/fd (Linux)")
def test_ctrl_c_at_any_step_of_reading_a_small_file_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    """Ctrl-C lands between any two lines of Python while a version file is read (the CI run that
    found this: after ``os.fdopen`` had handed the descriptor to a file object, whose collection
    closed it before the cleanup closed it again, so the trainer reported EBADF as a format error
    and exited 1, not 130): every step ends as a ``KeyboardInterrupt``, no descriptor left open."""
    from pbgio.formats import files

    version = tmp_path / "checkpoint_version.txt"
    version.write_text("3\n")
    step = 0
    while True:
        step += 1
        before = _open_descriptors()
        sys.settrace(_interrupt_at(step))
        try:
            data = files.read_bytes(version, "checkpoint version file")
        except KeyboardInterrupt:
            data = None
        finally:
            sys.settrace(None)
        gc.collect()
        assert _open_descriptors() <= before, f"step {step}: a descriptor was left open"
        if data is not None:  # the read ran to its end before the step came: every step was tried
            assert data == b"3\n"
            break
    assert step > 10
