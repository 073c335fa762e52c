"""benchmarks/host_reference: the coordinator's own work timed over a scale-shaped fleet, in a
subprocess pinned to a CPU (as coordinator_scale runs it), and an error, not a crash, when
it cannot run."""

from __future__ import annotations

import os

import pytest

from benchmarks.coordinator_scale import _host_reference

pytestmark = pytest.mark.timeout(120)


def test_the_reference_times_routes_and_reports_on_the_cpu_given() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    figures = _host_reference(cpu, agents=400)
    assert "error" not in figures, figures
    assert figures["agents"] == 400
    assert 1 < figures["route_us"] < 100_000  # a real decision over 400 agents
    assert 0 < figures["record_report_us"] < 10_000
    assert figures["timeit_sum_range_100_ns"] > 0


def test_a_reference_that_cannot_run_is_an_error_entry() -> None:
    figures = _host_reference(10_000, agents=10)  # no such CPU: sched_setaffinity fails
    assert set(figures) == {"error"}
    assert "Invalid argument" in figures["error"] or "OSError" in figures["error"], figures
