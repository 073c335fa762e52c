"""Admin roles: every route names its role, every guarded route refuses a caller without
a good enough token, loopback is no credential, and admin actions are audited.

Routes are enumerated from the app's own router, so a route added later (anywhere) is
checked too: it must be in the role table (``route_roles``) and the OpenAPI document.

The tests whose outcome the store decides (tokens minted, revoked and checked, every admin
handler past the gate, the audit log and its append-only guard, a token minted by the CLI
on the database used by a running coordinator) run on SQLite and on PostgreSQL
(``ON_BOTH``); the gate's own refusals, SQLite's run only.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.access.admin_tokens import AdminTokens, Role
from coordinator.api.app_keys import TOKENS_KEY
from coordinator.api.openapi import documented_routes
from coordinator.api.routes import api_document, route_roles
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.sqlite import DB_FILE
from devtools.fleet import CoordinatorProcess
from tests.coordinator.store_backends import BACKENDS, StoreFactory, backend, store_factory
from tests.postgres_cluster import PostgresCluster

pytestmark = pytest.mark.timeout(60)
__all__ = ["backend", "store_factory"]  # fixtures
#: ``start`` on each store backend (indirect: the fixture makes the database).
ON_BOTH = pytest.mark.parametrize("start", BACKENDS, indirect=True)

ADMIN_TOKEN = "s3cret-admin-token-of-32-chars-at-least"
REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {("GET", "/v1/route"), ("GET", "/healthz"), ("GET", "/openapi.json")} | {
    # The dashboard's page and files, and its sign-in/out (coordinator.api.dashboard).
    ("GET", "/dashboard/"), ("GET", "/dashboard/{name}"), ("GET", "/dashboard/vendor/{name}"),
    ("POST", "/v1/dashboard/session"), ("DELETE", "/v1/dashboard/session"),
}  # fmt: skip
SAMPLE_SHA256 = "0" * 64
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def from_address(remote: str) -> Any:
    """Outermost middleware: the request seems to come from ``remote`` (as behind a proxy)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request.clone(remote=remote))

    return middleware


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Running:
    def __init__(self, app: web.Application, server: TestServer, config: CoordinatorConfig) -> None:
        self.app, self.server, self.config = app, server, config

    def routes(self) -> list[tuple[str, str]]:
        return sorted(
            {
                ("GET" if r.method == "HEAD" else r.method, r.resource.canonical)
                for r in self.app.router.routes()
                if r.resource is not None
            }
        )

    def guarded_routes(self) -> list[tuple[str, str]]:
        """(method, path with sample parameters) of every non-public route."""
        out = []
        for method, canonical in self.routes():
            if (method, canonical) in PUBLIC:
                continue
            path = canonical.replace("{agent_id}", "edge-1").replace("{token_id}", "t1")
            path = (
                path.replace("{key_id}", "k1")
                .replace("{name}", "m")
                .replace("{version}", "v")
                .replace("{rollout_id}", "ro-1")
                .replace("{model}", "m")
            )
            path = path.replace("{sha256}", SAMPLE_SHA256)
            assert "{" not in path, f"give {canonical} a sample parameter here"
            out.append((method, path))
        return out

    async def call(
        self, method: str, path: str, headers: dict[str, str], body: Any = None
    ) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, str(self.server.make_url(path)), headers=headers, json=body
            ) as response,
        ):
            if response.content_type == "application/json":
                return response.status, await response.json()
            if response.content_type == "text/event-stream":  # a live stream: its first event
                return response.status, await response.content.readline()
            return response.status, await response.text()


@pytest.fixture
async def start(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """``start(**settings)``: a coordinator in-process; on PostgreSQL (``ON_BOTH``) each on
    a fresh database of the test cluster."""
    servers: list[TestServer] = []
    cluster: PostgresCluster | None = None
    if getattr(request, "param", "sqlite") == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")

    async def make(*, remote: str | None = None, **settings: Any) -> Running:
        if cluster is not None:
            settings.setdefault("store_url", cluster.create_database())
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
        return Running(app, server, config)

    yield make
    for server in servers:
        await server.close()


async def test_every_route_declares_a_role_and_is_documented(
    start: Callable[..., Awaitable[Running]],
) -> None:
    c = await start(admin_token=ADMIN_TOKEN)
    table = route_roles()
    document = api_document()
    for method, path in c.routes():
        assert (method, path) in table, f"{method} {path} declares no role in route_roles()"
        assert (method, path) in documented_routes(), f"{method} {path} is not in the OpenAPI"
        operation = document["paths"][path][method.lower()]
        role = table[(method, path)]
        assert operation["x-role"] == (None if role is None else role.label)
    assert {k for k, v in table.items() if v is None} == PUBLIC
    assert set(table) == set(c.routes())
    # The enumeration is not vacuous: it finds the admin API and the fleet view.
    guarded = c.guarded_routes()
    assert ("POST", "/v1/admin/tokens") in guarded and ("GET", "/v1/agents") in guarded
    assert ("GET", "/metrics") in guarded
    status, served = await c.call("GET", "/openapi.json", {})
    assert status == 200 and served["paths"].keys() == document["paths"].keys()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-token",
        f"Basic {ADMIN_TOKEN}",
        f"Bearer {ADMIN_TOKEN}x",
        f"Bearer {ADMIN_TOKEN[:-1]}",
        "Bearer x",  # a 1-character token
        "Bearer sécret-ünicode",  # not ASCII: still a plain 401, not a crash
    ],
    ids=["missing", "wrong", "not-bearer", "longer", "shorter", "one-char", "non-ascii"],
)
async def test_every_guarded_route_refuses_a_missing_or_wrong_token(
    start: Callable[..., Awaitable[Running]], authorization: str | None
) -> None:
    c = await start(admin_token=ADMIN_TOKEN)
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in c.guarded_routes():
        status, body = await c.call(method, path, headers)
        assert status == 401, (method, path, body)
        if isinstance(body, dict):
            assert body["error"]["code"] == "invalid_admin_token"
            assert body["error"]["type"] == "authentication_error"
            assert ADMIN_TOKEN not in str(body)
    assert await c.app[TOKENS_KEY].list() == []  # the refused POSTs did nothing
    # Honest traffic kept being served.
    assert (await c.call("GET", "/v1/agents", bearer(ADMIN_TOKEN)))[0] == 200
    assert (await c.call("GET", "/v1/route?model=m", {}))[0] == 200


async def test_loopback_is_no_credential(start: Callable[..., Awaitable[Running]]) -> None:
    """Before: with no admin token set every loopback client was admin (201 here)."""
    local = await start()  # no bootstrap token, caller on 127.0.0.1
    for method, path in local.guarded_routes():
        status, body = await local.call(method, path, {})
        assert status == 401, (method, path, body)
    assert await local.app[TOKENS_KEY].list() == []
    # The public routes stay open.
    for path in ("/healthz", "/v1/route?model=m", "/openapi.json"):
        assert (await local.call("GET", path, {}))[0] == 200


@ON_BOTH
async def test_the_right_token_is_let_through_on_every_guarded_route(
    start: Callable[..., Awaitable[Running]],
) -> None:
    c = await start(admin_token=ADMIN_TOKEN, remote="203.0.113.7")
    for method, path in c.guarded_routes():
        status, body = await c.call(method, path, bearer(ADMIN_TOKEN))
        # Past the gate: the handler answers (400 for an empty mint, 404 for sample ids).
        assert status not in (401, 403), (method, path, body)
    assert len(await c.app[TOKENS_KEY].list()) == 1


@ON_BOTH
async def test_roles_viewer_operator_admin(start: Callable[..., Awaitable[Running]]) -> None:
    c = await start(admin_token=ADMIN_TOKEN)
    tokens = {}
    for label in ("viewer", "operator", "admin"):
        status, body = await c.call(
            "POST", "/v1/admin/admin-tokens", bearer(ADMIN_TOKEN), {"role": label, "name": label}
        )
        assert status == 201 and body["role"] == label and body["token"].startswith("efa_")
        tokens[label] = body["token"]
    table = route_roles()
    for role_name, token in tokens.items():
        role = Role.parse(role_name)
        for method, path in c.guarded_routes():
            canonical = next(
                k for k in table if k[0] == method and
                k[1].replace("{agent_id}", "edge-1").replace("{token_id}", "t1")
                .replace("{key_id}", "k1").replace("{name}", "m").replace("{version}", "v")
                .replace("{sha256}", SAMPLE_SHA256).replace("{rollout_id}", "ro-1")
                .replace("{model}", "m") == path
            )  # fmt: skip
            needed = table[canonical]
            assert needed is not None
            status, body = await c.call(method, path, bearer(token), {})
            if role >= needed:
                assert status not in (401, 403), (role_name, method, path, body)
            else:
                assert status == 403, (role_name, method, path, body)
                assert body["error"]["code"] == "insufficient_role"
    status, body = await c.call("GET", "/v1/admin/whoami", bearer(tokens["operator"]))
    assert body["role"] == "operator" and body["name"] == "operator"
    # Revoked: refused from then on.
    viewer_id = tokens["viewer"].split("_")[1].split(".")[0]
    assert (await c.call("DELETE", f"/v1/admin/admin-tokens/{viewer_id}",
                         bearer(tokens["admin"])))[0] == 200  # fmt: skip
    assert (await c.call("GET", "/v1/agents", bearer(tokens["viewer"])))[0] == 401
    assert (await c.call("GET", "/v1/agents", bearer(tokens["operator"])))[0] == 200


@ON_BOTH
async def test_audit_records_who_what_where_and_outcome(
    start: Callable[..., Awaitable[Running]], tmp_path: Path
) -> None:
    c = await start(admin_token=ADMIN_TOKEN, remote="198.51.100.9")
    status, minted = await c.call(
        "POST", "/v1/admin/admin-tokens", bearer(ADMIN_TOKEN), {"role": "operator", "name": "ops"}
    )
    assert status == 201
    assert (await c.call("POST", "/v1/admin/agents/ghost/drain", bearer(minted["token"])))[0] == 404
    assert (await c.call("POST", "/v1/admin/tokens", bearer(minted["token"]), {}))[0] == 403
    assert (await c.call("POST", "/v1/admin/tokens", {}, {}))[0] == 401
    status, text = await c.call("GET", "/v1/admin/audit?format=jsonl", bearer(minted["token"]))
    assert status == 200
    entries = [json.loads(line) for line in text.splitlines()]
    assert [(e["action"], e["actor_name"], e["outcome"], e["status"]) for e in entries] == [
        ("POST /v1/admin/admin-tokens", "bootstrap", "ok", 201),
        ("POST /v1/admin/agents/{agent_id}/drain", "ops", "failed", 404),
        ("POST /v1/admin/tokens", "ops", "refused", 403),
        ("POST /v1/admin/tokens", "", "refused", 401),
    ]
    assert all(e["peer"] == "198.51.100.9" for e in entries)
    assert entries[1]["target"] == "agent_id=ghost" and entries[1]["role"] == "operator"
    assert minted["token"] not in text and ADMIN_TOKEN not in text
    # Append-only, in the database itself.
    url = c.config.store_url
    statements = ("UPDATE audit_log SET outcome = 'ok'", "DELETE FROM audit_log")
    if not url:
        db = sqlite3.connect(tmp_path / "c0" / DB_FILE)
        for sql in statements:
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(sql)
        db.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:  # as the database's owner
            for sql in (*statements, "TRUNCATE audit_log"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                    pg.execute(sql)
    # The CLI exports the same JSON lines.
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "audit", "export", "--data-dir",
         str(tmp_path / "c0")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "EDGEFLEET_COORDINATOR_STORE_URL": url},
    )  # fmt: skip
    assert [json.loads(line)["seq"] for line in done.stdout.splitlines()] == [
        e["seq"] for e in entries
    ]


def test_a_short_bootstrap_token_is_refused() -> None:
    for short in ("x", "s3cret-admin-token"):
        with pytest.raises(ValueError, match="at least 32"):
            CoordinatorConfig(admin_token=short)


@pytest.mark.slow
def test_the_admin_token_flag_is_refused() -> None:
    for args in (["--admin-token", ADMIN_TOKEN], ["--set", f"admin_token={ADMIN_TOKEN}"]):
        done = subprocess.run(
            [sys.executable, "-m", "coordinator", *args], cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 2
        assert "/proc/PID/cmdline" in done.stderr and "ADMIN_TOKEN" in done.stderr
    from coordinator.config import load_config

    with pytest.raises(ConfigError, match="cannot be given as a flag"):
        load_config(environ={}, overrides={"admin_token": ADMIN_TOKEN})


def test_admin_token_file(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text(ADMIN_TOKEN + "\n")
    path.chmod(0o600)
    assert CoordinatorConfig(admin_token_file=str(path)).bootstrap_admin_token() == ADMIN_TOKEN
    path.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 32"):
        CoordinatorConfig(admin_token_file=str(path)).bootstrap_admin_token()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_running_coordinator_keeps_its_token_out_of_its_command_line(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Before: ``--admin-token TOKEN`` put it in /proc/PID/cmdline for every local user."""
    env = {}
    if backend == "postgres":
        env["EDGEFLEET_COORDINATOR_STORE_URL"] = request.getfixturevalue("postgres_url")
    async with CoordinatorProcess(data_dir=tmp_path / "data", env=env) as coordinator:
        cmdline = Path(f"/proc/{coordinator.pid}/cmdline").read_bytes()
        assert coordinator.admin_token.encode() not in cmdline
        assert (await coordinator.get_json("/v1/admin/whoami"))["role"] == "admin"
        # A token minted by the CLI on the database works at once on the running process.
        done = subprocess.run(
            [sys.executable, "-m", "coordinator", "admin-tokens", "mint", "--role", "viewer",
             "--name", "grafana", "--data-dir", str(tmp_path / "data"), "--json"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True,
            env={**os.environ, **env},
        )  # fmt: skip
        viewer = json.loads(done.stdout)["token"]
        async with aiohttp.ClientSession(headers=bearer(viewer)) as http:
            async with http.get(coordinator.http_url + "/metrics") as response:
                assert response.status == 200
            async with http.post(coordinator.http_url + "/v1/admin/tokens", json={}) as response:
                assert response.status == 403
        async with (
            aiohttp.ClientSession() as http,
            http.get(coordinator.http_url + "/v1/agents") as response,
        ):
            assert response.status == 401


async def test_admin_tokens_table_keeps_only_digests(
    store_factory: StoreFactory, backend: str, tmp_path: Path
) -> None:
    store = store_factory()
    await store.open()
    try:
        tokens = AdminTokens(store)
        minted = await tokens.mint(Role.ADMIN, "ci")
        if backend == "sqlite":
            raw = (tmp_path / DB_FILE).read_bytes() + (tmp_path / (DB_FILE + "-wal")).read_bytes()
        else:  # every row of the table as text, every column
            assert isinstance(store, PostgresFleetStore)
            with psycopg.connect(store.url) as pg:
                rows = pg.execute("SELECT t::text FROM admin_tokens AS t").fetchall()
            raw = "".join(row[0] for row in rows).encode()
            assert minted.record.token_id in raw.decode()  # the rows are there
        assert minted.token.split(".")[1].encode() not in raw
        assert await tokens.check(minted.token) is not None
        last = "B" if minted.token.endswith("A") else "A"  # always a different token
        assert await tokens.check(minted.token[:-1] + last) is None
    finally:
        await store.close()
