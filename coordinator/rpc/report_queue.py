"""Load reports applied to the fleet in slices, so that a burst of them does not hold the
event loop while route lookups wait.

gRPC hands the coordinator many sessions' messages at once: an HTTP/2 connection carries
hundreds of agents (a proxy's, or the benchmark's 250), and whatever arrived while the
loop was busy comes in one go. Read and applied in one step each, a burst of 200-280
reports kept the loop 10-20 ms on end (``python -m benchmarks.coordinator_scale``, one
CPU), and every route lookup that came in meanwhile waited for all of it. Each session's
reader now only parses its report (a malformed one still ends the session at once) and
puts it here; the queue applies ``SLICE`` at a time, each slice a callback of its own,
so lookups and other sessions' steps get the loop in between.

Order is kept: one queue, first in first out, and ``flush()`` applies everything pending
at once. The servicer flushes before it handles any other message of a session (a Bye,
request records, a certificate renewal) and before a session's end is recorded, so no
report is applied after its session closed and none overtakes what came after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

#: Reports applied per callback (about 25 us each on the benchmark's machine).
SLICE = 32

S = TypeVar("S")
R = TypeVar("R")


class ReportQueue(Generic[S, R]):
    """Calls ``apply(session, report)`` for every ``put``, in order, ``SLICE`` per loop
    callback (or all at once in ``flush``). An exception from ``apply`` is logged, and
    the reports after it are still applied."""

    def __init__(self, apply: Callable[[S, R], None], slice_size: int = SLICE) -> None:
        if slice_size < 1:
            raise ValueError(f"slice_size must be >= 1, got {slice_size}")
        self._apply = apply
        self._slice = slice_size
        self._pending: deque[tuple[S, R]] = deque()
        self._scheduled: asyncio.Handle | None = None
        self._failures_logged = 0

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, session: S, report: R) -> None:
        self._pending.append((session, report))
        if self._scheduled is None:
            self._scheduled = asyncio.get_running_loop().call_soon(self._drain)

    def flush(self) -> None:
        """Apply everything pending now."""
        while self._pending:
            self._apply_one(*self._pending.popleft())

    def _drain(self) -> None:
        self._scheduled = None
        pending = self._pending
        for _ in range(min(self._slice, len(pending))):
            self._apply_one(*pending.popleft())
        if pending:  # the rest after whatever else is ready
            self._scheduled = asyncio.get_running_loop().call_soon(self._drain)

    def _apply_one(self, session: S, report: R) -> None:
        try:
            self._apply(session, report)
        except Exception:  # one bad report must not stop the others being applied
            if self._failures_logged < 10:
                self._failures_logged += 1
                logger.exception("applying a load report failed (the first 10 failures are logged)")
