"""Durable writes issued from synchronous code on the event loop, run in order behind it.

Some state changes happen in synchronous code that must stay quick (an agent's session
opening in the registry, a never-enrolled agent forgotten by the liveness sweep, an audit
entry while the database is away): the change in memory is made at once, and its write to
the store is queued here and run by one task, in the order queued, so that a later write
never overtakes an earlier one for the same agent.

A write the database could not take because it is away or too slow
(``StoreUnavailableError``) stays at the head of the queue and is tried again, with a
growing pause (up to ``MAX_RETRY_S``), until the database is back: nothing is dropped for
an outage, and the writes after it wait their turn. A write the database refuses
(another ``StoreError``: a bug, a constraint) is tried ``REFUSED_ATTEMPTS`` times, then
given up, logged and counted (``dropped``). The queue holds ``max_pending`` writes at
most: beyond it a new write is given up, logged and counted too (the bound that keeps a
long outage from exhausting memory; ``edgefleet_coordinator_store_writes_dropped_total``).
``flush()`` waits until everything queued so far is written (within ``timeout_s`` when
given): the app calls it at shutdown before closing the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from coordinator.errors import StoreError
from coordinator.store.interface import StoreUnavailableError

if TYPE_CHECKING:
    from coordinator.store.health import StoreHealth

logger = logging.getLogger(__name__)

Write = Callable[[], Awaitable[object]]

#: Writes a queue keeps at most by default.
MAX_PENDING = 100_000
#: The first and the longest pause before a write that failed is tried again.
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 2.0
#: Tries of a write the database refuses (not for being away) before it is given up.
REFUSED_ATTEMPTS = 3


class WriteBehind:
    """A queue of store writes and the task that runs them."""

    def __init__(
        self,
        name: str,
        *,
        max_pending: int = MAX_PENDING,
        health: StoreHealth | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.name = name
        self.max_pending = max_pending
        self._health = health
        self._queue: deque[tuple[Write, str]] = deque()
        self._task: asyncio.Task[None] | None = None
        #: Write attempts that failed since start (each retry counts).
        self.failed = 0
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._queue)

    def pending(self) -> int:
        return len(self._queue)

    @property
    def dropped(self) -> int:
        """Writes given up since start (the bound hit, or refused by the database)."""
        return self._dropped

    def store_up(self) -> bool:
        """Whether the database answered last (as far as the health it reports to knows):
        a caller may queue at once rather than wait for a call that will fail."""
        return self._health is None or self._health.up

    def watched_by(self, health: StoreHealth) -> None:
        """Report failures and successes to ``health``, which counts this queue."""
        self._health = health
        health.watch(self)

    def submit(self, write: Write, what: str) -> None:
        """Queue ``write()`` (a coroutine function) to run after those queued before."""
        if len(self._queue) >= self.max_pending:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                logger.error(
                    "%s: %d writes are waiting for the fleet database, the most kept: %s "
                    "not written (%d given up so far)",
                    self.name, len(self._queue), what, self._dropped,
                )  # fmt: skip
            return
        self._queue.append((write, what))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"write-behind-{self.name}"
            )

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every write queued so far has run; False when ``timeout_s`` passed
        first (the writes stay queued)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._task is not None:
                    await asyncio.shield(self._task)
        except TimeoutError:
            return False
        return True

    async def _drain(self) -> None:
        pause = FIRST_RETRY_S
        refused = 0
        try:
            while self._queue:
                write, what = self._queue[0]
                try:
                    await write()
                except StoreUnavailableError as exc:
                    self.failed += 1
                    if self._health is not None:
                        self._health.failed(exc)
                    if pause == FIRST_RETRY_S:
                        logger.warning("%s: could not write %s, kept to try again: %s",
                                       self.name, what, exc)  # fmt: skip
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, MAX_RETRY_S)
                    continue
                except StoreError as exc:
                    self.failed += 1
                    refused += 1
                    if refused < REFUSED_ATTEMPTS:
                        await asyncio.sleep(FIRST_RETRY_S)
                        continue
                    self._dropped += 1
                    logger.error("%s: the fleet database refused %s %d times, given up: %s",
                                 self.name, what, refused, exc)  # fmt: skip
                if pause != FIRST_RETRY_S:
                    logger.info("%s: writing again, %d kept writes to go", self.name,
                                len(self._queue))  # fmt: skip
                    if self._health is not None:
                        self._health.succeeded()
                pause, refused = FIRST_RETRY_S, 0
                self._queue.popleft()
        finally:
            self._task = None
