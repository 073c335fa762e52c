"""The coordinator app in-process: real gRPC and HTTP over loopback, fresh app per test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.api.app_keys import GRPC_SERVER_KEY, REGISTRY_KEY, ROUTE_ROLES_KEY, TOKENS_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.errors import UnknownAgentError
from devtools.process import wait_until
from edgefleet.contract import (
    CONTRACT_MINOR,
    ConfigSection,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
)
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, TEST_ADMIN_TOKEN

pytestmark = pytest.mark.timeout(30)


@dataclass
class Running:
    app: web.Application
    http_url: str
    grpc_target: str
    stub: Any

    async def get(self, path: str) -> tuple[int, Any, str]:
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
            http.get(self.http_url + path) as response,
        ):
            return response.status, response.headers.get("Content-Type", ""), await response.text()

    async def get_json(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
            http.get(self.http_url + path) as response,
        ):
            return await response.json()


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Running]:
    config = CoordinatorConfig(
        grpc_port=0, http_port=0, report_interval_ms=200, hello_timeout_s=2,
        data_dir=str(tmp_path), admin_token=TEST_ADMIN_TOKEN,
    )  # fmt: skip
    app = create_app(config)

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("handler bug")

    app.router.add_get("/boom", boom)
    app[ROUTE_ROLES_KEY][("GET", "/boom")] = None  # public, like /healthz
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    async with grpc.aio.insecure_channel(app[GRPC_SERVER_KEY].address) as channel:
        yield Running(
            app=app,
            http_url=str(server.make_url("")).rstrip("/"),
            grpc_target=app[GRPC_SERVER_KEY].address,
            stub=pb_grpc.CoordinatorStub(channel),
        )
    await server.close()


def hello(agent_id: str = "edge-1", **fields: Any) -> pb.AgentMessage:
    defaults: dict[str, Any] = {
        "site": "lab",
        "http_url": "http://127.0.0.1:8001",
        "location": pb.Location(lat=48.1, lon=11.6),
        "models": [pb.LoadedModel(name="smollm2-135m", version="v1", task="chat")],
        "contract_minor": CONTRACT_MINOR,
    }
    return pb.AgentMessage(hello=pb.Hello(agent_id=agent_id, **(defaults | fields)))


def report(waiting: int, **fields: Any) -> pb.AgentMessage:
    return pb.AgentMessage(load_report=pb.LoadReport(waiting_sequences=waiting, **fields))


async def test_first_message_must_be_hello(coordinator: Running) -> None:
    call = coordinator.stub.Session()
    await call.write(report(1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first message of a Session must be Hello, got load_report" in info.value.details()
    assert coordinator.app[REGISTRY_KEY].agents() == []
    _, _, metrics = await coordinator.get("/metrics")
    assert 'edgefleet_coordinator_sessions_rejected_total{reason="no_hello"} 1.0' in metrics


async def test_a_session_closed_before_its_hello_is_refused(coordinator: Running) -> None:
    call = coordinator.stub.Session()
    await call.done_writing()  # the agent's side ends with nothing sent
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session closed before the agent sent Hello" in info.value.details()
    _, _, metrics = await coordinator.get("/metrics")
    assert 'edgefleet_coordinator_sessions_rejected_total{reason="no_hello"} 1.0' in metrics


async def test_invalid_hello_is_rejected_naming_the_field(coordinator: Running) -> None:
    call = coordinator.stub.Session()
    await call.write(hello(agent_id="bad id!"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Hello.agent_id 'bad id!' is invalid" in info.value.details()


async def test_session_welcome_reports_and_disconnect(coordinator: Running) -> None:
    call = coordinator.stub.Session()
    await call.write(hello())
    welcome = await call.read()
    assert welcome.WhichOneof("body") == "welcome"
    assert welcome.welcome.report_interval_ms == 200
    assert welcome.welcome.session_id
    desired = await call.read()
    assert desired.WhichOneof("body") == "desired_state"

    await call.write(report(5))

    async def has_report() -> bool:
        agent = await coordinator.get_json("/v1/agents/edge-1")
        return agent["load"] is not None and agent["load"]["waiting_sequences"] == 5

    await wait_until(has_report, message="load report stored")
    agent = await coordinator.get_json("/v1/agents/edge-1")
    assert agent["status"] == "connected"
    assert agent["session_id"] == welcome.welcome.session_id
    assert agent["models"] == [
        {"name": "smollm2-135m", "version": "v1", "task": "chat", "variant": ""}
    ]

    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    agent = await coordinator.get_json("/v1/agents/edge-1")
    assert agent["status"] == "disconnected"
    assert agent["load"]["waiting_sequences"] == 5  # the last report is kept


async def test_a_second_hello_breaks_the_protocol(coordinator: Running) -> None:
    call = coordinator.stub.Session()
    await call.write(hello())
    await call.read()
    await call.read()
    await call.write(hello())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Hello may only be sent once" in info.value.details()
    await wait_until(
        lambda: coordinator.app[REGISTRY_KEY].connected_count() == 0,
        timeout_s=30,  # the cancel reaches the server's stream handler; 10 s failed once in CI
        message="disconnect",
    )


async def test_an_enrolled_agents_new_session_replaces_its_old_one(coordinator: Running) -> None:
    token = (await coordinator.app[TOKENS_KEY].create()).token
    enrolled = await coordinator.stub.Enroll(
        pb.EnrollRequest(join_token=token, requested_name="edge-1")
    )
    old = coordinator.stub.Session()
    await old.write(hello(token=enrolled.credentials))
    await old.read()
    await old.read()
    new = coordinator.stub.Session()
    await new.write(hello(token=enrolled.credentials))
    new_welcome = await new.read()
    # The credential proves it is the same agent (reconnecting): the coordinator ends the
    # old stream cleanly; the agent stays connected.
    assert await asyncio.wait_for(old.read(), 5) is grpc.aio.EOF
    agent = await coordinator.get_json("/v1/agents/edge-1")
    assert agent["status"] == "connected"
    assert agent["session_id"] == new_welcome.welcome.session_id
    # The agent ends the session as a stopping agent does (see the next test: a cancelled
    # call took over 10 s to reach the in-process server's handler on loaded CI machines).
    await new.done_writing()
    await wait_until(
        lambda: coordinator.app[REGISTRY_KEY].connected_count() == 0,
        message="an ended session marks the agent disconnected",
    )


async def test_an_unenrolled_hello_never_replaces_a_live_session(coordinator: Running) -> None:
    old = coordinator.stub.Session()
    await old.write(hello())
    welcome = await old.read()
    await old.read()
    impostor = coordinator.stub.Session()
    await impostor.write(hello(http_url="http://127.0.0.1:9999"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await impostor.read()
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already has a live session" in info.value.details()
    agent = await coordinator.get_json("/v1/agents/edge-1")
    assert agent["session_id"] == welcome.welcome.session_id
    assert agent["http_url"] == "http://127.0.0.1:8001"
    # Once the real session ends, the id is free again. The agent ends it as an agent
    # that stops does: it closes its side of the stream (a cancelled call, RST_STREAM, took
    # over 10 s and then over 30 s to reach the in-process server's handler on loaded CI
    # machines; a SIGKILLed agent's dropped connection is tests/e2e's).
    await old.done_writing()
    await wait_until(
        lambda: coordinator.app[REGISTRY_KEY].connected_count() == 0,
        timeout_s=10,
        message="disconnect",
    )
    again = coordinator.stub.Session()
    await again.write(hello())
    assert (await again.read()).WhichOneof("body") == "welcome"
    again.cancel()


async def test_route_ranks_connected_agents_serving_the_model(coordinator: Running) -> None:
    calls = []
    for agent_id, queue in [("busy", 9), ("idle", 0)]:
        call = coordinator.stub.Session()
        await call.write(hello(agent_id=agent_id))
        await call.read()
        await call.write(report(queue))
        calls.append(call)
    await wait_until(
        lambda: all(r.last_report for r in coordinator.app[REGISTRY_KEY].agents()),
        message="both reports",
    )
    answer = await coordinator.stub.Route(pb.RouteRequest(model="smollm2-135m"))
    assert [a.agent_id for a in answer.agents] == ["idle", "busy"]
    assert answer.agents[0].http_url == "http://127.0.0.1:8001"
    assert answer.agents[0].score > answer.agents[1].score
    assert "queue" in answer.agents[0].score_parts
    none = await coordinator.stub.Route(pb.RouteRequest(model="smollm2-135m", version="v2"))
    assert list(none.agents) == [] and "no edge agent can take smollm2-135m@v2" in none.reason
    for call in calls:
        call.cancel()


async def test_enroll_with_a_malformed_token_is_unauthenticated(coordinator: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coordinator.stub.Enroll(pb.EnrollRequest(join_token="t"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "malformed" in info.value.details()


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nope", 404, "not_found"),
        ("POST", "/v1/agents", 405, "method_not_allowed"),
        ("GET", "/v1/agents/ghost", 404, "agent_not_found"),
        ("GET", "/boom", 500, "internal_error"),
    ],
)
async def test_http_errors_have_openai_bodies(
    coordinator: Running, method: str, path: str, status: int, code: str
) -> None:
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.request(method, coordinator.http_url + path) as response,
    ):
        body = await response.json()
    assert response.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert "handler bug" not in body["error"]["message"]  # no internals leak


async def test_health_and_metrics(coordinator: Running) -> None:
    status, _, _ = await coordinator.get("/healthz")
    assert status == 200
    health = await coordinator.get_json("/healthz")
    store = health.pop("store")
    # the one coordinator on its SQLite database: alone, and leading
    cluster = health.pop("coordinator")
    assert (cluster["members_alive"], cluster["is_leader"], cluster["lease_epoch"]) == (1, True, 1)
    assert cluster["leader"] == cluster["id"] != ""
    assert health == {
        "status": "ok",
        "grpc": coordinator.grpc_target,
        "connected_agents": 0,
        "tls": False,
        "enroll": coordinator.grpc_target,
    }
    # the fleet database's health: probed at start, answered from memory
    assert store["status"] == "ok" and store["backend"] == "sqlite"
    assert "database" not in store  # /healthz answers anyone: no host, role or file path
    assert store["latency_ms"] is not None and store["latency_ms"] < 1000
    assert (store["last_error"], store["pending_writes"], store["dropped_writes"]) == (None, 0, 0)
    status, content_type, text = await coordinator.get("/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    for name in (
        "edgefleet_coordinator_connected_agents",
        "edgefleet_coordinator_known_agents",
        "edgefleet_coordinator_sessions_total",
        "edgefleet_coordinator_load_reports_total",
        "edgefleet_coordinator_http_requests_total",
        'edgefleet_coordinator_store_up{backend="sqlite"} 1.0',
        'edgefleet_coordinator_store_pending_writes{queue="request records"} 0.0',
        "edgefleet_coordinator_store_latency_seconds",
        "edgefleet_coordinator_members 1.0",
        "edgefleet_coordinator_is_leader 1.0",
        "edgefleet_coordinator_lease_epoch 1.0",
    ):
        assert f"\n{name}" in text
    assert all(
        line.startswith(("#", "edgefleet_coordinator_")) for line in text.splitlines() if line
    )


@pytest.mark.parametrize("minor", [CONTRACT_MINOR + 2, CONTRACT_MINOR + 5])
async def test_an_agent_two_minor_versions_ahead_is_refused_with_a_clear_message(
    coordinator: Running, minor: int
) -> None:
    call = coordinator.stub.Session()
    await call.write(hello(contract_minor=minor))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"the agent speaks contract v1.{minor}" in info.value.details()
    assert f"accepts v1.{CONTRACT_MINOR - 1} to v1.{CONTRACT_MINOR + 1}" in info.value.details()
    assert "upgrade the coordinator" in info.value.details()
    _, _, metrics = await coordinator.get("/metrics")
    assert 'edgefleet_coordinator_sessions_rejected_total{reason="contract_version"} 1.0' in metrics


@pytest.mark.parametrize("minor", [CONTRACT_MINOR - 1, CONTRACT_MINOR + 1])
async def test_agents_one_minor_version_apart_are_accepted(
    coordinator: Running, minor: int
) -> None:
    call = coordinator.stub.Session()
    await call.write(hello(contract_minor=minor))
    welcome = await call.read()
    assert welcome.welcome.contract_minor == CONTRACT_MINOR
    agent = await coordinator.get_json("/v1/agents/edge-1")
    assert agent["contract_minor"] == minor
    call.cancel()


async def test_an_agent_from_before_contract_versions_is_refused_naming_the_versions(
    coordinator: Running,
) -> None:
    # Minor 0: an agent from before contract versions sends no contract_minor at all.
    call = coordinator.stub.Session()
    await call.write(pb.AgentMessage(hello=pb.Hello(agent_id="old", site="lab")))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = info.value.details()
    assert "the agent speaks contract v1.0" in details
    assert f"this coordinator speaks v1.{CONTRACT_MINOR}" in details
    assert f"accepts v1.{CONTRACT_MINOR - 1} to v1.{CONTRACT_MINOR + 1}" in details
    assert "upgrade the agent" in details
    assert (await coordinator.get("/v1/agents/old"))[0] == 404
    _, _, metrics = await coordinator.get("/metrics")
    assert 'edgefleet_coordinator_sessions_rejected_total{reason="contract_version"} 1.0' in metrics


async def test_0n_0e_from_an_accepted_agent_is_a_real_place(coordinator: Running) -> None:
    # Only minor-0 agents sent 0, 0 for "no place"; they are refused now, so from any
    # agent the coordinator accepts (the oldest one included) 0, 0 is the Gulf of Guinea.
    calls = []
    for agent_id, minor in (("oldest", CONTRACT_MINOR - 1), ("current", CONTRACT_MINOR)):
        call = coordinator.stub.Session()
        await call.write(
            hello(agent_id, contract_minor=minor, location=pb.Location(lat=0.0, lon=0.0))
        )
        await call.read()
        calls.append(call)
        found = await coordinator.get_json(f"/v1/agents/{agent_id}")
        assert found["location"] == {"lat": 0.0, "lon": 0.0}
    for call in calls:
        call.cancel()


async def test_a_section_set_for_an_agent_is_pushed_whole_and_its_ack_recorded(
    coordinator: Running,
) -> None:
    servicer = coordinator.app[GRPC_SERVER_KEY].servicer
    call = coordinator.stub.Session()
    await call.write(hello())
    await call.read()
    first = (await call.read()).desired_state
    assert (first.version, first.HasField("overflow_targets")) == (0, False)

    peer = OverflowTarget("peer-1", OverflowKind.PEER, "http://10.0.0.8:8000", ("m",))
    servicer.set_section("edge-1", ConfigSection(0, {"engine.max_batch_size": "8"}))
    servicer.set_section("edge-1", OverflowTargetsSection(0, (peer,)))
    servicer.set_section("edge-1", ConfigSection(0, {"engine.max_batch_size": "4"}))
    pushed = [(await call.read()).desired_state for _ in range(3)]
    # One counter in the store for every section (it started above the clock-based
    # generations agents held before it): each push takes the next.
    g = pushed[0].config.generation
    assert g > 1_700_000_000_000
    assert [p.version for p in pushed] == [1, 2, 3]
    # Each push carries only the section that changed, whole, with its own generation.
    assert [p.WhichOneof("_config") for p in pushed] == ["config", None, "config"]
    assert dict(pushed[2].config.values) == {"engine.max_batch_size": "4"}
    assert pushed[2].config.generation == g + 2
    assert pushed[1].overflow_targets.generation == g + 1
    assert pushed[1].overflow_targets.targets[0].kind == pb.OVERFLOW_KIND_PEER

    applied = pb.SectionGenerations(config=g + 2, overflow_targets=g + 1)
    await call.write(report(0, applied=applied))

    async def acked() -> bool:
        view = await coordinator.get_json("/v1/agents/edge-1")
        return bool(view["load"])

    await wait_until(acked, message="acknowledging report")
    view = (await coordinator.get_json("/v1/agents/edge-1"))["desired_state"]
    assert view["version"] == 3
    generations = {"models": 0, "overflow_targets": g + 1, "keys": 0, "config": g + 2}
    assert view["generations"] == generations
    assert view["applied"] == generations

    # A reconnecting agent gets every section set for it in its first DesiredState.
    call.cancel()
    again = coordinator.stub.Session()
    await again.write(hello())
    await again.read()
    full = (await again.read()).desired_state
    assert full.version == 3
    assert (full.config.generation, full.overflow_targets.generation) == (g + 2, g + 1)
    assert not full.HasField("models")
    again.cancel()
    with pytest.raises(UnknownAgentError):
        servicer.set_section("ghost", ConfigSection(0))
