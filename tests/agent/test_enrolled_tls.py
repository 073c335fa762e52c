"""An agent that enrolls after it started (it serves plain HTTP, so it enrolls in its first
session) uses its enrollment certificate and the fleet CA from then on: the blob fetcher
gets models from a coordinator serving HTTPS, overflow forwards to peers over mutual TLS,
and a renewal's files are used once written, with no restart.

Found by the dashboard rollouts test run with TLS on: its plain-HTTP agent enrolled in its
session, then failed every blob from the coordinator's HTTPS (CERTIFICATE_VERIFY_FAILED)
for as long as it ran: the fetcher's context was made once at start-up, before
enrollment wrote the files, and stayed None."""

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from agent.config import AgentConfig, load_config
from agent.enrollment import CA_FILE
from agent.errors import ModelSyncError
from agent.model_registry import ModelRegistry
from agent.overflow.breaker import BreakerSettings, CircuitBreaker
from agent.overflow.forwarder import Forwarder
from agent.overflow.targets import Target, TargetSet
from agent.overflow.wiring import peer_client_tls
from agent.redaction import Redactor
from agent.sync.fetch import BlobSource
from agent.sync.setup import build_model_sync
from coordinator.identity.ca import CertificateAuthority
from edgefleet.blob_http import send_blob
from edgefleet.contract import OverflowKind, OverflowTarget
from edgefleet.tls import agent_server_name, server_context, write_atomically
from tests.certs import write_agent_cert

pytestmark = pytest.mark.timeout(60)


def agent_config(state_dir: Path) -> AgentConfig:
    """An agent with a coordinator and its state dir, through the real config loader."""
    return load_config(
        environ={
            "EDGEFLEET_AGENT_COORDINATOR__TARGET": "127.0.0.1:9",
            "EDGEFLEET_AGENT_COORDINATOR__STATE_DIR": str(state_dir),
        }
    )


def enroll(ca: CertificateAuthority, state_dir: Path) -> None:
    """What enrollment writes into the state dir: agent.key, agent.crt, ca.pem."""
    write_agent_cert(ca, state_dir, "agent")  # agent.crt, agent.key
    write_atomically(state_dir / CA_FILE, ca.cert_pem)


@pytest.fixture
async def blob_server(
    tmp_path: Path,
) -> AsyncIterator[Callable[[CertificateAuthority], Awaitable[tuple[str, bytes, str]]]]:
    """``await serve(ca)``: (blob URL base, blob, sha256) of an HTTPS blob server with a
    certificate from ``ca`` that requires a client certificate from ``ca`` too."""
    runners: list[web.AppRunner] = []

    async def start(ca: CertificateAuthority) -> tuple[str, bytes, str]:
        data = os.urandom(256 * 1024)
        digest = hashlib.sha256(data).hexdigest()
        path = tmp_path / f"blob-{len(runners)}"
        path.write_bytes(data)

        async def handler(request: web.Request) -> web.StreamResponse:
            return await send_blob(request, path, digest)

        app = web.Application()
        app.router.add_get("/v1/blobs/sha256/{hex}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = server_context(
            write_agent_cert(ca, tmp_path, f"server-{len(runners)}"),
            ca.cert_pem,
            client_certs="required",
        )
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        runners.append(runner)
        return f"https://127.0.0.1:{runner.addresses[0][1]}/v1/blobs", data, digest

    yield start
    for runner in runners:
        await runner.cleanup()


def ignore(n: int, kind: str) -> None:
    pass


async def test_the_blob_fetcher_uses_enrollment_written_after_start_and_renewals(
    tmp_path: Path,
    blob_server: Callable[[CertificateAuthority], Awaitable[tuple[str, bytes, str]]],
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    sync = build_model_sync(agent_config(state), ModelRegistry({}, {}), [])
    fetcher = sync.fetcher
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    base, data, digest = await blob_server(ca)
    try:
        # not enrolled yet: the coordinator's HTTPS cannot be verified
        with pytest.raises(ModelSyncError, match="could not be fetched"):
            await fetcher.fetch(digest, len(data), [BlobSource(base, "coordinator")], ignore)
        enroll(ca, state)  # the first session enrolls
        await fetcher.fetch(digest, len(data), [BlobSource(base, "coordinator")], ignore)
        assert fetcher.store.blob(digest).read_bytes() == data
        # a new CA (and a certificate from it) written over the files: used from then on
        other = CertificateAuthority.load_or_create(tmp_path / "other-ca")
        base, data, digest = await blob_server(other)
        enroll(other, state)
        await fetcher.fetch(digest, len(data), [BlobSource(base, "coordinator")], ignore)
        assert fetcher.store.blob(digest).read_bytes() == data
    finally:
        await fetcher.close()


def test_forwards_to_peers_use_enrollment_written_after_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    forwarder = Forwarder(TargetSet(), Redactor(), peer_ssl=peer_client_tls(agent_config(state)))
    peer = Target(
        OverflowTarget("edge-b", OverflowKind.PEER, "https://127.0.0.1:8443"),
        CircuitBreaker(BreakerSettings()),
    )
    assert "ssl" not in forwarder._post_kwargs(peer, "https://127.0.0.1:8443/v1/completions")
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    enroll(ca, state)
    kwargs = forwarder._post_kwargs(peer, "https://127.0.0.1:8443/v1/completions")
    context = kwargs["ssl"]
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    trusted = [ssl.DER_cert_to_PEM_cert(c) for c in context.get_ca_certs(binary_form=True)]
    assert ca.cert_pem.split() in [t.split() for t in trusted]  # the fleet CA
    assert kwargs["server_hostname"] == agent_server_name("edge-b")  # that peer only
    # unchanged files: the same context, not made again per forward
    assert forwarder._post_kwargs(peer, "https://127.0.0.1:8443/v1/x")["ssl"] is context
