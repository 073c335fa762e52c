"""Changes made through one coordinator reach agents whose sessions are on another.

Two coordinators serve one fleet on one PostgreSQL database (TLS, API keys required, as
shipped); a real agent's session is on B only. Through A's admin API: an API key minted
is accepted by the agent, the key revoked is refused by it, the agent drained shows as
draining on B, the agent revoked loses its session on B, each within about a second.
The report interval is 5 s, so B's periodic key refresh (once per report interval) would
take up to 5 s: only the change feed (NOTIFY, then B reads the rows) is this fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from tests.coordinator.test_several_coordinators import (
    fleet_agent,
    two_coordinators,
    wait_connected_only_to,
)

pytestmark = pytest.mark.timeout(180)

REPORT_INTERVAL_S = 5.0
# A change through A in effect on B's agent within this (the issue: 1 s p99; a loaded
# test machine adds some).
WITHIN_S = 1.5


async def _admin(coordinator: CoordinatorProcess, method: str, path: str, **json: Any) -> Any:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.request(
            method, coordinator.http_url + path, json=json or None, raise_for_status=True,
            ssl=coordinator.http_context(),
        ) as response,
    ):  # fmt: skip
        return await response.json()


async def _within(check: Any, what: str) -> float:
    started = time.monotonic()
    await wait_until(check, timeout_s=15, interval_s=0.05, message=what)
    took = time.monotonic() - started
    assert took < WITHIN_S, f"{what} after {took:.2f} s"
    return took


async def test_changes_through_one_coordinator_reach_agents_on_another(
    tmp_path: Path, postgres_url: str, tiny_artifacts: Path
) -> None:
    async with two_coordinators(tmp_path, postgres_url, report_interval_s=REPORT_INTERVAL_S) as (
        first,
        second,
    ):
        agent = fleet_agent(tmp_path, postgres_url, tiny_artifacts, first, [second])
        await agent.start()
        try:
            await wait_connected_only_to(second)

            # An API key minted through A: accepted by the agent on B.
            minted = await _admin(first, "POST", "/v1/admin/keys", name="through-a")
            secret = minted["secret"]

            async def accepted() -> bool:
                return await agent.accepts_key(secret)

            await _within(accepted, "the key minted through A accepted by B's agent")

            # Revoked through A: refused by the agent on B.
            await _admin(first, "DELETE", f"/v1/admin/keys/{minted['key_id']}")

            async def refused() -> bool:
                return not await agent.accepts_key(secret)

            await _within(refused, "the key revoked through A refused by B's agent")

            # Drained through A (which has never seen this agent's session): B has it
            # draining and told the agent.
            await _admin(first, "POST", "/v1/admin/agents/edge-1/drain")

            async def draining_on_second() -> bool:
                view = await second.get_json("/v1/agents/edge-1")
                return bool(view.get("draining"))

            await _within(draining_on_second, "the drain through A in effect on B")
            assert any("drain" in line for line in agent.log), "the agent got no drain"

            # Revoked through A: B ends the agent's session.
            await _admin(first, "POST", "/v1/admin/agents/edge-1/revoke")

            async def gone_from_second() -> bool:
                return not any(
                    a["agent_id"] == "edge-1" and a["status"] == "connected"
                    for a in await second.agents()
                )

            await _within(gone_from_second, "the revoke through A ended the session on B")
            metrics = await _metrics(second)
            assert (
                'edgefleet_coordinator_changes_applied_total{kind="api_keys",outcome="ok"} 2.0'
                in metrics
            )
            assert (
                'edgefleet_coordinator_changes_applied_total{kind="agent",outcome="ok"}' in metrics
            )
            health = await second.get_json("/healthz")
            assert health["coordinator"]["change_feed"]["ok"] is True
            assert health["coordinator"]["change_feed"]["applied"] >= 4
        finally:
            await agent.terminate()


async def _metrics(coordinator: CoordinatorProcess) -> str:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics", ssl=coordinator.http_context()) as response,
    ):
        return await response.text()
