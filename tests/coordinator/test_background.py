"""The coordinator's periodic background work never ends silently."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coordinator.background import periodic_task


async def test_a_failing_step_is_logged_once_and_the_task_keeps_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls in (2, 3):  # a run of two failures, then it works again
            raise RuntimeError("database is locked")

    with caplog.at_level(logging.INFO, logger="coordinator.background"):
        async with periodic_task("test sweep", 0.01, step) as task:
            async with asyncio.timeout(5):
                while calls < 6:
                    await asyncio.sleep(0.01)
            assert not task.done()  # the failures did not end it
    assert task.cancelled()  # the context cancelled and awaited it
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1 and "test sweep failed" in failures[0].getMessage()
    assert failures[0].exc_info is not None  # with the traceback
    assert any("test sweep works again" in r.getMessage() for r in caplog.records)


async def test_a_period_must_be_positive() -> None:
    async def step() -> None:
        return None

    with pytest.raises(ValueError, match="period_s"):
        async with periodic_task("bad", 0, step):
            pass
