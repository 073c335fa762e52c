"""One SQLite connection to the fleet database for the admin tokens, the audit log and
the agents' request records (tables of migration 3 in ``coordinator.store.sqlite``).

Separate from the fleet store's connection (WAL lets both work on one file) so these
services do not depend on the ``FleetStore`` protocol. Used from one thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator.errors import StoreError
from coordinator.store.sqlite import DB_FILE, migrate


class AdminDatabase:
    """The connection and its transaction helper."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            migrate(self.db, path)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the fleet database {path}: {exc}") from exc

    @classmethod
    def in_directory(cls, data_dir: Path) -> AdminDatabase:
        return cls(data_dir / DB_FILE)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"fleet database {self.path}: {exc}") from exc

    def query(self, sql: str, *args: object) -> list[sqlite3.Row]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"fleet database {self.path}: {exc}") from exc

    def close(self) -> None:
        self.db.close()
