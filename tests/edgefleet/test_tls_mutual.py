"""Agent-to-agent mutual TLS with edgefleet.tls: a real aiohttp server and client."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from coordinator.identity.ca import CertificateAuthority
from edgefleet.tls import (
    agent_client_context,
    agent_server_name,
    fleet_client_context,
    peer_agent_id,
    server_context,
)
from tests.certs import write_agent_cert


async def _serve(context: ssl.SSLContext) -> tuple[web.AppRunner, str]:
    async def whoami(request: web.Request) -> web.Response:
        return web.json_response({"peer": peer_agent_id(request.transport)})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    return runner, f"https://127.0.0.1:{runner.addresses[0][1]}/whoami"


async def test_mutual_tls_between_two_agents_refuses_a_client_without_a_fleet_cert(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    server_files, client_files = (
        write_agent_cert(ca, tmp_path, "edge-a"),
        write_agent_cert(ca, tmp_path, "edge-b"),
    )
    runner, url = await _serve(server_context(server_files, ca.cert_pem, client_certs="required"))
    try:
        peer = agent_client_context(client_files, ca.cert_pem)
        async with aiohttp.ClientSession() as http:
            # the server learns who called; the caller checked it reached edge-a
            async with http.get(url, ssl=peer, server_hostname=agent_server_name("edge-a")) as r:
                assert (await r.json()) == {"peer": "edge-b"}
            # expecting another agent at that address: refused in the handshake
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(url, ssl=peer, server_hostname=agent_server_name("edge-c"))
            # a client that verifies the server but has no fleet certificate: refused
            with pytest.raises(aiohttp.ClientError):
                async with http.get(url, ssl=fleet_client_context(ca.cert_pem)) as r:
                    await r.read()
            # a certificate from another CA: refused too
            other = CertificateAuthority.load_or_create(tmp_path / "other-ca")
            rogue = agent_client_context(
                write_agent_cert(other, tmp_path, "edge-rogue"), ca.cert_pem
            )
            with pytest.raises(aiohttp.ClientError):
                async with http.get(url, ssl=rogue) as r:
                    await r.read()
            # honest traffic still served afterwards
            async with http.get(url, ssl=peer) as r:
                assert (await r.json()) == {"peer": "edge-b"}
    finally:
        await runner.cleanup()


def test_agent_certificate_is_client_and_server_for_its_url_host(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    cert = x509.load_pem_x509_certificate(
        ca.issue_client("edge-1", server_names=["10.0.0.7", "edge1.lan"]).cert_pem.encode()
    )
    usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert san.get_values_for_type(x509.DNSName) == ["edge1.lan", agent_server_name("edge-1")]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["edgefleet://agent/edge-1"]
    # without server_names: a client certificate only, as before
    plain = x509.load_pem_x509_certificate(ca.issue_client("edge-2").cert_pem.encode())
    eku = plain.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
