"""The per-request spool: records survive a restart until acknowledged, a full spool
drops the oldest and says so, and the coordinator stores a batch once and acks it."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from agent.config import AgentConfig
from agent.request_log import RequestLog, RequestLogSlot
from coordinator.errors import ProtocolError
from coordinator.fleet.request_records import RequestRecordStore
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import RequestRecords


async def opened(data_dir: Path) -> SQLiteFleetStore:
    store = SQLiteFleetStore.in_directory(data_dir)
    await store.open()
    return store


def record(i: int) -> dict[str, object]:
    return {"model": "tiny", "version": "v1", "prompt_tokens": i, "completion_tokens": 2,
            "latency_ms": 1.5, "status": 200, "served_by": "edge-1", "key_id": None}  # fmt: skip


def test_unacknowledged_records_survive_a_restart_and_go_once_acked(tmp_path: Path) -> None:
    log = RequestLog(tmp_path)
    for i in range(5):
        log.append(record(i))
    # No close: as after a SIGKILL, only what reached the file counts.
    again = RequestLog(tmp_path)
    batch = again.batch(0)
    assert batch is not None
    first, packed, count = batch
    assert (first, count) == (1, 5)
    assert [r["prompt_tokens"] for r in msgpack.unpackb(packed)] == [0, 1, 2, 3, 4]
    assert "prompt" not in str(msgpack.unpackb(packed)).replace("prompt_tokens", "")
    again.ack(3)
    third = RequestLog(tmp_path)
    assert third.pending == 2 and third.next_seq == 6
    assert third.append(record(9)) == 6
    for each in (log, again, third):
        each.close()


def test_a_full_spool_drops_the_oldest_and_counts_the_loss(tmp_path: Path) -> None:
    lost: list[int] = []
    log = RequestLog(tmp_path, max_bytes=8192, on_drop=lost.append)
    for i in range(400):
        log.append(record(i))
    assert log.dropped_total == sum(lost) > 0
    batch = log.batch(0, max_records=10_000, max_bytes=1 << 20)
    assert batch is not None
    records = msgpack.unpackb(batch[1])
    gaps = [r["gap"] for r in records if "gap" in r]
    assert sum(gaps) == log.dropped_total
    assert records[-1]["prompt_tokens"] == 399  # the newest are kept
    assert (tmp_path / "requests.spool").stat().st_size <= 2 * 8192
    log.close()


async def test_the_coordinator_stores_a_batch_once_and_refuses_hostile_ones(
    tmp_path: Path,
) -> None:
    db = await opened(tmp_path)
    store = RequestRecordStore(db, max_rows=1000)
    await store.load()
    packed = msgpack.packb([record(1), record(2), {"model": 5}, "junk"])
    first = await store.accept("edge-1", RequestRecords(10, packed))
    assert first.ack is not None and first.ack.through_seq == 13
    assert (first.stored, first.invalid) == (2, 2)
    again = await store.accept("edge-1", RequestRecords(10, packed))  # ack lost, sent twice
    assert again.stored == 0 and store.count() == 2
    assert [r["seq"] for r in await store.list(agent_id="edge-1")] == [10, 11]
    for bad in (
        RequestRecords(0, packed),
        RequestRecords(1, b"\xc1"),
        RequestRecords(1, msgpack.packb({"not": "a list"})),
        RequestRecords(1, b"\x00" * (2 << 20)),
        RequestRecords(1, msgpack.packb([record(0)] * 5000)),
    ):
        with pytest.raises(ProtocolError):
            await store.accept("edge-1", bad)
    long = msgpack.packb([{**record(3), "model": "m" * 10_000, "prompt_tokens": 2**50}])
    assert (await store.accept("edge-2", RequestRecords(1, long))).invalid == 1
    await db.close()


async def test_records_beyond_the_cap_are_pruned_oldest_first_and_counted(
    tmp_path: Path,
) -> None:
    db = await opened(tmp_path)
    store = RequestRecordStore(db, max_rows=100)
    await store.load()
    pruned = 0
    for batch in range(12):
        packed = msgpack.packb([record(i) for i in range(10)])
        pruned += (await store.accept("edge-1", RequestRecords(1 + batch * 10, packed))).pruned
    assert store.count() <= 100
    assert pruned == 120 - store.count()  # every removed row is counted, none silently
    assert min(r["seq"] for r in await store.list(agent_id="edge-1")) == 1 + pruned
    await db.close()


async def test_a_full_spool_counts_the_loss_in_the_metric_and_sends_a_gap_record(
    tmp_path: Path,
) -> None:
    registry = CollectorRegistry()
    slot = RequestLogSlot(registry)
    log = slot.open(tmp_path, "edge-1", max_bytes=AgentConfig().audit.spool_max_bytes)
    assert log.max_bytes == 64 << 20  # the default
    slot.close()
    config = AgentConfig.model_validate({"audit": {"spool_max_bytes": 4096}})
    log = slot.open(tmp_path / "small", "edge-1", max_bytes=config.audit.spool_max_bytes)
    for i in range(200):
        log.append(record(i))
    dropped = registry.get_sample_value("edgefleet_agent_request_records_dropped_total")
    assert dropped == log.dropped_total > 0
    batch = log.batch(0, max_records=10_000, max_bytes=1 << 20)
    assert batch is not None
    first, packed, _ = batch
    records = msgpack.unpackb(packed)
    assert first > 1  # the oldest went
    assert any("gap" in r for r in records)  # and a gap record says how many
    assert sum(r.get("gap", 0) for r in records) == dropped
    # The coordinator stores the gap; the loss also rides on the batch.
    db = await opened(tmp_path / "coordinator")
    store = RequestRecordStore(db)
    await store.load()
    result = await store.accept(
        "edge-1", RequestRecords(first, packed, dropped=log.dropped_unreported)
    )
    assert result.ack is not None and result.stored == len(records)
    assert result.lost_at_agent == log.dropped_unreported > 0  # counted in the metric
    assert sum(r["dropped"] for r in await store.list(agent_id="edge-1")) == dropped
    slot.close()
    await db.close()
    with pytest.raises(ValueError):
        AgentConfig.model_validate({"audit": {"spool_max_bytes": 100}})


def test_a_torn_tail_is_cut_off_so_later_records_stay_readable(tmp_path: Path) -> None:
    log = RequestLog(tmp_path)
    for i in range(3):
        log.append(record(i))
    log.close()
    with open(tmp_path / "requests.spool", "ab") as spool:
        spool.write(msgpack.packb(record(99))[:7])  # a write cut short
    again = RequestLog(tmp_path)
    assert again.pending == 3
    assert again.append(record(3)) == 4
    again.close()
    third = RequestLog(tmp_path)
    batch = third.batch(0)
    assert batch is not None
    assert [r["prompt_tokens"] for r in msgpack.unpackb(batch[1])] == [0, 1, 2, 3]
    third.close()
