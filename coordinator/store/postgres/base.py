"""What every table module of the PostgreSQL backend shares: the pool, the instance name."""

from __future__ import annotations

from typing import Any

from coordinator.store.postgres.pool import PostgresPool
from edgefleet.contract import Location


class PostgresTable:
    """Base of the table mixins ``PostgresFleetStore`` is made of."""

    _pool: PostgresPool
    #: This coordinator's name among those sharing the database (its usage rows).
    _instance: str


def location_of(row: dict[str, Any]) -> Location | None:
    """The lat/lon columns (of join_tokens and agents)."""
    if row["lat"] is None or row["lon"] is None:
        return None
    return Location(lat=row["lat"], lon=row["lon"])
