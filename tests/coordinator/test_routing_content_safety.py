"""A key whose policy blocks a moderation category is routed only to agents that enforce
content safety (they name their moderation heads in LoadReport.moderation_heads): an agent
from before the field, or one without the embedding model or its heads, would answer that
key's requests 503 moderation_unavailable. The route lookup learns the key from the
``Authorization: Bearer ef-...`` the client sends to agents anyway; a key that says nothing
(the defaults fail open), a key the coordinator does not know and a lookup without a key
are routed as before."""

from __future__ import annotations

from typing import Any

import aiohttp

from coordinator.api.app_keys import REGISTRY_KEY
from devtools.process import wait_until
from edgefleet.key_policy import blocks_a_category, key_policy_from_json
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, Coordinator, MakeCoordinator, hello

HEADS = "moderation/all-minilm-l6-v2@fp32-ddf7336dbb12"
BLOCKS = {"moderation": {"input": {"illicit": "block"}}}


async def _agent(c: Coordinator, agent_id: str, heads: str) -> Any:
    call = c.stub.Session()
    await call.write(hello(agent_id))
    await call.read()
    await call.write(pb.AgentMessage(load_report=pb.LoadReport(moderation_heads=heads)))
    return call


async def _mint(c: Coordinator, **fields: Any) -> str:
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.post(c.http_url + "/v1/admin/keys", json={"name": "k", **fields}) as response,
    ):
        assert response.status == 201, await response.text()
        return str((await response.json())["secret"])


async def _route(c: Coordinator, key: str = "", **headers: str) -> tuple[int, Any]:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(c.http_url + "/v1/route", params={"model": "m", "site": "lab"}) as response,
    ):
        return response.status, await response.json()


async def _grpc_ids(c: Coordinator, key: str = "") -> list[str]:
    """The same lookup over gRPC, the key as ``authorization`` metadata."""
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    answer = await c.stub.Route(pb.RouteRequest(model="m", site="lab"), metadata=metadata)
    return sorted(a.agent_id for a in answer.agents)


def _ids(body: Any) -> list[str]:
    return sorted(a["agent_id"] for a in body["agents"])


async def test_a_blocking_key_is_routed_only_to_agents_that_enforce_it(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator(report_interval_ms=2000)
    safe = await _agent(c, "safe", HEADS)
    old = await _agent(c, "old", "")  # an older agent, or one without heads
    await wait_until(
        lambda: (
            all(r.last_report for r in c.app[REGISTRY_KEY].agents())
            and len(c.app[REGISTRY_KEY].agents()) == 2
        ),
        message="two agents reporting",
    )
    blocking = await _mint(c, policy=BLOCKS)
    flagging = await _mint(c, policy={"moderation": {"input": {"illicit": "flag"}}})
    plain = await _mint(c)

    status, body = await _route(c, blocking)
    assert status == 200 and _ids(body) == ["safe"]
    assert body["excluded"] == {"no_content_safety": 1}
    assert "cannot enforce this API key's moderation policy" in body["reason"]
    for key in (flagging, plain, ""):  # the defaults and flag-only policies fail open
        status, body = await _route(c, key)
        assert status == 200 and _ids(body) == ["old", "safe"]
    # gRPC Route reads the key from its metadata the same way
    assert await _grpc_ids(c, blocking) == ["safe"]
    for key in (flagging, plain, ""):
        assert await _grpc_ids(c, key) == ["old", "safe"]
    # an admin token is not an API key: not read, routed as without a key
    status, body = await _route(c, **ADMIN_HEADERS)
    assert status == 200 and _ids(body) == ["old", "safe"]
    # a key this coordinator does not know (revoked, or an agent's own): as without a key
    status, body = await _route(c, "ef-000000000000-unknown")
    assert status == 200 and _ids(body) == ["old", "safe"]

    # the safe agent swaps in an embedding model without heads: no route for that key
    await safe.write(pb.AgentMessage(load_report=pb.LoadReport(moderation_heads="")))
    await wait_until(
        lambda: not c.app[REGISTRY_KEY].get("safe").last_report.moderation_heads,
        message="the safe agent's new report",
    )
    status, body = await _route(c, blocking)
    assert status == 200 and body["agents"] == []
    assert body["excluded"] == {"no_content_safety": 2}
    for call in (safe, old):
        call.cancel()


def test_which_policies_need_an_agent_that_enforces() -> None:
    assert blocks_a_category(key_policy_from_json(BLOCKS))
    assert blocks_a_category(key_policy_from_json({"moderation": {"output": {"hate": "block"}}}))
    assert not blocks_a_category(key_policy_from_json({}))  # defaults: sexual/minors, open
    assert not blocks_a_category(
        key_policy_from_json({"moderation": {"input": {"hate": "flag", "violence": "off"}}})
    )
