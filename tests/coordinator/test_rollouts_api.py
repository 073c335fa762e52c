"""The rollouts admin API and CLI on a real coordinator app (create_app + install_rollouts):
roles (operator starts and steers, viewer reads), clear errors, audit entries, /metrics
gauges by state, and ``python -m coordinator rollouts ...`` against the running server.

The model catalog and assignment layer are the in-memory stand-ins of
``model_sync_standins`` until the catalog branch is merged.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.access.admin_tokens import Role
from coordinator.api.app_keys import ADMIN_TOKENS_KEY, AUDIT_KEY, REGISTRY_KEY, ROLLOUTS_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.rollouts.engine import RolloutEngine
from coordinator.rollouts.wiring import ReportHook, RolloutDeps
from edgefleet.contract import (
    Hello,
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    ModelStats,
    SelfCheckResult,
)
from tests.coordinator.model_sync_standins import Selector, StandinAssignments, StandinCatalog

pytestmark = pytest.mark.timeout(60)

ADMIN_TOKEN = "s3cret-admin-token-of-32-chars-at-least"
REPO_ROOT = Path(__file__).resolve().parents[2]


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Running:
    def __init__(self, app: web.Application, server: TestServer, engine: RolloutEngine,
                 clock: Clock, hooks: list[ReportHook]) -> None:  # fmt: skip
        self.app, self.server, self.engine, self.clock, self.hooks = (
            app,
            server,
            engine,
            clock,
            hooks,
        )
        self.tokens: dict[str, str] = {}
        self.sessions = {
            agent_id: app[REGISTRY_KEY].open_session(Hello(agent_id=agent_id, site="s1"))
            for agent_id in ("edge-1", "edge-2", "edge-3", "edge-4")
        }

    async def mint_tokens(self) -> None:
        for role in (Role.VIEWER, Role.OPERATOR):
            minted = await self.app[ADMIN_TOKENS_KEY].mint(role, role.label)
            self.tokens[role.label] = minted.token

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def call(self, method: str, path: str, role: str = "operator",
                   body: Any = None) -> tuple[int, Any]:  # fmt: skip
        headers = {"Authorization": f"Bearer {self.tokens.get(role, ADMIN_TOKEN)}"}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, self.url + path, headers=headers, json=body) as response,
        ):
            return response.status, await response.json(content_type=None)

    def report(self, agent_id: str, requests: int) -> None:
        report = LoadReport(
            inventory=(ModelInventory("m", "2", ModelInventoryState.LOADED,
                                      self_check=SelfCheckResult(passed=True)),),
            model_stats=(ModelStats("m", "2", requests=requests),),
        )  # fmt: skip
        self.app[REGISTRY_KEY].record_report(agent_id, self.sessions[agent_id], report)
        for hook in self.hooks:
            hook(agent_id, report)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    config = CoordinatorConfig(
        grpc_port=0, http_port=0, enroll_port=0, data_dir=str(tmp_path / "data"),
        admin_token=ADMIN_TOKEN, report_interval_ms=60_000,
    )  # fmt: skip
    clock, hooks = Clock(), list[ReportHook]()
    assignments = StandinAssignments()
    app = create_app(config, rollouts=RolloutDeps(
        StandinCatalog(("m", "1"), ("m", "2")), assignments, Selector, hooks.append, clock,
    ))  # fmt: skip
    assignments.registry = app[REGISTRY_KEY]
    await assignments.set_rule(Selector(), "m", "1")
    engine = app[ROLLOUTS_KEY]
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    made = Running(app, server, engine, clock, hooks)
    await made.mint_tokens()
    yield made
    await server.close()


async def test_operator_steers_and_viewer_reads(running: Running) -> None:
    policy = {"model": "m", "version": "2", "canary_count": 1, "waves": [50, 100],
              "soak_s": 60, "min_requests": 10}  # fmt: skip
    status, body = await running.call("POST", "/v1/admin/rollouts", "viewer", policy)
    assert status == 403 and body["error"]["code"] == "insufficient_role"
    status, started = await running.call("POST", "/v1/admin/rollouts", "operator", policy)
    assert status == 201, started
    rollout_id = started["rollout_id"]
    assert started["state"] == "running" and started["plan"] == [["edge-1"], ["edge-2"],
                                                                 ["edge-3", "edge-4"]]  # fmt: skip
    assert started["created_by"].startswith("operator (")
    status, again = await running.call("POST", "/v1/admin/rollouts", "operator", policy)
    assert status == 409 and again["error"]["code"] == "rollout_conflict"
    # The viewer reads; show carries the gate as it stands now.
    running.report("edge-1", 12)
    running.clock.now += 30
    status, shown = await running.call("GET", f"/v1/admin/rollouts/{rollout_id}", "viewer")
    assert status == 200 and shown["gate"]["verdict"] == "wait"
    assert shown["gate"]["requests"] == 12 and shown["gate"]["reasons"] == ["soak 30/60 s"]
    for action in ("pause", "resume", "abort"):
        status, _ = await running.call("POST", f"/v1/admin/rollouts/{rollout_id}/{action}",
                                       "viewer")  # fmt: skip
        assert status == 403
    status, paused = await running.call("POST", f"/v1/admin/rollouts/{rollout_id}/pause")
    assert status == 200 and paused["state"] == "paused"
    status, resumed = await running.call("POST", f"/v1/admin/rollouts/{rollout_id}/resume")
    assert status == 200 and resumed["state"] == "running"
    running.clock.now += 31
    await running.engine.tick()
    status, listed = await running.call("GET", "/v1/admin/rollouts?state=running", "viewer")
    assert status == 200 and [r["step"] for r in listed["data"]] == [1]
    status, aborted = await running.call(
        "POST", f"/v1/admin/rollouts/{rollout_id}/abort", "operator", {"reason": "bad canary"}
    )
    assert status == 200 and aborted["state"] == "aborted"
    assert "aborted by operator: bad canary" in aborted["detail"]
    status, body = await running.call("POST", f"/v1/admin/rollouts/{rollout_id}/pause")
    assert status == 409 and "aborted already" in body["error"]["message"]
    # Audit: the operator's actions by the middleware, the engine's own with actor rollouts.
    entries = await running.app[AUDIT_KEY].entries()
    ours = [(e.action, e.actor_name, e.status) for e in entries if "rollout" in e.action]
    assert ("POST /v1/admin/rollouts", "operator", 201) in ours
    assert ("POST /v1/admin/rollouts/{rollout_id}/abort", "operator", 200) in ours
    assert ("rollout step passed", "rollouts", 0) in ours
    assert ("rollout aborted", "rollouts", 0) in ours
    # /metrics: rollouts by state.
    async with (
        aiohttp.ClientSession() as http,
        http.get(running.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        as response,
    ):  # fmt: skip
        text = await response.text()
    assert 'edgefleet_coordinator_rollouts{state="aborted"} 1.0' in text
    assert 'edgefleet_coordinator_rollouts{state="running"} 0.0' in text


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/admin/rollouts/ro-nope", None, 404, "rollout_not_found"),
        ("POST", "/v1/admin/rollouts/ro-nope/abort", {}, 404, "rollout_not_found"),
        ("GET", "/v1/admin/rollouts?state=sideways", None, 400, "invalid_parameter"),
        ("POST", "/v1/admin/rollouts", {"model": "m", "version": "9"}, 404,
         "model_version_not_found"),
        ("POST", "/v1/admin/rollouts", {"model": "m", "version": "2", "waves": [10]}, 400,
         "invalid_parameter"),
        ("POST", "/v1/admin/rollouts", [1, 2], 400, "invalid_parameter"),
        ("POST", "/v1/admin/rollouts",
         {"model": "m", "version": "2", "selector": {"sites": ["elsewhere"]}}, 409,
         "rollout_conflict"),
    ],
)  # fmt: skip
async def test_errors_are_clear(
    running: Running, method: str, path: str, body: Any, status: int, code: str
) -> None:
    got, answer = await running.call(method, path, "operator", body)
    assert got == status, answer
    assert answer["error"]["code"] == code and answer["error"]["message"]


async def _cli(running: Running, *args: str, role: str = "operator") -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", "rollouts", *args, "--url", running.url,
        cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": running.tokens[role]},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_cli(running: Running) -> None:
    code, out, err = await _cli(
        running, "start", "m@2", "--canary", "2", "--waves", "100", "--soak", "5m",
        "--min-requests", "10", "--json",
    )  # fmt: skip
    assert code == 0, err
    started = json.loads(out)
    rollout_id = started["rollout_id"]
    assert started["policy"]["soak_s"] == 300 and started["plan"][0] == ["edge-1", "edge-2"]
    code, out, err = await _cli(running, "list", role="viewer")
    assert code == 0 and rollout_id in out and "m@2" in out and "running" in out
    running.report("edge-1", 7)
    code, out, err = await _cli(running, "show", rollout_id, role="viewer")
    assert code == 0, err
    assert "gate: wait; 7 requests" in out and "canary: edge-1, edge-2" in out
    assert "1/2 moved agents loaded and self-checked" in out
    code, out, err = await _cli(running, "pause", rollout_id, role="viewer")
    assert code == 1 and "403" in err
    for action in ("pause", "resume"):
        code, out, err = await _cli(running, action, rollout_id)
        assert code == 0 and f"rollout {rollout_id}" in out, err
    code, out, err = await _cli(running, "abort", rollout_id, "--keep", "--reason", "enough")
    assert code == 0 and "aborted" in out and "kept on the new version" in out, err
    code, out, err = await _cli(running, "start", "m-without-version")
    assert code == 1 and "NAME@VERSION" in err


async def test_a_restarted_coordinator_resumes_the_rollout(tmp_path: Path) -> None:
    """The app is stopped mid-rollout and a new one starts on the same data directory."""
    data = str(tmp_path / "data")
    clock = Clock()

    async def start() -> tuple[TestServer, RolloutEngine, StandinAssignments]:
        config = CoordinatorConfig(grpc_port=0, http_port=0, enroll_port=0, data_dir=data,
                                   admin_token=ADMIN_TOKEN, report_interval_ms=60_000)  # fmt: skip
        assignments = StandinAssignments()
        app = create_app(config, rollouts=RolloutDeps(
            StandinCatalog(("m", "1"), ("m", "2")), assignments, Selector,
            lambda hook: None, clock,
        ))  # fmt: skip
        assignments.registry = app[REGISTRY_KEY]
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        for agent_id in ("edge-1", "edge-2"):
            app[REGISTRY_KEY].open_session(Hello(agent_id=agent_id, site="s1"))
        return server, app[ROLLOUTS_KEY], assignments

    server, engine, _ = await start()
    policy = {"model": "m", "version": "2", "soak_s": 600, "min_requests": 0}
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(str(server.make_url("/v1/admin/rollouts")), json=policy) as response,
    ):
        assert response.status == 201
        rollout_id = (await response.json())["rollout_id"]
    clock.now += 500
    await server.close()
    server, engine, _ = await start()
    try:
        resumed = await engine.get(rollout_id)
        assert resumed.state.value == "running" and resumed.step == 0
        assert resumed.step_started_at == clock.now - 500  # the stored start, not a new one
        clock.now += 101  # 601 s after the stored start: the canary's soak is over
        await engine.tick()
        # The canary's agent never reported the new version loaded: still waiting.
        assert "0/1 moved agents loaded" in (await engine.get(rollout_id)).detail
    finally:
        await server.close()
