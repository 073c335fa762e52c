"""``FleetStore`` in PostgreSQL: the store for fleets that outgrow one machine's SQLite.

``PostgresFleetStore`` is one table mixin per resource (the modules of this package, each
with its SQL), all on one :class:`~coordinator.store.postgres.pool.PostgresPool`
(psycopg 3 with psycopg_pool: every call within a statement and lock timeout, and a
client-side deadline). Its schema history is ``coordinator.store.postgres.migrations``
(run under an advisory lock, refusing a newer database). Where the SQLite backend relies
on its single writer, this one is safe with several: conditional updates and
``INSERT ... ON CONFLICT ... RETURNING`` under row locks (enrollment, rules, the
generation counter), and usage totals in per-coordinator rows.

Selected by ``store_url = "postgresql://USER@HOST:PORT/DATABASE"`` (coordinator/config.py;
its password from the environment or a file, never in the URL).
"""

from __future__ import annotations

import socket
from pathlib import Path

from coordinator.errors import StoreError
from coordinator.store.postgres.admin_tokens import PostgresAdminTokens
from coordinator.store.postgres.agents import PostgresAgents
from coordinator.store.postgres.api_keys import PostgresApiKeys
from coordinator.store.postgres.assignments import PostgresAssignments
from coordinator.store.postgres.audit import PostgresAudit
from coordinator.store.postgres.catalog import PostgresCatalog
from coordinator.store.postgres.changes import PostgresChanges
from coordinator.store.postgres.generations import PostgresGenerations
from coordinator.store.postgres.join_tokens import PostgresJoinTokens
from coordinator.store.postgres.key_demand import PostgresKeyDemand
from coordinator.store.postgres.last_state import PostgresLastStates
from coordinator.store.postgres.membership import PostgresMembership
from coordinator.store.postgres.migrations import SCHEMA_VERSION, migrate, schema_version
from coordinator.store.postgres.ownership import PostgresOwnership
from coordinator.store.postgres.pool import (
    MAX_CONNECTIONS,
    STATEMENT_TIMEOUT_S,
    Connection,
    PostgresPool,
    display_url,
)
from coordinator.store.postgres.request_records import PostgresRequestRecords
from coordinator.store.postgres.rollouts import PostgresRollouts

__all__ = ["SCHEMA_VERSION", "PostgresFleetStore", "display_url"]


class PostgresFleetStore(
    PostgresJoinTokens,
    PostgresAgents,
    PostgresApiKeys,
    PostgresGenerations,
    PostgresLastStates,
    PostgresAdminTokens,
    PostgresAudit,
    PostgresCatalog,
    PostgresAssignments,
    PostgresRequestRecords,
    PostgresRollouts,
    PostgresMembership,
    PostgresChanges,
    PostgresKeyDemand,
    PostgresOwnership,
):
    """FleetStore backed by PostgreSQL; ``await open()`` before the first call.

    ``url``: ``postgresql://USER@HOST:PORT/DATABASE`` (libpq's URL; no password in it);
    ``password``: from the environment or a file (coordinator/config.py), handed to libpq
    apart; ``statement_timeout_s``: each statement's and each lock wait's limit;
    ``instance``: this coordinator's name among those sharing the database (its rows of
    usage totals; the host name by default); ``migrate`` False opens the database as it is.
    """

    def __init__(
        self,
        url: str,
        *,
        password: str = "",
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        instance: str = "",
        migrate: bool = True,
    ) -> None:
        self.url = url
        self._migrate = migrate
        self._instance = instance or socket.gethostname()
        self._pool = PostgresPool(
            url,
            password=password,
            statement_timeout_s=statement_timeout_s,
            max_size=max_connections,
        )

    @property
    def name(self) -> str:
        """The database's URL as logs show it (no password)."""
        return self._pool.name

    @property
    def pool(self) -> PostgresPool:
        return self._pool

    async def open(self) -> None:
        migrating, name = self._migrate, self._pool.name

        async def setup(db: Connection) -> None:
            if migrating:
                await migrate(db, name)
            elif await schema_version(db) > SCHEMA_VERSION:
                await migrate(db, name)  # refuses it, naming both versions

        await self._pool.open(setup)

    async def close(self) -> None:
        await self.close_listener()
        await self._pool.close()

    async def schema_version(self) -> int:
        return await self._pool.call(schema_version)

    async def ping(self) -> None:
        await self._pool.call(_select_one)

    async def backup_to(self, path: Path) -> int:
        raise StoreError(
            f"the fleet database {self.name} is on PostgreSQL: a file copy of it is "
            "SQLite's; `python -m coordinator backup` dumps it with pg_dump "
            "(coordinator/store/postgres/dump.py)"
        )


async def _select_one(db: Connection) -> None:
    await db.execute("SELECT 1")
