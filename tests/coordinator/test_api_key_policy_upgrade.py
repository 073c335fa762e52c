"""Issue 28's upgrade of ``api_keys``: a database one migration behind (SQLite 15,
PostgreSQL 8) holding a key opens at the current version; the key reads the default
policy (block sexual/minors, flag the rest: an upgrade changes no answer) and keeps its
other scopes, and a policy minted after it round-trips."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from coordinator.store import migrations
from coordinator.store.api_keys import ApiKeyRecord
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.postgres import migrations as pg_migrations
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import KeyPolicy
from edgefleet.key_policy import key_policy_from_json
from tests.coordinator.upgrade_testing import postgres_at, sqlite_at

pytestmark = pytest.mark.timeout(60)

# The migrations that added the policy column (SQLite, PostgreSQL).
SQLITE_POLICY = 16
POSTGRES_POLICY = 9
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_OLD_KEY = (
    "INSERT INTO api_keys (key_id, secret_sha256, created_at, name, models_json, allow_cloud,"
    " max_priority, max_tokens_per_request, requests_per_minute, tokens_per_minute,"
    " max_keep_alive_s) VALUES ('k-old', '{digest}', {created}, 'kiosk', '[\"llm-a\"]',"
    " {cloud}, 'high', 64, 30, 0, 90)"
)
POLICY = key_policy_from_json(
    {"moderation": {"input": {"harassment": "block"}, "output": {"violence": "off"}}}
)


async def _after_upgrade(store: SQLiteFleetStore | PostgresFleetStore, version: int) -> None:
    await store.open()
    try:
        assert await store.schema_version() == version
        (old,) = await store.list_api_keys()
        assert (old.key_id, old.models, old.allow_cloud, old.max_keep_alive_s) == (
            "k-old", ("llm-a",), True, 90.0
        )  # fmt: skip
        assert old.policy == KeyPolicy()
        new = ApiKeyRecord("k-new", "ab" * 32, NOW, policy=POLICY)
        await store.add_api_key(new)
        assert {k.key_id: k for k in await store.list_api_keys()}["k-new"] == new
    finally:
        await store.close()


async def test_a_sqlite_database_at_migration_15_keeps_its_key_with_the_default_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert migrations.MIGRATIONS[SQLITE_POLICY - 1].__name__ == "_key_policy"
    old_key = _OLD_KEY.format(digest="ee" * 32, created=f"'{NOW.isoformat()}'", cloud=1)
    store = await sqlite_at(tmp_path, SQLITE_POLICY - 1, old_key, monkeypatch)
    await _after_upgrade(store, migrations.SCHEMA_VERSION)


async def test_a_postgres_database_at_migration_8_keeps_its_key_with_the_default_policy(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pg_migrations.MIGRATIONS[POSTGRES_POLICY - 1].__name__ == "_key_policy"
    old_key = _OLD_KEY.format(digest="ee" * 32, created=f"'{NOW.isoformat()}'", cloud="true")
    store = await postgres_at(postgres_url, POSTGRES_POLICY - 1, old_key, monkeypatch)
    await _after_upgrade(store, pg_migrations.SCHEMA_VERSION)
