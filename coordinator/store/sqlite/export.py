"""Reading a SQLite fleet database table by table, for a copy to another backend
(coordinator/store/copy.py): column names, and rows in primary-key order, in batches, all
from one read transaction (one consistent snapshot, while a coordinator may still write)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coordinator.errors import StoreError

BATCH = 5000


class SQLiteReader:
    """One read-only connection to ``path`` holding one read transaction."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    def columns(self, table: str) -> list[str]:
        return [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]

    def count(self, table: str) -> int:
        return int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def rows(
        self, table: str, columns: Sequence[str], order_by: Sequence[str]
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows' ``columns``, ordered by ``order_by``, BATCH at a time."""
        cursor = self._db.execute(
            f"SELECT {', '.join(columns)} FROM {table} ORDER BY {', '.join(order_by)}"
        )
        while batch := cursor.fetchmany(BATCH):
            yield [tuple(row) for row in batch]

    def scalar(self, query: str) -> Any:
        row = self._db.execute(query).fetchone()
        return None if row is None else row[0]


@contextmanager
def reading(path: Path) -> Iterator[SQLiteReader]:
    """A reader of the database at ``path`` (which must exist)."""
    if not path.exists():
        raise StoreError(f"there is no fleet database at {path}")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        db.execute("BEGIN")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the fleet database {path}: {exc}") from exc
    try:
        yield SQLiteReader(db, path)
    except sqlite3.Error as exc:
        raise StoreError(f"reading the fleet database {path}: {exc}") from exc
    finally:
        db.close()
