"""benchmarks/coordinator_scale's lookup client: its answers over a real keep-alive
connection, and the time on the wire (the kernel's receive time of the answer's last
byte), which must leave out how late the client itself got to read it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from benchmarks.coordinator_scale import _Connection

BODY = b'{"agents": [{"agent_id": "a"}]}' + b" " * 70_000  # more than one read


class _Route(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    """A server on threads of its own, so that it answers while the client's loop is
    blocked."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Route)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_answers_come_back_whole_on_one_kept_alive_connection(port: int) -> None:
    connection = await _Connection.open("127.0.0.1", port)
    try:
        for _ in range(3):
            status, body, received_at = await connection.get("127.0.0.1", "/v1/route?model=m")
            assert status == 200
            assert body == BODY
            assert received_at is not None and abs(received_at - time.time()) < 5
    finally:
        connection.close()


async def test_the_wire_time_leaves_out_how_late_the_client_read_the_answer(port: int) -> None:
    connection = await _Connection.open("127.0.0.1", port)
    try:
        await connection.get("127.0.0.1", "/v1/route")  # warm
        blocked_s = 0.3
        send = connection.loop.sock_sendall

        async def send_then_get_descheduled(sock: socket.socket, data: Any) -> None:
            await send(sock, data)
            time.sleep(blocked_s)  # the client not scheduled while the answer comes

        connection.loop.sock_sendall = send_then_get_descheduled  # type: ignore[method-assign]
        sent_at, t0 = time.time(), time.perf_counter()
        _status, body, received_at = await connection.get("127.0.0.1", "/v1/route")
        elapsed = time.perf_counter() - t0
        assert body == BODY
        assert received_at is not None
        assert elapsed >= blocked_s
        assert received_at - sent_at < blocked_s / 2, (received_at - sent_at, elapsed)
    finally:
        connection.close()


async def test_the_kernel_send_time_leaves_out_how_late_the_client_wrote(port: int) -> None:
    """The request's own send time comes from the kernel (SO_TIMESTAMPING): a client kept
    off the CPU before its write reached the kernel does not count it as time on the wire."""
    connection = await _Connection.open("127.0.0.1", port)
    try:
        await connection.get("127.0.0.1", "/v1/route")  # warm
        assert connection.sent_at is not None and abs(connection.sent_at - time.time()) < 5
        blocked_s = 0.3
        send = connection.loop.sock_sendall

        async def get_descheduled_then_send(sock: socket.socket, data: Any) -> None:
            time.sleep(blocked_s)  # the client not scheduled before its write
            await send(sock, data)

        connection.loop.sock_sendall = get_descheduled_then_send  # type: ignore[method-assign]
        meant_at = time.time()
        _status, body, received_at = await connection.get("127.0.0.1", "/v1/route")
        assert body == BODY
        assert received_at is not None and connection.sent_at is not None
        assert connection.sent_at - meant_at >= blocked_s
        assert received_at - connection.sent_at < blocked_s / 2
        # and the error queue was emptied: the socket does not poll readable for nothing
        with pytest.raises(BlockingIOError):
            connection.sock.recvmsg(1, 256, socket.MSG_ERRQUEUE)
    finally:
        connection.close()
