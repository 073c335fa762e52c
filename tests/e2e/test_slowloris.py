"""Slowloris on both HTTP servers: a request head or body sent at 1 byte/s is cut off
within the configured bound, connections beyond the cap get 503, and honest requests keep
being answered throughout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess

pytestmark = pytest.mark.timeout(120)

TINY = "tiny-llama"
HEADER_S, BODY_S, MAX_CONN = 2.0, 3.0, 40
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


def body_head(path: str) -> bytes:
    """A complete request head for ``path`` announcing a 1000-byte JSON body."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()


async def held_open_s(host: str, port: int, first: bytes, *, give_up_s: float) -> float:
    """Send ``first``, then one byte a second; seconds until the server closes the socket."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(first)
    try:
        while time.monotonic() - started < give_up_s:
            writer.write(b"x")
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(4096), 1.0) == b"":
                    break
            except TimeoutError:
                continue
            # a response (the 408) came: wait for the close after it
            while await asyncio.wait_for(reader.read(4096), give_up_s) != b"":
                pass
            break
    except (ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()
    return time.monotonic() - started


async def honest_ok(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as response:
        return response.status == 200


async def replay(
    url: str, post_path: str, *, header_s: float, body_s: float, max_conn: int
) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    give_up = 30.0
    # 20 slow heads and 10 slow bodies, honest requests in between
    slow = [held_open_s(host, int(port), HEAD, give_up_s=give_up) for _ in range(20)]
    slow += [
        held_open_s(host, int(port), body_head(post_path), give_up_s=give_up) for _ in range(10)
    ]
    tasks = [asyncio.ensure_future(s) for s in slow]
    honest = 0
    while not all(t.done() for t in tasks):
        assert await honest_ok(url)
        honest += 1
        await asyncio.sleep(0.5)
    held = [t.result() for t in tasks]
    heads, bodies = held[:20], held[20:]
    print(f"{url}: heads held {max(heads):.1f} s, bodies {max(bodies):.1f} s, honest {honest}")
    # Cut, not held: a connection the server never cuts is held here until give_up (30 s).
    # Cut within the configured bound, plus aiohttp's 1 s timer granularity and its 2 s
    # linger, plus slack for a loaded machine (10 s: generous, well short of give_up).
    assert max(heads) < header_s + 10 < give_up, heads
    assert max(bodies) < header_s + body_s + 10 < give_up, bodies
    assert honest >= 3

    # connections beyond the cap: 503 and closed; honest traffic served once they go
    conns = [await asyncio.open_connection(host, int(port)) for _ in range(max_conn + 10)]
    refused = 0
    for reader, _writer in conns[max_conn:]:
        data = await asyncio.wait_for(reader.read(4096), 5)
        refused += data.startswith(b"HTTP/1.1 503")
    assert refused == 10
    for _reader, writer in conns:
        writer.close()
    await asyncio.sleep(0.2)
    assert await honest_ok(url)


async def test_coordinator_cuts_slow_heads_and_bodies_and_caps_connections() -> None:
    limits = [
        f"--set=http_header_timeout_s={HEADER_S}",
        f"--set=http_body_timeout_s={BODY_S}",
        f"--set=http_max_connections={MAX_CONN}",
    ]
    async with CoordinatorProcess(extra_args=limits) as coordinator:
        await replay(
            coordinator.http_url,
            "/v1/admin/tokens",
            header_s=HEADER_S,
            body_s=BODY_S,
            max_conn=MAX_CONN,
        )


async def test_agent_cuts_slow_heads_and_bodies_and_caps_connections(
    tiny_artifacts: Path,
) -> None:
    limits = [
        f"--set=server.header_timeout_s={HEADER_S}",
        f"--set=server.body_timeout_s={BODY_S}",
        f"--set=server.max_connections={MAX_CONN}",
    ]
    agent = AgentProcess(models_dir=str(tiny_artifacts), serve=[TINY], extra_args=limits)
    async with agent:
        await replay(
            agent.url, "/v1/chat/completions", header_s=HEADER_S, body_s=BODY_S, max_conn=MAX_CONN
        )
