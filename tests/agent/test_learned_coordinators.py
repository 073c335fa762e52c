"""Coordinators an agent learns from Welcome (``Welcome.coordinators``): each address checked
like a configured one (stricter: a port, no gRPC scheme), bounded in number, added after the
configured targets, which always stay; the session moves to a learned one when its
coordinator goes. Against in-process stand-in coordinators (plain gRPC servers that answer
Hello with a Welcome); tests/coordinator/test_learned_coordinators.py does it with real ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from agent.control import CoordinatorSession
from agent.control.reconnect import MAX_LEARNED, learned_address_problem, learned_targets
from devtools.fleet import free_port
from devtools.process import wait_until
from edgefleet import contract_pb
from edgefleet.contract import Hello, LoadReport, Welcome
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "entry",
    ["10.0.0.1:50051", "coord-b.fleet.example:1", "localhost:65535", "[fd00::2]:50051",
     "[::1]:7", "c_1.internal:443"],
)  # fmt: skip
def test_host_port_addresses_are_taken(entry: str) -> None:
    assert learned_address_problem(entry) is None


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("", "empty"),
        ("coord-b", "no port"),
        ("coord-b:0", "port '0'"),
        ("coord-b:65536", "port '65536'"),
        ("coord-b:\uff15\uff10", "port"),  # non-ASCII (fullwidth) digits
        ("coord-b:1²", "port"),
        ("unix:/run/evil.sock", "port"),
        ("dns:///coord-b:1", "port"),
        ("ipv4:10.0.0.1:1", "port"),
        ("0.0.0.0:50051", "wildcard"),
        ("[::]:50051", "wildcard"),
        ("fd00::2:50051", "port"),
        ("[fd00::zz]:1", "IPv6"),
        ("[fd00::2]", "[address]:port"),
        ("a b:1", "host"),
        ("-x:1", "host"),
        ("coord\n:1", "host"),
        ("x" * 300 + ":1", "longer"),
    ],
)
def test_garbage_is_refused_with_a_reason(entry: str, why: str) -> None:
    problem = learned_address_problem(entry)
    assert problem is not None and why in problem


def test_learned_targets_keep_the_configured_ones_out_and_are_bounded() -> None:
    configured = ("a:1", "b:1")
    listed = ["a:1", "c:1", "garbage", "c:1", "d:1", "unix:/x", "b:1"]
    learned, problems = learned_targets(configured, listed)
    assert learned == ("c:1", "d:1")  # in order, once each, none configured
    assert [p.split(":", 1)[0] for p in problems] == ["'garbage'", "'unix"]
    many = [f"c{i}:1" for i in range(MAX_LEARNED + 3)]
    learned, problems = learned_targets(configured, many)
    assert learned == tuple(many[:MAX_LEARNED])
    assert len(problems) == 3 and all("beyond the" in p for p in problems)
    assert learned_targets(configured, []) == ((), [])


class StandIn(pb_grpc.CoordinatorServicer):  # type: ignore[misc]
    """A coordinator that answers Hello with a Welcome naming ``coordinators``, then keeps
    the session open until it stops (as a killed process would: no Bye, no status)."""

    def __init__(self, coordinators: Sequence[str] = ()) -> None:
        self.coordinators = tuple(coordinators)
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.hellos: list[str] = []
        self._server: Any = None

    async def Session(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        first = await request_iterator.__anext__()
        self.hellos.append(first.hello.agent_id)
        welcome = Welcome(f"s-{self.port}", 200, coordinators=self.coordinators)
        yield pb.CoordinatorMessage(welcome=contract_pb.welcome_to_pb(welcome))
        async for _ in request_iterator:
            pass

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_CoordinatorServicer_to_server(self, self._server)
        self._server.add_insecure_port(self.target)
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0)


def session_for(target: str) -> CoordinatorSession:
    return CoordinatorSession(
        target, lambda: Hello(agent_id="edge-1", site="lab"), LoadReport,
        initial_backoff_s=2.0, max_backoff_s=5.0, probe_interval_s=0.05,
    )  # fmt: skip


async def test_the_session_moves_to_a_coordinator_it_learned_from_welcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Configured with A only; A's Welcome names A, B and garbage. A stops: the session is
    on B at once (well within the 2 s backoff, which a second round would wait first)."""
    b = StandIn()
    a = StandIn()
    a.coordinators = (a.target, b.target, "unix:/run/x.sock", "0.0.0.0:1")
    b.coordinators = (b.target,)
    await a.start()
    await b.start()
    session = session_for(a.target)
    caplog.set_level(logging.INFO, logger="agent.control.session")
    await session.start()
    try:
        await wait_until(lambda: session.coordinator == a.target, timeout_s=10, message="on A")
        assert session.learned == (b.target,)
        ignored = [r.getMessage() for r in caplog.records if "ignoring a coordinator" in r.message]
        assert len(ignored) == 2 and "unix:/run/x.sock" in ignored[0] and "0.0.0.0" in ignored[1]
        await a.stop()
        stopped = time.monotonic()
        await wait_until(lambda: session.coordinator == b.target, timeout_s=10, message="on B")
        assert time.monotonic() - stopped < 1.5
        assert b.hellos == ["edge-1"]
        # B names only itself: the configured A stays, and is still tried first after B
        assert session.targets == (a.target,) and session.learned == (b.target,)
    finally:
        await session.stop()
        await b.stop()


async def test_an_empty_list_leaves_what_was_learned_and_a_new_list_replaces_it() -> None:
    session = session_for("a:1")
    session._learn(("b:1", "c:1"))
    assert session.learned == ("b:1", "c:1")
    session._learn(("a:1", "d:1"))
    assert list(session.learned) == ["d:1"]
    session._learn(("garbage",))  # nothing valid: nothing learned, the configured A stays
    assert (list(session.targets), list(session.learned)) == (["a:1"], [])


async def test_without_a_list_the_session_stays_on_its_configured_targets() -> None:
    """A coordinator that lists none (an older one): nothing learned, nothing else tried."""
    a = StandIn()
    await a.start()
    session = session_for(a.target)
    await session.start()
    try:
        await wait_until(lambda: session.connected, timeout_s=10, message="connected")
        assert session.learned == ()
    finally:
        await session.stop()
        await a.stop()
    await asyncio.sleep(0)
