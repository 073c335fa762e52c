"""A fleet database as an older coordinator left it: opened once with the migrations up
to ``version`` only, then a row written by hand in that schema, for the upgrade tests of
each migration (tests/coordinator/test_*_upgrade.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from coordinator.store import migrations
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.postgres import migrations as pg_migrations
from coordinator.store.sqlite import DB_FILE, SQLiteFleetStore


async def sqlite_at(
    directory: Path, version: int, insert: str, monkeypatch: pytest.MonkeyPatch
) -> SQLiteFleetStore:
    """A SQLite fleet database in ``directory`` at ``version`` holding what ``insert`` (a
    statement) wrote; returns a store of today's coordinator on it, not opened yet."""
    db = directory / DB_FILE
    with monkeypatch.context() as old:
        old.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:version])
        old.setattr(migrations, "SCHEMA_VERSION", version)
        store = SQLiteFleetStore(db)
        await store.open()
        try:
            assert await store.schema_version() == version
        finally:
            await store.close()
    raw = sqlite3.connect(db)
    with raw:
        raw.execute(insert)
    raw.close()
    return SQLiteFleetStore(db)


async def postgres_at(
    url: str, version: int, insert: str, monkeypatch: pytest.MonkeyPatch
) -> PostgresFleetStore:
    """The same on the PostgreSQL database at ``url`` (empty before)."""
    with monkeypatch.context() as old:
        old.setattr(pg_migrations, "MIGRATIONS", pg_migrations.MIGRATIONS[:version])
        old.setattr(pg_migrations, "SCHEMA_VERSION", version)
        store = PostgresFleetStore(url)
        await store.open()
        try:
            assert await store.schema_version() == version
        finally:
            await store.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as raw:
        await raw.execute(insert)
    return PostgresFleetStore(url)
