"""What every table module of the SQLite backend shares: the worker, and time columns."""

from __future__ import annotations

from datetime import UTC, datetime

from coordinator.store.sqlite.worker import SQLiteWorker


class SQLiteTable:
    """Base of the table mixins ``SQLiteFleetStore`` is made of."""

    _worker: SQLiteWorker


def text(value: datetime | None) -> str | None:
    """A time as stored in TEXT columns (UTC, ISO 8601 with microseconds)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")


def parse_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
