"""The shared live view's reader (coordinator/cluster/live_view.py) against a real store:
another coordinator's rows become remote records (routed, never swept here); a row of an
agent whose session is here waits for that session to end; the model stats in the rows
reach the rollout gates' hook as differences, once; a dead coordinator's agents are
unconfirmed, then down after the grace period. Rows are written as coordinator B through
the store, as B's registry writes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.cluster.live_view import LiveView, stats_difference
from coordinator.fleet.records import AgentStatus, Liveness
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.store.interface import AgentLastState, CoordinatorMember
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import Hello, Histogram, LoadedModel, LoadReport, ModelStats

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class Members:
    """What the live view reads of the membership (coordinator/cluster/membership.py)."""

    coordinator_id: str = "coord-a"
    members: list[CoordinatorMember] = field(default_factory=list)
    last_error: str | None = None
    lease_s: float = 2.0

    def alive(self) -> list[CoordinatorMember]:
        return [m for m in self.members if m.alive]


def member(coordinator_id: str, alive: bool = True) -> CoordinatorMember:
    return CoordinatorMember(coordinator_id, "x", "", "", "1", alive=alive)


def stats(requests: int, counts: tuple[int, ...]) -> ModelStats:
    return ModelStats("m", "v2", requests, 0, 0, 0, Histogram((0.1, 1.0), counts, 0.0))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteFleetStore]:
    opened = SQLiteFleetStore.in_directory(tmp_path)
    await opened.open()
    yield opened
    await opened.close()


async def test_other_coordinators_agents_are_routed_here(store: SQLiteFleetStore) -> None:
    now = [T0]
    mono = [100.0]
    registry = await LiveFleetRegistry.open(
        store, report_interval_ms=500, restart_grace_s=30, coordinator_id="coord-a",
        clock=lambda: now[0],
    )  # fmt: skip
    members = Members(members=[member("coord-a"), member("coord-b")])
    view = LiveView(store, registry, members, period_s=0.1,  # type: ignore[arg-type]
                    monotonic=lambda: mono[0])  # fmt: skip
    served: list[tuple[str, tuple[ModelStats, ...]]] = []
    view.on_stats(lambda agent_id, report: served.append((agent_id, report.model_stats)))
    hello = Hello("edge-1", site="lab", http_url="http://edge-1:8000",
                  models=(LoadedModel("m", "v2"),))  # fmt: skip
    await store.save_hello(hello, T0)
    epoch = await store.claim_agent("edge-1", "coord-b")

    async def b_writes(waiting: int, sums: ModelStats, liveness: Liveness = Liveness.LIVE) -> None:
        row = AgentLastState("edge-1", liveness, now[0], LoadReport(waiting_sequences=waiting),
                             epoch=epoch, stats=(sums,))  # fmt: skip
        assert await store.save_last_states([row], now[0], owner="coord-b") == []

    # B's agent: routed here, remote, owned by B; what it served before A looked is
    # not counted
    await b_writes(1, stats(5, (2, 2, 1)))
    assert await view.poll() == 1
    (record,) = registry.find(["edge-1"])
    assert (record.remote, record.owner, record.liveness) == (True, "coord-b", Liveness.LIVE)
    assert record.status is AgentStatus.DISCONNECTED and registry.connected_count() == 0
    assert registry.index.serving("m") == {"edge-1"}
    assert served == []
    # what it served since: counted once, as the difference
    await b_writes(2, stats(8, (3, 3, 2)))
    assert await view.poll() == 1 and await view.poll() == 0
    assert served == [("edge-1", (stats(3, (1, 1, 1)),))]
    assert registry.find(["edge-1"])[0].last_report == LoadReport(waiting_sequences=2)
    # never swept here, whatever A's clock says (B sweeps it)
    now[0] += timedelta(minutes=5)
    assert registry.sweep() == [] and registry.find(["edge-1"])[0].liveness is Liveness.LIVE

    # a new session on B: its sums start from nothing
    epoch = await store.claim_agent("edge-1", "coord-b")
    served.clear()
    await b_writes(0, stats(4, (4, 0, 0)))
    await view.poll()
    assert served == [("edge-1", (stats(4, (4, 0, 0)),))]

    # B dies (membership, by the database's clock) and wrote nothing for lease_s: its
    # agent is unconfirmed, still routed; down once the grace period is over
    members.members = [member("coord-a"), member("coord-b", alive=False)]
    await view.poll()
    assert registry.find(["edge-1"])[0].liveness is Liveness.LIVE  # B wrote just now
    mono[0] += 3
    await view.poll()
    assert registry.find(["edge-1"])[0].liveness is Liveness.UNCONFIRMED
    now[0] += timedelta(seconds=31)
    await view.poll()
    assert registry.find(["edge-1"])[0].liveness is Liveness.DOWN


async def test_a_row_waits_while_the_agents_session_is_here(store: SQLiteFleetStore) -> None:
    registry = await LiveFleetRegistry.open(store, coordinator_id="coord-a")
    members = Members(members=[member("coord-a"), member("coord-b")])
    view = LiveView(store, registry, members, period_s=0.1)  # type: ignore[arg-type]
    hello = Hello("edge-1", site="lab", http_url="http://edge-1:8000")
    session = registry.open_session(hello, enrolled=True)
    registry.claimed("edge-1", session, await store.claim_agent("edge-1", "coord-a"))
    await registry.flush()
    # the agent moved to B (this session is stale: the ownership check ends it)
    epoch = await store.claim_agent("edge-1", "coord-b")
    row = AgentLastState("edge-1", Liveness.LIVE, T0, LoadReport(waiting_sequences=7),
                         epoch=epoch)  # fmt: skip
    await store.save_last_states([row], T0, owner="coord-b")
    # A's own write for it is refused now
    assert await registry.save_last_states() == 0
    assert await view.poll() == 0
    record = registry.get("edge-1")
    assert (record.remote, record.status, record.owner) == (False, AgentStatus.CONNECTED,
                                                            "coord-a")  # fmt: skip
    registry.close_session("edge-1", session)
    assert await view.poll() == 1
    record = registry.get("edge-1")
    assert (record.remote, record.owner, record.epoch) == (True, "coord-b", epoch)
    assert record.last_report == LoadReport(waiting_sequences=7)


def test_stats_difference() -> None:
    assert stats_difference(stats(5, (2, 2, 1)), None) == stats(5, (2, 2, 1))
    assert stats_difference(stats(5, (2, 2, 1)), stats(5, (2, 2, 1))) is None
    assert stats_difference(stats(6, (2, 3, 1)), stats(5, (2, 2, 1))) == stats(1, (0, 1, 0))
    other = ModelStats("m", "v2", 1, 0, 0, 0, Histogram((0.5,), (1, 0), 0.0))
    assert stats_difference(stats(9, (3, 3, 3)), other) is None  # cannot be compared


async def test_a_row_of_an_older_session_is_not_applied(store: SQLiteFleetStore) -> None:
    registry = await LiveFleetRegistry.open(store, coordinator_id="coord-a")
    members = Members(members=[member("coord-a"), member("coord-b")])
    view = LiveView(store, registry, members, period_s=0.1)  # type: ignore[arg-type]
    hello = Hello("edge-1", site="lab", http_url="http://edge-1:8000")
    await store.save_hello(hello, T0)
    old = await store.claim_agent("edge-1", "coord-b")
    row = AgentLastState("edge-1", Liveness.LIVE, T0, None, epoch=old)
    await store.save_last_states([row], T0, owner="coord-b")
    # the agent moved here before this coordinator read B's row: it waits, and once the
    # session here ended it is not applied (B's session is older than this one)
    session = registry.open_session(hello, enrolled=True)
    registry.claimed("edge-1", session, await store.claim_agent("edge-1", "coord-a"))
    assert await view.poll() == 0
    registry.close_session("edge-1", session)
    assert await view.poll() == 0
    record = registry.get("edge-1")
    assert (record.remote, record.owner) == (False, "coord-a")
