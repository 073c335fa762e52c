"""Content safety on a coordinator-managed agent (issue 28): the moderation heads travel
inside the MiniLM artifact (``python -m models build`` bundles them), so publishing that
version to the coordinator's catalog and deploying it brings them to an agent that starts
with an empty model store; it answers ``/v1/moderations`` through the ``openai`` SDK, and
keeps answering after a hot swap to another catalog version of the same files. A MiniLM
published without heads (as a build from before bundling wrote it) leaves the agent
without a classifier once swapped in: 503 ``moderation_unavailable``, and the agent's
reports say it enforces nothing, so route lookups for a key whose policy blocks a category
leave it out until a version with heads is back. A real coordinator (TLS, enrollment), a
real agent, API keys on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from devtools.fleet import CoordinatorProcess, enrolled_agent
from devtools.process import wait_until
from models.moderation_spec import BUNDLED_HEADS_KEY
from tests.e2e.moderation_helpers import (
    BOMB,
    HEADS,
    MINILM,
    Site,
    minilm_with_heads,  # noqa: F401  (a fixture)
    other_version,
    without_heads,
)

pytestmark = [pytest.mark.e2e]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def site(
    minilm_with_heads: Path,  # noqa: F811  (the fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Site]:
    tmp = tmp_path_factory.mktemp("moderation-fleet")
    coordinator = CoordinatorProcess(report_interval_ms=500, data_dir=tmp / "c", tls=True)
    await coordinator.start()
    agent = enrolled_agent(
        coordinator, agent_id="mod-agent", site="paris", state_dir=tmp / "agent",
        extra_args=["--set", "models.source=store", "--threads", "1"],
    )  # fmt: skip
    try:
        await agent.start()
        fleet = Site(coordinator, agent)
        fleet.key = await coordinator.api_key_for([agent])
        yield fleet
    finally:
        await agent.terminate()
        await coordinator.terminate()


async def routed(site: Site, key: str) -> list[str]:
    """The agents a route lookup presenting ``key`` answers with (as the client library
    asks: the key as a bearer, over the coordinator's HTTPS)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(site.coordinator.http_url + "/v1/route", params={"model": MINILM},
                 ssl=site.coordinator.ca_context()) as response,
    ):  # fmt: skip
        assert response.status == 200, await response.text()
        return [a["agent_id"] for a in (await response.json())["agents"]]


async def wait_routed(site: Site, key: str, expected: list[str]) -> None:
    async def check() -> bool:
        return await routed(site, key) == expected

    await wait_until(check, timeout_s=30, message=f"route lookups to answer {expected}")


async def moderate(site: Site, text: str, key: str = "") -> Any:
    async with site.client(key) as client:
        return await client.moderations.create(input=text)


async def test_heads_travel_with_the_embedding_model_and_follow_a_hot_swap(
    site: Site,
    minilm_with_heads: Path,  # noqa: F811  (the fixture)
    tmp_path: Path,
) -> None:
    built = json.loads((minilm_with_heads / "manifest.json").read_text())
    v1 = other_version(built["version"], 1)
    await site.deploy(minilm_with_heads, v1)
    first = await moderate(site, BOMB)
    assert first.model == f"{HEADS}@{built[BUNDLED_HEADS_KEY]['version']}"
    assert first.results[0].flagged and first.results[0].categories.illicit
    harmless = await moderate(site, "What time does the store open on Sunday?")
    assert not harmless.results[0].flagged

    # the agent reports the heads it enforces with: a key that blocks is routed to it
    blocking = await site.coordinator.mint_api_key(
        "blocks", policy={"moderation": {"input": {"illicit": "block"}}}
    )
    await wait_routed(site, blocking, ["mod-agent"])

    # a hot swap to another catalog version: the classifier comes with it
    v2 = other_version(built["version"], 2)
    await site.deploy(minilm_with_heads, v2)
    assert (await moderate(site, BOMB)).results[0].flagged

    # a MiniLM without heads swapped in: moderation is unavailable (and says why)
    v3 = other_version(built["version"], 3)
    await site.deploy(without_heads(minilm_with_heads, tmp_path / "bare"), v3)
    with pytest.raises(openai.InternalServerError) as refused:
        await moderate(site, BOMB)
    assert refused.value.status_code == 503 and refused.value.code == "moderation_unavailable"
    assert f"{MINILM}@{v3} has no moderation heads" in refused.value.message
    # it cannot enforce a block now: the blocking key gets no route to it, others do
    await wait_routed(site, blocking, [])
    assert await routed(site, site.key) == ["mod-agent"]

    # and back: the version with heads brings the classifier again
    await site.deploy(minilm_with_heads, v1)
    assert (await moderate(site, BOMB)).results[0].flagged
    await wait_routed(site, blocking, ["mod-agent"])
