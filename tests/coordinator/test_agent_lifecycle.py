"""The agent lifecycle end to end: CSR enrollment, idempotence, renewal, expiry, the CA
files, backup and restore. Real gRPC (TLS where it matters) and real processes."""

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
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.control import CoordinatorSession
from agent.enrollment import (
    KEY_FILE,
    STATE_FILE,
    Enroller,
    EnrollmentRefusedError,
    _csr,
    write_private,
)
from coordinator.api.app_keys import LIFECYCLE_KEY, REGISTRY_KEY, STORE_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.errors import CertificateError
from coordinator.identity.ca import certificate_serial
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from edgefleet.contract import Hello, LoadedModel, LoadReport
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, TEST_ADMIN_TOKEN, MakeCoordinator
from tests.coordinator.store_backends import on_both_stores

pytestmark = pytest.mark.timeout(90)
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores

DAY_S = 86_400.0
IDENTITY = Hello(
    agent_id="edge-1",
    site="lab",
    http_url="http://127.0.0.1:8001",
    models=(LoadedModel(name="m", version="v1", task="chat"),),
)


def session(target: str, enroller: Enroller, **kwargs: Any) -> CoordinatorSession:
    return CoordinatorSession(
        target,
        lambda: IDENTITY,
        lambda: LoadReport(),
        enroller=enroller,
        initial_backoff_s=0.05,
        max_backoff_s=0.2,
        probe_interval_s=0.05,
        **kwargs,
    )


def new_key_pem() -> str:
    from cryptography.hazmat.primitives.asymmetric import ec

    return (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )


async def test_csr_enrollment_puts_no_private_key_on_the_wire_and_saves_0600_files(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    key = new_key_pem()
    reply = await c.stub.Enroll(
        pb.EnrollRequest(
            join_token=await c.new_token(site="lab"),
            requested_name="edge-1",
            csr_pem=_csr(key, "x"),
        )
    )
    assert reply.client_key_pem == ""  # the coordinator never made or sent a key
    cert = x509.load_pem_x509_certificate(reply.client_cert_pem.encode())
    own = serialization.load_pem_private_key(key.encode(), None).public_key()
    assert cert.public_key() == own
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert abs(lifetime.total_seconds() - (7 * DAY_S + 300)) < 5  # 7 days (+5 min skew)
    assert reply.site == "lab" and reply.cert_not_after_unix > 0

    # The agent's Enroller: its own key and the answer, atomically written, 0600.
    state = tmp_path / "state"
    enroller = Enroller(
        c.grpc_target, await c.new_token(), state_dir=state, requested_name="edge-2"
    )
    credentials = await enroller.ensure()
    assert credentials.agent_id == "edge-2"
    for name in (KEY_FILE, STATE_FILE):
        assert (state / name).stat().st_mode & 0o777 == 0o600
    assert "PRIVATE KEY" not in (state / STATE_FILE).read_text()
    assert not list(state.glob(".*.tmp"))
    # A legacy agent (no CSR) still enrolls, with a key the coordinator made.
    legacy = await c.stub.Enroll(
        pb.EnrollRequest(join_token=await c.new_token(), requested_name="old")
    )
    assert "PRIVATE KEY" in legacy.client_key_pem


async def test_enrollment_is_idempotent_for_the_same_token_and_key(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    """An agent that crashed after Enroll, before saving the answer, enrolls again."""
    c = await make_coordinator()
    token = await c.new_token(max_uses=1)
    state = tmp_path / "state"
    first = Enroller(c.grpc_target, token, state_dir=state, requested_name="edge-1")
    got = await first.ensure()
    (state / STATE_FILE).unlink()  # the crash: the key was saved, the answer was not
    again = await Enroller(c.grpc_target, token, state_dir=state, requested_name="edge-1").ensure()
    assert again.agent_id == got.agent_id == "edge-1"
    assert again.token != got.token  # a fresh credential replaces the lost one
    token_id = token.split("_", 1)[1].split(".")[0]
    record = await c.app[STORE_KEY].get_token(token_id)
    assert record is not None and record.uses == 1
    assert [a.agent_id for a in await c.app[STORE_KEY].list_agents()] == ["edge-1"]
    # Another key with the same, used-up token is refused.
    with pytest.raises(EnrollmentRefusedError, match="already used 1 of 1"):
        await Enroller(
            c.grpc_target, token, state_dir=tmp_path / "other", requested_name="edge-9"
        ).ensure()
    # The re-enrolled agent opens a session with its new credential.
    agent = session(c.grpc_target, Enroller(c.grpc_target, "", state_dir=state))
    await agent.start()
    await wait_until(lambda: agent.connected, message="session with the new credential")
    await agent.stop()


async def test_certificates_are_renewed_over_the_session(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    # 153 s: with the 5-minute back-dating, two thirds of the life have passed after ~2 s.
    c = await make_coordinator(agent_cert_days=153 / DAY_S)
    state = tmp_path / "state"
    enroller = Enroller(
        c.grpc_target, await c.new_token(), state_dir=state, requested_name="edge-1"
    )
    agent = session(c.grpc_target, enroller)
    await agent.start()
    await wait_until(lambda: agent.connected, message="connected")
    first = certificate_serial(enroller.credentials.client_cert_pem)  # type: ignore[union-attr]
    await wait_until(lambda: agent.certificates_renewed >= 1, timeout_s=15, message="renewal")
    saved = json.loads((state / STATE_FILE).read_text())
    renewed = certificate_serial(saved["client_cert_pem"])
    assert renewed != first
    stored = await c.app[STORE_KEY].get_agent("edge-1")
    assert stored is not None and stored.cert_serial in (
        renewed,
        certificate_serial(enroller.credentials.client_cert_pem),  # type: ignore[union-attr]
    )
    assert agent.connected  # renewal did not disturb the session
    await agent.stop()


@pytest.mark.slow
async def test_an_agent_offline_past_its_certificates_expiry_comes_back_without_an_operator(
    tmp_path: Path,
) -> None:
    data = tmp_path / "coordinator"
    coordinator = CoordinatorProcess(
        report_interval_ms=200,
        data_dir=data,
        extra_args=["--tls", "on", "--enroll-port", "0", "--set", f"agent_cert_days={3 / DAY_S}"],
    )
    await coordinator.start()
    try:
        token = _admin(data, "tokens", "create").strip()
        state = tmp_path / "state"
        enroller = Enroller(
            coordinator.enroll_target,
            token,
            state_dir=state,
            requested_name="edge-1",
            tls=True,
            ca_pem=(data / "ca" / "ca.pem").read_bytes(),
        )
        first = await enroller.ensure()
        await asyncio.sleep(3.5)  # offline past the certificate's expiry
        assert first.expired()
        agent = session(coordinator.grpc_target, enroller)
        await agent.start()
        await wait_until(lambda: agent.connected, timeout_s=15, message="back after expiry")
        assert enroller.credentials is not None
        assert enroller.credentials.agent_id == "edge-1"
        assert not enroller.credentials.expired()
        await agent.stop()
    finally:
        await coordinator.terminate()


def _admin(data: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_a_revoked_agent_cannot_renew_or_reenroll(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    state = tmp_path / "state"
    enroller = Enroller(
        c.grpc_target, await c.new_token(), state_dir=state, requested_name="edge-1"
    )
    credentials = await enroller.ensure()
    await c.app[LIFECYCLE_KEY].revoke("edge-1")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.stub.Enroll(
            pb.EnrollRequest(
                join_token="efa_" + credentials.token,
                requested_name="edge-1",
                csr_pem=_csr(credentials.client_key_pem, "edge-1"),
            )
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "revoked" in info.value.details()


def test_the_coordinator_refuses_to_start_with_one_ca_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_app(CoordinatorConfig(data_dir=str(data), grpc_port=0, http_port=0))
    (data / "ca" / "ca.key").unlink()
    with pytest.raises(CertificateError, match=r"ca\.pem exists but .*ca\.key is missing"):
        create_app(CoordinatorConfig(data_dir=str(data), grpc_port=0, http_port=0))
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "--data-dir", str(data), "--grpc-port", "0",
         "--http-port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "ca.pem" in errors[0] and "ca.key" in errors[0]
    assert not (data / "ca" / "ca.key").exists()  # no new CA silently made


def test_plaintext_beyond_loopback_needs_require_enrollment_off(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "coordinator", "--data-dir", str(tmp_path), "--grpc-host",
            "0.0.0.0", "--tls", "off", "--grpc-port", "0", "--http-port", "0"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "needs an explicit require_enrollment = false" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    config = CoordinatorConfig(grpc_host="0.0.0.0", tls="off", require_enrollment=False)
    assert not config.enrollment_required
    assert CoordinatorConfig(grpc_host="0.0.0.0", tls="on").enrollment_required
    assert CoordinatorConfig(grpc_host="0.0.0.0").enrollment_required


@pytest.mark.slow
async def test_backup_while_running_then_restore_onto_a_fresh_data_dir(tmp_path: Path) -> None:
    """TLS on: the restored CA must be the one the agent trusts, and its record known."""
    data = tmp_path / "coordinator"
    first = CoordinatorProcess(
        report_interval_ms=200, data_dir=data, extra_args=["--tls", "on", "--enroll-port", "0"]
    )
    await first.start()
    state = tmp_path / "state"
    try:
        token = _admin(data, "tokens", "create").strip()
        enroller = Enroller(
            first.enroll_target,
            token,
            state_dir=state,
            requested_name="edge-1",
            tls=True,
            ca_pem=(data / "ca" / "ca.pem").read_bytes(),
        )
        agent = session(first.grpc_target, enroller)
        await agent.start()
        await wait_until(lambda: agent.connected, timeout_s=15, message="connected")
        backup = tmp_path / "backup"
        _admin(data, "backup", str(backup))  # while the coordinator runs
        assert (backup / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
        assert (backup / "fleet.db").exists()
    finally:
        await first.terminate()
    await wait_until(lambda: not agent.connected, message="coordinator gone")

    fresh = tmp_path / "fresh"
    _admin(fresh, "restore", str(backup))
    # Restoring over existing state needs --force.
    refused = subprocess.run(
        [sys.executable, "-m", "coordinator", "restore", str(backup), "--data-dir", str(fresh)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and "--force" in refused.stderr
    second = CoordinatorProcess(
        grpc_port=first.grpc_port,
        report_interval_ms=200,
        data_dir=fresh,
        extra_args=["--tls", "on", "--enroll-port", "0"],
    )
    await second.start()
    try:
        opened = agent.sessions_opened
        await wait_until(
            lambda: agent.connected and agent.sessions_opened > opened,
            timeout_s=20,
            message="the agent reconnects to the restored coordinator",
        )
        agents = await second.agents()
        assert [(a["agent_id"], a["enrolled"], a["status"]) for a in agents] == [
            ("edge-1", True, "connected")
        ]
    finally:
        await agent.stop()
        await second.terminate()


def test_state_dir_follows_systemd_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.config import load_config
    from agent.enrollment import state_dir_of

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "systemd"))
    assert state_dir_of(load_config(None, environ={})) == tmp_path / "systemd"
    chosen = load_config(None, environ={}, overrides={"coordinator.state_dir": str(tmp_path)})
    assert state_dir_of(chosen) == tmp_path
    write_private(tmp_path / "x" / "f", "text")
    assert (tmp_path / "x" / "f").stat().st_mode & 0o777 == 0o600


async def _admin_http(c: Any, method: str, path: str, body: Any = None) -> Any:
    import aiohttp

    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.request(method, f"{c.http_url}/v1/admin{path}", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


async def test_agents_set_fixes_the_place_and_url_and_the_agent_follows(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    enroller = Enroller(
        c.grpc_target, await c.new_token(), state_dir=tmp_path, requested_name="edge-1"
    )
    agent = session(c.grpc_target, enroller)
    await agent.start()
    await wait_until(lambda: agent.connected, message="connected")
    registry = c.app[REGISTRY_KEY]
    assert registry.get("edge-1").hello.http_url == IDENTITY.http_url
    opened = agent.sessions_opened
    fixed = {"site": "hall-2", "lat": 47.0, "lon": 8.0, "http_url": "http://127.0.0.1:8555"}
    body = await _admin_http(c, "PATCH", "/agents/edge-1", fixed)
    assert body["session_ended"] is True and body["http_url"] == fixed["http_url"]
    # Its next Hello (old URL) is refused once; it re-enrolls with its credential to
    # learn the fixed values and comes back with them.
    await wait_until(
        lambda: agent.connected and agent.sessions_opened > opened,
        timeout_s=15,
        message="reconnected with the fixed identity",
    )
    hello = registry.get("edge-1").hello
    assert (hello.site, hello.http_url) == ("hall-2", "http://127.0.0.1:8555")
    assert hello.location is not None and hello.location.lat == 47.0
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["http_url"] == "http://127.0.0.1:8555"
    await agent.stop()


async def test_revoking_a_token_with_agents_revokes_them_and_remove_deletes_the_record(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    token = await c.new_token(max_uses=2)
    kept = await c.new_token()
    agents = []
    for name, join in (("a1", token), ("a2", token), ("keep", kept)):
        enroller = Enroller(c.grpc_target, join, state_dir=tmp_path / name, requested_name=name)
        agents.append(session(c.grpc_target, enroller))
        await agents[-1].start()
    await wait_until(lambda: all(a.connected for a in agents), message="all connected")
    token_id = token.split("_", 1)[1].split(".")[0]
    plain = await _admin_http(c, "DELETE", f"/tokens/{kept.split('_', 1)[1].split('.')[0]}")
    assert "revoked_agents" not in plain  # revoking a token alone leaves its agents
    body = await _admin_http(c, "DELETE", f"/tokens/{token_id}?agents=true")
    assert sorted(body["revoked_agents"]) == ["a1", "a2"]
    await wait_until(
        lambda: not agents[0].connected and not agents[1].connected, message="sessions ended"
    )
    await asyncio.sleep(0.5)  # they retry and are refused
    assert not agents[0].connected and "revoked" in (agents[0].last_error or "")
    assert agents[2].connected
    removed = await _admin_http(c, "DELETE", "/agents/a1")
    assert removed["removed"] is True
    assert await c.app[STORE_KEY].get_agent("a1") is None
    # Its id stays refused (even where enrollment is optional), until enrolled again.
    await asyncio.sleep(0.5)
    assert not agents[0].connected and "removed" in (agents[0].last_error or "")
    for a in agents:
        await a.stop()


@pytest.mark.slow
async def test_the_cli_sets_revokes_and_removes_agents(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator()
    await Enroller(
        c.grpc_target, await c.new_token(), state_dir=tmp_path, requested_name="e1"
    ).ensure()

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "coordinator", "agents", *args, "--url", c.http_url],
            env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": TEST_ADMIN_TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await cli("set", "e1", "--site", "hall-9", "--http-url", "http://10.0.0.9:8000")
    assert done.returncode == 0, done.stderr
    stored = await c.app[STORE_KEY].get_agent("e1")
    assert stored is not None and (stored.site, stored.http_url) == (
        "hall-9",
        "http://10.0.0.9:8000",
    )
    assert (await cli("revoke", "e1")).returncode == 0
    assert (await c.app[STORE_KEY].get_agent("e1")).revoked  # type: ignore[union-attr]
    assert (await cli("remove", "e1")).returncode == 0
    assert await c.app[STORE_KEY].get_agent("e1") is None
    missing = await cli("revoke", "e1")
    assert missing.returncode == 1 and "unknown agent 'e1'" in missing.stderr


def test_credentials_saved_by_a_legacy_enrollment_still_load(tmp_path: Path) -> None:
    """Before v1.2 the coordinator made the key and the agent kept it in enrollment.json."""
    key = new_key_pem()
    legacy = {
        "agent_id": "old-1",
        "site": "lab",
        "token": "t",
        "ca_cert_pem": "",
        "client_cert_pem": "",
        "client_key_pem": key,
    }
    write_private(tmp_path / STATE_FILE, json.dumps(legacy))
    loaded = Enroller("127.0.0.1:1", "", state_dir=tmp_path).load()
    assert loaded is not None and loaded.agent_id == "old-1" and loaded.client_key_pem == key
