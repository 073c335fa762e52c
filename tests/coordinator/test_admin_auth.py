"""The admin API's gate: every route but the public ones refuses a caller without the token.

Routes are enumerated from the app's own router, so a route added later (anywhere)
is checked too: either it is listed in PUBLIC here, or it must refuse.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.app import create_app
from coordinator.app_keys import TOKENS_KEY
from coordinator.config import CoordinatorConfig

pytestmark = pytest.mark.timeout(30)

ADMIN_TOKEN = "s3cret-admin-token"
# Open to anyone: reading the fleet, route lookups, health and metrics.
PUBLIC = {
    (method, path)
    for path in ("/v1/agents", "/v1/agents/{agent_id}", "/v1/route", "/healthz", "/metrics")
    for method in ("GET", "HEAD")
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def from_address(remote: str) -> Any:
    """Outermost middleware: the request seems to come from ``remote`` (as behind a proxy)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request.clone(remote=remote))

    return middleware


class Running:
    def __init__(self, app: web.Application, server: TestServer) -> None:
        self.app, self.server = app, server

    def guarded_routes(self) -> list[tuple[str, str]]:
        """(method, path with sample parameters) of every non-public route."""
        routes = []
        for route in self.app.router.routes():
            resource = route.resource
            assert resource is not None
            if (route.method, resource.canonical) in PUBLIC:
                continue
            path = resource.canonical.replace("{agent_id}", "edge-1").replace("{token_id}", "t1")
            path = path.replace("{key_id}", "k1")
            assert "{" not in path, f"give {resource.canonical} a sample parameter here"
            routes.append((route.method, path))
        return routes

    async def call(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, str(self.server.make_url(path)), headers=headers) as response,
        ):
            body = None if method == "HEAD" else await response.json()
            return response.status, body


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    servers: list[TestServer] = []

    async def make(*, remote: str | None = None, **settings: Any) -> Running:
        config = CoordinatorConfig(
            grpc_port=0, http_port=0, enroll_port=0,
            data_dir=str(tmp_path / f"c{len(servers)}"), **settings,
        )  # fmt: skip
        app = create_app(config)
        if remote is not None:
            app.middlewares.insert(0, from_address(remote))
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return Running(app, server)

    yield make
    for server in servers:
        await server.close()


async def test_the_admin_routes_are_the_guarded_ones(
    start: Callable[..., Awaitable[Running]],
) -> None:
    """The enumeration the other tests use is not vacuous: it finds the admin API."""
    guarded = (await start()).guarded_routes()
    assert ("POST", "/v1/admin/tokens") in guarded
    assert ("POST", "/v1/admin/agents/edge-1/drain") in guarded
    assert all(path.startswith("/v1/admin/") for _, path in guarded)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-token",
        f"Basic {ADMIN_TOKEN}",
        f"Bearer {ADMIN_TOKEN}x",
        "Bearer sécret-ünicode",  # not ASCII: still a plain 401, not a crash
    ],
    ids=["missing", "wrong", "not-bearer", "longer", "non-ascii"],
)
async def test_every_guarded_route_refuses_a_missing_or_wrong_token(
    start: Callable[..., Awaitable[Running]], authorization: str | None
) -> None:
    c = await start(admin_token=ADMIN_TOKEN)
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in c.guarded_routes():
        status, body = await c.call(method, path, headers)
        assert status == 401, (method, path, body)
        if body is not None:
            assert body["error"]["code"] == "invalid_admin_token"
            assert body["error"]["type"] == "authentication_error"
            assert ADMIN_TOKEN not in str(body)
    assert c.app[TOKENS_KEY].list() == []  # the refused POSTs did nothing


async def test_the_right_token_is_let_through_on_every_guarded_route(
    start: Callable[..., Awaitable[Running]],
) -> None:
    c = await start(admin_token=ADMIN_TOKEN, remote="203.0.113.7")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for method, path in c.guarded_routes():
        status, body = await c.call(method, path, headers)
        # Past the gate: the handler answers (404 for the sample agent / token ids).
        assert status not in (401, 403), (method, path, body)
    assert len(c.app[TOKENS_KEY].list()) == 1


async def test_without_an_admin_token_only_loopback_callers_get_in(
    start: Callable[..., Awaitable[Running]],
) -> None:
    remote = await start(remote="203.0.113.7")
    for method, path in remote.guarded_routes():
        status, body = await remote.call(method, path, {})
        assert status == 403, (method, path, body)
        if body is not None:
            assert body["error"]["code"] == "admin_loopback_only"
    # The public routes stay open to that caller.
    status, _ = await remote.call("GET", "/v1/agents", {})
    assert status == 200

    local = await start()
    status, body = await local.call("POST", "/v1/admin/tokens", {})
    assert status == 201 and body["token"]
