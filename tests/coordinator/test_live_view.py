"""Routing from any coordinator: the shared live view, against real processes.

Two coordinators on one PostgreSQL database (TLS, API keys required, as shipped), a real
agent whose session is on B. A route lookup on A returns the agent, owned by B (A has no
session with it); a change B sees in the agent's reports shows in A's route answers
within 1.5 s (the agent paused until A no longer has it live, then resumed: B's answer
and A's are watched side by side). Then the agent is paused again and B SIGKILLed: on A the agent
is unconfirmed (still routed) once B is not alive by the database's clock, never down;
resumed, it reconnects to A and is live there, owned by A.

The report interval is 0.5 s (the owner writes its agents' rows every interval and A reads
every 0.25 s), the leader lease 2 s (B dead 2 s after its last heartbeat).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from tests.coordinator.test_several_coordinators import (
    fleet_agent,
    two_coordinators,
    wait_connected_only_to,
)

pytestmark = pytest.mark.timeout(120)

REPORT_INTERVAL_S = 0.5
# A report received by B in A's route answers within this (the bound).
WITHIN_S = 1.5


async def _routed(coordinator: CoordinatorProcess) -> dict[str, Any] | None:
    """edge-1 in the coordinator's route answer (None: not in it)."""
    answer = await coordinator.get_json("/v1/route?model=tiny-llama")
    found = [a for a in answer["agents"] if a["agent_id"] == "edge-1"]
    return found[0] if found else None


async def _liveness(coordinator: CoordinatorProcess) -> str | None:
    routed = await _routed(coordinator)
    return None if routed is None else str(routed["liveness"])


async def _listed(coordinator: CoordinatorProcess) -> dict[str, Any]:
    (agent,) = [a for a in await coordinator.agents() if a["agent_id"] == "edge-1"]
    return agent


@pytest.mark.slow  # 11 s: three coordinators on one PostgreSQL
async def test_a_route_lookup_on_any_coordinator_sees_every_agent(
    tmp_path: Path, postgres_url: str, tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_COORDINATOR_LEADER_LEASE_S", "2")
    monkeypatch.setenv("EDGEFLEET_COORDINATOR_COORDINATOR_HEARTBEAT_S", "0.5")
    async with two_coordinators(tmp_path, postgres_url, report_interval_s=REPORT_INTERVAL_S) as (
        first,
        second,
    ):
        a_id = (await first.get_json("/healthz"))["coordinator"]["id"]
        b_id = (await second.get_json("/healthz"))["coordinator"]["id"]
        agent = fleet_agent(tmp_path, postgres_url, tiny_artifacts, first, [second, first])
        await agent.start()
        try:
            await wait_connected_only_to(second)

            # A routes to B's agent: live, owned by B, no session on A.
            async def live_on_first() -> bool:
                return await _liveness(first) == "live"

            await wait_until(live_on_first, timeout_s=10, interval_s=0.05,
                             message="B's agent routed by A")  # fmt: skip
            listed = await _listed(first)
            assert (listed["coordinator"], listed["status"]) == (b_id, "disconnected")
            assert (await _listed(second))["coordinator"] == b_id

            # Paused until A no longer routes it as live (B called it suspect, or down, and
            # wrote that), then resumed: its next report makes it live on B, and on A
            # within WITHIN_S of that.
            os.kill(agent.pid, signal.SIGSTOP)
            try:

                async def not_live_on_first() -> bool:
                    return await _liveness(first) != "live"

                await wait_until(not_live_on_first, timeout_s=10, interval_s=0.05,
                                 message="the paused agent no longer live on A")  # fmt: skip
                assert await _liveness(second) != "live"
            finally:
                os.kill(agent.pid, signal.SIGCONT)
            seen_on_second = seen_on_first = None
            started = time.monotonic()
            while seen_on_first is None:
                now = time.monotonic()
                assert now - started < 10, "the agent's reports never made it live on A"
                if seen_on_second is None and await _liveness(second) == "live":
                    seen_on_second = time.monotonic()
                if await _liveness(first) == "live":
                    seen_on_first = time.monotonic()
            assert seen_on_second is not None, "live on A before B"
            took = seen_on_first - seen_on_second
            assert took < WITHIN_S, f"B's report in A's route answers after {took:.2f} s"

            # B dies (the agent paused: it cannot move at once): on A the agent is
            # unconfirmed, still routed, once B is not alive; never down.
            os.kill(agent.pid, signal.SIGSTOP)
            try:
                await second.signal_and_wait(signal.SIGKILL, 10)
                seen: list[str | None] = []

                async def unconfirmed_on_first() -> bool:
                    seen.append(await _liveness(first))
                    return seen[-1] == "unconfirmed"

                await wait_until(unconfirmed_on_first, timeout_s=15, interval_s=0.05,
                                 message="B's agent unconfirmed on A")  # fmt: skip
            finally:
                os.kill(agent.pid, signal.SIGCONT)

            # Resumed, it reconnects to A: live there, owned by A.
            async def moved_to_first() -> bool:
                seen.append(await _liveness(first))
                listed = await _listed(first)
                return (listed["coordinator"], listed["status"], seen[-1]) == (
                    a_id, "connected", "live",
                )  # fmt: skip

            await wait_until(moved_to_first, timeout_s=15, interval_s=0.05,
                             message="the agent's session on A")  # fmt: skip
            # never down, never left out of the answer
            assert set(seen) <= {"live", "suspect", "unconfirmed"}, seen
            health = await first.get_json("/healthz")
            assert health["coordinator"]["live_view"]["ok"] is True
            assert health["coordinator"]["live_view"]["applied"] > 0
        finally:
            await agent.terminate()
