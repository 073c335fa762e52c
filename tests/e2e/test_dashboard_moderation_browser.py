"""The dashboard shows content safety per key and per agent (issue 28), in a real browser
(Playwright driving Debian's Chromium) against a real coordinator (TLS, enrollment) and a
real agent that synced MiniLM with its moderation heads from the coordinator's catalog: a
key that blocks and a key that says nothing each send a harmful prompt; the keys page
counts one flag for each (what the agents report), the agent's page names the heads it
enforces with and its flags by category and action."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devtools.browser import poll, signed_in_page
from devtools.fleet import CoordinatorProcess, enrolled_agent
from tests.e2e.moderation_helpers import (
    BOMB,
    HEADS,
    Site,
    minilm_with_heads,  # noqa: F401  (a fixture)
    other_version,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def site(
    minilm_with_heads: Path,  # noqa: F811  (the fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Site]:
    state = tmp_path_factory.mktemp("dashboard-moderation")
    async with CoordinatorProcess(report_interval_ms=400, tls=True) as coordinator:
        agent = enrolled_agent(
            coordinator, agent_id="edge-lyon", site="lyon", state_dir=state / "agent",
            extra_args=["--set", "models.source=store", "--threads", "1"],
        )  # fmt: skip
        try:
            await agent.start()
            fleet = Site(coordinator, agent)
            fleet.key = await coordinator.api_key_for([agent])
            version = json.loads((minilm_with_heads / "manifest.json").read_text())["version"]
            await fleet.deploy(minilm_with_heads, other_version(version, 5))
            yield fleet
        finally:
            await agent.terminate()


async def chat(site: Site, key: str) -> int:
    """A chat request whose user message is harmful; its status (the input check runs
    before the model is looked up, so this MiniLM-only agent checks it too)."""
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": BOMB}]}
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http,
        http.post(site.agent.url + "/v1/chat/completions", json=body,
                  ssl=site.coordinator.ca_context()) as response,
    ):  # fmt: skip
        if response.status == 400:
            assert (await response.json())["error"]["code"] == "content_filter"
        return response.status


async def test_flags_per_key_and_per_agent(site: Site) -> None:
    coordinator = site.coordinator
    blocking = await coordinator.api_key_for(
        [site.agent], "blocks", policy={"moderation": {"input": {"illicit": "block"}}}
    )
    assert await chat(site, blocking) == 400  # blocked
    assert await chat(site, site.key) != 400  # the default flags it, and passes it on

    SHOTS.mkdir(parents=True, exist_ok=True)
    async with signed_in_page(coordinator) as page:
        await page.goto(f"{coordinator.http_url}/dashboard/#keys")
        flags_js = (
            "Object.fromEntries([...document.querySelectorAll('#key-rows tr')]"
            ".map(tr => [tr.children[1].textContent, tr.children[7].textContent]))"
        )
        await poll(page, f"(r => r.blocks === '1' && r.test === '1')({flags_js})")
        rows: dict[str, Any] = await page.evaluate(flags_js)
        assert rows == {"blocks": "1", "test": "1"}, rows
        await page.screenshot(path=str(SHOTS / "keys-flags.png"), full_page=True)

        await page.goto(f"{coordinator.http_url}/dashboard/#agent/edge-lyon")
        detail_js = (
            "Object.fromEntries([...document.querySelectorAll('#agent-detail dt')]"
            ".map(dt => [dt.textContent, dt.nextElementSibling.textContent]))"
        )
        await poll(page, f"({detail_js})['Content safety'] !== undefined")
        detail = await page.evaluate(detail_js)
        assert detail["Content safety"].startswith(f"{HEADS}@fp32-"), detail
        flags = detail["Moderation flags since start"]
        assert "illicit:block: 1" in flags and "illicit:flag: 1" in flags, flags
        await page.screenshot(path=str(SHOTS / "agent-moderation.png"), full_page=True)
