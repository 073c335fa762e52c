"""The fleet-wide housekeeping runs on the leader only (issue 24): a coordinator that does
not lead writes request records past the cap but never prunes them (the leader's periodic
``prune_if_over`` does, counting every coordinator's rows), and its liveness sweep does not
forget never-enrolled agents long gone (it still sweeps liveness)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgpack

from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.fleet.request_records import RequestRecordStore
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import Hello, RequestRecords


def record(i: int) -> dict[str, object]:
    return {"model": "tiny", "version": "v1", "prompt_tokens": i, "completion_tokens": 2,
            "latency_ms": 1.5, "status": 200, "served_by": "edge-1", "key_id": None}  # fmt: skip


async def test_only_the_leader_prunes_request_records(tmp_path: Path) -> None:
    db = SQLiteFleetStore.in_directory(tmp_path)
    await db.open()
    try:
        follower = RequestRecordStore(db, max_rows=100)
        follower.prunes = lambda: False
        await follower.load()
        pruned = 0
        for batch in range(12):
            packed = msgpack.packb([record(i) for i in range(10)])
            accepted = await follower.accept("edge-1", RequestRecords(1 + batch * 10, packed))
            pruned += accepted.pruned
        assert pruned == 0 and await db.count_request_records() == 120
        leader = RequestRecordStore(db, max_rows=100)  # another coordinator, leading
        await leader.load()
        assert await leader.prune_if_over() > 0
        assert await db.count_request_records() <= 100
        assert await leader.prune_if_over() == 0  # under the cap: nothing
    finally:
        await db.close()


async def test_a_follower_sweeps_liveness_but_forgets_no_agent(tmp_path: Path) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    db = SQLiteFleetStore.in_directory(tmp_path)
    await db.open()
    try:
        registry = await LiveFleetRegistry.open(
            db, stale_unenrolled_after_s=3600, clock=lambda: now[0]
        )
        hello = Hello(agent_id="junk", site="lab", http_url="http://127.0.0.1:8001")
        registry.close_session("junk", registry.open_session(hello))
        now[0] += timedelta(hours=2)
        changed = registry.sweep(forget_stale=False)  # not the leader
        assert [(r.agent_id, r.liveness.value) for r in changed] == [("junk", "down")]
        assert [r.agent_id for r in registry.agents()] == ["junk"]
        registry.sweep()  # the leader's sweep forgets it
        assert registry.agents() == []
        await registry.flush()
        assert await db.list_agents() == []
    finally:
        await db.close()
