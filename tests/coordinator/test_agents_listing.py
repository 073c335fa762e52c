"""/v1/agents pages through a 5,000-agent fleet while /healthz keeps answering: a page is
turned into JSON off the event loop. How fast /healthz answers meanwhile is measured by
``python -m benchmarks.responsiveness``."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

import aiohttp
import pytest

from coordinator.api import agents as agents_api
from coordinator.api.app_keys import REGISTRY_KEY
from edgefleet.contract import Hello, LoadedModel, Location
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, Coordinator, MakeCoordinator
from tests.coordinator.store_backends import on_both_stores

pytestmark = pytest.mark.timeout(120)
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores
FLEET = 5000


def _join(coordinator: Coordinator, agents: int) -> None:
    registry = coordinator.app[REGISTRY_KEY]
    for i in range(agents):
        registry.open_session(
            Hello(
                agent_id=f"edge-{i:05d}",
                site=f"site-{i % 50}",
                http_url=f"http://10.0.{i // 250}.{i % 250}:8000",
                location=Location(lat=45.0 + i % 10, lon=5.0),
                models=(LoadedModel(name="smollm2-135m", version="v1", task="chat"),),
            )
        )


async def test_healthz_answers_while_a_page_is_being_serialized(
    make_coordinator: MakeCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page held in the middle of its serialization until /healthz has answered: off the
    event loop, /healthz answers at once; on it, nothing would until the hold gave up."""
    coordinator = await make_coordinator()
    _join(coordinator, 20)
    serializing, answered = threading.Event(), threading.Event()
    outcome: dict[str, bool] = {}
    serialize = agents_api._agents_page_json

    def held(*args: Any) -> bytes:
        serializing.set()
        outcome["healthz_answered_meanwhile"] = answered.wait(10)
        return serialize(*args)

    monkeypatch.setattr(agents_api, "_agents_page_json", held)
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as http:

        async def first_page() -> list[str]:
            async with http.get(coordinator.http_url + "/v1/agents") as response:
                assert response.status == 200
                return [a["agent_id"] for a in (await response.json())["data"]]

        page = asyncio.ensure_future(first_page())
        while not serializing.is_set():
            await asyncio.sleep(0.01)
        async with http.get(coordinator.http_url + "/healthz") as response:
            assert response.status == 200
        answered.set()
        assert await page == [f"edge-{i:05d}" for i in range(20)]
    assert outcome == {"healthz_answered_meanwhile": True}


@pytest.mark.slow
async def test_agents_are_paginated_and_healthz_keeps_answering(
    make_coordinator: MakeCoordinator,
) -> None:
    # These agents never report: with a long report interval the sweep does not mark them
    # suspect one by one (5,000 changes on the event loop) while they are listed.
    coordinator = await make_coordinator(max_agents=10_000, report_interval_ms=600_000)
    _join(coordinator, FLEET)
    url = coordinator.http_url
    healthz: list[float] = []
    listed: list[str] = []

    # The lister is a process of its own: its JSON parsing must not hold this process's
    # GIL while the coordinator (in this process) answers /healthz.
    lister_code = (
        "import json, sys, urllib.request\n"
        "url, token = sys.argv[1], sys.argv[2]\n"
        "path, pages, ids = '/v1/agents', 0, []\n"
        "while True:\n"
        "    req = urllib.request.Request(url + path, headers={'Authorization': token})\n"
        "    with urllib.request.urlopen(req) as r:\n"
        "        assert r.status == 200\n"
        "        body = json.load(r)\n"
        "    pages += 1\n"
        "    ids += [a['agent_id'] for a in body['data']]\n"
        "    if not body.get('has_more'):\n"
        "        break\n"
        "    path = '/v1/agents?after=' + body['last_id']\n"
        "print(json.dumps({'pages': pages, 'ids': ids}))\n"
    )

    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as http:
        # Started before the probes: spawning a process blocks this event loop for a moment
        # (a fork of this process), which is not the listing.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", lister_code, url, ADMIN_HEADERS["Authorization"],
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        lister = asyncio.ensure_future(process.communicate())
        started = time.monotonic()
        while not lister.done():
            t = time.monotonic()
            async with http.get(url + "/healthz") as response:
                assert response.status == 200
            healthz.append(time.monotonic() - t)
            await asyncio.sleep(0.01)
        out, _ = await lister
        assert process.returncode == 0
        result = json.loads(out)
        pages = result["pages"]
        listed.extend(result["ids"])
        took = time.monotonic() - started
        print(
            f"listed {len(listed)} agents in {pages} pages, {took:.2f} s; /healthz max "
            f"{max(healthz) * 1000:.0f} ms over {len(healthz)} probes"
        )
        assert len(healthz) >= 2  # every one answered 200
        assert listed == sorted(listed) and len(set(listed)) == FLEET
        assert pages == 10

        async with http.get(url + "/v1/agents?limit=2&after=edge-00010") as response:
            page = await response.json()
        assert [a["agent_id"] for a in page["data"]] == ["edge-00011", "edge-00012"]
        assert page["has_more"] is True and page["last_id"] == "edge-00012"
        async with http.get(url + "/v1/agents?limit=5000") as response:
            assert response.status == 400  # above the page cap
            assert (await response.json())["error"]["param"] == "limit"
