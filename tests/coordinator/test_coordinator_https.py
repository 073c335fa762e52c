"""The coordinator's HTTP port over HTTPS: its own CA's certificate, or the operator's."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from coordinator.identity.ca import CertificateAuthority
from devtools.fleet import CoordinatorProcess
from edgefleet.tls import write_atomically
from edgefleet_client import DiscoveryError, route_lookup


async def _healthz(url: str, context: ssl.SSLContext) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/healthz", ssl=context) as r:
        return r.status


async def test_https_with_a_certificate_from_the_coordinators_ca(tmp_path: Path) -> None:
    async with CoordinatorProcess(
        data_dir=tmp_path / "data", extra_args=["--http-tls", "on", "--tls", "off"]
    ) as coordinator:
        assert coordinator.http_url.startswith("https://")
        ca_pem = (tmp_path / "data" / "ca" / "ca.pem").read_text()
        context = ssl.create_default_context(cadata=ca_pem)
        assert await _healthz(coordinator.http_url, context) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await _healthz(coordinator.http_url, ssl.create_default_context())
        # the client library's route lookups verify it with the fleet CA
        assert route_lookup(coordinator.http_url, "tiny-llama", ssl_context=context) == []
        with pytest.raises(DiscoveryError, match="CERTIFICATE_VERIFY_FAILED"):
            route_lookup(coordinator.http_url, "tiny-llama")
        assert (tmp_path / "data" / "tls" / "http.key").stat().st_mode & 0o077 == 0


async def test_https_with_the_operators_certificate(tmp_path: Path) -> None:
    operator_ca = CertificateAuthority.load_or_create(tmp_path / "operator-ca")
    issued = operator_ca.issue_server(["127.0.0.1"])
    cert, key = tmp_path / "http.crt", tmp_path / "http.key"
    write_atomically(key, issued.key_pem, private=True)
    write_atomically(cert, issued.cert_pem)
    async with CoordinatorProcess(
        data_dir=tmp_path / "data",
        extra_args=[
            "--http-tls", "on", "--tls", "off",
            "--set", f"http_tls_cert_file={cert}", "--set", f"http_tls_key_file={key}",
        ],
    ) as coordinator:  # fmt: skip
        context = ssl.create_default_context(cadata=operator_ca.cert_pem)
        assert await _healthz(coordinator.http_url, context) == 200


async def test_loopback_stays_plain_http_by_default(tmp_path: Path) -> None:
    async with CoordinatorProcess(data_dir=tmp_path / "data") as coordinator:
        assert coordinator.http_url.startswith("http://")
