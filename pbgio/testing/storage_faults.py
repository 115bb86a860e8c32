"""Faults injected into the fsspec layer of ``s3://`` storage, for tests and the fault campaign.

:func:`inject` wraps s3fs's one request call (``S3FileSystem._call_s3``: every S3 request of a
listing, a ``head``, a ranged read, an upload, a copy or a delete goes through it) so that chosen
requests fail before they reach the server, as a reset connection or a time-out would make them
fail; the real s3fs and the real server answer every other request. Requests are numbered from 0
in the order the process makes them.

>>> plan = Plan(at=3, burst=1, kind="timeout")
>>> plan.fault(2) is None, type(plan.fault(3)).__name__, plan.fault(4) is None
(True, 'TimeoutError', True)
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Plan:
    """Fail ``burst`` consecutive requests from request number ``at`` (``at=None``: none, only count)."""

    at: int | None = None
    burst: int = 1
    kind: str = "error"  # "error" (a connection reset) or "timeout"
    calls: int = 0
    injected: int = 0
    methods: list[str] = field(default_factory=list)

    def fault(self, number: int) -> OSError | None:
        if self.at is None or not self.at <= number < self.at + self.burst:
            return None
        if self.kind == "timeout":
            return TimeoutError(f"injected fault: read timed out (request {number})")
        return ConnectionResetError(errno.ECONNRESET, f"injected fault: connection reset (request {number})")


@contextlib.contextmanager
def inject(plan: Plan) -> Iterator[Plan]:
    """Requests of every ``S3FileSystem`` in this process fail as ``plan`` says, inside the block."""
    import s3fs
    from fsspec.asyn import sync_wrapper

    original, original_sync = s3fs.S3FileSystem._call_s3, s3fs.S3FileSystem.call_s3
    lock = threading.Lock()

    async def call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            number = plan.calls
            plan.calls += 1
            plan.methods.append(method)
            fault = plan.fault(number)
            if fault is not None:
                plan.injected += 1
        if fault is not None:
            raise fault
        return await original(self, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = call_s3
    s3fs.S3FileSystem.call_s3 = sync_wrapper(call_s3)
    try:
        yield plan
    finally:
        s3fs.S3FileSystem._call_s3 = original
        s3fs.S3FileSystem.call_s3 = original_sync
