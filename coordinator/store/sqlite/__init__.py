"""``FleetStore`` in one SQLite file (WAL journal), the coordinator's default store.

``SQLiteFleetStore`` is one table mixin per resource (the modules of this package, each
with its SQL), all on one :class:`~coordinator.store.sqlite.worker.SQLiteWorker`: a
thread of its own that owns the connection, runs the calls in order off the event loop
and interrupts any that runs past the statement timeout. The schema and its migrations
are ``coordinator.store.migrations``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from coordinator.errors import StoreError
from coordinator.store.migrations import migrate, schema_version
from coordinator.store.sqlite.admin_tokens import SQLiteAdminTokens
from coordinator.store.sqlite.agents import SQLiteAgents
from coordinator.store.sqlite.api_keys import SQLiteApiKeys
from coordinator.store.sqlite.assignments import SQLiteAssignments
from coordinator.store.sqlite.audit import SQLiteAudit
from coordinator.store.sqlite.catalog import SQLiteCatalog
from coordinator.store.sqlite.changes import SQLiteChanges
from coordinator.store.sqlite.generations import SQLiteGenerations
from coordinator.store.sqlite.join_tokens import SQLiteJoinTokens
from coordinator.store.sqlite.key_demand import SQLiteKeyDemand
from coordinator.store.sqlite.last_state import SQLiteLastStates
from coordinator.store.sqlite.membership import SQLiteMembership
from coordinator.store.sqlite.ownership import SQLiteOwnership
from coordinator.store.sqlite.request_records import SQLiteRequestRecords
from coordinator.store.sqlite.rollouts import SQLiteRollouts
from coordinator.store.sqlite.worker import STATEMENT_TIMEOUT_S, SQLiteWorker

#: The database's file name in the coordinator's data_dir.
DB_FILE = "fleet.db"
#: How long a backup may take (seconds): it copies the whole file.
BACKUP_TIMEOUT_S = 3600.0


class SQLiteFleetStore(
    SQLiteJoinTokens,
    SQLiteAgents,
    SQLiteApiKeys,
    SQLiteGenerations,
    SQLiteLastStates,
    SQLiteAdminTokens,
    SQLiteAudit,
    SQLiteCatalog,
    SQLiteAssignments,
    SQLiteRequestRecords,
    SQLiteRollouts,
    SQLiteMembership,
    SQLiteChanges,
    SQLiteKeyDemand,
    SQLiteOwnership,
):
    """FleetStore backed by SQLite; ``await open()`` before the first call.

    ``statement_timeout_s``: how long one call's statements may run, and how long it waits
    for another connection's write lock (coordinator/store/sqlite/worker.py). ``migrate``
    False opens the database as it is (a backup copies what is there; migrating is the
    coordinator's job).
    """

    def __init__(
        self,
        path: Path,
        *,
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        migrate: bool = True,
    ) -> None:
        self.path = path
        self._migrate = migrate
        self._worker = SQLiteWorker(path, statement_timeout_s=statement_timeout_s)

    @classmethod
    def in_directory(cls, data_dir: Path, **options: object) -> SQLiteFleetStore:
        return cls(data_dir / DB_FILE, **options)  # type: ignore[arg-type]

    @property
    def worker(self) -> SQLiteWorker:
        """The thread the calls run on (tests block it to show the loop keeps serving)."""
        return self._worker

    async def open(self) -> None:
        path, migrating = self.path, self._migrate

        def setup(db: sqlite3.Connection) -> None:
            try:
                if migrating:
                    migrate(db, path)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the fleet database {path}: {exc}") from exc

        await self._worker.open(setup)

    async def close(self) -> None:
        await self._worker.close()

    async def schema_version(self) -> int:
        return await self._worker.call(_schema_version)

    async def ping(self) -> None:
        await self._worker.call(_select_one)

    async def backup_to(self, path: Path) -> int:
        """A consistent copy of the database (SQLite's online backup), even while in use;
        the copy's schema version."""
        return await self._worker.call_with_timeout(BACKUP_TIMEOUT_S, _backup, path)


def _select_one(db: sqlite3.Connection) -> None:
    db.execute("SELECT 1").fetchone()


def _schema_version(db: sqlite3.Connection) -> int:
    return schema_version(db)


def _backup(db: sqlite3.Connection, path: Path) -> int:
    try:
        target = sqlite3.connect(path)
        try:
            db.backup(target)
            return schema_version(target)
        finally:
            target.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot back up the fleet database to {path}: {exc}") from exc
