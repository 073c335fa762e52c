"""CoordinatorSession against a real `python -m coordinator` process over loopback gRPC."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from agent.__main__ import serve
from agent.agent_state import AgentState
from agent.config import load_config
from agent.control import CoordinatorSession
from agent.control.reconnect import ReconnectBackoff, host_port
from agent.errors import ConfigError
from agent.load_sampler import LoadSampler
from agent.metrics import AgentMetrics
from agent.model_registry import ModelRegistry
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from edgefleet.contract import (
    DesiredState,
    Hardware,
    Hello,
    LoadedModel,
    LoadReport,
    Location,
    SectionGenerations,
)

pytestmark = pytest.mark.timeout(60)

IDENTITY = Hello(
    agent_id="edge-lab-1",
    site="lab",
    http_url="http://127.0.0.1:8001",
    location=Location(52.52, 13.405),
    agent_version="0.1.0",
    hardware=Hardware(
        cpu_count=4,
        memory_bytes=8 << 30,
        execution_providers=("CPUExecutionProvider",),
    ),
    models=(
        LoadedModel("smollm2-135m", "2024-11", "chat", "int4-cpu"),
        LoadedModel("minilm-l6", "v2", "embedding", "int8-cpu"),
    ),
    token="s3cret",
)


def fast_session(target: str, **kwargs: Any) -> CoordinatorSession:
    defaults: dict[str, Any] = {
        "initial_backoff_s": 0.05,
        "max_backoff_s": 0.3,
        "connect_timeout_s": 3.0,
    }
    return CoordinatorSession(
        target,
        lambda: IDENTITY,
        lambda: LoadReport(waiting_sequences=3, tokens_per_second=41.5, requests_total=7),
        **(defaults | kwargs),
    )


def test_load_sampler_counts_requests_failures_and_generated_tokens() -> None:
    metrics, state = AgentMetrics(), AgentState()
    sampler = LoadSampler(ModelRegistry({}, {}), metrics, state)
    for status, n in [("200", 3), ("499", 4), ("500", 2), ("503", 1), ("99", 5)]:
        metrics.requests.labels("/v1/chat/completions", status).inc(n)
    metrics.generation_tokens.labels("a").inc(7)
    metrics.generation_tokens.labels("b").inc(5)
    state.set_draining(True)
    report = sampler()
    # Status codes compare as numbers: "99" >= "500" as text, but 99 is no server error.
    assert (report.requests_total, report.requests_failed_total) == (15, 3)
    assert report.tokens_per_second > 0 and report.draining
    assert report.unhealthy_reason == ""
    assert sampler().tokens_per_second == 0.0  # no tokens since the last report


def test_load_sampler_reports_an_unhealthy_agent() -> None:
    state = AgentState()
    sampler = LoadSampler(ModelRegistry({}, {}), AgentMetrics(), state)
    state.mark_unhealthy("engine dead: planner failed 4 times in 60 s")
    assert sampler().unhealthy_reason == "engine dead: planner failed 4 times in 60 s"


async def test_coordinator_tls_without_enrollment_fails_at_start(tmp_path: Path) -> None:
    # mutual TLS needs the client certificate enrollment gives; without one the agent
    # connected in plaintext, silently ignoring coordinator.tls
    config = load_config(
        environ={},
        overrides={
            "models": {"dir": str(tmp_path / "no-models")},
            "coordinator": {
                "target": "127.0.0.1:1",
                "tls": True,
                "state_dir": str(tmp_path / "state"),
            },
        },
    )
    with pytest.raises(ConfigError, match="not enrolled"):
        await serve(config)  # before any model is loaded


async def agent_view(coordinator: CoordinatorProcess, agent_id: str) -> dict[str, Any] | None:
    listing = await coordinator.get_json("/v1/agents")
    return next((a for a in listing["data"] if a["agent_id"] == agent_id), None)


async def agent_status(coordinator: CoordinatorProcess, agent_id: str) -> str | None:
    view = await agent_view(coordinator, agent_id)
    return None if view is None else view["status"]


async def test_agent_appears_with_its_site_models_and_load() -> None:
    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        session = fast_session(coordinator.grpc_target)
        await session.start()
        try:
            await wait_until(lambda: session.connected, message="session connected")

            async def reported() -> bool:
                view = await agent_view(coordinator, IDENTITY.agent_id)
                return view is not None and view["load"] is not None

            await wait_until(reported, message="agent with a load report")
            view = await agent_view(coordinator, IDENTITY.agent_id)
            assert view is not None
            assert view["status"] == "connected"
            assert view["site"] == "lab"
            assert view["http_url"] == "http://127.0.0.1:8001"
            assert view["location"] == {"lat": 52.52, "lon": 13.405}
            assert view["hardware"]["execution_providers"] == ["CPUExecutionProvider"]
            assert [(m["name"], m["version"], m["task"], m["variant"]) for m in view["models"]] == [
                ("smollm2-135m", "2024-11", "chat", "int4-cpu"),
                ("minilm-l6", "v2", "embedding", "int8-cpu"),
            ]
            assert view["load"]["waiting_sequences"] == 3
            assert view["load"]["tokens_per_second"] == 41.5
            assert view["load"]["requests_total"] == 7
            assert view["last_seen"].endswith("Z")
            assert "s3cret" not in str(view)
            # The coordinator's interval and desired state reached the agent.
            assert session.report_interval_s == pytest.approx(0.2)
            assert session.desired_state == DesiredState()
            assert view["load"]["applied"] == SectionGenerations()._asdict()
            assert session.session_id == view["session_id"]
        finally:
            await session.stop()


@pytest.mark.slow
async def test_stopping_the_session_marks_the_agent_disconnected() -> None:
    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        session = fast_session(coordinator.grpc_target)
        await session.start()
        await wait_until(lambda: session.connected, message="session connected")
        await wait_until(
            lambda: _is(agent_status(coordinator, IDENTITY.agent_id), "connected"),
            message="agent listed as connected",
        )
        await asyncio.wait_for(session.stop(), 5)
        assert not session.connected
        await wait_until(
            lambda: _is(agent_status(coordinator, IDENTITY.agent_id), "disconnected"),
            message="agent listed as disconnected",
        )
        view = await agent_view(coordinator, IDENTITY.agent_id)
        assert view is not None and view["bye_reason"] == "agent stopping"
        metrics = await _metrics_text(coordinator)
        assert "edgefleet_coordinator_connected_agents 0.0" in metrics


@pytest.mark.slow
async def test_the_agent_is_back_within_one_report_interval_of_the_coordinators_return() -> None:
    # The default backoff (initial 0.5 s) against a coordinator away for 6 s: uncapped
    # exponential backoff had grown to waits of 4-8 s by then.
    first = CoordinatorProcess(report_interval_ms=2000)
    await first.start()
    session = CoordinatorSession(first.grpc_target, lambda: IDENTITY, LoadReport)
    await session.start()
    try:
        await wait_until(lambda: session.connected, message="first session")
        first_session_id = session.session_id
        await first.kill()
        await wait_until(lambda: not session.connected, message="session noticing the loss")
        assert session.last_error is not None
        await asyncio.sleep(6.0)

        # Same ports, fresh process with an empty registry.
        async with CoordinatorProcess(
            grpc_port=first.grpc_port, http_port=first.http_port, report_interval_ms=2000
        ) as second:
            returned = time.monotonic()
            await wait_until(lambda: session.connected, timeout_s=15, interval_s=0.02)
            away = time.monotonic() - returned
            print(f"agent back {away:.2f} s after the coordinator returned")
            assert away < 2.5, f"agent back {away:.2f} s after the coordinator"
            assert session.session_id != first_session_id
            await wait_until(
                lambda: _is(agent_status(second, IDENTITY.agent_id), "connected"),
                message="agent listed again after restart",
            )
    finally:
        await session.stop()


async def test_no_coordinator_means_retries_without_raising() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    session = fast_session(f"127.0.0.1:{port}")
    await session.start()
    await asyncio.sleep(0.6)  # several failed attempts
    assert not session.connected
    assert session.last_error is not None and "UNAVAILABLE" in session.last_error
    assert session.desired_state == DesiredState()
    await asyncio.wait_for(session.stop(), 3)


async def test_a_rejected_hello_is_logged_as_an_error_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = dataclasses.replace(IDENTITY, agent_id="not a valid id")
    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        session = CoordinatorSession(
            coordinator.grpc_target,
            lambda: bad,
            LoadReport,
            initial_backoff_s=0.05,
            max_backoff_s=0.1,
        )
        with caplog.at_level(logging.ERROR, logger="agent.control.session"):
            await session.start()
            await wait_until(lambda: session.last_error is not None, message="rejection")
            await asyncio.sleep(0.3)  # it keeps trying
            await session.stop()
    assert not session.connected
    assert "INVALID_ARGUMENT" in (session.last_error or "")
    assert "Hello.agent_id 'not a valid id' is invalid" in (session.last_error or "")
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) >= 2


async def test_a_failing_load_provider_does_not_end_the_session() -> None:
    calls = 0

    def broken_load() -> LoadReport:
        nonlocal calls
        calls += 1
        raise RuntimeError("metrics backend down")

    async with CoordinatorProcess(report_interval_ms=100) as coordinator:
        session = CoordinatorSession(coordinator.grpc_target, lambda: IDENTITY, broken_load)
        await session.start()
        try:
            await wait_until(lambda: session.connected and calls >= 3, message="3 reports")
            assert session.connected
            assert await agent_status(coordinator, IDENTITY.agent_id) == "connected"
        finally:
            await session.stop()


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    backoff = ReconnectBackoff(0.5, random.Random(7))
    for failures, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 2.0), (40, 2.0)]:
        delays = [backoff.delay(failures, cap_s=2.0) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_the_backoff_cap_is_the_report_interval_unless_configured() -> None:
    session = CoordinatorSession("127.0.0.1:1", lambda: IDENTITY, LoadReport)
    assert session.max_backoff_s == session.report_interval_s == 2.0
    session.report_interval_s = 0.5  # as a coordinator's Welcome sets it
    assert session.max_backoff_s == 0.5
    pinned = CoordinatorSession("127.0.0.1:1", lambda: IDENTITY, LoadReport, max_backoff_s=5.0)
    assert pinned.max_backoff_s == 5.0


def test_gRPC_targets_name_the_port_to_probe() -> None:
    assert host_port("coordinator:50051") == ("coordinator", 50051)
    assert host_port("dns:///coord.example:443") == ("coord.example", 443)
    assert host_port("[::1]:7000") == ("::1", 7000)
    assert host_port("unix:/run/coordinator.sock") is None


def test_bad_arguments_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="target"):
        CoordinatorSession("", lambda: IDENTITY, LoadReport)
    with pytest.raises(ValueError, match="backoff"):
        CoordinatorSession("h:1", lambda: IDENTITY, LoadReport, initial_backoff_s=0)


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _metrics_text(coordinator: CoordinatorProcess) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics") as r,
    ):
        return await r.text()


async def test_reports_keep_their_interval_when_a_write_is_slow() -> None:
    """The report loop keeps its own grid: a write that takes most of an interval (gRPC
    flow control, a slow coordinator) does not push every later report back by its time."""
    session = CoordinatorSession("127.0.0.1:1", lambda: IDENTITY, LoadReport)
    session.report_interval_s = 0.2
    sent: list[float] = []

    class SlowCall:
        async def write(self, message: Any) -> None:
            if message.WhichOneof("body") == "load_report":
                sent.append(time.monotonic())
            await asyncio.sleep(0.12)

        async def done_writing(self) -> None:
            pass

    loop = asyncio.create_task(session._report_loop(SlowCall()))
    await asyncio.sleep(1.5)
    session._stopping.set()
    await asyncio.wait_for(loop, 2)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert len(sent) >= 7, sent  # 1.5 s at 0.2 s a report (0.32 s with the write's time added)
    assert all(0.15 <= gap <= 0.3 for gap in gaps), gaps
