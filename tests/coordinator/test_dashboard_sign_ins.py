"""Dashboard sign-ins kept in the database (coordinator/api/dashboard.py,
``DashboardSessions``): a hash of the session id, the admin token's id and the expiry.

Against real coordinator processes as shipped (TLS, API keys required, a bootstrap admin
token in the environment and a minted one): a sign-in survives a SIGKILL and a new
process on the same data directory (SQLite); two coordinators on one PostgreSQL database
honour each other's sign-ins, a sign-out on one is refused on the other at once, and so
is a sign-in of a revoked admin token. The table's rows, read raw, hold neither the
cookie's session id nor the admin token. On a store of each backend: expiry, revocation,
a replaced bootstrap token, and the bound on live sign-ins.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from coordinator.access.admin_tokens import AdminTokens, Role
from coordinator.api import dashboard
from coordinator.api.dashboard import COOKIE, DashboardSessions
from coordinator.errors import SignInsFullError
from coordinator.store.interface import FleetStore
from coordinator.store.sqlite import DB_FILE
from devtools.fleet import ADMIN_TOKEN_ENV, CoordinatorProcess
from tests.coordinator.store_backends import backend, store, store_factory
from tests.coordinator.test_several_coordinators import two_coordinators

__all__ = ["backend", "store", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(180)

BOOTSTRAP = "a-bootstrap-admin-token-of-32-characters"


# ------------------------------------------------------------------ real processes


class Browser:
    """What a browser holds after signing in: the session cookie, presented to any
    coordinator (the test sends it to each by hand; a browser would to one origin)."""

    def __init__(self, cookie: str) -> None:
        self.cookie = cookie

    async def whoami(self, coordinator: CoordinatorProcess) -> tuple[int, Any]:
        return await call(
            coordinator, "GET", "/v1/admin/whoami", headers={"Cookie": f"{COOKIE}={self.cookie}"}
        )

    async def sign_out(self, coordinator: CoordinatorProcess) -> tuple[int, Any]:
        return await call(
            coordinator, "DELETE", "/v1/dashboard/session",
            headers={"Cookie": f"{COOKIE}={self.cookie}", "Origin": coordinator.http_url},
        )  # fmt: skip


async def call(
    coordinator: CoordinatorProcess,
    method: str,
    path: str,
    *,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, coordinator.http_url + path, json=json, headers=headers or {},
            ssl=coordinator.http_context(),
        ) as response,
    ):  # fmt: skip
        return response.status, await response.json()


async def sign_in(coordinator: CoordinatorProcess, token: str) -> Browser:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            coordinator.http_url + "/v1/dashboard/session", json={"token": token},
            headers={"Origin": coordinator.http_url}, ssl=coordinator.http_context(),
        ) as response,
    ):  # fmt: skip
        assert response.status == 201, await response.text()
        morsel = response.cookies[COOKIE]
        assert morsel["secure"] and morsel["httponly"]  # HTTPS, as shipped beyond loopback
        return Browser(morsel.value)


async def mint_admin_token(coordinator: CoordinatorProcess, role: str) -> tuple[str, str]:
    status, body = await call(
        coordinator, "POST", "/v1/admin/admin-tokens", json={"role": role, "name": "ops"},
        headers=coordinator.admin_headers,
    )  # fmt: skip
    assert status == 201, body
    return str(body["token"]), str(body["token_id"])


def assert_rows_hold_no_secret(rows: list[tuple[Any, ...]], *secrets: str) -> None:
    """Every row, each column as text: neither a session id nor a token appears."""
    assert rows
    for row in rows:
        text = " ".join(str(value) for value in row)
        for secret in secrets:
            assert secret not in text, "a dashboard_sessions row holds a secret"
            # nor the secret part of a minted token (efa_<id>.<secret>)
            assert secret.rsplit(".", 1)[-1] not in text


def sqlite_rows(data_dir: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data_dir / DB_FILE) as db:
        return list(db.execute("SELECT * FROM dashboard_sessions"))


def postgres_rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as db:
        return list(db.execute("SELECT * FROM dashboard_sessions").fetchall())


async def test_a_sign_in_survives_a_sigkill_and_a_new_coordinator_on_the_same_data_dir(
    tmp_path: Path,
) -> None:
    first = CoordinatorProcess(tls=True, data_dir=tmp_path / "c")
    await first.start()
    try:
        token, token_id = await mint_admin_token(first, "operator")
        minted = await sign_in(first, token)
        bootstrap = await sign_in(first, first.admin_token)
        assert (await minted.whoami(first))[1]["token_id"] == token_id
        assert (await bootstrap.whoami(first))[1]["token_id"] == "bootstrap"
    finally:
        await first.signal_and_wait(signal.SIGKILL, 10)

    rows = sqlite_rows(first.data_dir)
    assert sorted(row[0] for row in rows) == sorted(
        hashlib.sha256(b.cookie.encode()).hexdigest() for b in (minted, bootstrap)
    )
    assert_rows_hold_no_secret(rows, minted.cookie, bootstrap.cookie, token, first.admin_token)

    again = CoordinatorProcess(
        tls=True, data_dir=first.data_dir, env={ADMIN_TOKEN_ENV: first.admin_token}
    )
    await again.start()
    try:
        status, body = await minted.whoami(again)
        assert status == 200, body
        assert (body["token_id"], body["role"]) == (token_id, "operator")
        status, body = await bootstrap.whoami(again)
        assert status == 200 and body["role"] == "admin", body
        status, body = await minted.sign_out(again)
        assert status == 200 and body["signed_out"] is True
        assert (await minted.whoami(again))[0] == 401
        assert (await bootstrap.whoami(again))[0] == 200
    finally:
        await again.kill()


async def test_two_coordinators_on_one_database_share_sign_ins_sign_outs_and_revocations(
    tmp_path: Path, postgres_url: str
) -> None:
    async with two_coordinators(tmp_path, postgres_url) as (a, b):
        token, token_id = await mint_admin_token(a, "viewer")
        browser = await sign_in(a, token)
        status, body = await browser.whoami(b)
        assert status == 200 and (body["token_id"], body["role"]) == (token_id, "viewer"), body
        assert_rows_hold_no_secret(postgres_rows(postgres_url), browser.cookie, token)

        status, body = await browser.sign_out(a)
        assert status == 200 and body["signed_out"] is True
        status, body = await browser.whoami(b)  # at once: nothing is cached
        assert status == 401, body

        browser = await sign_in(a, token)
        other = await sign_in(b, token)
        assert (await browser.whoami(b))[0] == 200
        status, body = await call(
            b, "DELETE", f"/v1/admin/admin-tokens/{token_id}", headers=b.admin_headers
        )
        assert status == 200 and body["state"] == "revoked", body
        assert (await browser.whoami(a))[0] == 401
        assert (await other.whoami(a))[0] == 401
        assert (await other.whoami(b))[0] == 401
        assert postgres_rows(postgres_url) == []  # the revoked token's rows are gone


# ------------------------------------------------------------------ on a store


async def test_sign_ins_expire_and_end_with_their_token(store: FleetStore) -> None:
    tokens = AdminTokens(store, bootstrap_token=BOOTSTRAP)
    sessions = DashboardSessions(store, tokens, ttl_s=0.5)
    minted = await tokens.mint(Role.OPERATOR, "ops")
    assert await sessions.open("efa_000000000000." + "x" * 43) is None
    assert await sessions.open("not a token") is None
    opened = await sessions.open(minted.token)
    assert opened is not None
    session_id, caller = opened
    assert len(session_id) >= 40 and caller.role is Role.OPERATOR
    assert await sessions.caller(session_id) == caller
    assert await sessions.caller(session_id + "x") is None
    assert await sessions.count() == 1
    await asyncio.sleep(0.7)
    assert await sessions.caller(session_id) is None  # expired
    assert await sessions.count() == 0

    sessions.ttl_s = 60
    session_id, _ = await sessions.open(minted.token) or ("", None)
    assert await sessions.caller(session_id) == caller
    await tokens.revoke(minted.record.token_id)
    assert await sessions.caller(session_id) is None  # revoked: refused before its rows go
    assert await sessions.end_token(minted.record.token_id) == 1
    assert await sessions.open(minted.token) is None


async def test_a_new_bootstrap_token_ends_the_old_ones_sign_ins(store: FleetStore) -> None:
    before = DashboardSessions(store, AdminTokens(store, bootstrap_token=BOOTSTRAP), ttl_s=60)
    session_id, caller = await before.open(BOOTSTRAP) or ("", None)
    assert caller is not None and caller.token_id == "bootstrap"
    row = await store.get_dashboard_session(dashboard.session_hash(session_id))
    assert row is not None and row.token_id.startswith("bootstrap.")
    assert BOOTSTRAP not in row.token_id

    same = DashboardSessions(store, AdminTokens(store, bootstrap_token=BOOTSTRAP), ttl_s=60)
    assert await same.caller(session_id) == caller  # a restart, or another coordinator
    other = AdminTokens(store, bootstrap_token="another-bootstrap-token-of-32-characters")
    assert await DashboardSessions(store, other, ttl_s=60).caller(session_id) is None
    none = AdminTokens(store)
    assert await DashboardSessions(store, none, ttl_s=60).caller(session_id) is None


async def test_live_sign_ins_are_bounded(
    store: FleetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "MAX_SESSIONS", 3)
    tokens = AdminTokens(store, bootstrap_token=BOOTSTRAP)
    sessions = DashboardSessions(store, tokens, ttl_s=60)
    first = await tokens.mint(Role.VIEWER, "first")
    second = await tokens.mint(Role.VIEWER, "second")
    made = [await sessions.open(first.token) for _ in range(3)]
    assert await sessions.count() == 3
    # Full: a token's new sign-in ends that token's older ones.
    newest, _ = await sessions.open(first.token) or ("", None)
    assert await sessions.caller(newest) is not None
    assert [await sessions.caller(m[0]) for m in made if m is not None] == [None] * 3
    await sessions.open(second.token)
    await sessions.open(second.token)
    # Full of other tokens' sign-ins: refused.
    with pytest.raises(SignInsFullError):
        await sessions.open(BOOTSTRAP)
    assert await sessions.count() == 3
