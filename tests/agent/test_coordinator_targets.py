"""CoordinatorSession given several coordinators: a list of targets, and a name with several
addresses; the next one is tried at once, the wait comes only after all of them failed."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from agent.control import CoordinatorSession
from agent.control.reconnect import Candidate, resolve, round_order, wait_to_retry
from agent.enrollment import Enroller
from agent.metrics import AgentMetrics
from devtools.fleet import CoordinatorProcess, free_port
from devtools.process import wait_until
from edgefleet.contract import Hello, LoadedModel, LoadReport

pytestmark = pytest.mark.timeout(60)


def fake_addresses(monkeypatch: pytest.MonkeyPatch, name: str, addresses: list[str]) -> None:
    """``name`` resolves to ``addresses`` on this event loop (anything else as usual)."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != name:
            return await real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
             (a, int(port)))
            for a in addresses
        ]  # fmt: skip

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


async def test_a_name_with_several_addresses_is_one_candidate_per_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_addresses(monkeypatch, "coord.fleet", ["10.0.0.1", "10.0.0.2", "10.0.0.1", "fd00::3"])
    found = await resolve(["coord.fleet:50051", "10.9.9.9:1", "dns:///x:2", "[::1]:3"])
    assert found == [
        Candidate("coord.fleet:50051", "ipv4:10.0.0.1:50051", "coord.fleet"),
        Candidate("coord.fleet:50051", "ipv4:10.0.0.2:50051", "coord.fleet"),
        Candidate("coord.fleet:50051", "ipv6:[fd00::3]:50051", "coord.fleet"),
        Candidate("10.9.9.9:1", "10.9.9.9:1"),
        Candidate("dns:///x:2", "dns:///x:2"),
        Candidate("[::1]:3", "[::1]:3"),
    ]
    # a name with one address (or none) stays a name, left to gRPC as before
    fake_addresses(monkeypatch, "one.fleet", ["10.0.0.7"])
    assert await resolve(["one.fleet:1", "nowhere.invalid:2"]) == [
        Candidate("one.fleet:1", "one.fleet:1"),
        Candidate("nowhere.invalid:2", "nowhere.invalid:2"),
    ]
    assert found[1].label == "coord.fleet:50051 (ipv4:10.0.0.2:50051)"
    # a round starts with the one that worked last
    assert round_order(found[:3], found[1]) == [found[1], found[2], found[0]]
    assert round_order(found[:3], Candidate("gone:1", "gone:1")) == found[:3]


async def test_the_wait_after_a_failed_round_ends_when_any_closed_port_opens() -> None:
    closed = [("127.0.0.1", free_port()), ("127.0.0.1", free_port())]
    server = None

    async def open_the_second() -> None:
        nonlocal server
        await asyncio.sleep(0.3)
        server = await asyncio.start_server(lambda r, w: w.close(), *closed[1])

    opener = asyncio.create_task(open_the_second())
    started = time.monotonic()
    await wait_to_retry(
        asyncio.Event(), 10.0, probe=closed, probe_interval_s=0.05, rng=random.Random(1)
    )
    assert time.monotonic() - started < 2.0
    await opener
    assert server is not None
    server.close()


async def test_the_session_moves_past_dead_coordinators_at_once_over_mutual_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Targets: a closed port, then a name with two addresses of which only the second
    serves. The session opens on that one within a fraction of the backoff (2 s here): the
    next target is tried at once; TLS checks the certificate against the name."""
    data = tmp_path / "coordinator"
    async with CoordinatorProcess(report_interval_ms=200, data_dir=data, tls=True) as coordinator:
        token = coordinator.mint_join_token("lab")
        port = coordinator.grpc_port
        fake_addresses(monkeypatch, "localhost", ["127.0.0.9", "127.0.0.1"])
        enroller = Enroller(
            "unused:1", token, state_dir=tmp_path / "agent", requested_name="edge-1",
            site="lab", tls=True, ca_pem=coordinator.ca_file.read_bytes(),
        )  # fmt: skip
        metrics = AgentMetrics()
        closed = f"127.0.0.1:{free_port()}"
        session = CoordinatorSession(
            [closed, f"localhost:{port}"],
            lambda: Hello(agent_id="edge-1", site="lab", models=(LoadedModel("m", "v1"),)),
            LoadReport, enroller=enroller, initial_backoff_s=2.0, max_backoff_s=5.0,
            # the dead one's Enroll is as dead; the live one's is its enrollment port
            enroll_target_for=lambda t: closed if t == closed else coordinator.enroll_target,
            on_coordinator=metrics.set_coordinator,
        )  # fmt: skip
        started = time.monotonic()
        await session.start()
        try:
            await wait_until(lambda: session.connected, timeout_s=15, message="connected")
            # enrollment (a key, a CSR, one Enroll call) and the session, with no backoff
            # between the three tries: one backoff here is 2 s at least
            assert time.monotonic() - started < 1.9
            here = f"localhost:{port} (ipv4:127.0.0.1:{port})"
            assert session.coordinator == here
            assert (
                metrics.registry.get_sample_value("edgefleet_agent_coordinator", {"target": here})
                == 1.0
            )
            assert (await coordinator.agents())[0]["status"] == "connected"
        finally:
            await session.stop()
        assert session.coordinator is None
        assert (
            metrics.registry.get_sample_value("edgefleet_agent_coordinator", {"target": here})
            is None
        )
