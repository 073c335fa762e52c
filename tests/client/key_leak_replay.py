"""Replay of the client-library key leak: a route answer naming an attacker's HTTP server.

The attacker runs a plain-HTTP server that records every ``Authorization`` header and
answers like an agent; a fake route answer (what a rogue route entry or mDNS responder
says) names it. Run as a script against any tree (``PYTHONPATH=TREE python
tests/client/key_leak_replay.py``) to measure the "before": it prints how many requests
carrying the key reached the attacker.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

SECRET = "sk-edgefleet-replay-secret"


@contextmanager
def serving(app: web.Application, ssl_context: Any = None) -> Iterator[str]:
    """``app`` on a loopback port in a background thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    ready = threading.Event()
    url: list[str] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = runner.addresses[0][1]
        url.append(f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}")
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    ready.wait(10)
    try:
        yield url[0]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def attacker_app(received: list[str]) -> web.Application:
    async def anything(request: web.Request) -> web.Response:
        received.append(request.headers.get("Authorization", ""))
        body = {
            "id": "x", "object": "chat.completion", "created": 0, "model": "tiny-llama",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "stolen"}}],
        }  # fmt: skip
        return web.json_response(body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


def route_app(agents: list[dict[str, str]]) -> web.Application:
    async def route(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"agents": agents}), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/route", route)
    return app


def ask(coordinator_url: str, **client_kwargs: Any) -> str:
    """One chat completion through FleetClient with the secret key; the reply or the error."""
    from edgefleet_client import FleetClient

    accepted = inspect.signature(FleetClient).parameters
    kwargs = {k: v for k, v in client_kwargs.items() if k in accepted}
    fleet = FleetClient("tiny-llama", coordinator_url=coordinator_url, **kwargs)
    try:
        with fleet.openai(api_key=SECRET) as client:
            reply = client.chat.completions.create(
                model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            return str(reply.choices[0].message.content)
    except Exception as exc:  # the replay reports whatever the client said
        return f"{type(exc).__name__}: {exc}"


def main() -> None:
    received: list[str] = []
    with serving(attacker_app(received)) as attacker:
        answer = [{"agent_id": "edge-1", "http_url": attacker, "site": "default"}]
        with serving(route_app(answer)) as coordinator:
            outcome = ask(coordinator)
    leaked = sum(1 for h in received if SECRET in h)
    print(
        json.dumps({"requests_at_attacker": len(received), "with_key": leaked, "outcome": outcome})
    )


if __name__ == "__main__":
    main()


def write_agent_cert(ca: Any, directory: Any, agent_id: str, host: str = "127.0.0.1") -> Any:
    """Issue ``agent_id`` a fleet certificate for ``host``; its files (edgefleet.tls.CertFiles)."""
    from edgefleet.tls import CertFiles, write_atomically

    issued = ca.issue_client(agent_id, server_names=[host])
    files = CertFiles(directory / f"{agent_id}.crt", directory / f"{agent_id}.key")
    write_atomically(files.key, issued.key_pem, private=True)
    write_atomically(files.cert, issued.cert_pem)
    return files
