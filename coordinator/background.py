"""The coordinator's periodic background work (liveness sweeps, state saves, key pushes).

:func:`periodic_task` runs a step every period for as long as its context is open (an
``app.cleanup_ctx`` owns it). A step that raises never ends the task silently: the
failure is logged once per run of failures, and the next period tries again.
:func:`running_task` runs one long-lived coroutine (the change feed, the live view, the
dashboard's event stream) the same way: cancelled and awaited when its context ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def periodic_task(
    name: str, period_s: float, step: Callable[[], Awaitable[None]]
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``step`` every ``period_s`` seconds until the context ends (then cancel and
    await it)."""
    if period_s <= 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")

    async def run() -> None:
        failing = False
        while True:
            await asyncio.sleep(period_s)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                if not failing:
                    logger.exception("%s failed; trying again every %.2f s", name, period_s)
                failing = True
            else:
                if failing:
                    logger.info("%s works again", name)
                failing = False

    async with running_task(name, run()) as task:
        yield task


@contextlib.asynccontextmanager
async def running_task(
    name: str, work: Coroutine[Any, Any, None]
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``work`` as a task until the context ends (then cancel and await it)."""
    task = asyncio.create_task(work, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
