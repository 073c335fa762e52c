"""Route lookups given several coordinator URLs: an unreachable one or a 5xx moves on to the
next, a 4xx is final, and the client asks the one that answered first from then on.

The coordinators here are stand-ins serving HTTPS with a certificate of a test fleet CA,
which the client trusts as it trusts a real fleet's (``ca_pem``); the real coordinators
are in tests/coordinator/test_several_coordinators.py."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from coordinator.identity.ca import CertificateAuthority
from devtools.fleet import free_port
from edgefleet_client import DiscoveryError, FleetClient, route_lookup
from edgefleet_client._trust import coordinator_ssl_context

ANSWER = {"agents": [{"agent_id": "edge-1", "http_url": "https://127.0.0.1:9", "site": "lab"}]}


@pytest.fixture(scope="module")
def fleet_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The test fleet's CA certificate (PEM), and a server certificate and key for
    127.0.0.1 it issued, in one file."""
    directory = tmp_path_factory.mktemp("fleet-ca")
    ca = CertificateAuthority.load_or_create(directory / "ca")
    issued = ca.issue_server(["127.0.0.1"])
    pair = directory / "server.pem"
    pair.write_text(issued.cert_pem + issued.key_pem)
    return ca.cert_pem, pair


@contextmanager
def stand_in(status: int, server_pem: Path) -> Iterator[tuple[str, list[str]]]:
    """A coordinator over HTTPS answering every route lookup with ``status`` (200:
    ANSWER); its URL and the paths asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps(ANSWER if status == 200 else {"error": "x"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_pem)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_lookups_move_past_unreachable_and_failing_coordinators(
    fleet_ca: tuple[str, Path],
) -> None:
    ca_pem, server_pem = fleet_ca
    trust = coordinator_ssl_context(ca_pem)
    dead = f"https://127.0.0.1:{free_port()}"
    with (
        stand_in(503, server_pem) as (failing, failing_asked),
        stand_in(200, server_pem) as (good, good_asked),
    ):
        # one URL, as always
        assert [a.agent_id for a in route_lookup(good, "m", ssl_context=trust)] == ["edge-1"]
        # a list, or the same comma-separated
        both = route_lookup([dead, failing, good], "m", ssl_context=trust)
        assert [a.agent_id for a in both] == ["edge-1"]
        joined = route_lookup(f"{dead}, {failing},{good}", "m", ssl_context=trust)
        assert [a.agent_id for a in joined] == ["edge-1"]
        assert len(failing_asked) == 2
        with pytest.raises(DiscoveryError, match="503") as info:
            route_lookup([dead, failing], "m", ssl_context=trust)
        assert "cannot reach the coordinator at " + dead in str(info.value)

        fleet = FleetClient(
            "m", coordinator_url=[dead, failing, good], ca_pem=ca_pem, probe_timeout_s=0.2
        )
        assert fleet.coordinator_url == dead
        fleet.discover()
        assert fleet.coordinator_urls == (good, dead, failing)  # the one that answered first
        asked_before = len(failing_asked)
        fleet.discover()
        assert len(failing_asked) == asked_before  # not asked again while the good one answers
        assert len(good_asked) >= 3


def test_a_4xx_is_final(fleet_ca: tuple[str, Path]) -> None:
    ca_pem, server_pem = fleet_ca
    with (
        stand_in(400, server_pem) as (refusing, _),
        stand_in(200, server_pem) as (good, good_asked),
    ):
        with pytest.raises(DiscoveryError, match="400"):
            route_lookup([refusing, good], "m", ssl_context=coordinator_ssl_context(ca_pem))
        assert good_asked == []
