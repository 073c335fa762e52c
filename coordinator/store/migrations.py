"""The SQLite schema's history: one function per migration, numbered from 1.

``PRAGMA user_version`` holds the version a database is at (0: an empty file, or one
written before versions were kept). ``migrate`` runs the missing steps, one transaction
each, when the store opens (``coordinator.store.sqlite.SQLiteFleetStore.open``). To change
the schema, add one function decorated ``@_migration(next number)``; never edit or
renumber a released one: databases written by older coordinators are migrated from
wherever they stopped (tests/coordinator/test_store_migrations.py). A PostgreSQL backend
keeps a history of its own, to the same tables.

Tables, and the module of ``coordinator/store/`` that reads and writes each:

- ``join_tokens`` (join_tokens), ``agents``, ``sites``, ``removed_agents``,
  ``revoked_certificates`` (agents), ``agent_last_state`` (last_state), ``api_keys``
  (api_keys), ``section_generations`` (generations): migrations 1, 2, 4, 5, 8, 14, 15 and 16;
- ``admin_tokens`` (admin_tokens), ``audit_log`` (audit), ``request_records``
  (request_records): migration 3;
- ``model_versions``, ``model_files`` (catalog), ``model_rules``, ``model_assignments``
  (assignments): migrations 6 and 15;
- ``rollouts`` (rollouts): migration 7;
- ``coordinators``, ``leases`` (membership): migration 9;
- ``changes``, ``dashboard_sessions`` (changes): migration 10;
- ``key_demand`` (key_demand): migration 11;
- ``agent_owners`` (ownership): migration 12;
- ``model_holders`` (catalog): migration 13.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from pathlib import Path

from coordinator.errors import StoreError

logger = logging.getLogger(__name__)

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


@_migration(9)
def _coordinators_and_leases(db: sqlite3.Connection) -> None:
    """Coordinators sharing the database and the leases they hold (store/membership.py):
    times as POSIX seconds by the database's clock."""
    db.execute("""
        CREATE TABLE coordinators (
            coordinator_id TEXT PRIMARY KEY,
            incarnation    TEXT NOT NULL,
            grpc_address   TEXT NOT NULL,
            http_address   TEXT NOT NULL,
            version        TEXT NOT NULL,
            started_at     REAL NOT NULL,
            heartbeat_at   REAL NOT NULL
        )""")  # fmt: skip
    db.execute("""
        CREATE TABLE leases (
            name        TEXT PRIMARY KEY,
            holder      TEXT NOT NULL,
            incarnation TEXT NOT NULL,
            epoch       INTEGER NOT NULL,
            acquired_at REAL NOT NULL,
            expires_at  REAL NOT NULL
        )""")  # fmt: skip


@_migration(10)
def _changes_and_dashboard_sessions(db: sqlite3.Connection) -> None:
    """The change feed (store/changes.py: what one coordinator changed, for the others to
    apply) and dashboard sign-ins kept in the database (a hash of the session id, never
    the admin token), so a sign-in outlives the coordinator that made it. Times as POSIX
    seconds by the database's clock."""
    db.execute("""
        CREATE TABLE changes (
            seq     INTEGER PRIMARY KEY AUTOINCREMENT,
            kind    TEXT NOT NULL,
            subject TEXT NOT NULL,
            detail  TEXT NOT NULL,
            origin  TEXT NOT NULL,
            at      REAL NOT NULL
        )""")  # fmt: skip
    db.execute("CREATE INDEX changes_at ON changes (at)")
    db.execute("""
        CREATE TABLE dashboard_sessions (
            session_hash TEXT PRIMARY KEY,
            token_id     TEXT NOT NULL,
            created_at   REAL NOT NULL,
            expires_at   REAL NOT NULL
        )""")  # fmt: skip
    db.execute("CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at)")


@_migration(11)
def _key_demand(db: sqlite3.Connection) -> None:
    """Each coordinator's smoothed per-key demand and agent count (store/key_demand.py),
    so API-key budgets are split over the whole fleet; times as POSIX seconds by the
    database's clock."""
    db.execute("""
        CREATE TABLE key_demand (
            coordinator_id TEXT NOT NULL,
            key_id         TEXT NOT NULL,
            agents         INTEGER NOT NULL,
            request_rate   REAL NOT NULL,
            token_rate     REAL NOT NULL,
            updated_at     REAL NOT NULL,
            PRIMARY KEY (coordinator_id, key_id)
        )""")  # fmt: skip


@_migration(12)
def _agent_owners(db: sqlite3.Connection) -> None:
    """Which coordinator an agent's session is on, with an epoch bumped at every session
    open (store/ownership.py)."""
    db.execute("""
        CREATE TABLE agent_owners (
            agent_id       TEXT PRIMARY KEY,
            coordinator_id TEXT NOT NULL,
            epoch          INTEGER NOT NULL,
            claimed_at     REAL NOT NULL
        )""")  # fmt: skip


@_migration(13)
def _model_holders(db: sqlite3.Connection) -> None:
    """Which coordinators hold every blob of a model version (store/catalog.py; one
    coordinator on SQLite); times as POSIX seconds by the database's clock."""
    db.execute("""
        CREATE TABLE model_holders (
            name           TEXT NOT NULL,
            version        TEXT NOT NULL,
            coordinator_id TEXT NOT NULL,
            held_at        REAL NOT NULL,
            PRIMARY KEY (name, version, coordinator_id),
            FOREIGN KEY (name, version) REFERENCES model_versions (name, version)
        )""")  # fmt: skip


@_migration(14)
def _shared_live_view(db: sqlite3.Connection) -> None:
    """``agent_last_state`` as the coordinators' shared live view (store/last_state.py):
    who wrote each row at which ownership epoch, its version (newer writes higher), the
    agent's summed model stats, and when it was written by the database's clock."""
    for column in (
        "owner TEXT", "epoch INTEGER NOT NULL DEFAULT 0", "version INTEGER NOT NULL DEFAULT 0",
        "stats_json TEXT", "written_at REAL",
    ):  # fmt: skip
        db.execute(f"ALTER TABLE agent_last_state ADD COLUMN {column}")
    db.execute("CREATE INDEX agent_last_state_version ON agent_last_state (version)")


@_migration(15)
def _models_on_demand(db: sqlite3.Connection) -> None:
    """Issue 26: a model target's residency (``on_demand``, ``pinned``, ``store_only``) on
    selector rules and explicit assignments, and each API key's keep-alive cap and pin
    right. Existing rows keep today's behaviour: on demand, the agent's own cap, no pin."""
    for table in ("model_rules", "model_assignments"):
        db.execute(f"ALTER TABLE {table} ADD COLUMN residency TEXT NOT NULL DEFAULT 'on_demand'")
    db.execute("ALTER TABLE api_keys ADD COLUMN max_keep_alive_s REAL NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE api_keys ADD COLUMN may_pin_models INTEGER NOT NULL DEFAULT 0")


@_migration(16)
def _key_policy(db: sqlite3.Connection) -> None:
    """Issue 28: each API key's policy (moderation per category and direction, stream
    mode) as JSON (edgefleet/key_policy.py). NULL, as every existing key has it: the
    default policy (block sexual/minors, flag the rest), so an upgrade changes no answer."""
    db.execute("ALTER TABLE api_keys ADD COLUMN policy_json TEXT")


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
