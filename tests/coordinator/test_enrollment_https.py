"""Enrollment gives the agent its HTTPS certificate: issued for the host of the URL fixed at
enrollment, written by the agent into its state dir, served by the agent's HTTPS API.

An agent process on 127.0.0.2 is not "beyond loopback", so this runs at the function level:
a real coordinator in process, the agent's enroll-before-serve step, the agent's HTTPS
server on the files enrollment wrote (``server.tls = on``), the openai SDK trusting the
fleet CA.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from pathlib import Path

import httpx2
import openai
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from agent.__main__ import enroll_before_serving, start_http
from agent.api.app import create_app
from agent.config import load_config
from agent.https import build_server_context, server_cert_files
from edgefleet.tls import agent_server_name
from tests.coordinator.coordinator_testing import MakeCoordinator
from tests.coordinator.store_backends import on_both_stores

# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores

TINY = "tiny-llama"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _names(cert_pem: str) -> tuple[set[str], set[str], set[x509.ObjectIdentifier]]:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return ips, set(sans.get_values_for_type(x509.DNSName)), set(usages)


def _chat(base_url: str, ca_file: Path) -> str:
    with openai.OpenAI(
        base_url=base_url + "/v1", api_key="unused", max_retries=0,
        http_client=httpx2.Client(verify=ssl.create_default_context(cafile=str(ca_file))),
    ) as client:  # fmt: skip
        reply = client.chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    return str(reply.choices[0].message.content)


async def test_enrollment_writes_the_https_certificate_the_agent_serves(
    make_coordinator: MakeCoordinator, tmp_path: Path, tiny_artifacts: Path
) -> None:
    c = await make_coordinator()
    port = _free_port()
    url = f"https://127.0.0.1:{port}"
    token = await c.new_token(site="lab", http_url=url)
    state = tmp_path / "state"
    server = {"host": "127.0.0.1", "port": port, "tls": "on"}
    config = load_config(
        environ={},
        overrides={
            "server": server,
            "identity": {"agent_id": "edge-https", "site": "lab"},
            "coordinator": {"target": c.grpc_target, "join_token": token, "state_dir": str(state)},
        },
    )
    # No certificate yet: the agent enrolls before its HTTP server starts.
    assert not (state / "agent.crt").exists()
    enroller = await enroll_before_serving(config)
    assert enroller is not None and enroller.credentials is not None
    assert enroller.credentials.http_url == url
    assert (state / "agent.key").stat().st_mode & 0o777 == 0o600
    cert_pem = (state / "agent.crt").read_text()
    assert (state / "ca.pem").read_text() == enroller.credentials.ca_cert_pem
    assert cert_pem == enroller.credentials.client_cert_pem
    ips, dns, usages = _names(cert_pem)
    assert ipaddress.ip_address("127.0.0.1") in {ipaddress.ip_address(i) for i in ips}
    assert agent_server_name("edge-https") in dns
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= usages
    assert not list(state.glob("*.tmp"))
    # With a certificate in place, a restart does not enroll again.
    assert await enroll_before_serving(config) is None

    # The agent's HTTPS server on those files (the app itself without a coordinator, so
    # that no API key is needed for this request: keys are tested elsewhere).
    files = server_cert_files(config)
    assert files is not None and files.cert == state / "agent.crt"
    serving = load_config(
        environ={},
        overrides={
            "server": server,
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"intra_op_threads": 1},
            "coordinator": {"state_dir": str(state)},
        },
    )
    runner = await start_http(serving, create_app(serving), build_server_context(config, files))
    try:
        assert isinstance(await asyncio.to_thread(_chat, url, state / "ca.pem"), str)

        # Renewal (re-enrollment with the agent's credential) names the host again and
        # rewrites the files the server reloads.
        renewed = await enroller.refresh()
        assert renewed.client_cert_pem != cert_pem
        assert (state / "agent.crt").read_text() == renewed.client_cert_pem
        ips, dns, usages = _names(renewed.client_cert_pem)
        assert "127.0.0.1" in ips and agent_server_name("edge-https") in dns
        assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    finally:
        await runner.cleanup()


async def test_a_token_without_a_url_gives_a_client_only_certificate(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    from agent.enrollment import Enroller

    c = await make_coordinator()
    state = tmp_path / "state"
    enroller = Enroller(
        c.grpc_target, await c.new_token(), state_dir=state, requested_name="edge-plain"
    )
    credentials = await enroller.ensure()
    _, _, usages = _names(credentials.client_cert_pem)
    assert ExtendedKeyUsageOID.SERVER_AUTH not in usages
    # the files are written all the same (the session and peers use them)
    assert (state / "agent.crt").read_text() == credentials.client_cert_pem
    assert (state / "agent.key").stat().st_mode & 0o777 == 0o600
