"""benchmarks/coordinator_scale's simulated agents keep their own report phases through
their simulator's stalls, as separate boxes do (``ReportSchedule``)."""

from __future__ import annotations

import random

from benchmarks.coordinator_scale import ReportSchedule


def test_the_next_report_stays_on_the_agents_own_grid() -> None:
    schedule = ReportSchedule(100.0, 2.0, 0.5)
    assert schedule.due == 100.5
    schedule.sent(100.51)
    assert schedule.due == 102.5
    schedule.sent(102.9)  # sent 0.4 s late: the next one is not 2 s after that
    assert schedule.due == 104.5
    schedule.sent(109.3)  # more than an interval late: the missed slots are skipped
    assert schedule.due == 110.5


def test_phases_stay_spread_through_a_simulators_stalls() -> None:
    """1,000 agents in one simulated simulator that stalls now and then (20-80 ms, about
    twice a second; whatever fell due meanwhile is sent when it ends), for five minutes.
    Agents delayed together by a stall must not stay together: in the last minute no
    instant sends more reports than one long stall can gather (its share of the interval),
    and every 100 ms of the interval still carries reports."""
    rng = random.Random(1)
    interval = 2.0
    agents = [ReportSchedule(0.0, interval, rng.uniform(0, interval)) for _ in range(1000)]
    together: list[int] = []
    per_slot = [0] * 20
    now, step = 0.0, 0.001
    stall_until, next_stall = 0.0, rng.expovariate(2.0)
    while now < 300.0:
        if now >= next_stall:
            stall_until = now + rng.uniform(0.02, 0.08)
            next_stall = stall_until + rng.expovariate(2.0)
        if now >= stall_until:
            due = [a for a in agents if a.due <= now]
            for schedule in due:
                schedule.sent(now)
            if now > 240.0 and due:
                together.append(len(due))
                per_slot[int(now % interval / 0.1)] += len(due)
        now += step
    longest_stall_share = 0.08 / interval * len(agents)  # 40 agents
    assert max(together) <= 1.5 * longest_stall_share, max(together)
    assert min(per_slot) > 0, per_slot
