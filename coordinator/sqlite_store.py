"""``FleetStore`` in one SQLite file (WAL journal), the coordinator's default store."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from coordinator.errors import StoreError
from coordinator.fleet_json import hello_from_json, hello_to_json
from coordinator.fleet_store import JoinToken, Site, StoredAgent
from edgefleet.contract import Hello

logger = logging.getLogger(__name__)

DB_FILE = "fleet.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS join_tokens (
    token_id      TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    expires_at    TEXT,
    max_uses      INTEGER NOT NULL,
    uses          INTEGER NOT NULL DEFAULT 0,
    site          TEXT NOT NULL DEFAULT '',
    revoked       INTEGER NOT NULL DEFAULT 0,
    note          TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS agents (
    agent_id          TEXT PRIMARY KEY,
    enrolled_at       TEXT,
    token_id          TEXT NOT NULL DEFAULT '',
    credential_sha256 TEXT NOT NULL DEFAULT '',
    cert_serial       TEXT NOT NULL DEFAULT '',
    site              TEXT NOT NULL DEFAULT '',
    hello_json        TEXT,
    last_seen         TEXT,
    draining          INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sites (
    name       TEXT PRIMARY KEY,
    first_seen TEXT NOT NULL
);
"""


def _text(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class SQLiteFleetStore:
    """FleetStore backed by SQLite; one connection, used from one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the fleet database {path}: {exc}") from exc

    @classmethod
    def in_directory(cls, data_dir: Path) -> SQLiteFleetStore:
        return cls(data_dir / DB_FILE)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"fleet database {self.path}: {exc}") from exc

    def _query(self, sql: str, *args: object) -> list[sqlite3.Row]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"fleet database {self.path}: {exc}") from exc

    # ---------------------------------------------------------------- tokens

    def add_token(self, token: JoinToken) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO join_tokens VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    token.token_id,
                    token.secret_sha256,
                    _text(token.created_at),
                    _text(token.expires_at),
                    token.max_uses,
                    token.uses,
                    token.site,
                    int(token.revoked),
                    token.note,
                ),
            )

    def get_token(self, token_id: str) -> JoinToken | None:
        rows = self._query("SELECT * FROM join_tokens WHERE token_id = ?", token_id)
        return _token(rows[0]) if rows else None

    def list_tokens(self) -> list[JoinToken]:
        return [_token(r) for r in self._query("SELECT * FROM join_tokens ORDER BY created_at")]

    def revoke_token(self, token_id: str) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE join_tokens SET revoked = 1 WHERE token_id = ?", (token_id,)
            )
            return cursor.rowcount == 1

    def enroll(self, token_id: str, now: datetime, agent: StoredAgent) -> bool:
        with self._transaction() as db:
            taken = db.execute(
                "SELECT 1 FROM agents WHERE agent_id = ? AND enrolled_at IS NOT NULL",
                (agent.agent_id,),
            ).fetchone()
            if taken is not None:
                return False
            used = db.execute(
                "UPDATE join_tokens SET uses = uses + 1 WHERE token_id = ? AND revoked = 0 "
                "AND uses < max_uses AND (expires_at IS NULL OR expires_at > ?)",
                (token_id, _text(now)),
            )
            if used.rowcount != 1:
                return False
            db.execute(
                "INSERT INTO agents (agent_id, enrolled_at, token_id, credential_sha256, "
                "cert_serial, site) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE "
                "SET enrolled_at = excluded.enrolled_at, token_id = excluded.token_id, "
                "credential_sha256 = excluded.credential_sha256, "
                "cert_serial = excluded.cert_serial, site = excluded.site",
                (
                    agent.agent_id,
                    _text(agent.enrolled_at),
                    agent.token_id,
                    agent.credential_sha256,
                    agent.cert_serial,
                    agent.site,
                ),
            )
            if agent.site:
                _add_site(db, agent.site, now)
            return True

    # ---------------------------------------------------------------- agents

    def get_agent(self, agent_id: str) -> StoredAgent | None:
        rows = self._query("SELECT * FROM agents WHERE agent_id = ?", agent_id)
        return _agent(rows[0]) if rows else None

    def list_agents(self) -> list[StoredAgent]:
        return [_agent(r) for r in self._query("SELECT * FROM agents ORDER BY agent_id")]

    def save_hello(self, hello: Hello, seen: datetime) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO agents (agent_id, site, hello_json, last_seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(agent_id) DO UPDATE SET hello_json = excluded.hello_json, "
                "last_seen = excluded.last_seen, "
                "site = CASE WHEN agents.enrolled_at IS NULL "
                "THEN excluded.site ELSE agents.site END",
                (hello.agent_id, hello.site, hello_to_json(hello), _text(seen)),
            )
            if hello.site:
                _add_site(db, hello.site, seen)

    def save_last_seen(self, agent_id: str, seen: datetime) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE agents SET last_seen = ? WHERE agent_id = ?", (_text(seen), agent_id)
            )

    def set_draining(self, agent_id: str, draining: bool) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE agents SET draining = ? WHERE agent_id = ?", (int(draining), agent_id)
            )
            return cursor.rowcount == 1

    # ----------------------------------------------------------------- sites

    def list_sites(self) -> list[Site]:
        return [
            Site(name=r["name"], first_seen=datetime.fromisoformat(r["first_seen"]))
            for r in self._query("SELECT * FROM sites ORDER BY name")
        ]

    def close(self) -> None:
        self._db.close()


def _add_site(db: sqlite3.Connection, name: str, now: datetime) -> None:
    db.execute(
        "INSERT INTO sites (name, first_seen) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
        (name, _text(now)),
    )


def _token(row: sqlite3.Row) -> JoinToken:
    created = _time(row["created_at"])
    if created is None:
        raise StoreError(f"join token {row['token_id']} has no creation time")
    return JoinToken(
        token_id=row["token_id"],
        secret_sha256=row["secret_sha256"],
        created_at=created,
        expires_at=_time(row["expires_at"]),
        max_uses=row["max_uses"],
        uses=row["uses"],
        site=row["site"],
        revoked=bool(row["revoked"]),
        note=row["note"],
    )


def _agent(row: sqlite3.Row) -> StoredAgent:
    return StoredAgent(
        agent_id=row["agent_id"],
        enrolled_at=_time(row["enrolled_at"]),
        token_id=row["token_id"],
        credential_sha256=row["credential_sha256"],
        cert_serial=row["cert_serial"],
        site=row["site"],
        hello=None if row["hello_json"] is None else hello_from_json(row["hello_json"]),
        last_seen=_time(row["last_seen"]),
        draining=bool(row["draining"]),
    )
