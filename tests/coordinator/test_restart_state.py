"""A restarted coordinator keeps routing to the agents it knew, as unconfirmed.

In-process: what the registry saves and restores, the grace period, the ranking.
Real processes: register agents over gRPC, SIGKILL or SIGTERM the coordinator,
restart it on the same data directory and look routes up at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from coordinator.fleet.records import Liveness
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.routing.scorer import RouteQuery, RouteScorer
from coordinator.store.last_state import AgentLastState
from coordinator.store.sqlite import SQLiteFleetStore
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from edgefleet.contract import Hello, LoadedModel, LoadReport
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.coordinator.coordinator_testing import hello

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def agent_hello(agent_id: str) -> Hello:
    return Hello(
        agent_id=agent_id,
        site="lab",
        http_url=f"http://{agent_id}:8000",
        models=(LoadedModel("m", "v1"),),
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@contextlib.asynccontextmanager
async def registry_at(
    data_dir: Path, clock: Clock, **kwargs: Any
) -> AsyncIterator[LiveFleetRegistry]:
    """A registry on the store in ``data_dir``; its queued writes are written at the end
    (as the app does at shutdown)."""
    store = SQLiteFleetStore.in_directory(data_dir)
    await store.open()
    try:
        registry = await LiveFleetRegistry.open(
            store, report_interval_ms=1000, clock=clock, **kwargs
        )
        yield registry
        await registry.flush()
    finally:
        await store.close()


async def test_agents_alive_before_a_restart_come_back_unconfirmed_with_their_last_load(
    data_dir: Path,
) -> None:
    clock = Clock()
    async with registry_at(data_dir, clock) as before:
        for agent_id in ("live-1", "suspect-1", "bye-1", "late-1"):
            before.open_session(agent_hello(agent_id))
        sessions = {r.agent_id: r.session_id for r in before.agents()}
        before.record_report("live-1", sessions["live-1"], LoadReport(waiting_sequences=3))
        before.record_bye("bye-1", sessions["bye-1"], "shutting down")
        clock.now += timedelta(seconds=2.5)
        before.record_report("live-1", sessions["live-1"], LoadReport(waiting_sequences=4))
        before.sweep()  # suspect-1 and late-1 missed two reports
        assert before.get("suspect-1").liveness is Liveness.SUSPECT
        assert await before.save_last_states() == 4
        # An agent connecting after the last snapshot is on record too (saved at Hello).
        before.open_session(agent_hello("after-save"))

    clock.now += timedelta(seconds=1)
    async with registry_at(data_dir, clock, restart_grace_s=30) as after:
        liveness = {r.agent_id: r.liveness for r in after.agents()}
        assert liveness == {
            "after-save": Liveness.UNCONFIRMED,
            "bye-1": Liveness.DOWN,
            "late-1": Liveness.UNCONFIRMED,
            "live-1": Liveness.UNCONFIRMED,
            "suspect-1": Liveness.UNCONFIRMED,
        }
        restored = after.get("live-1")
        assert restored.last_report is not None and restored.last_report.waiting_sequences == 4
        assert restored.last_seen == T0 + timedelta(seconds=2.5)


async def test_unconfirmed_agents_go_down_when_the_grace_period_ends_without_a_session(
    data_dir: Path,
) -> None:
    clock = Clock()
    async with registry_at(data_dir, clock) as before:
        before.open_session(agent_hello("a"))
        before.open_session(agent_hello("b"))
    clock.now += timedelta(minutes=5)  # the coordinator was away a while
    async with registry_at(data_dir, clock, restart_grace_s=30) as after:
        # Silent for minutes, yet not suspect or down while the grace period runs.
        clock.now += timedelta(seconds=29)
        assert after.sweep() == []
        assert after.get("a").liveness is Liveness.UNCONFIRMED
        after.open_session(agent_hello("a"))
        clock.now += timedelta(seconds=1)
        changed = after.sweep()
        assert [(r.agent_id, r.liveness) for r in changed] == [("b", Liveness.DOWN)]
        assert after.get("a").liveness is Liveness.LIVE
        # And that is what a further restart starts from.
        assert await after.save_last_states() == 2
    async with registry_at(data_dir, clock) as again:
        assert again.get("a").liveness is Liveness.UNCONFIRMED
        assert again.get("b").liveness is Liveness.DOWN


async def test_saving_writes_only_what_changed_in_batches(data_dir: Path) -> None:
    clock = Clock()
    batches: list[int] = []
    async with registry_at(data_dir, clock) as registry:
        store = registry._store
        save = store.save_last_states

        async def counted(
            states: Sequence[AgentLastState], saved_at: datetime, *, owner: str = ""
        ) -> list[str]:
            batches.append(len(states))
            return await save(states, saved_at, owner=owner)

        store.save_last_states = counted  # type: ignore[method-assign]
        for i in range(7):
            registry.open_session(agent_hello(f"a{i}"))
        assert await registry.save_last_states(batch_size=3) == 7
        assert batches == [3, 3, 1]
        assert await registry.save_last_states(batch_size=3) == 0
        session = registry.get("a5").session_id
        clock.now += timedelta(seconds=1)
        registry.record_report("a5", session, LoadReport(waiting_sequences=9))
        assert await registry.save_last_states(batch_size=3) == 1
        assert batches == [3, 3, 1, 1]


async def test_unconfirmed_agents_are_routed_after_live_ones(data_dir: Path) -> None:
    clock = Clock()
    async with registry_at(data_dir, clock) as before:
        before.open_session(agent_hello("known"))
    async with registry_at(data_dir, clock) as after:
        decision = RouteScorer().rank(after.agents(), RouteQuery(model="m"))
        assert [(a.agent_id, a.liveness) for a in decision.agents] == [
            ("known", Liveness.UNCONFIRMED)
        ]
        assert decision.agents[0].score_parts["unconfirmed_factor"] == 0.5
        after.open_session(agent_hello("fresh"))
        decision = RouteScorer().rank(after.agents(), RouteQuery(model="m"))
        assert [a.agent_id for a in decision.agents] == ["fresh", "known"]


# ----------------------------------------------------------- real processes


@contextlib.asynccontextmanager
async def sessions(target: str, agent_ids: list[str]) -> AsyncIterator[None]:
    """Real Sessions: Hello, then a load report every 200 ms, until the block ends."""
    channel = grpc.aio.insecure_channel(target)
    stub = pb_grpc.CoordinatorStub(channel)
    calls = []
    for i, agent_id in enumerate(agent_ids):
        call = stub.Session()
        await call.write(hello(agent_id))
        assert (await call.read()).WhichOneof("body") == "welcome"
        calls.append((call, i))

    async def report(call: Any, depth: int) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                await call.write(
                    pb.AgentMessage(load_report=pb.LoadReport(waiting_sequences=depth))
                )
                await asyncio.sleep(0.2)

    reporters = [asyncio.create_task(report(call, depth)) for call, depth in calls]
    try:
        yield
    finally:
        for task in reporters:
            task.cancel()
        await asyncio.gather(*reporters, return_exceptions=True)
        for call, _ in calls:
            call.cancel()
        await channel.close()


async def route(coordinator: CoordinatorProcess) -> dict[str, Any]:
    body: dict[str, Any] = await coordinator.get_json("/v1/route?model=m&limit=10")
    return body


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
async def test_a_restarted_coordinator_routes_to_the_agents_it_had(
    data_dir: Path, stop: signal.Signals, backend: str, request: pytest.FixtureRequest
) -> None:
    """On either store: SQLite in data_dir, or PostgreSQL at store_url (data_dir then
    keeps only the CA and keys)."""
    env = {}
    if backend == "postgres":
        env["EDGEFLEET_COORDINATOR_STORE_URL"] = request.getfixturevalue("postgres_url")
    agent_ids = ["edge-a", "edge-b", "edge-c"]
    first = CoordinatorProcess(report_interval_ms=200, data_dir=data_dir, env=env)
    await first.start()
    try:
        async with sessions(first.grpc_target, agent_ids):

            async def all_reported() -> bool:
                agents = await first.agents()
                return sum(a["load"] is not None for a in agents) == len(agent_ids)

            await wait_until(all_reported, timeout_s=10, message="load reports")
            # Past one periodic save (5 report intervals), so reports are on disk too.
            await asyncio.sleep(1.5)
            before = await route(first)
            assert sorted(a["agent_id"] for a in before["agents"]) == agent_ids
            await first.signal_and_wait(stop, 10)
    finally:
        await first.kill()

    if backend == "postgres":
        assert not (data_dir / "fleet.db").exists()  # the store was PostgreSQL's
    async with CoordinatorProcess(report_interval_ms=200, data_dir=data_dir, env=env) as second:
        # At once, before any agent is back: every agent, unconfirmed, none "down".
        body = await route(second)
        assert sorted(a["agent_id"] for a in body["agents"]) == agent_ids, body
        assert {a["liveness"] for a in body["agents"]} == {"unconfirmed"}
        assert body["excluded"] == {}
        views = {a["agent_id"]: a for a in await second.agents()}
        assert views["edge-c"]["load"]["waiting_sequences"] == 2  # its last report, kept
        assert views["edge-c"]["status"] == "disconnected"

        # One agent reconnects: live again, and ranked before the unconfirmed ones.
        async with sessions(second.grpc_target, ["edge-b"]):
            body = await route(second)
            assert body["agents"][0]["agent_id"] == "edge-b"
            liveness = {a["agent_id"]: a["liveness"] for a in body["agents"]}
            assert liveness == {"edge-a": "unconfirmed", "edge-b": "live", "edge-c": "unconfirmed"}


async def test_an_agent_whose_session_ends_without_a_bye_is_suspect_at_once(data_dir: Path) -> None:
    """A SIGKILLed agent's session ends with no Bye: the next sweep ranks it after every
    live agent (suspect), without waiting for two missed reports; it is down once its
    reports are overdue, and live again when it reconnects and reports."""
    clock = Clock()
    async with registry_at(data_dir, clock) as registry:
        for agent_id in ("crashed", "healthy"):
            registry.open_session(agent_hello(agent_id))
        sessions = {r.agent_id: r.session_id for r in registry.agents()}
        for agent_id, session in sessions.items():
            registry.record_report(agent_id, session, LoadReport())
        clock.now += timedelta(seconds=0.3)
        assert registry.close_session("crashed", sessions["crashed"])
        changed = registry.sweep()
        assert [(r.agent_id, r.liveness) for r in changed] == [("crashed", Liveness.SUSPECT)]
        assert registry.get("healthy").liveness is Liveness.LIVE
        ranked = RouteScorer().rank(registry.agents(), RouteQuery(model="m"))
        assert [a.agent_id for a in ranked.agents] == ["healthy", "crashed"]
        clock.now += timedelta(seconds=10)
        assert ("crashed", Liveness.DOWN) in [(r.agent_id, r.liveness) for r in registry.sweep()]
        again = registry.open_session(agent_hello("crashed"))
        registry.record_report("crashed", again, LoadReport())
        assert registry.get("crashed").liveness is Liveness.LIVE
