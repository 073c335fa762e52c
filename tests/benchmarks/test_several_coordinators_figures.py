"""benchmarks/several_coordinators.py at its smallest: three real coordinators on a
throwaway PostgreSQL server, 30 simulated agents, one coordinator killed; a few
revocations through A seen by an agent on C. The JSON has every figure the report quotes,
and the simulated agents move to a survivor as the real agent does (with the failover of
the simulator broken, the orphans stay unowned and this fails)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.several_coordinators import STORE_URL_ENV, main, parse_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


async def test_the_smallest_run_writes_every_figure(tmp_path: Path) -> None:
    results = tmp_path / "several"
    args = parse_args([
        "--scenario", "kill", "revocation", "connections",
        "--agents", "30", "--workers", "1", "--lookups-per-s", "20", "--kill-window-s", "8",
        "--revocations", "3", "--revocation-agents", "6", "--route-probes", "1",
        "--results", str(results),
    ])  # fmt: skip
    before = os.environ.get(STORE_URL_ENV)
    assert await main(args) == 0
    # run in a pytest worker: the coordinators it starts later must not get the stopped
    # server's URL from the environment
    assert os.environ.get(STORE_URL_ENV) == before
    document = json.loads((tmp_path / "several.json").read_text())
    sections = document["sections"]
    assert set(sections) == {"kill", "revocation", "connections"}

    kill = sections["kill"]["figures"]
    assert kill["orphaned_agents"] == 10
    assert kill["orphans_owned_by_a_survivor"] == 10, kill
    assert 0 <= kill["takeover_p99_s"] < 10
    assert kill["lookups_answered"] > 0
    assert sum(kill["agents_connected_on_survivors_at_end"]) == 30
    for name in ("lookups_failed", "lookups_empty_answers", "load_average_1m_before"):
        assert name in kill

    revocation = sections["revocation"]["figures"]
    assert revocation["revocations_not_seen_within_10s"] == 0
    assert revocation["revocations_notify_cut_not_seen_within_10s"] == 0
    assert revocation["listener_backends_stopped"] >= 2
    assert revocation["revocation_to_c_p99_s"] is not None
    assert "report_on_b_in_a_route_answers_s" in revocation

    connections = sections["connections"]["figures"]
    assert (
        0 < connections["coordinators_connections_max"] <= connections["postgres_connections_max"]
    )
    assert connections["limit_coordinators_x_pool_plus_1"] == 33
    assert connections["coordinator_log_lines_searched"] > 0

    for name, found in document["targets"].items():
        assert set(found) == {"value", "target", "met"}, name
        assert isinstance(found["met"], bool)
    assert {"kill.takeover_p99_s", "revocation.revocation_to_c_p99_s",
            "connections.coordinators_connections_max"} <= set(document["targets"])  # fmt: skip
