"""Supervision of the engine's long-running loops (the scheduler, the embedding batcher).

A loop that raises is not allowed to end silently: :func:`supervise` logs the failure once,
lets the owner fail every request the loop held (``on_failure``) and runs the loop again, at
most ``max_restarts`` times within ``window_s`` seconds. The failure after that marks the
engine dead: ``on_failure`` is told so, and the loop stays down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

OnDead = Callable[[str], None]  # told once, with the reason, when an engine dies


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 3  # restarts allowed within the window; the next failure is fatal
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")


class RestartBudget:
    """Counts failures in a sliding window; says whether one more restart is allowed."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._failures: deque[float] = deque()

    @property
    def failures_in_window(self) -> int:
        return len(self._failures)

    def record_failure(self) -> bool:
        """Counts a failure now; True when the loop may restart, False when it is dead."""
        now = self._clock()
        self._failures.append(now)
        while self._failures and self._failures[0] <= now - self._policy.window_s:
            self._failures.popleft()
        return len(self._failures) <= self._policy.max_restarts


async def supervise(
    name: str,
    loop: Callable[[], Awaitable[None]],
    policy: RestartPolicy,
    on_failure: Callable[[str | None], None],
) -> None:
    """Runs ``loop`` until it returns or is cancelled, restarting it after a failure.

    After each failure ``on_failure`` is called with ``None`` when the loop restarts, or
    with the reason the engine is dead (the loop then stays down and this returns).
    """
    budget = RestartBudget(policy)
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            restart = budget.record_failure()
            if restart:
                log.exception(
                    "the %s failed; failing its requests and restarting it (failure %d of "
                    "%d allowed in %.0f s)",
                    name,
                    budget.failures_in_window,
                    policy.max_restarts,
                    policy.window_s,
                )
                dead: str | None = None
            else:
                dead = (
                    f"the {name} failed {budget.failures_in_window} times in "
                    f"{policy.window_s:.0f} s and was stopped (last error: "
                    f"{type(exc).__name__}: {str(exc)[:200]})"
                )
                log.exception("%s", dead)
        try:
            on_failure(dead)
        except Exception:
            log.exception("the %s could not clean up after its failure; stopping it", name)
            return
        if dead is not None:
            return
