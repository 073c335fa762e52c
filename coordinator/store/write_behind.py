"""Durable writes issued from synchronous code on the event loop, run in order behind it.

Some state changes happen in synchronous code that must stay quick (an agent's session
opening in the registry, a never-enrolled agent forgotten by the liveness sweep): the
change in memory is made at once, and its write to the store is queued here and run by
one task, in the order queued, so that a later write never overtakes an earlier one for
the same agent. A failed write is logged and the ones after it still run. ``flush()``
waits until everything queued so far is written: the app calls it at shutdown before
closing the store, so no queued write is lost on a clean stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from coordinator.errors import StoreError

logger = logging.getLogger(__name__)

Write = Callable[[], Awaitable[object]]


class WriteBehind:
    """A queue of store writes and the task that runs them."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: deque[tuple[Write, str]] = deque()
        self._task: asyncio.Task[None] | None = None
        #: Writes that failed since start.
        self.failed = 0

    def __len__(self) -> int:
        return len(self._queue) + (self._task is not None)

    def submit(self, write: Write, what: str) -> None:
        """Queue ``write()`` (a coroutine function) to run after those queued before."""
        self._queue.append((write, what))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"write-behind-{self._name}"
            )

    async def flush(self) -> None:
        """Wait until every write queued so far has run."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        try:
            while self._queue:
                write, what = self._queue.popleft()
                try:
                    await write()
                except StoreError as exc:
                    self.failed += 1
                    logger.error("%s: could not write %s: %s", self._name, what, exc)
        finally:
            self._task = None
