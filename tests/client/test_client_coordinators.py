"""Route lookups given several coordinator URLs: an unreachable one or a 5xx moves on to the
next, a 4xx is final, and the client asks the one that answered first from then on.

The coordinators here are stand-ins on loopback plain HTTP (insecure: no TLS); the real
coordinators, over HTTPS, are in tests/coordinator/test_several_coordinators.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.fleet import free_port
from edgefleet_client import DiscoveryError, FleetClient, route_lookup

ANSWER = {"agents": [{"agent_id": "edge-1", "http_url": "http://127.0.0.1:9", "site": "lab"}]}


@contextmanager
def stand_in(status: int) -> Iterator[tuple[str, list[str]]]:
    """A coordinator answering every route lookup with ``status`` (200: ANSWER); its URL
    and the paths asked."""
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_lookups_move_past_unreachable_and_failing_coordinators_insecure_plain_http() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with stand_in(503) as (failing, failing_asked), stand_in(200) as (good, good_asked):
        # one URL, as always
        assert [a.agent_id for a in route_lookup(good, "m")] == ["edge-1"]
        # a list, or the same comma-separated
        assert [a.agent_id for a in route_lookup([dead, failing, good], "m")] == ["edge-1"]
        assert [a.agent_id for a in route_lookup(f"{dead}, {failing},{good}", "m")] == ["edge-1"]
        assert len(failing_asked) == 2
        with pytest.raises(DiscoveryError, match="503") as info:
            route_lookup([dead, failing], "m")
        assert "cannot reach the coordinator at " + dead in str(info.value)

        fleet = FleetClient(
            "m",
            coordinator_url=[dead, failing, good],
            allow_insecure_agents=True,
            probe_timeout_s=0.2,
        )
        assert fleet.coordinator_url == dead
        fleet.discover()
        assert fleet.coordinator_urls == (good, dead, failing)  # the one that answered first
        asked_before = len(failing_asked)
        fleet.discover()
        assert len(failing_asked) == asked_before  # not asked again while the good one answers
        assert len(good_asked) >= 3


def test_a_4xx_is_final_insecure_plain_http() -> None:
    with stand_in(400) as (refusing, _), stand_in(200) as (good, good_asked):
        with pytest.raises(DiscoveryError, match="400"):
            route_lookup([refusing, good], "m")
        assert good_asked == []
