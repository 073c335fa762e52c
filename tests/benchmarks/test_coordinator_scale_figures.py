"""benchmarks/coordinator_scale's reading of the coordinator's event-loop lag histogram."""

from __future__ import annotations

from benchmarks.coordinator_scale import _longest_stall_ms

NAME = "edgefleet_coordinator_event_loop_lag_seconds"


def scrape(counts: dict[str, float]) -> dict[str, float]:
    """Cumulative bucket counts as /metrics gives them, keyed as the benchmark reads them."""
    found = {f'{NAME}_bucket{{le="{le}"}}': n for le, n in counts.items()}
    found[f"{NAME}_count"] = counts["+Inf"]
    return found


def test_the_longest_stall_is_the_highest_bucket_reached_in_the_window() -> None:
    before = scrape({"0.001": 90.0, "0.02": 99.0, "0.05": 100.0, "0.1": 100.0, "+Inf": 100.0})
    # in the window: 40 wake-ups on time, 3 up to 20 ms late, 2 up to 50 ms, 1 up to 100 ms
    after = scrape({"0.001": 130.0, "0.02": 142.0, "0.05": 144.0, "0.1": 146.0, "+Inf": 146.0})
    assert _longest_stall_ms(before, after, NAME) == (100.0, 3)


def test_no_lag_histogram_reads_as_nothing() -> None:
    assert _longest_stall_ms({}, {}, NAME) == (0.0, 0)
