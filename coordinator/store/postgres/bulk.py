"""Writing and checking whole tables of a PostgreSQL fleet database, for a copy from
another backend (coordinator/store/copy.py): one synchronous connection, one transaction
for everything written (COPY per table: identity values kept as given, their sequences
moved past them), then checksums read back in primary-key order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from coordinator.errors import StoreError
from coordinator.store.postgres.pool import display_url

BATCH = 5000


class PostgresBulk:
    def __init__(self, db: psycopg.Connection[Any], name: str) -> None:
        self._db = db
        self.name = name

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> data type (information_schema's words), in table order."""
        rows = self._db.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
        return {name: kind for name, kind in rows}

    def primary_key(self, table: str) -> list[str]:
        rows = self._db.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey, a.attnum)",
            (table,),
        ).fetchall()
        return [r[0] for r in rows]

    def count(self, table: str) -> int:
        row = self._db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int(row.fetchone()[0])  # type: ignore[index]

    def copy_in(
        self, table: str, columns: Sequence[str], batches: Iterable[list[tuple[Any, ...]]]
    ) -> int:
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        written = 0
        with self._db.cursor() as cursor, cursor.copy(statement) as copy:
            for batch in batches:
                for row in batch:
                    copy.write_row(row)
                written += len(batch)
        return written

    def move_identity_past(self, table: str, column: str) -> None:
        self._db.execute(
            sql.SQL(
                "SELECT setval(pg_get_serial_sequence(%s, %s),"
                " GREATEST((SELECT max({}) FROM {}), 1),"
                " (SELECT max({}) FROM {}) IS NOT NULL)"
            ).format(sql.Identifier(column), sql.Identifier(table), sql.Identifier(column),
                     sql.Identifier(table)),
            (table, column),
        )  # fmt: skip

    def execute(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = self._db.execute(query, params)
        return cursor.fetchall() if cursor.description else []

    def rows(
        self, table: str, columns: Sequence[str], order_by: Sequence[str], text_columns: set[str]
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows' ``columns`` in ``order_by`` order (text compared byte-wise, as SQLite)."""
        order = sql.SQL(", ").join(
            sql.SQL("{} COLLATE \"C\"").format(sql.Identifier(c)) if c in text_columns
            else sql.Identifier(c)
            for c in order_by
        )  # fmt: skip
        query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(table), order
        )
        with self._db.cursor(name=f"read_{table}") as cursor:
            cursor.itersize = BATCH
            cursor.execute(query)
            while batch := cursor.fetchmany(BATCH):
                yield batch


@contextmanager
def bulk_transaction(url: str, password: str = "") -> Iterator[PostgresBulk]:
    """One connection, one transaction: committed when the block ends, rolled back when it
    raises (nothing of a failed copy is kept)."""
    name = display_url(url)
    try:
        db = psycopg.connect(url, password=password or None, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreError(f"cannot open the fleet database {name}: {exc}") from exc
    try:
        with db.transaction():
            yield PostgresBulk(db, name)
    except psycopg.Error as exc:
        raise StoreError(f"fleet database {name}: {exc}") from exc
    finally:
        db.close()
