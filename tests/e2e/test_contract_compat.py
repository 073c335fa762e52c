"""An agent one contract minor version older (v1.2, commit f15fd8a) against today's coordinator.

The old agent runs from its own tree (what ``git archive`` gave at that commit, vendored in
tests/data/old_trees/: see tests/old_trees.py). It speaks contract v1.2: it knows
nothing of model sync (no signing key, no signed manifests, no inventory or per-model
stats in its reports). Today's coordinator (v1.3) accepts it on loopback, where
enrollment is not required: it must still connect, report its load, be routed to and
serve a request, with API keys on as shipped (the keys section is v1.2's: a key minted on
today's coordinator reaches the old agent, which refuses a request without it).
The coordinator's fleet view needs an admin token now
(``CoordinatorProcess.admin_headers``); ``/v1/route`` stays public. Agents from before
contract versions (minor 0) are refused: tests/coordinator/test_coordinator_service.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until
from edgefleet.contract import CONTRACT_MINOR
from tests.old_trees import AGENT_CONTRACT_V1_2, extract

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TINY = "tiny-llama"


def old_tree(into: Path) -> Path:
    return extract(AGENT_CONTRACT_V1_2, into)


def test_the_old_tree_speaks_the_previous_minor_version(tmp_path: Path) -> None:
    tree = old_tree(tmp_path)
    source = (tree / "edgefleet" / "contract.py").read_text()
    assert f"CONTRACT_MINOR = {CONTRACT_MINOR - 1}\n" in source
    assert (
        "model_signing_key"
        not in (tree / "protos" / "edgefleet" / "v1" / "fleet.proto").read_text()
    )


async def test_a_v1_2_agent_connects_reports_is_routed_to_and_serves(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    tree = old_tree(tmp_path)
    async with (
        CoordinatorProcess(report_interval_ms=500) as coordinator,
        AgentProcess(
            models_dir=str(tiny_artifacts.resolve()),
            serve=[TINY],
            coordinator=coordinator.grpc_target,
            agent_id="old-agent",
            site="lab",
            lat=52.5,
            lon=13.4,
            cwd=tree,
        ) as agent,
    ):
        # Without the admin token the fleet view is refused (loopback is no credential).
        async with (
            aiohttp.ClientSession() as http,
            http.get(coordinator.http_url + "/v1/agents") as response,
        ):
            assert response.status == 401

        async def view() -> dict[str, Any] | None:
            agents = await coordinator.agents()  # presents coordinator.admin_headers
            return next((a for a in agents if a["agent_id"] == "old-agent"), None)

        async def reporting() -> bool:
            found = await view()
            return found is not None and found["load"] is not None

        await wait_until(reporting, timeout_s=20, message="the old agent's first load report")
        found = await view()
        assert found is not None
        assert found["status"] == "connected"
        assert found["contract_minor"] == CONTRACT_MINOR - 1
        assert not found["enrolled"]  # loopback: enrollment not required
        assert found["location"] == {"lat": 52.5, "lon": 13.4}
        assert found["http_url"] == agent.url
        assert [m["name"] for m in found["models"]] == [TINY]
        assert found["load"]["waiting_sequences"] == 0 and found["healthy"]

        route_url = coordinator.http_url + f"/v1/route?model={TINY}&lat=52.5&lon=13.4"
        async with aiohttp.ClientSession() as http, http.get(route_url) as response:
            assert response.status == 200  # no token: /v1/route is public
            route = await response.json()
        assert [a["agent_id"] for a in route["agents"]] == ["old-agent"]
        # API keys on: a key minted today reaches the old agent; without it, 401.
        key = await coordinator.api_key_for([agent])
        completion = {"model": TINY, "prompt": "hello", "max_tokens": 4}
        async with aiohttp.ClientSession() as http:
            url = route["agents"][0]["http_url"] + "/v1/completions"
            async with http.post(url, json=completion) as response:
                assert response.status == 401
            async with http.post(url, json=completion, headers=agent.headers(key)) as response:
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] >= 1
        # Its load reports keep arriving after the request (the session stays up).
        before = found["load"]["requests_total"]

        async def counted() -> bool:
            again = await view()
            return again is not None and again["load"]["requests_total"] > before

        await wait_until(counted, timeout_s=10, message="the served request in a load report")
