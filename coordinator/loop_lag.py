"""Event-loop lag: how late the loop runs a timer, so how long every agent session and
route lookup waited behind whatever held the loop (a long callback, a collection, a
synchronous call).

A ``LoopLagProbe`` asks the loop to call it back every ``interval_s`` and observes how
late each call came into a histogram (``edgefleet_coordinator_event_loop_lag_seconds``):
the highest bucket reached in a window bounds the longest stall in it, whatever held the
loop, and the count above a bound says how often. An idle loop is late by about a
millisecond (the selector's resolution). The probe is a plain timer callback (no task,
no future): a hundred cheap calls a second. ``server.serve`` runs one for as long as
the coordinator serves.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

#: The probe's period: short enough that a stall of a few milliseconds is seen.
PROBE_INTERVAL_S = 0.01


class LoopLagProbe:
    """Observes the loop's lateness into ``histogram`` every ``interval_s``, from
    ``start()`` (on the running loop) until ``stop()``."""

    def __init__(self, histogram: Histogram, interval_s: float = PROBE_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._observe = histogram.observe
        self._interval_s = interval_s
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self._interval_s
        self._timer = loop.call_at(due, self._called, loop, due)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _called(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        now = loop.time()
        self._observe(max(0.0, now - due))
        due = now + self._interval_s
        self._timer = loop.call_at(due, self._called, loop, due)
