"""The dashboard benchmark at a small size: the scale benchmark's simulated agents, a real
coordinator and Chromium; the figures are measured in the browser and are plausible (the
timing targets themselves are the benchmark's, at 1,000 agents on a quiet machine)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.dashboard import measure

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def test_the_benchmark_measures_first_render_and_live_updates_in_the_browser() -> None:
    args = argparse.Namespace(agents=60, interval_ms=500, renders=2, duration=3.0)
    figures = await measure(args)
    assert figures["agents_shown"] == 60
    assert len(figures["first_render_ms"]) == 2
    assert all(0 < ms < 10_000 for ms in figures["first_render_ms"])
    # 50 rows on the first page, each reported twice a second for 3 s.
    assert figures["live_updates"] >= 100
    assert 0 < figures["live_update_ms_p50"] <= figures["live_update_ms_p99"] < 5_000
    assert 0 <= figures["coordinator_ms_p50"] <= figures["live_update_ms_p50"]
