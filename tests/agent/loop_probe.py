"""/healthz asked over and over while a request is in flight, as a user's monitor would."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any

from aiohttp.test_utils import TestClient


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """What a probe measures is the request's work on or off the loop, not a full
    collection of what earlier tests left in this (multi-GB) pytest process, which a
    megabyte's allocations can start (in CI: a 650-ms gap in an 869-ms request, 18-21 ms
    alone): those objects are frozen out of the GC meanwhile."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def healthz_while(
    during: asyncio.Future[Any], client: TestClient
) -> tuple[float, int, float]:
    """Until ``during`` is done, /healthz every 5 ms: the longest the asker went without an
    answer (from one answer, or the start, to the next, less the 5 ms pause), how many
    answered, and how long ``during`` took from here. Every answer must be 200.

    A test compares the longest gap with the request's own time (a ratio measured side by
    side, which a loaded machine stretches on both sides), not with a fixed bound: the
    absolute figures are ``python -m benchmarks.responsiveness``'s."""
    started = last = time.monotonic()
    longest, answered = 0.0, 0
    while not during.done():
        response = await client.get("/healthz")
        assert response.status == 200
        await response.read()
        now = time.monotonic()
        longest = max(longest, now - last - (0.005 if answered else 0.0))
        last = now
        answered += 1
        await asyncio.sleep(0.005)  # a monitor's pace, not a flood competing for the GIL
    return longest, answered, time.monotonic() - started
