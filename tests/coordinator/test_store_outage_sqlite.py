"""The same outage paths on SQLite: the fleet database locked by another process (a long
write transaction: an operator's tool, a stuck backup) past the statement timeout.

An agent's session stays and its load is routed, an admin write gets 503
``store_unavailable`` with Retry-After within the timeout, the request records sent
meanwhile are acknowledged only once the lock is gone, and the refused write's audit entry
is appended then. (PostgreSQL slow and away, with real processes:
tests/coordinator/test_store_outage.py.)
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import msgpack

from coordinator.store.health import ERROR_KINDS
from devtools.process import wait_until
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, MakeCoordinator, hello

STATEMENT_TIMEOUT_S = 0.5


def records(first_seq: int, count: int) -> pb.AgentMessage:
    packed = msgpack.packb([{"model": "m", "status": 200} for _ in range(count)])
    return pb.AgentMessage(
        request_records=pb.RequestRecords(first_seq=first_seq, records_msgpack=packed)
    )


async def test_a_locked_sqlite_database_stops_nothing_that_serves(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    data_dir = tmp_path / "coordinator"
    coordinator = await make_coordinator(
        data_dir=str(data_dir), store_statement_timeout_s=STATEMENT_TIMEOUT_S
    )
    outgoing: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
    outgoing.put_nowait(hello("edge-1"))

    async def messages() -> Any:
        while (message := await outgoing.get()) is not None:
            yield message

    call = coordinator.stub.Session(messages())
    acks: list[int] = []

    async def read() -> None:
        while (message := await call.read()) is not grpc.aio.EOF:
            if message.WhichOneof("body") == "records_ack":
                acks.append(message.records_ack.through_seq)

    async def report() -> None:  # as an agent does, every report interval (200 ms)
        while True:
            outgoing.put_nowait(pb.AgentMessage(load_report=pb.LoadReport(running_sequences=1)))
            await asyncio.sleep(0.1)

    reader = asyncio.create_task(read())
    reporter = asyncio.create_task(report())
    http = aiohttp.ClientSession(headers=ADMIN_HEADERS)
    lock = sqlite3.connect(data_dir / "fleet.db", isolation_level=None)
    try:
        outgoing.put_nowait(records(1, 3))
        await wait_until(lambda: acks == [3], timeout_s=5, message="first records acknowledged")

        lock.execute("BEGIN EXCLUSIVE")  # every write waits for it
        outgoing.put_nowait(records(4, 2))
        started = time.monotonic()
        async with http.post(coordinator.http_url + "/v1/admin/keys", json={"name": "k"}) as r:
            body = await r.json()
            assert r.status == 503, body
            assert r.headers["Retry-After"] == "5"
        assert time.monotonic() - started < STATEMENT_TIMEOUT_S * 4 + 1
        assert body["error"]["code"] == "store_unavailable"
        for _ in range(8):  # the session's reports are routed; nothing acknowledged yet
            async with http.get(coordinator.http_url + "/v1/route?model=m") as r:
                assert r.status == 200
                assert [a["agent_id"] for a in (await r.json())["agents"]] == ["edge-1"]
            await asyncio.sleep(0.2)
        assert acks == [3]
        async with http.get(coordinator.http_url + "/healthz") as r:
            text = await r.text()
            health = json.loads(text)
        # a write waits up to the timeout for the lock, and the probe behind it; /healthz
        # answers anyone: the failure's kind, never the driver's words or the file's path
        assert health["status"] == "degraded"
        assert health["store"]["last_error"] == ERROR_KINDS["timeout"]
        assert str(data_dir) not in text and "fleet.db" not in text
        assert health["store"]["pending_writes"] >= 3  # two records, an audit entry

        lock.execute("ROLLBACK")
        await wait_until(lambda: acks == [3, 5], timeout_s=10, message="kept records written")
        assert not reader.done()  # the same session throughout

        async def audited() -> bool:
            async with http.get(coordinator.http_url + "/v1/admin/audit") as r:
                entries = (await r.json())["data"]
            return any(e["action"] == "POST /v1/admin/keys" and e["status"] == 503
                       for e in entries)  # fmt: skip

        await wait_until(audited, timeout_s=10, message="the refused write's audit entry")
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        await http.close()
        reporter.cancel()
        outgoing.put_nowait(None)
        call.cancel()
        reader.cancel()
        await asyncio.gather(reader, reporter, return_exceptions=True)
