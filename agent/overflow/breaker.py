"""A circuit breaker per overflow target.

Closed: calls go through. It opens after ``failures`` consecutive failures, or when at
least ``min_calls`` of the last ``window`` calls were made and more than ``error_rate`` of
them failed. Open: no calls for ``cooldown_s``. Then half-open: one trial call at a time;
its success closes the breaker (history cleared), its failure opens it again.
"""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5
    error_rate: float = 0.5
    window: int = 20
    min_calls: int = 10
    cooldown_s: float = 30.0


class CircuitBreaker:
    def __init__(
        self, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._s = settings
        self._clock = clock
        self._recent: collections.deque[bool] = collections.deque(maxlen=settings.window)
        self._consecutive = 0
        self._opened_at: float | None = None
        self._trial_running = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at >= self._s.cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        """May a call start now? In half-open, only one trial at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._trial_running:
            return False
        self._trial_running = True
        return True

    def release(self) -> None:
        """A call that was allowed ended without a verdict (e.g. the client left)."""
        self._trial_running = False

    def success(self) -> None:
        self._trial_running = False
        if self._opened_at is not None:
            self._opened_at = None
            self._recent.clear()
        self._consecutive = 0
        self._recent.append(True)

    def failure(self) -> None:
        self._trial_running = False
        if self._opened_at is not None:  # a failed trial (or a straggler): open again
            self._opened_at = self._clock()
            return
        self._consecutive += 1
        self._recent.append(False)
        failed = self._recent.count(False)
        if self._consecutive >= self._s.failures or (
            len(self._recent) >= self._s.min_calls
            and failed / len(self._recent) > self._s.error_rate
        ):
            self._opened_at = self._clock()
            self._consecutive = 0
