"""Drain with real processes: the agent finishes its work, says it is draining, resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import REPO_ROOT, get_json, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

AGENT = "edge-drain"


def cli(*args: str, admin_token: str) -> Any:
    """The operator CLI; the admin token goes in its environment, never a flag."""
    env = {**os.environ, "EDGEFLEET_ADMIN_TOKEN": admin_token}
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *args, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True, env=env,
    )  # fmt: skip
    return json.loads(done.stdout)


async def test_drain_and_resume_reach_the_agent_and_the_router(tiny_artifacts: Path) -> None:
    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        agent = AgentProcess(
            models_dir=str(tiny_artifacts), serve=["tiny-llama"],
            coordinator=coordinator.grpc_target, agent_id=AGENT,
        )  # fmt: skip
        await agent.start()
        try:
            key = await coordinator.api_key_for([agent])

            async def health() -> str:
                return str((await get_json(agent.url + "/healthz"))["status"])

            async def routed() -> dict[str, Any]:
                body: dict[str, Any] = await coordinator.get_json("/v1/route?model=tiny-llama")
                return body

            async def reported_draining() -> bool | None:
                view = await coordinator.get_json(f"/v1/agents/{AGENT}")
                return None if view["load"] is None else bool(view["load"]["draining"])

            await wait_until(lambda: _routes_to_agent(routed), timeout_s=20, message="agent routed")
            assert await health() == "ok"

            async def first_report_not_draining() -> bool:
                return await reported_draining() is False

            await wait_until(first_report_not_draining, timeout_s=10, message="a load report")

            async with aiohttp.ClientSession(headers=agent.headers(key)) as http:
                # A streamed completion in flight when the drain comes finishes normally.
                body = {"model": "tiny-llama", "prompt": "Once upon", "max_tokens": 64,
                        "temperature": 0, "stream": True, "cache": False}  # fmt: skip
                async with http.post(agent.url + "/v1/completions", json=body) as stream:
                    assert stream.status == 200
                    first = await stream.content.readline()
                    assert first.startswith(b"data: ")

                    drained = cli(
                        "agents",
                        "drain",
                        AGENT,
                        "--url",
                        coordinator.http_url,
                        admin_token=coordinator.admin_token,
                    )
                    assert drained["draining"] is True and drained["command_sent"] is True
                    await wait_until(
                        lambda: _equals(health, "draining"), timeout_s=10,
                        message="agent /healthz says draining",
                    )  # fmt: skip

                    rest = (await stream.content.read()).decode()
                assert rest.rstrip().endswith("data: [DONE]")

                # Requests that still reach a draining agent are answered.
                del body["stream"]
                async with http.post(agent.url + "/v1/completions", json=body) as answer:
                    assert answer.status == 200
                    assert (await answer.json())["choices"][0]["text"]

            route = await routed()
            assert route["agents"] == [] and route["excluded"] == {"draining": 1}
            await wait_until(
                lambda: _equals(reported_draining, True), timeout_s=5,
                message="load report says draining",
            )  # fmt: skip

            resumed = cli(
                "agents",
                "resume",
                AGENT,
                "--url",
                coordinator.http_url,
                admin_token=coordinator.admin_token,
            )
            assert resumed["draining"] is False and resumed["command_sent"] is True
            await wait_until(lambda: _equals(health, "ok"), timeout_s=10, message="agent ok")
            # The coordinator routes to it again once its reports stop saying draining.
            await wait_until(
                lambda: _routes_to_agent(routed), timeout_s=10, message="agent routed again"
            )
            assert await reported_draining() is False
        finally:
            await agent.terminate()


async def _routes_to_agent(routed: Any) -> bool:
    body = await routed()
    return [a["agent_id"] for a in body["agents"]] == [AGENT]


async def _equals(probe: Any, wanted: object) -> bool:
    return bool(await probe() == wanted)
