"""Issue 26's upgrade of ``api_keys``: a database one migration behind (SQLite 14,
PostgreSQL 7) holding a key opens at the current version, and the key reads the defaults
of the new columns (``max_keep_alive_s`` 0: the agent's own cap; ``may_pin_models``
false), keeps its other scopes, and the new fields of a key minted after it round-trip."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from coordinator.store import migrations
from coordinator.store.api_keys import ApiKeyRecord
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.postgres import migrations as pg_migrations
from coordinator.store.sqlite import SQLiteFleetStore
from tests.coordinator.upgrade_testing import postgres_at, sqlite_at

pytestmark = pytest.mark.timeout(60)

# The migrations that added the two columns (SQLite, PostgreSQL).
SQLITE_KEEP_ALIVE = 15
POSTGRES_KEEP_ALIVE = 8
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_OLD_KEY = (
    "INSERT INTO api_keys (key_id, secret_sha256, created_at, name, models_json, allow_cloud,"
    " max_priority, max_tokens_per_request, requests_per_minute, tokens_per_minute)"
    " VALUES ('k-old', '{digest}', {created}, 'kiosk', '[\"llm-a\"]', {cloud}, 'high', 64, 30,"
    " 0)"
)


async def _after_upgrade(store: SQLiteFleetStore | PostgresFleetStore, version: int) -> None:
    await store.open()
    try:
        assert await store.schema_version() == version
        (old,) = await store.list_api_keys()
        assert (old.key_id, old.name, old.models, old.allow_cloud, old.max_priority) == (
            "k-old", "kiosk", ("llm-a",), True, "high"
        )  # fmt: skip
        assert (old.max_tokens_per_request, old.requests_per_minute) == (64, 30.0)
        assert (old.max_keep_alive_s, old.may_pin_models) == (0.0, False)
        new = ApiKeyRecord("k-new", "ab" * 32, NOW, max_keep_alive_s=60.0, may_pin_models=True)
        await store.add_api_key(new)
        assert {k.key_id: k for k in await store.list_api_keys()}["k-new"] == new
    finally:
        await store.close()


async def test_a_sqlite_database_at_migration_14_keeps_its_key_with_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert migrations.MIGRATIONS[SQLITE_KEEP_ALIVE - 1].__name__ == "_models_on_demand"
    old_key = _OLD_KEY.format(digest="ee" * 32, created=f"'{NOW.isoformat()}'", cloud=1)
    store = await sqlite_at(tmp_path, SQLITE_KEEP_ALIVE - 1, old_key, monkeypatch)
    await _after_upgrade(store, migrations.SCHEMA_VERSION)


async def test_a_postgres_database_at_migration_7_keeps_its_key_with_the_defaults(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pg_migrations.MIGRATIONS[POSTGRES_KEEP_ALIVE - 1].__name__ == "_models_on_demand"
    old_key = _OLD_KEY.format(digest="ee" * 32, created=f"'{NOW.isoformat()}'", cloud="true")
    store = await postgres_at(postgres_url, POSTGRES_KEEP_ALIVE - 1, old_key, monkeypatch)
    await _after_upgrade(store, pg_migrations.SCHEMA_VERSION)
