"""The event-loop lag probe (coordinator.loop_lag): a stall shows in its histogram."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from coordinator.fleet.metrics import LOOP_LAG_BUCKETS
from coordinator.loop_lag import LoopLagProbe

pytestmark = pytest.mark.timeout(30)


async def test_a_callback_holding_the_loop_is_the_longest_lag() -> None:
    registry = CollectorRegistry()
    lag = Histogram("lag_seconds", "lag", buckets=LOOP_LAG_BUCKETS, registry=registry)
    probe = LoopLagProbe(lag, interval_s=0.01)
    probe.start()
    try:
        await asyncio.sleep(0.1)  # idle: calls on time
        time.sleep(0.35)  # a synchronous call on the loop
        await asyncio.sleep(0.1)
    finally:
        probe.stop()

    def count(le: str) -> float:
        value = registry.get_sample_value("lag_seconds_bucket", {"le": le})
        assert value is not None
        return value

    total = registry.get_sample_value("lag_seconds_count")
    assert total is not None and total >= 5
    # the call due while the blocking call held the loop came at least its 0.35 s less
    # the 10 ms it was due in late
    assert total - count("0.3") >= 1
    assert count("+Inf") == total
    await asyncio.sleep(0.05)  # stopped: nothing more observed
    assert registry.get_sample_value("lag_seconds_count") == total


def test_the_interval_must_be_positive() -> None:
    lag = Histogram("lag_seconds", "lag", registry=CollectorRegistry())
    with pytest.raises(ValueError, match="interval_s"):
        LoopLagProbe(lag, interval_s=0)
