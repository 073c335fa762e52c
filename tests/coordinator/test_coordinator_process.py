"""`python -m coordinator` as a real process: serves, reports errors, shuts down cleanly."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_serves_metrics_health_and_json_errors() -> None:
    async with CoordinatorProcess() as coordinator, aiohttp.ClientSession() as http:
        async with http.get(coordinator.http_url + "/healthz") as response:
            assert response.status == 200
            assert (await response.json())["status"] == "ok"
        metrics_url = coordinator.http_url + "/metrics"
        async with http.get(metrics_url, headers=coordinator.admin_headers) as response:
            text = await response.text()
        assert "edgefleet_coordinator_connected_agents 0.0" in text
        assert "edgefleet_coordinator_sessions_total 0.0" in text
        async with http.get(coordinator.http_url + "/no/such/route") as response:
            assert response.status == 404
            assert response.content_type == "application/json"
            error = (await response.json())["error"]
        assert error == {
            "message": "Invalid URL (GET /no/such/route)",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
        assert await coordinator.get_json("/v1/agents") == {
            "object": "list",
            "data": [],
            "first_id": None,
            "last_id": None,
            "has_more": False,
        }


async def test_route_lookups_and_probes_leave_no_access_log_line_but_others_do() -> None:
    """A line per route lookup would cost more than the lookup (hundreds a second)."""
    async with CoordinatorProcess() as coordinator, aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(coordinator.http_url + "/v1/route?model=m") as response:
                assert response.status in (200, 404)
            async with http.get(coordinator.http_url + "/healthz") as response:
                assert response.status == 200
        async with http.get(coordinator.http_url + "/v1/agents") as response:
            assert response.status == 401

        def access_lines() -> list[str]:
            return [line for line in coordinator.log if '"GET /' in line]

        await wait_until(
            lambda: any("/v1/agents" in line for line in access_lines()),
            timeout_s=10,
            message="the access-log line of GET /v1/agents",
        )
        assert not [line for line in access_lines() if "/v1/route" in line or "/healthz" in line]


async def test_sigterm_with_a_live_session_exits_promptly_and_cleanly() -> None:
    coordinator = CoordinatorProcess()
    await coordinator.start()
    async with grpc.aio.insecure_channel(coordinator.grpc_target) as channel:
        call = pb_grpc.CoordinatorStub(channel).Session()
        await call.write(
            pb.AgentMessage(
                hello=pb.Hello(agent_id="edge-1", site="lab", contract_minor=CONTRACT_MINOR)
            )
        )
        assert (await call.read()).WhichOneof("body") == "welcome"
        await wait_until(lambda: _connected(coordinator), message="agent connected before shutdown")
        started = time.monotonic()
        code = await coordinator.terminate(timeout_s=10)
        elapsed = time.monotonic() - started
        # The coordinator ended the session itself instead of waiting out the grace period.
        await call.read()  # welcome's desired state
        assert await asyncio.wait_for(call.read(), 2) is grpc.aio.EOF
    assert code == 0
    assert elapsed < 4.0
    log = "".join(coordinator.log)
    assert "shutting down" in log and "coordinator stopped" in log


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_port_in_use_is_a_clear_startup_error(protocol: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"grpc": "0", "http": "0", protocol: str(port)}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coordinator",
            "--grpc-port",
            ports["grpc"],
            "--http-port",
            ports["http"],
            cwd=REPO_ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 1
    assert (
        f"cannot listen for {'gRPC' if protocol == 'grpc' else 'HTTP'} on 127.0.0.1:{port}"
        in stderr.decode()
    )
    assert "Traceback" not in stderr.decode()


async def _connected(coordinator: CoordinatorProcess) -> bool:
    listing = await coordinator.get_json("/v1/agents")
    return [a["status"] for a in listing["data"]] == ["connected"]
