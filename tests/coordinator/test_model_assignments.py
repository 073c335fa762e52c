"""Desired model versions reach agents: selector rules and explicit assignments, pushed as
signed ModelTargets on the live Session (and to agents that join later), with the site
peers that hold a version; inventory in reports drives version-aware routing and the
fleet view; rules survive a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from coordinator_testing import ADMIN_HEADERS, MakeCoordinator, hello
from model_testing import make_artifact

from coordinator.app_keys import MODEL_ASSIGNMENTS_KEY, MODEL_CATALOG_KEY, REPORT_HOOKS_KEY
from coordinator.errors import UnknownModelVersionError
from coordinator.model_assignments import Selector
from devtools.process import wait_until
from edgefleet import contract_pb
from edgefleet.contract import (
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    ModelsSection,
    ModelStats,
)
from edgefleet.model_signing import verify_manifest
from edgefleet.v1 import fleet_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class RawAgent:
    """An agent's Session over the real gRPC stub: sends Hello and reports, keeps what
    the coordinator pushes (Welcome, the models section)."""

    def __init__(self, stub: Any, agent_id: str, **fields: Any) -> None:
        self.agent_id = agent_id
        self._outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
        self._outbox.put_nowait(hello(agent_id, **fields))
        self.welcome: pb.Welcome | None = None
        self.models: ModelsSection | None = None
        self.pushes = 0
        self._call = stub.Session(self._messages())
        self._reader = asyncio.create_task(self._read())

    async def _messages(self) -> AsyncIterator[pb.AgentMessage]:
        while (message := await self._outbox.get()) is not None:
            yield message

    async def _read(self) -> None:
        async for message in self._call:
            kind = message.WhichOneof("body")
            if kind == "welcome":
                self.welcome = message.welcome
            elif kind == "desired_state":
                state = contract_pb.desired_state_from_pb(message.desired_state)
                if state.models is not None:
                    self.models = state.models
                    self.pushes += 1

    def report(self, *inventory: ModelInventory, stats: tuple[ModelStats, ...] = ()) -> None:
        report = LoadReport(inventory=inventory, model_stats=stats)
        self._outbox.put_nowait(pb.AgentMessage(load_report=contract_pb.load_report_to_pb(report)))

    def versions(self) -> dict[str, str]:
        return {} if self.models is None else {t.name: t.version for t in self.models.models}

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def inventory(name: str, version: str, state: ModelInventoryState) -> ModelInventory:
    return ModelInventory(name=name, version=version, state=state)


async def test_rules_and_assignments_are_pushed_signed_with_peers(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    catalog, assignments = c.app[MODEL_CATALOG_KEY], c.app[MODEL_ASSIGNMENTS_KEY]
    make_artifact(tmp_path / "v1", weights=b"one" * 50)
    make_artifact(tmp_path / "v2", weights=b"two" * 50)
    v1 = catalog.publish_directory(tmp_path / "v1").version
    v2 = catalog.publish_directory(tmp_path / "v2").version
    name = v1.name
    stats_seen: list[tuple[str, LoadReport]] = []
    c.app[REPORT_HOOKS_KEY].add(lambda agent_id, r: stats_seen.append((agent_id, r)))

    a = RawAgent(c.stub, "edge-a", site="north", http_url="http://127.0.0.1:9001", models=[])
    b = RawAgent(c.stub, "edge-b", site="north", http_url="http://127.0.0.1:9002", models=[])
    s = RawAgent(c.stub, "edge-s", site="south", http_url="http://127.0.0.1:9003", models=[])
    agents = [a, b, s]
    try:
        await wait_until(lambda: all(x.welcome is not None for x in agents), message="welcome")
        assert all(x.welcome.model_signing_key == catalog.public_key for x in agents)
        with pytest.raises(UnknownModelVersionError):
            assignments.set_rule(Selector(), name, "int4-000000000000")

        # The whole fleet runs v1: each target carries the signed manifest.
        pushed = assignments.set_rule(Selector(), name, v1.version)
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
        assert b.models.models[0].peer_urls == ("http://127.0.0.1:9001/v1/blobs",)
        assert s.models is not None and s.models.models[0].peer_urls == ()
        await wait_until(lambda: any(agent == "edge-a" for agent, _ in stats_seen))

        # A site rule overrides the fleet rule there; an explicit assignment beats both.
        assignments.set_rule(Selector(sites=("south",)), name, v2.version)
        await wait_until(lambda: s.versions() == {name: v2.version})
        assert a.versions() == {name: v1.version}
        assignments.assign(["edge-b"], name, v2.version, rollout_id="r-1")
        await wait_until(lambda: b.versions() == {name: v2.version})
        assert b.models is not None and b.models.models[0].rollout_id == "r-1"
        assert assignments.agents_desiring(name, v2.version) == {"edge-b", "edge-s"}
        assert assignments.agents_desiring(name, v1.version) == {"edge-a"}
        assignments.clear(["edge-b"], name)
        await wait_until(lambda: b.versions() == {name: v1.version})

        # Unchanged desires push nothing new.
        before = a.pushes
        assert assignments.refresh() == []
        await asyncio.sleep(0.1)
        assert a.pushes == before

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
    v1 = c.app[MODEL_CATALOG_KEY].publish_directory(tmp_path / "v1").version
    assignments = c.app[MODEL_ASSIGNMENTS_KEY]
    assignments.set_rule(Selector(sites=("north",)), v1.name, v1.version)
    assignments.assign(["edge-9"], v1.name, v1.version, rollout_id="r-7")
    again = await make_coordinator(data_dir=str(data))
    reloaded = again.app[MODEL_ASSIGNMENTS_KEY]
    assert [(r.name, r.selector, r.version) for r in reloaded.rules()] == [
        (v1.name, Selector(sites=("north",)), v1.version)
    ]
    assert reloaded.desired_for("edge-9")[v1.name].rollout_id == "r-7"
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.get(f"{again.http_url}/v1/admin/models") as response,
    ):
        listing = await response.json()
    assert listing["data"][0]["ref"] == v1.ref and listing["rules"][0]["selector"]["sites"] == [
        "north"
    ]
