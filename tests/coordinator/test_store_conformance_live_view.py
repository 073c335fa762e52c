"""The fleet store's conformance suite, the shared live view (``agent_last_state`` written
fenced by ``agent_owners``, read incrementally by version): on both backends
(tests/coordinator/store_backends.py), the writers on separate connections as coordinators
sharing one database would be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from coordinator.fleet.records import Liveness
from coordinator.store.interface import AgentLastState, FleetStore
from edgefleet.contract import Histogram, LoadReport, ModelStats
from tests.coordinator.store_backends import StoreFactory, backend, store, store_factory

__all__ = ["backend", "store", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def state(agent_id: str, epoch: int, waiting: int = 0, **fields: object) -> AgentLastState:
    return AgentLastState(
        agent_id, Liveness.LIVE, NOW, LoadReport(waiting_sequences=waiting), epoch=epoch,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_a_stale_owners_write_is_refused(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    await a.open()
    await b.open()
    try:
        assert await a.claim_agent("edge-1", "coord-a") == 1
        assert await a.save_last_states([state("edge-1", 1, 1)], NOW, owner="coord-a") == []
        # the agent's session moves to B (epoch 2): A's writes are refused from now on,
        # at its old epoch and at "any epoch" (0) alike; B's apply
        assert await b.claim_agent("edge-1", "coord-b") == 2
        assert await b.save_last_states([state("edge-1", 2, 2)], NOW, owner="coord-b") == []
        for epoch in (1, 0):
            refused = await a.save_last_states([state("edge-1", epoch, 9)], NOW, owner="coord-a")
            assert refused == ["edge-1"]
        # a session of B's that was superseded by B's own newer one: refused too
        assert await b.claim_agent("edge-1", "coord-b") == 3
        assert await b.save_last_states([state("edge-1", 2, 8)], NOW, owner="coord-b") == ["edge-1"]
        (saved,) = await a.list_last_states()
        assert (saved.owner, saved.epoch, saved.report) == (
            "coord-b", 2, LoadReport(waiting_sequences=2),
        )  # fmt: skip
        # in one batch, only the stale rows are left out; an agent never claimed is written
        await a.claim_agent("edge-2", "coord-a")
        refused = await a.save_last_states(
            [state("edge-1", 1), state("edge-2", 1, 5), state("edge-3", 0, 6)], NOW,
            owner="coord-a",
        )  # fmt: skip
        assert refused == ["edge-1"]
        owners = {s.agent_id: (s.owner, s.report) for s in await b.list_last_states()}
        assert owners == {
            "edge-1": ("coord-b", LoadReport(waiting_sequences=2)),
            "edge-2": ("coord-a", LoadReport(waiting_sequences=5)),
            "edge-3": ("coord-a", LoadReport(waiting_sequences=6)),
        }
    finally:
        await a.close()
        await b.close()


async def test_the_live_view_is_read_by_version(store: FleetStore) -> None:
    stats = ModelStats("m", "v1", 7, 1, 70, 700, Histogram((0.1, 1.0), (3, 3, 1), 2.5))
    await store.save_last_states(
        [state("a", 1, 1, stats=(stats,)), state("b", 1, 2)], NOW, owner="coord-a"
    )
    first = await store.live_states_after(0, 10)
    assert [s.agent_id for s in first] == ["a", "b"]
    assert first[0].version < first[1].version
    assert first[0].stats == (stats,) and first[1].stats == ()
    assert all(s.owner == "coord-a" and s.epoch == 1 for s in first)
    assert all(s.written_at is not None for s in first)
    assert await store.live_states_after(first[-1].version, 10) == []
    # only what was written since: b again, then c
    await store.save_last_states([state("b", 1, 3)], NOW + timedelta(seconds=1), owner="x")
    await store.save_last_states([state("c", 1, 4)], NOW, owner="coord-b")
    changed = await store.live_states_after(first[-1].version, 10)
    assert [(s.agent_id, s.owner, s.report) for s in changed] == [
        ("b", "x", LoadReport(waiting_sequences=3)),
        ("c", "coord-b", LoadReport(waiting_sequences=4)),
    ]
    assert [s.agent_id for s in await store.live_states_after(first[-1].version, 1)] == ["b"]
