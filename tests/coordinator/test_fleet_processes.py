"""Real processes: mTLS enrollment, liveness after SIGKILL, restart keeps the registry, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.control import CoordinatorSession
from agent.enrollment import Enroller
from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import REPO_ROOT, wait_until
from edgefleet.contract import CONTRACT_MINOR, Hello, LoadedModel, LoadReport
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def cli(*args: str, admin_token: str = "") -> Any:
    """The operator CLI; ``admin_token`` for --url calls goes in its environment."""
    env = {**os.environ, "EDGEFLEET_ADMIN_TOKEN": admin_token}
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *args, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True, env=env,
    )  # fmt: skip
    return json.loads(done.stdout)


async def agent_view(coordinator: CoordinatorProcess, agent_id: str) -> dict[str, Any] | None:
    return next((a for a in await coordinator.agents() if a["agent_id"] == agent_id), None)


def identity(agent_id: str) -> Hello:
    return Hello(
        agent_id=agent_id,
        site="lab",
        http_url="http://127.0.0.1:9",
        models=(LoadedModel("m", "v1"),),
    )


async def test_tls_enrollment_and_mutual_tls_session(tmp_path: Path) -> None:
    data = tmp_path / "coordinator"
    async with CoordinatorProcess(
        report_interval_ms=200, data_dir=data, extra_args=["--tls", "on", "--enroll-port", "0"]
    ) as coordinator:
        assert coordinator.enroll_target != coordinator.grpc_target
        token = cli("tokens", "create", "--data-dir", str(data), "--uses", "2")["token"]
        ca_pem = (data / "ca" / "ca.pem").read_bytes()
        enroller = Enroller(
            coordinator.enroll_target, token, state_dir=tmp_path / "agent",
            requested_name="edge-1", site="lab", tls=True, ca_pem=ca_pem,
        )  # fmt: skip
        session = CoordinatorSession(
            coordinator.grpc_target, lambda: identity("edge-1"), LoadReport,
            enroller=enroller, initial_backoff_s=0.05, max_backoff_s=0.3,
        )  # fmt: skip
        await session.start()
        try:
            await wait_until(lambda: session.connected, timeout_s=15, message="mTLS session")
            view = await agent_view(coordinator, "edge-1")
            assert view is not None and view["enrolled"] and view["status"] == "connected"
            assert (tmp_path / "agent" / "enrollment.json").stat().st_mode & 0o777 == 0o600
        finally:
            await session.stop()

        server_only = grpc.ssl_channel_credentials(root_certificates=ca_pem)
        # No client certificate: the enrollment port refuses Session with a clear status.
        async with grpc.aio.secure_channel(coordinator.enroll_target, server_only) as channel:
            call = pb_grpc.CoordinatorStub(channel).Session()
            await call.write(
                pb.AgentMessage(
                    hello=pb.Hello(agent_id="edge-x", site="lab", contract_minor=CONTRACT_MINOR)
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "requires mutual TLS" in info.value.details()
        # ... and the session port will not even complete the handshake.
        async with grpc.aio.secure_channel(coordinator.grpc_target, server_only) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.CoordinatorStub(channel).Route(pb.RouteRequest(model="m"), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # A certificate for another agent cannot speak for edge-1.
        other = Enroller(
            coordinator.enroll_target, token, state_dir=tmp_path / "other",
            requested_name="edge-2", tls=True, ca_pem=ca_pem,
        )  # fmt: skip
        other_creds = await other.ensure()
        mine = enroller.load()
        assert mine is not None
        async with grpc.aio.secure_channel(
            coordinator.grpc_target, other_creds.channel_credentials()
        ) as channel:
            call = pb_grpc.CoordinatorStub(channel).Session()
            await call.write(
                pb.AgentMessage(
                    hello=pb.Hello(
                        agent_id="edge-1",
                        token=mine.token,
                        site="lab",
                        contract_minor=CONTRACT_MINOR,
                    )
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "certificate is for agent 'edge-2'" in info.value.details()
        assert await agent_view(coordinator, "edge-2") is None  # never registered


async def test_sigkilled_agent_goes_down_and_comes_back(tiny_artifacts: Path) -> None:
    async with CoordinatorProcess(
        report_interval_ms=200, extra_args=["--set", "down_after_reports=5"]
    ) as coordinator:

        def agent() -> AgentProcess:
            return AgentProcess(
                models_dir=str(tiny_artifacts), serve=["tiny-llama"],
                coordinator=coordinator.grpc_target, agent_id="edge-kill",
            )  # fmt: skip

        async def liveness() -> str | None:
            view = await agent_view(coordinator, "edge-kill")
            return None if view is None else str(view["liveness"])

        async def routed() -> list[str]:
            body = await coordinator.get_json("/v1/route?model=tiny-llama")
            return [a["agent_id"] for a in body["agents"]]

        first = agent()
        await first.start()
        await wait_until(lambda: _is(liveness, "live"), timeout_s=20, message="agent live")
        assert await routed() == ["edge-kill"]
        await first.kill()
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        await wait_until(lambda: _is(liveness, "down"), timeout_s=5, message="agent down")
        # 5 missed 200 ms reports = 1 s, plus sweep granularity and polling.
        assert loop.time() - killed_at < 2.5
        assert await routed() == []

        second = agent()
        await second.start()
        try:
            await wait_until(lambda: _is(liveness, "live"), timeout_s=20, message="agent back")
            assert await routed() == ["edge-kill"]
        finally:
            await second.terminate()


async def _is(probe: Any, wanted: Any) -> bool:
    return bool(await probe() == wanted)


async def test_restart_keeps_registry_tokens_and_drain(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    data = tmp_path / "coordinator"
    first = CoordinatorProcess(report_interval_ms=200, data_dir=data)
    await first.start()
    agent = AgentProcess(
        models_dir=str(tiny_artifacts), serve=["tiny-llama"],
        coordinator=first.grpc_target, agent_id="edge-persist", site="berlin",
    )  # fmt: skip
    await agent.start()
    try:
        await wait_until(
            lambda: _connected(first, "edge-persist"), timeout_s=20, message="agent connected"
        )
        created = cli(
            "tokens",
            "create",
            "--url",
            first.http_url,
            "--site",
            "berlin",
            admin_token=first.admin_token,
        )
        drained = cli(
            "agents",
            "drain",
            "edge-persist",
            "--url",
            first.http_url,
            admin_token=first.admin_token,
        )
        assert drained["draining"] is True and drained["command_sent"] is True
        await wait_until(
            lambda: any("coordinator command drain" in line for line in agent.log),
            timeout_s=5, message="agent got drain",
        )  # fmt: skip
        body = await first.get_json("/v1/route?model=tiny-llama")
        assert body["agents"] == [] and body["excluded"] == {"draining": 1}
        grpc_port = first.grpc_port
        await first.terminate()

        second = CoordinatorProcess(report_interval_ms=200, data_dir=data, grpc_port=grpc_port)
        await second.start()
        try:
            view = await agent_view(second, "edge-persist")
            assert view is not None  # straight from the store, before the agent is back
            assert view["site"] == "berlin" and view["draining"] is True
            listed = cli("tokens", "list", "--data-dir", str(data))["data"]
            assert [t["token_id"] for t in listed] == [created["token_id"]]
            await wait_until(
                lambda: _connected(second, "edge-persist"), timeout_s=20, message="reconnect"
            )
            cli(
                "agents",
                "resume",
                "edge-persist",
                "--url",
                second.http_url,
                admin_token=second.admin_token,
            )

            # The agent's own reports said "draining" until it hears the resume;
            # routing follows within a report interval, not at once.
            async def routed() -> list[str]:
                body = await second.get_json("/v1/route?model=tiny-llama")
                return [a["agent_id"] for a in body["agents"]]

            await wait_until(
                lambda: _is(routed, ["edge-persist"]), timeout_s=5, message="routed again"
            )
            revoked = cli(
                "tokens",
                "revoke",
                created["token_id"],
                "--url",
                second.http_url,
                admin_token=second.admin_token,
            )
            assert revoked["state"] == "revoked"
        finally:
            await second.terminate()
    finally:
        await agent.terminate()


async def _connected(coordinator: CoordinatorProcess, agent_id: str) -> bool:
    view = await agent_view(coordinator, agent_id)
    return view is not None and view["status"] == "connected" and view["liveness"] == "live"
