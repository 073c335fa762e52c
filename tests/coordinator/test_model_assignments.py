"""Desired model versions reach agents: selector rules and explicit assignments, pushed as
signed ModelTargets on the live Session (and to agents that join later), with the site
peers that hold a version; inventory in reports drives version-aware routing and the
fleet view; rules survive a restart."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from coordinator.api.app_keys import (
    MODEL_ASSIGNMENTS_KEY,
    MODEL_CATALOG_KEY,
    REPORT_HOOKS_KEY,
    STORE_KEY,
)
from coordinator.catalog.assignments import Selector
from coordinator.errors import UnknownModelVersionError
from coordinator.fleet.report_hooks import ReportHooks
from devtools.process import wait_until
from edgefleet.contract import (
    LoadReport,
    ModelInventoryState,
)
from edgefleet.model_signing import verify_manifest
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, MakeCoordinator
from tests.coordinator.model_testing import RawAgent, inventory, make_artifact
from tests.coordinator.store_backends import on_both_stores

# make_artifact copies tiny-llama's build manifest: built (or found) first
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("tiny_artifacts")]
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores


async def test_rules_and_assignments_are_pushed_signed_with_peers(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    catalog, assignments = c.app[MODEL_CATALOG_KEY], c.app[MODEL_ASSIGNMENTS_KEY]
    make_artifact(tmp_path / "v1", weights=b"one" * 50)
    make_artifact(tmp_path / "v2", weights=b"two" * 50)
    v1 = (await catalog.publish_directory(tmp_path / "v1")).version
    v2 = (await catalog.publish_directory(tmp_path / "v2")).version
    name = v1.name
    stats_seen: list[tuple[str, LoadReport]] = []
    c.app[REPORT_HOOKS_KEY].add(lambda agent_id, r: stats_seen.append((agent_id, r)))

    a = RawAgent(c.stub, "edge-a", site="north", http_url="http://127.0.0.1:9001", models=[])
    b = RawAgent(c.stub, "edge-b", site="north", http_url="http://127.0.0.1:9002", models=[])
    s = RawAgent(c.stub, "edge-s", site="south", http_url="http://127.0.0.1:9003", models=[])
    agents = [a, b, s]
    try:
        await wait_until(lambda: all(x.welcome is not None for x in agents), message="welcome")
        assert all(x.welcome and x.welcome.model_signing_key == catalog.public_key for x in agents)
        with pytest.raises(UnknownModelVersionError):
            await assignments.set_rule(Selector(), name, "int4-000000000000")

        # The whole fleet runs v1: each target carries the signed manifest.
        pushed = await assignments.set_rule(Selector(), name, v1.version)
        assert pushed == ["edge-a", "edge-b", "edge-s"]
        await wait_until(lambda: all(x.versions() == {name: v1.version} for x in agents))
        target = a.models.models[0] if a.models else None
        assert target is not None and target.sha256 == v1.sha256
        verify_manifest(catalog.public_key, target.manifest, target.signature)
        assert target.artifact_url == c.http_url + "/v1/blobs"
        assert target.peer_urls == () and target.rollout_id == ""

        # edge-a holds v1: edge-b (same site) is told to ask it first; edge-s is not.
        a.report(inventory(name, v1.version, ModelInventoryState.LOADED))
        await wait_until(lambda: b.models is not None and b.models.models[0].peer_urls != ())
        assert b.models is not None and b.models.models[0].peer_urls == (
            "http://127.0.0.1:9001/v1/blobs",
        )
        assert s.models is not None and s.models.models[0].peer_urls == ()
        await wait_until(lambda: any(agent == "edge-a" for agent, _ in stats_seen))

        # A site rule overrides the fleet rule there; an explicit assignment beats both.
        await assignments.set_rule(Selector(sites=("south",)), name, v2.version)
        await wait_until(lambda: s.versions() == {name: v2.version})
        assert a.versions() == {name: v1.version}
        await assignments.assign(["edge-b"], name, v2.version, rollout_id="r-1")
        await wait_until(lambda: b.versions() == {name: v2.version})
        assert b.models is not None and b.models.models[0].rollout_id == "r-1"
        assert assignments.agents_desiring(name, v2.version) == {"edge-b", "edge-s"}
        assert assignments.agents_desiring(name, v1.version) == {"edge-a"}
        await assignments.clear(["edge-b"], name)
        await wait_until(lambda: b.versions() == {name: v1.version})

        # Unchanged desires push nothing new.
        before = a.pushes
        assert assignments.refresh() == []
        await asyncio.sleep(0.1)
        assert a.pushes == before

        # Generations come from the store's counter, above the clock-based ones of old.
        assert b.models is not None and b.models.generation > 1_700_000_000_000

        # An agent that joins later gets the current desired state with its Welcome.
        late = RawAgent(c.stub, "edge-late", site="south", models=[])
        agents.append(late)
        await wait_until(lambda: late.versions() == {name: v2.version}, message="late joiner")
    finally:
        for x in agents:
            await x.close()


async def test_routing_follows_loaded_versions_from_inventory(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    one = RawAgent(c.stub, "edge-1", http_url="http://127.0.0.1:9101", models=[])
    two = RawAgent(c.stub, "edge-2", http_url="http://127.0.0.1:9102",
                   models=[pb.LoadedModel(name="chat", version="v1")])  # fmt: skip
    try:
        await wait_until(lambda: one.welcome is not None and two.welcome is not None)

        async def routed(query: str) -> list[str]:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{c.http_url}/v1/route?{query}") as response,
            ):
                assert response.status == 200, await response.text()
                return sorted(a["agent_id"] for a in (await response.json())["agents"])

        # edge-2 has no inventory: its Hello says what it serves.
        assert await routed("model=chat") == ["edge-2"]
        # edge-1 reports v1 loaded and v2 downloading: only v1 routes to it.
        one.report(
            inventory("chat", "v1", ModelInventoryState.LOADED),
            inventory("chat", "v2", ModelInventoryState.DOWNLOADING),
        )
        for _ in range(100):
            if await routed("model=chat") == ["edge-1", "edge-2"]:
                break
            await asyncio.sleep(0.05)
        assert await routed("model=chat@v1") == ["edge-1", "edge-2"]
        assert await routed("model=chat&version=v1") == ["edge-1", "edge-2"]
        assert await routed("model=chat@v2") == []
        # Hot swap done: v2 loaded, v1 gone.
        one.report(inventory("chat", "v2", ModelInventoryState.LOADED))
        for _ in range(100):
            if await routed("model=chat@v2") == ["edge-1"]:
                break
            await asyncio.sleep(0.05)
        assert await routed("model=chat@v2") == ["edge-1"]
        assert await routed("model=chat@v1") == ["edge-2"]
        grpc_answer = await c.stub.Route(pb.RouteRequest(model="chat@v2"))
        assert [a.agent_id for a in grpc_answer.agents] == ["edge-1"]
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{c.http_url}/v1/route?model=chat@") as bad,
        ):
            assert bad.status == 400 and (await bad.json())["error"]["param"] == "model"
        # The fleet view shows the inventory.
        view = await c.get_json("/v1/agents/edge-1")
        assert view["load"]["inventory"][0]["state"] == "loaded"
        assert view["load"]["inventory"][0]["version"] == "v2"
    finally:
        await one.close()
        await two.close()


async def test_rules_and_assignments_survive_a_restart(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    data = tmp_path / "shared-data"
    c = await make_coordinator(data_dir=str(data))
    make_artifact(tmp_path / "v1", weights=b"one" * 50)
    v1 = (await c.app[MODEL_CATALOG_KEY].publish_directory(tmp_path / "v1")).version
    assignments = c.app[MODEL_ASSIGNMENTS_KEY]
    await assignments.set_rule(Selector(sites=("north",)), v1.name, v1.version)
    await assignments.assign(["edge-9"], v1.name, v1.version, rollout_id="r-7")
    again = await make_coordinator(data_dir=str(data))
    reloaded = again.app[MODEL_ASSIGNMENTS_KEY]
    assert [(r.name, r.selector, r.version) for r in reloaded.rules()] == [
        (v1.name, Selector(sites=("north",)), v1.version)
    ]
    assert reloaded.desired_for("edge-9")[v1.name].rollout_id == "r-7"
    # The rule blocks a delete even with no agent matching it (a later joiner would).
    users = reloaded.in_use_by(v1.name, v1.version)
    assert "edge-9" in users and any(u.startswith("rule ") and "north" in u for u in users)
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.get(f"{again.http_url}/v1/admin/models") as response,
    ):
        listing = await response.json()
    assert listing["data"][0]["ref"] == v1.ref and listing["rules"][0]["selector"]["sites"] == [
        "north"
    ]


async def test_blobs_are_served_with_ranges_to_viewers_and_enrolled_agents_only(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator(require_enrollment="on")
    catalog = c.app[MODEL_CATALOG_KEY]
    weights = bytes(range(256)) * 40
    make_artifact(tmp_path / "v1", weights=weights)
    v1 = (await catalog.publish_directory(tmp_path / "v1")).version
    sha = next(f["sha256"] for f in v1.files() if f["path"] == "model.onnx")
    url = f"{c.http_url}/v1/blobs/sha256/{sha}"
    reply = await c.stub.Enroll(
        pb.EnrollRequest(join_token=await c.new_token(), requested_name="e1")
    )
    assert reply.model_signing_key == catalog.public_key
    agent = {"Authorization": f"Bearer {reply.credentials}", "Edgefleet-Agent": reply.agent_id}

    async def get(headers: dict[str, str], method: str = "GET") -> tuple[int, bytes, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, url, headers=headers) as response,
        ):
            return response.status, await response.read(), response.headers

    status, body, headers = await get(agent)
    assert status == 200 and body == weights and headers["ETag"] == f'"{sha}"'
    assert (await get(ADMIN_HEADERS))[1] == weights
    status, body, headers = await get(agent | {"Range": "bytes=1000-1999"})
    assert status == 206 and body == weights[1000:2000]
    assert headers["Content-Range"] == f"bytes 1000-1999/{len(weights)}"
    status, body, _ = await get(agent | {"Range": "bytes=10000-"})
    assert status == 206 and body == weights[10000:]
    status, body, _ = await get(agent | {"Range": "bytes=-5"})
    assert status == 206 and body == weights[-5:]
    status, body, headers = await get(agent | {"Range": f"bytes={len(weights)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(weights)}"
    error = json.loads(body)["error"]  # the admin API's error format
    assert (error["type"], error["code"]) == ("invalid_request_error", "range_not_satisfiable")
    status, body, _ = await get(agent | {"Range": "bytes=0-9,20-29"})
    assert status == 200 and body == weights  # not one byte range: ignored, all of it
    status, body, _ = await get(agent | {"Range": "bytes=0-9", "If-Range": '"other"'})
    assert status == 200 and body == weights  # the resumed file changed: all of it
    assert (await get(agent | {"If-None-Match": f'"{sha}"'}))[0] == 304
    status, body, headers = await get(agent, "HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(weights))
    missing = f"{c.http_url}/v1/blobs/sha256/{'0' * 64}"
    async with aiohttp.ClientSession() as http, http.get(missing, headers=agent) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "blob_not_found"

    # Refused: nothing, another agent's id, a wrong credential, a revoked agent.
    for refused in (
        {},
        {"Edgefleet-Agent": reply.agent_id},
        agent | {"Edgefleet-Agent": "someone-else"},
        agent | {"Authorization": "Bearer wrong"},
    ):
        assert (await get(refused))[0] == 401, refused
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.get(f"{c.http_url}/metrics") as response,
    ):
        exposition = await response.text()
    metric = 'edgefleet_coordinator_blob_bytes_sent_total{reader="agent"}'
    sent = next(line for line in exposition.splitlines() if line.startswith(metric))
    # The whole file three times (the first GET, the ignored multi-range, the stale
    # If-Range), plus the ranges read.
    assert float(sent.split()[-1]) == 3 * len(weights) + 1000 + (len(weights) - 10000) + 5
    await c.app[STORE_KEY].revoke_agent(reply.agent_id, datetime.now(UTC))
    assert (await get(agent))[0] == 401


def test_a_failing_report_hook_does_not_stop_the_others() -> None:
    hooks = ReportHooks()
    seen: list[str] = []

    def broken(agent_id: str, report: LoadReport) -> None:
        raise RuntimeError("collector bug")

    hooks.add(broken)
    hooks.add(lambda agent_id, report: seen.append(agent_id))
    hooks("edge-1", LoadReport())
    hooks("edge-2", LoadReport())
    assert seen == ["edge-1", "edge-2"] and len(hooks) == 2


async def test_a_rules_residency_reaches_the_agents_is_kept_and_checked(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    """Issue 26: ``deploy`` names how agents hold the weights (on_demand, pinned,
    store_only); the pushed target carries it, a later rule for the same selector without
    one (a rollout completing) keeps it, explicit assignments inherit it, it survives a
    restart, and a bad value is refused in the API's error format."""
    data = tmp_path / "data"
    c = await make_coordinator(data_dir=str(data))
    make_artifact(tmp_path / "v1", weights=b"one" * 50)
    make_artifact(tmp_path / "v2", weights=b"two" * 50)
    v1 = (await c.app[MODEL_CATALOG_KEY].publish_directory(tmp_path / "v1")).version
    v2 = (await c.app[MODEL_CATALOG_KEY].publish_directory(tmp_path / "v2")).version
    name = v1.name
    agent = RawAgent(c.stub, "edge-r", site="north", http_url="http://127.0.0.1:9201", models=[])

    async def deploy(version: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
            http.post(f"{c.http_url}/v1/admin/models/{name}/{version}/deploy",
                      json=body) as response,
        ):  # fmt: skip
            return response.status, await response.json()

    def residency_seen() -> str | None:
        return str(agent.models.models[0].residency) if agent.models else None

    try:
        await wait_until(lambda: agent.welcome is not None)
        for bad in ("forever", 3, ["pinned"], None):
            status, body = await deploy(v1.version, {"sites": ["north"], "residency": bad})
            if bad is None:  # null: as before (on demand for a first rule)
                assert status == 200 and body["residency"] == "on_demand"
                continue
            assert status == 400 and body["error"]["param"] == "residency", body
        status, body = await deploy(v1.version, {"sites": ["north"], "residency": "pinned"})
        assert status == 200 and body["residency"] == "pinned"
        await wait_until(lambda: residency_seen() == "pinned", message="pinned pushed")
        # a rollout's new rule for the same selector names no residency: it stays pinned
        assignments = c.app[MODEL_ASSIGNMENTS_KEY]
        await assignments.set_rule(Selector(sites=("north",)), name, v2.version, "ro-1")
        await wait_until(lambda: agent.versions() == {name: v2.version})
        assert residency_seen() == "pinned"
        await assignments.assign(["edge-r"], name, v1.version, "ro-2")  # a canary step
        await wait_until(lambda: agent.versions() == {name: v1.version})
        assert residency_seen() == "pinned"
        status, body = await deploy(v2.version, {"sites": ["north"], "residency": "store_only"})
        assert status == 200
        await assignments.clear(["edge-r"], name)
        await wait_until(lambda: residency_seen() == "store_only", message="store_only pushed")
    finally:
        await agent.close()
    again = await make_coordinator(data_dir=str(data))
    [rule] = again.app[MODEL_ASSIGNMENTS_KEY].rules(name)
    assert (rule.version, str(rule.residency)) == (v2.version, "store_only")
    listing = await again.get_json("/v1/admin/models")
    assert listing["rules"][0]["residency"] == "store_only"
