"""An agent's session lives on one coordinator: the database records which, with an epoch.

Two in-process coordinators on one PostgreSQL database (plaintext gRPC on loopback, as
shipped there; the agent enrolled with a join token). The agent's session is on A; the
agent opens a new session on B (it moved: A looked alive to A but not to the agent, a
half-open connection or a paused A). B claims the agent at epoch + 1; A ends its stale
session at once (the change feed), and the periodic check ends it even without the feed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from coordinator.api.app_keys import CHANGES_KEY, GRPC_SERVER_KEY, STORE_KEY, TOKENS_KEY
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import MakeCoordinator, hello

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("feed", [True, False], ids=["change-feed", "periodic-check"])
async def test_a_coordinator_ends_its_stale_session_when_the_agent_moved(
    make_coordinator: MakeCoordinator, postgres_url: str, tmp_path: Path, feed: bool
) -> None:
    a = await make_coordinator(
        store_url=postgres_url, data_dir=str(tmp_path / "a"), coordinator_id="coord-a",
        report_interval_ms=500,
    )  # fmt: skip
    b = await make_coordinator(
        store_url=postgres_url, data_dir=str(tmp_path / "b"), coordinator_id="coord-b",
        report_interval_ms=500,
    )  # fmt: skip
    if feed:  # only the feed can tell A
        a.app[GRPC_SERVER_KEY].servicer.check_ownership = _nothing  # type: ignore[method-assign]
    else:  # the notice lost: only the periodic check can tell A
        b.app[CHANGES_KEY].publish = _nothing  # type: ignore[method-assign]
    token = (await a.app[TOKENS_KEY].create()).token
    enrolled = await a.stub.Enroll(pb.EnrollRequest(join_token=token, requested_name="edge-1"))
    store = a.app[STORE_KEY]
    old = a.stub.Session()
    await old.write(hello("edge-1", token=enrolled.credentials))
    await old.read()  # Welcome
    await old.read()  # desired state
    assert await store.agent_owners(["edge-1"]) == {"edge-1": ("coord-a", 1)}
    new = b.stub.Session()
    await new.write(hello("edge-1", token=enrolled.credentials))
    moved_at = time.monotonic()
    assert (await new.read()).HasField("welcome")
    assert await store.agent_owners(["edge-1"]) == {"edge-1": ("coord-b", 2)}
    # A's stale stream ends (cleanly: the agent is not there to see it)
    while True:
        message = await asyncio.wait_for(old.read(), 10)
        if message is grpc.aio.EOF:
            break
    ended_s = time.monotonic() - moved_at
    bound = 1.5 if feed else 0.5 + 1.5  # the feed at once; else one check period and slack
    assert ended_s < bound, f"A ended its stale session after {ended_s:.2f} s"
    servicer_a = a.app[GRPC_SERVER_KEY].servicer
    assert "edge-1" not in servicer_a.connected_agent_ids()
    assert "edge-1" in b.app[GRPC_SERVER_KEY].servicer.connected_agent_ids()
    assert servicer_a._metrics.sessions_superseded._value.get() == 1
    # B's Hello-to-Welcome steps, as /metrics shows them (each opening observed once)
    opened = b.app[GRPC_SERVER_KEY].servicer._metrics.session_open_seconds
    for step in ("authenticate", "claim", "generations", "total"):
        count = next(
            s.value for s in opened.collect()[0].samples
            if s.name.endswith("_count") and s.labels == {"step": step}
        )  # fmt: skip
        assert count == 1, step
    await new.done_writing()


async def _nothing(*args: object, **kwargs: object) -> int:
    return 0
