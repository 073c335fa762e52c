"""The agent as it was before contract versions (commit 9bb823e) against today's coordinator.

The old agent runs from its own tree (``git archive``), speaks contract minor 0 (no
``contract_minor``, the unsectioned DesiredState, ``queue_depth`` beside
``waiting_sequences``, 0°N 0°E for "no place"), and must still connect, report its load
and be routed to.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import REPO_ROOT, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BEFORE_CONTRACT_VERSIONS = "9bb823e"
TINY = "tiny-llama"


def old_tree(into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", BEFORE_CONTRACT_VERSIONS],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=60)
    return into


async def test_an_agent_from_before_contract_versions_connects_reports_and_is_routed_to(
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
            cwd=tree,
        ) as agent,
    ):

        async def view() -> dict[str, Any] | None:
            agents = await coordinator.agents()
            return next((a for a in agents if a["agent_id"] == "old-agent"), None)

        async def reporting() -> bool:
            found = await view()
            return found is not None and found["load"] is not None

        await wait_until(reporting, timeout_s=20, message="the old agent's first load report")
        found = await view()
        assert found is not None
        assert found["status"] == "connected" and found["contract_minor"] == 0
        assert found["location"] is None  # it sent 0, 0 for "not configured"
        assert found["http_url"] == agent.url
        assert [m["name"] for m in found["models"]] == [TINY]
        assert found["load"]["waiting_sequences"] == 0 and found["healthy"]

        route = await coordinator.get_json(f"/v1/route?model={TINY}&lat=52.5&lon=13.4")
        assert [a["agent_id"] for a in route["agents"]] == ["old-agent"]
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                route["agents"][0]["http_url"] + "/v1/completions",
                json={"model": TINY, "prompt": "hello", "max_tokens": 4},
            ) as response,
        ):
            assert response.status == 200
            assert (await response.json())["usage"]["completion_tokens"] >= 1
