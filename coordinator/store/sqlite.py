"""``FleetStore`` in one SQLite file (WAL journal), the coordinator's default store."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

from coordinator.errors import StoreError
from coordinator.fleet.records import Liveness
from coordinator.store.fleet_json import hello_from_json, hello_to_json
from coordinator.store.interface import AgentLastState, ApiKeyRecord, JoinToken, Site, StoredAgent
from edgefleet.contract import (
    Hello,
    LoadReport,
    Location,
    ModelInventory,
    ModelInventoryState,
    SectionGenerations,
    SelfCheckResult,
)

logger = logging.getLogger(__name__)

DB_FILE = "fleet.db"

Migration = Callable[[sqlite3.Connection], None]

# The schema's history: MIGRATIONS[n - 1] takes a database from version n - 1 to n
# (``PRAGMA user_version``; 0 is an empty file, or one written before versions were
# kept). To change the schema, add one function decorated ``@_migration(next number)``.
MIGRATIONS: list[Migration] = []


def _migration(version: int) -> Callable[[Migration], Migration]:
    def register(step: Migration) -> Migration:
        if version != len(MIGRATIONS) + 1:
            raise RuntimeError(f"migration {step.__name__} is numbered {version}, "
                               f"the next free number is {len(MIGRATIONS) + 1}")  # fmt: skip
        MIGRATIONS.append(step)
        return step

    return register


@_migration(1)
def _tokens_agents_sites(db: sqlite3.Connection) -> None:
    """The schema as first released (no version kept): its tables may already exist."""
    db.execute("""
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
        )""")  # fmt: skip
    db.execute("""
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
        )""")  # fmt: skip
    db.execute("""
        CREATE TABLE IF NOT EXISTS sites (
            name       TEXT PRIMARY KEY,
            first_seen TEXT NOT NULL
        )""")  # fmt: skip


@_migration(2)
def _agent_last_state(db: sqlite3.Connection) -> None:
    """Each agent's last live state, so that a restart does not declare the fleet down."""
    db.execute("""
        CREATE TABLE agent_last_state (
            agent_id      TEXT PRIMARY KEY REFERENCES agents (agent_id) ON DELETE CASCADE,
            liveness      TEXT NOT NULL,
            -- POSIX seconds (UTC): thousands of rows are written per snapshot.
            last_seen     REAL NOT NULL,
            -- The load report as a JSON list of values, named by report_fields.
            report_fields TEXT,
            report_json   TEXT,
            saved_at      REAL NOT NULL
        ) WITHOUT ROWID""")  # fmt: skip


@_migration(3)
def _admin_tokens_audit_request_records(db: sqlite3.Connection) -> None:
    """Admin tokens (roles), the append-only audit log and the agents' request records."""
    db.execute("""
        CREATE TABLE admin_tokens (
            token_id      TEXT PRIMARY KEY,
            name          TEXT NOT NULL,
            role          TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
            secret_sha256 TEXT NOT NULL,
            created_at    TEXT NOT NULL,
            created_by    TEXT NOT NULL DEFAULT '',
            revoked_at    TEXT
        )""")  # fmt: skip
    db.execute("""
        CREATE TABLE audit_log (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            at         TEXT NOT NULL,
            actor_id   TEXT NOT NULL DEFAULT '',
            actor_name TEXT NOT NULL DEFAULT '',
            role       TEXT NOT NULL DEFAULT '',
            action     TEXT NOT NULL,
            target     TEXT NOT NULL DEFAULT '',
            peer       TEXT NOT NULL DEFAULT '',
            outcome    TEXT NOT NULL,
            status     INTEGER NOT NULL DEFAULT 0,
            detail     TEXT NOT NULL DEFAULT ''
        )""")  # fmt: skip
    # Append-only: no path in the code updates or deletes, and the database refuses to.
    for verb in ("UPDATE", "DELETE"):
        db.execute(f"""
            CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log
            BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""")  # fmt: skip
    db.execute("""
        CREATE TABLE request_records (
            agent_id          TEXT NOT NULL,
            seq               INTEGER NOT NULL,
            received_at       REAL NOT NULL,
            at                REAL NOT NULL DEFAULT 0,
            key_id            TEXT,
            model             TEXT NOT NULL DEFAULT '',
            version           TEXT NOT NULL DEFAULT '',
            prompt_tokens     INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            latency_ms        REAL NOT NULL DEFAULT 0,
            ttft_ms           REAL,
            served_by         TEXT NOT NULL DEFAULT '',
            endpoint          TEXT NOT NULL DEFAULT '',
            status            INTEGER NOT NULL DEFAULT 0,
            -- > 0: a gap record, this many records were lost at the agent (spool full)
            dropped           INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (agent_id, seq)
        )""")  # fmt: skip
    db.execute("CREATE INDEX request_records_received ON request_records (received_at)")


@_migration(4)
def _agent_lifecycle(db: sqlite3.Connection) -> None:
    """What the operator fixes (place, URL), the agent's own key, revocation."""
    for table in ("join_tokens", "agents"):
        db.execute(f"ALTER TABLE {table} ADD COLUMN lat REAL")
        db.execute(f"ALTER TABLE {table} ADD COLUMN lon REAL")
        db.execute(f"ALTER TABLE {table} ADD COLUMN http_url TEXT NOT NULL DEFAULT ''")
    # sha256 of the agent's public key (DER SubjectPublicKeyInfo): enrollment is idempotent.
    db.execute("ALTER TABLE agents ADD COLUMN public_key_sha256 TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE agents ADD COLUMN cert_not_after TEXT")
    db.execute("ALTER TABLE agents ADD COLUMN revoked_at TEXT")
    db.execute("""
        CREATE TABLE revoked_certificates (
            serial     TEXT PRIMARY KEY,
            agent_id   TEXT NOT NULL,
            revoked_at TEXT NOT NULL
        ) WITHOUT ROWID""")  # fmt: skip
    # Ids of removed agents: refused until enrolled again with a new token.
    db.execute("""
        CREATE TABLE removed_agents (
            agent_id   TEXT PRIMARY KEY,
            removed_at TEXT NOT NULL
        ) WITHOUT ROWID""")  # fmt: skip


@_migration(5)
def _api_keys(db: sqlite3.Connection) -> None:
    """API keys for client apps (coordinator/access/api_keys.py): digests, scopes, usage totals."""
    db.execute("""
        CREATE TABLE api_keys (
            key_id                 TEXT PRIMARY KEY,
            secret_sha256          TEXT NOT NULL,
            created_at             TEXT NOT NULL,
            name                   TEXT NOT NULL DEFAULT '',
            models_json            TEXT NOT NULL DEFAULT '[]',
            allow_cloud            INTEGER NOT NULL DEFAULT 0,
            max_priority           TEXT NOT NULL DEFAULT 'normal',
            max_tokens_per_request INTEGER NOT NULL DEFAULT 0,
            requests_per_minute    REAL NOT NULL DEFAULT 0,
            tokens_per_minute      REAL NOT NULL DEFAULT 0,
            expires_at             TEXT,
            revoked_at             TEXT,
            requests               INTEGER NOT NULL DEFAULT 0,
            prompt_tokens          INTEGER NOT NULL DEFAULT 0,
            completion_tokens      INTEGER NOT NULL DEFAULT 0,
            rejected               INTEGER NOT NULL DEFAULT 0
        )""")  # fmt: skip


@_migration(6)
def _model_catalog(db: sqlite3.Connection) -> None:
    """The model catalog (coordinator/catalog/catalog.py): published versions with their
    signed manifests and the files each lists, and which version each agent should run
    (coordinator/catalog/assignments.py): selector rules and explicit per-agent choices."""
    db.execute("""
        CREATE TABLE model_versions (
            name         TEXT NOT NULL,
            version      TEXT NOT NULL,
            task         TEXT NOT NULL DEFAULT '',
            -- the signed bytes, exactly as published, and their ed25519 signature
            manifest     BLOB NOT NULL,
            signature    BLOB NOT NULL,
            sha256       TEXT NOT NULL,
            size_bytes   INTEGER NOT NULL,
            gate_passed  INTEGER NOT NULL,
            deprecated   INTEGER NOT NULL DEFAULT 0,
            published_at TEXT NOT NULL,
            PRIMARY KEY (name, version)
        ) WITHOUT ROWID""")  # fmt: skip
    db.execute("""
        CREATE TABLE model_files (
            name    TEXT NOT NULL,
            version TEXT NOT NULL,
            path    TEXT NOT NULL,
            sha256  TEXT NOT NULL,
            size    INTEGER NOT NULL,
            PRIMARY KEY (name, version, path),
            FOREIGN KEY (name, version) REFERENCES model_versions (name, version)
                ON DELETE CASCADE
        ) WITHOUT ROWID""")  # fmt: skip
    db.execute("CREATE INDEX model_files_sha256 ON model_files (sha256)")
    db.execute("""
        CREATE TABLE model_rules (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            name       TEXT NOT NULL,
            -- the Selector as canonical JSON; one rule per (name, selector)
            selector   TEXT NOT NULL,
            version    TEXT NOT NULL,
            rollout_id TEXT NOT NULL DEFAULT '',
            set_at     TEXT NOT NULL,
            UNIQUE (name, selector)
        )""")  # fmt: skip
    db.execute("""
        CREATE TABLE model_assignments (
            agent_id   TEXT NOT NULL,
            name       TEXT NOT NULL,
            version    TEXT NOT NULL,
            rollout_id TEXT NOT NULL DEFAULT '',
            set_at     TEXT NOT NULL,
            PRIMARY KEY (agent_id, name)
        ) WITHOUT ROWID""")  # fmt: skip


@_migration(7)
def _rollouts(db: sqlite3.Connection) -> None:
    """Model rollouts (coordinator/rollouts/engine.py): policy, plan, state and gate stats, one
    JSON body per rollout, rewritten on every change."""
    db.execute("""
        CREATE TABLE rollouts (
            rollout_id TEXT PRIMARY KEY,
            model      TEXT NOT NULL,
            version    TEXT NOT NULL,
            state      TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            body_json  TEXT NOT NULL
        )""")  # fmt: skip
    db.execute("CREATE INDEX rollouts_state ON rollouts (state, created_at)")


#: How far above everything it can see migration 8 starts the generation counter: room for
#: what the old coordinator sent after its last snapshot of the agents' state, and for its
#: clock-based generations running ahead of its clock in a burst of pushes.
GENERATION_MARGIN_MS = 3_600_000


@_migration(8)
def _section_generations(db: sqlite3.Connection) -> None:
    """The counter behind every desired-state section's generation (store/generations.py).

    Before it, keys and models sections took the wall clock in milliseconds as their
    generation, overflow targets and config a count kept in memory, and agents keep the
    newest they received. The counter starts above all of them: above the larger of this
    machine's clock, the newest time the database records (the last snapshot of the
    agents' state, the last audit entry) and every generation an agent reported applying,
    by GENERATION_MARGIN_MS.
    """
    db.execute("""
        CREATE TABLE section_generations (
            id             INTEGER PRIMARY KEY CHECK (id = 1),
            -- every generation up to this one may have been sent to an agent
            issued_through INTEGER NOT NULL
        )""")  # fmt: skip
    db.execute(
        "INSERT INTO section_generations (id, issued_through) VALUES (1, ?)",
        (_newest_generation_on_record(db, time.time()) + GENERATION_MARGIN_MS,),
    )


def _newest_generation_on_record(db: sqlite3.Connection, now_s: float) -> int:
    """The largest of ``now_s``, the times the database records and the generations agents
    reported applying, as milliseconds (clock-based generations are milliseconds)."""
    newest_s = now_s
    row = db.execute("SELECT MAX(saved_at), MAX(last_seen) FROM agent_last_state").fetchone()
    newest_s = max([newest_s, *(t for t in row if t is not None)])
    last = db.execute("SELECT at FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
    if last is not None:
        with suppress(TypeError, ValueError):  # not a time: no evidence
            newest_s = max(newest_s, datetime.fromisoformat(last[0]).timestamp())
    newest = int(newest_s * 1000)
    for names, text in db.execute(
        "SELECT report_fields, report_json FROM agent_last_state WHERE report_json IS NOT NULL"
    ):
        try:
            applied = dict(zip(names.split(","), json.loads(text), strict=True))["applied"]
            newest = max([newest, *(int(g) for g in applied)])
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a report this version cannot read holds no generation it can use
    return newest


SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the database to SCHEMA_VERSION, one transaction per migration.

    Safe to run concurrently (the admin CLI and the coordinator): each step re-reads
    the version inside its write transaction and skips what another connection did.
    Refuses a database written by a newer coordinator.
    """
    for version in range(schema_version(db) + 1, SCHEMA_VERSION + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            if schema_version(db) < version:
                MIGRATIONS[version - 1](db)
                db.execute(f"PRAGMA user_version = {version:d}")
                logger.info("fleet database %s: schema migrated to version %d", path, version)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    found = schema_version(db)
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"the fleet database {path} has schema version {found}, newer than this "
            f"coordinator's {SCHEMA_VERSION}: run a coordinator at least as new as the one "
            "that wrote it (or point data_dir elsewhere)"
        )


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
            migrate(self._db, path)
        except StoreError:
            self._db.close()
            raise
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
                "INSERT INTO join_tokens (token_id, secret_sha256, created_at, expires_at, "
                "max_uses, uses, site, revoked, note, lat, lon, http_url) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    None if token.location is None else token.location.lat,
                    None if token.location is None else token.location.lon,
                    token.http_url,
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
            db.execute("DELETE FROM removed_agents WHERE agent_id = ?", (agent.agent_id,))
            db.execute(
                "INSERT INTO agents (agent_id, enrolled_at, token_id, credential_sha256, "
                "cert_serial, site, lat, lon, http_url, public_key_sha256, cert_not_after) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE "
                "SET enrolled_at = excluded.enrolled_at, token_id = excluded.token_id, "
                "credential_sha256 = excluded.credential_sha256, "
                "cert_serial = excluded.cert_serial, site = excluded.site, "
                "lat = excluded.lat, lon = excluded.lon, http_url = excluded.http_url, "
                "public_key_sha256 = excluded.public_key_sha256, "
                "cert_not_after = excluded.cert_not_after, revoked_at = NULL",
                (
                    agent.agent_id,
                    _text(agent.enrolled_at),
                    agent.token_id,
                    agent.credential_sha256,
                    agent.cert_serial,
                    agent.site,
                    None if agent.location is None else agent.location.lat,
                    None if agent.location is None else agent.location.lon,
                    agent.http_url,
                    agent.public_key_sha256,
                    _text(agent.cert_not_after),
                ),
            )
            if agent.site:
                _add_site(db, agent.site, now)
            return True

    # -------------------------------------------------------------- API keys

    def add_api_key(self, key: ApiKeyRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO api_keys (key_id, secret_sha256, created_at, name, models_json, "
                "allow_cloud, max_priority, max_tokens_per_request, requests_per_minute, "
                "tokens_per_minute, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.key_id,
                    key.secret_sha256,
                    _text(key.created_at),
                    key.name,
                    json.dumps(list(key.models)),
                    int(key.allow_cloud),
                    key.max_priority,
                    key.max_tokens_per_request,
                    key.requests_per_minute,
                    key.tokens_per_minute,
                    _text(key.expires_at),
                ),
            )

    def list_api_keys(self) -> list[ApiKeyRecord]:
        return [_api_key(r) for r in self._query("SELECT * FROM api_keys ORDER BY created_at")]

    def revoke_api_key(self, key_id: str, now: datetime) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?",
                (_text(now), key_id),
            )
            return cursor.rowcount == 1

    def add_api_key_usage(self, usage: Sequence[tuple[str, int, int, int, int]]) -> None:
        if not usage:
            return
        with self._transaction() as db:
            db.executemany(
                "UPDATE api_keys SET requests = requests + ?, prompt_tokens = prompt_tokens + ?, "
                "completion_tokens = completion_tokens + ?, rejected = rejected + ? "
                "WHERE key_id = ?",
                [(r, p, c, x, k) for k, r, p, c, x in usage],
            )

    # -------------------------------------------------- section generations

    def reserve_generations(self, count: int, at_least: int) -> int:
        with self._transaction() as db:
            (issued,) = db.execute(
                "SELECT issued_through FROM section_generations WHERE id = 1"
            ).fetchone()
            first = max(issued + 1, at_least)
            db.execute(
                "UPDATE section_generations SET issued_through = ? WHERE id = 1",
                (first + count - 1,),
            )
        return int(first)

    # ---------------------------------------------------------------- agents

    def get_agent(self, agent_id: str) -> StoredAgent | None:
        rows = self._query("SELECT * FROM agents WHERE agent_id = ?", agent_id)
        return _agent(rows[0]) if rows else None

    def list_agents(self) -> list[StoredAgent]:
        return [_agent(r) for r in self._query("SELECT * FROM agents ORDER BY agent_id")]

    def find_enrolled_key(self, token_id: str, public_key_sha256: str) -> StoredAgent | None:
        rows = self._query(
            "SELECT * FROM agents WHERE token_id = ? AND public_key_sha256 = ? "
            "AND enrolled_at IS NOT NULL",
            token_id,
            public_key_sha256,
        )
        return _agent(rows[0]) if rows else None

    def reissue(
        self,
        agent_id: str,
        *,
        credential_sha256: str | None,
        cert_serial: str,
        cert_not_after: datetime,
        public_key_sha256: str | None = None,
    ) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE agents SET cert_serial = ?, cert_not_after = ?, "
                "credential_sha256 = COALESCE(?, credential_sha256), "
                "public_key_sha256 = COALESCE(?, public_key_sha256) "
                "WHERE agent_id = ? AND enrolled_at IS NOT NULL AND revoked_at IS NULL",
                (cert_serial, _text(cert_not_after), credential_sha256, public_key_sha256,
                 agent_id),
            )  # fmt: skip
            return cursor.rowcount == 1

    def set_fixed(
        self, agent_id: str, *, site: str | None, location: Location | None, http_url: str | None
    ) -> StoredAgent | None:
        with self._transaction() as db:
            if site is not None:
                db.execute("UPDATE agents SET site = ? WHERE agent_id = ?", (site, agent_id))
                if site:
                    _add_site(db, site, datetime.now(UTC))
            if location is not None:
                db.execute(
                    "UPDATE agents SET lat = ?, lon = ? WHERE agent_id = ?",
                    (location.lat, location.lon, agent_id),
                )
            if http_url is not None:
                db.execute(
                    "UPDATE agents SET http_url = ? WHERE agent_id = ?", (http_url, agent_id)
                )
        return self.get_agent(agent_id)

    def revoke_agent(self, agent_id: str, now: datetime) -> bool:
        with self._transaction() as db:
            row = db.execute(
                "SELECT cert_serial FROM agents WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            if row is None:
                return False
            db.execute(
                "UPDATE agents SET revoked_at = COALESCE(revoked_at, ?), credential_sha256 = '' "
                "WHERE agent_id = ?",
                (_text(now), agent_id),
            )
            if row["cert_serial"]:
                db.execute(
                    "INSERT OR IGNORE INTO revoked_certificates VALUES (?, ?, ?)",
                    (row["cert_serial"], agent_id, _text(now)),
                )
            return True

    def remove_agent(self, agent_id: str) -> bool:
        with self._transaction() as db:
            db.execute("DELETE FROM agent_last_state WHERE agent_id = ?", (agent_id,))
            if db.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,)).rowcount != 1:
                return False
            db.execute(
                "INSERT OR REPLACE INTO removed_agents VALUES (?, ?)",
                (agent_id, _text(datetime.now(UTC))),
            )
            return True

    def agent_removed(self, agent_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM removed_agents WHERE agent_id = ?", agent_id))

    def agents_of_token(self, token_id: str) -> list[str]:
        rows = self._query(
            "SELECT agent_id FROM agents WHERE token_id = ? ORDER BY agent_id", token_id
        )
        return [r["agent_id"] for r in rows]

    def certificate_revoked(self, serial: str) -> bool:
        return bool(self._query("SELECT 1 FROM revoked_certificates WHERE serial = ?", serial))

    def backup_to(self, path: Path) -> None:
        """A consistent copy of the database (SQLite's online backup), even while in use."""
        try:
            target = sqlite3.connect(path)
            try:
                self._db.backup(target)
            finally:
                target.close()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot back up the fleet database to {path}: {exc}") from exc

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
            # Live as of now, keeping the last saved report until the next snapshot.
            db.execute(
                "INSERT INTO agent_last_state (agent_id, liveness, last_seen, saved_at) "
                "VALUES (?, 'live', ?, ?) ON CONFLICT(agent_id) DO UPDATE SET "
                "liveness = excluded.liveness, last_seen = excluded.last_seen, "
                "saved_at = excluded.saved_at",
                (hello.agent_id, seen.timestamp(), seen.timestamp()),
            )
            if hello.site:
                _add_site(db, hello.site, seen)

    def save_last_seen(self, agent_id: str, seen: datetime) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE agents SET last_seen = ? WHERE agent_id = ?", (_text(seen), agent_id)
            )

    def delete_unenrolled_agents(self, agent_ids: Sequence[str]) -> int:
        ids = [(agent_id,) for agent_id in agent_ids]
        with self._transaction() as db:
            db.executemany(
                "DELETE FROM agent_last_state WHERE agent_id IN "
                "(SELECT agent_id FROM agents WHERE agent_id = ? AND enrolled_at IS NULL)",
                ids,
            )
            before = db.total_changes
            db.executemany("DELETE FROM agents WHERE agent_id = ? AND enrolled_at IS NULL", ids)
            deleted = db.total_changes - before
            db.execute(
                "DELETE FROM sites WHERE name NOT IN (SELECT site FROM agents) "
                "AND name NOT IN (SELECT site FROM join_tokens)"
            )
        return deleted

    def set_draining(self, agent_id: str, draining: bool) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE agents SET draining = ? WHERE agent_id = ?", (int(draining), agent_id)
            )
            return cursor.rowcount == 1

    # ------------------------------------------------------- live-state snapshot

    def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        if not states:
            return
        saved, names = saved_at.timestamp(), _REPORT_FIELDS
        rows = [
            (
                s.agent_id,
                s.liveness.value,
                s.last_seen.timestamp(),
                None if s.report is None else names,
                _report_to_json(s.report),
                saved,
            )
            for s in states
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO agent_last_state VALUES (?, ?, ?, ?, ?, ?)", rows
            )

    def list_last_states(self) -> list[AgentLastState]:
        states = []
        for row in self._query("SELECT * FROM agent_last_state ORDER BY agent_id"):
            try:
                liveness = Liveness(row["liveness"])
            except ValueError:
                liveness = Liveness.DOWN
            states.append(
                AgentLastState(
                    agent_id=row["agent_id"],
                    liveness=liveness,
                    last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
                    report=_report_from_json(
                        row["agent_id"], row["report_fields"], row["report_json"]
                    ),
                    saved_at=datetime.fromtimestamp(row["saved_at"], UTC),
                )
            )
        return states

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
        location=_location(row),
        http_url=row["http_url"],
    )


def _api_key(row: sqlite3.Row) -> ApiKeyRecord:
    created = _time(row["created_at"])
    if created is None:
        raise StoreError(f"API key {row['key_id']} has no creation time")
    return ApiKeyRecord(
        key_id=row["key_id"],
        secret_sha256=row["secret_sha256"],
        created_at=created,
        name=row["name"],
        models=tuple(json.loads(row["models_json"])),
        allow_cloud=bool(row["allow_cloud"]),
        max_priority=row["max_priority"],
        max_tokens_per_request=row["max_tokens_per_request"],
        requests_per_minute=row["requests_per_minute"],
        tokens_per_minute=row["tokens_per_minute"],
        expires_at=_time(row["expires_at"]),
        revoked_at=_time(row["revoked_at"]),
        requests=row["requests"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        rejected=row["rejected"],
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
        location=_location(row),
        http_url=row["http_url"],
        public_key_sha256=row["public_key_sha256"],
        cert_not_after=_time(row["cert_not_after"]),
        revoked_at=_time(row["revoked_at"]),
    )


def _location(row: sqlite3.Row) -> Location | None:
    if row["lat"] is None or row["lon"] is None:
        return None
    return Location(lat=row["lat"], lon=row["lon"])


_REPORT_FIELDS = ",".join(LoadReport._fields)
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _report_to_json(report: LoadReport | None) -> str | None:
    """The report's values as a JSON list, in ``_REPORT_FIELDS`` order (the row keeps
    the names, so a version with renamed or added fields loses only those fields)."""
    if report is None:
        return None
    # Per-key usage is per interval (recorded by coordinator/access/api_keys.py), not state.
    # So are per-version model stats (handed to the report hooks as they arrive).
    return _encode(list(report._replace(key_usage=(), model_stats=(), overflow_usage=())))


def _inventory(item: list[object]) -> ModelInventory:
    """A ModelInventory saved as a JSON list (its fields in order)."""
    inventory = ModelInventory(*item)  # type: ignore[arg-type]
    check = inventory.self_check
    return inventory._replace(
        state=ModelInventoryState(inventory.state),
        self_check=None if check is None else SelfCheckResult(*check),
    )


def _report_from_json(agent_id: str, names: str | None, text: str | None) -> LoadReport | None:
    if text is None or not names:
        return None
    try:
        stored = dict(zip(names.split(","), json.loads(text), strict=True))
        fields = {name: stored[name] for name in LoadReport._fields if name in stored}
        if "applied" in fields:  # nested tuples, saved as JSON lists
            fields["applied"] = SectionGenerations(*fields["applied"])
        fields.pop("key_usage", None)  # not state: see _report_to_json
        fields.pop("model_stats", None)
        if "inventory" in fields:
            fields["inventory"] = tuple(_inventory(item) for item in fields["inventory"])
        fields.pop("overflow_usage", None)
        if "redactions" in fields:  # (type, count) pairs, saved as JSON lists
            fields["redactions"] = tuple((str(t), int(n)) for t, n in fields["redactions"])
        return LoadReport(**fields)
    except (TypeError, ValueError) as exc:
        logger.info("ignoring the saved load report of agent %s: %s", agent_id, exc)
        return None
