"""Load reports applied in slices (coordinator.rpc.report_queue): in order, a slice per
loop callback with other callbacks in between, all at once on ``flush``, one failure not
stopping the rest; and through a real session, what an agent sent before its Bye is
applied before the Bye, so the Bye's "down" stands."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from coordinator.api.app_keys import GRPC_SERVER_KEY, REGISTRY_KEY
from coordinator.fleet.records import AgentStatus, Liveness
from coordinator.rpc.report_queue import SLICE, ReportQueue
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.test_coordinator_service import Running, coordinator, hello, report

__all__ = ["coordinator"]  # the fixture, used by name below

pytestmark = pytest.mark.timeout(30)


async def test_reports_are_applied_in_order_a_slice_per_callback() -> None:
    applied: list[tuple[str, int]] = []
    queue: ReportQueue[str, int] = ReportQueue(lambda s, r: applied.append((s, r)))
    loop = asyncio.get_running_loop()
    for n in range(3 * SLICE + 5):
        queue.put("a" if n % 2 else "b", n)
    assert applied == [] and len(queue) == 3 * SLICE + 5  # nothing applied inline
    seen_between: list[int] = []
    loop.call_soon(lambda: seen_between.append(len(applied)))
    await asyncio.sleep(0)  # one pass of the loop: the first slice, then the other callback
    assert seen_between == [SLICE]
    while len(queue):
        await asyncio.sleep(0)
    assert [r for _, r in applied] == list(range(3 * SLICE + 5))
    assert applied[1] == ("a", 1)


async def test_flush_applies_everything_pending_at_once() -> None:
    applied: list[int] = []
    queue: ReportQueue[str, int] = ReportQueue(lambda s, r: applied.append(r), slice_size=2)
    for n in range(7):
        queue.put("s", n)
    queue.flush()
    assert applied == list(range(7)) and len(queue) == 0
    await asyncio.sleep(0)  # the drain scheduled before the flush finds nothing left
    assert applied == list(range(7))
    queue.put("s", 7)  # and the queue keeps working
    await asyncio.sleep(0)
    assert applied == list(range(8))


async def test_a_failing_report_is_logged_and_the_rest_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    applied: list[int] = []

    def apply(session: str, n: int) -> None:
        if n == 2:
            raise RuntimeError("bad report")
        applied.append(n)

    queue: ReportQueue[str, int] = ReportQueue(apply)
    with caplog.at_level(logging.ERROR, logger="coordinator.rpc.report_queue"):
        for n in range(5):
            queue.put("s", n)
        await asyncio.sleep(0)
    assert applied == [0, 1, 3, 4]
    assert "applying a load report failed" in caplog.text and "bad report" in caplog.text


def test_the_slice_must_hold_a_report() -> None:
    with pytest.raises(ValueError, match="slice_size"):
        ReportQueue(lambda s, r: None, slice_size=0)


def _stalled(coordinator: Running) -> None:
    """The servicer's queue applies nothing by itself from now on, as when the loop is
    too busy to drain it before a session's next message: only flushes apply reports."""
    coordinator.app[GRPC_SERVER_KEY].servicer._reports._slice = 0


async def _open(coordinator: Running, agent_id: str) -> grpc.aio.StreamStreamCall:
    call = coordinator.stub.Session()
    await call.write(hello(agent_id))
    assert (await call.read()).WhichOneof("body") == "welcome"
    assert (await call.read()).WhichOneof("body") == "desired_state"
    return call


async def _close(call: grpc.aio.StreamStreamCall) -> None:
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass
    assert await call.code() == grpc.StatusCode.OK


async def test_reports_sent_before_a_bye_are_applied_before_it(coordinator: Running) -> None:
    """The Bye ("down") comes after the reports before it, so the agent stays down with
    its last report kept; a report applied after the Bye would bring it back as live."""
    _stalled(coordinator)
    call = await _open(coordinator, "edge-bye")
    for n in range(1, 6):
        await call.write(report(n))
    await call.write(pb.AgentMessage(bye=pb.Bye(reason="maintenance")))
    await _close(call)
    record = coordinator.app[REGISTRY_KEY].get("edge-bye")
    assert record.liveness is Liveness.DOWN
    assert record.last_report is not None and record.last_report.waiting_sequences == 5


async def test_a_sessions_reports_are_all_applied_by_its_end(coordinator: Running) -> None:
    """What a session sent before it ended is in the registry when its end is: none is
    left to be applied to a closed session later (it would make it live again)."""
    _stalled(coordinator)
    call = await _open(coordinator, "edge-end")
    for n in range(1, 6):
        await call.write(report(n))
    await _close(call)
    record = coordinator.app[REGISTRY_KEY].get("edge-end")
    assert record.status is AgentStatus.DISCONNECTED
    assert record.last_report is not None and record.last_report.waiting_sequences == 5
    assert len(coordinator.app[GRPC_SERVER_KEY].servicer._reports) == 0
