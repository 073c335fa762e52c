"""The PostgreSQL schema's history: one function per migration, numbered from 1.

The same tables as the SQLite backend's (coordinator/store/migrations.py), with
PostgreSQL's types: ``timestamptz`` for times, ``boolean`` for flags, ``bytea`` for signed
bytes, ``bigint`` for every integer (SQLite's are 64-bit: a value SQLite takes, this
backend takes too), identity columns for sequence numbers. Migration 1 is the schema as the SQLite
backend had it at its version 8, when this backend was added; from then on each backend
keeps a history of its own.

The version lives in table ``edgefleet_schema`` (one row). ``migrate`` runs the missing
steps when the store opens, one transaction each, under a transaction-scoped advisory
lock (:data:`LOCK_KEY`): coordinators (and CLIs) starting together against one database
wait for each other, and each step re-reads the version under the lock, so every step
runs exactly once. A database written by a newer coordinator is refused. Never edit or
renumber a released migration.

What differs from SQLite on purpose:

- ``api_key_usage``: usage totals in one row per (key, coordinator instance), added to by
  that coordinator alone, so several coordinators never update one hot row per key; a
  key's totals are the sum of its rows;
- ``audit_log``: append-only, enforced by a trigger that refuses UPDATE, DELETE and
  TRUNCATE;
- ``agent_last_state``: no foreign key to ``agents`` (SQLite does not enforce its own;
  the store deletes an agent's state with the agent).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.rows import DictRow

from coordinator.errors import StoreError
from coordinator.store.migrations import GENERATION_MARGIN_MS

logger = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[DictRow]
Migration = Callable[[Connection], Awaitable[None]]

#: The advisory lock migrations run under (any fixed 64-bit number: "edgeflt1").
LOCK_KEY = 0x6564_6765_666C_7431

MIGRATIONS: list[Migration] = []


def _migration(version: int) -> Callable[[Migration], Migration]:
    def register(step: Migration) -> Migration:
        if version != len(MIGRATIONS) + 1:
            raise RuntimeError(f"migration {step.__name__} is numbered {version}, "
                               f"the next free number is {len(MIGRATIONS) + 1}")  # fmt: skip
        MIGRATIONS.append(step)
        return step

    return register


_SCHEMA_1 = [
    """CREATE TABLE join_tokens (
        token_id      text PRIMARY KEY,
        secret_sha256 text NOT NULL,
        created_at    timestamptz NOT NULL,
        expires_at    timestamptz,
        max_uses      bigint NOT NULL,
        uses          bigint NOT NULL DEFAULT 0,
        site          text NOT NULL DEFAULT '',
        revoked       boolean NOT NULL DEFAULT false,
        note          text NOT NULL DEFAULT '',
        lat           double precision,
        lon           double precision,
        http_url      text NOT NULL DEFAULT ''
    )""",
    """CREATE TABLE agents (
        agent_id          text PRIMARY KEY,
        enrolled_at       timestamptz,
        token_id          text NOT NULL DEFAULT '',
        credential_sha256 text NOT NULL DEFAULT '',
        cert_serial       text NOT NULL DEFAULT '',
        site              text NOT NULL DEFAULT '',
        hello_json        text,
        last_seen         timestamptz,
        draining          boolean NOT NULL DEFAULT false,
        lat               double precision,
        lon               double precision,
        http_url          text NOT NULL DEFAULT '',
        public_key_sha256 text NOT NULL DEFAULT '',
        cert_not_after    timestamptz,
        revoked_at        timestamptz
    )""",
    "CREATE INDEX agents_token ON agents (token_id)",
    """CREATE TABLE sites (
        name       text PRIMARY KEY,
        first_seen timestamptz NOT NULL
    )""",
    """CREATE TABLE revoked_certificates (
        serial     text PRIMARY KEY,
        agent_id   text NOT NULL,
        revoked_at timestamptz NOT NULL
    )""",
    """CREATE TABLE removed_agents (
        agent_id   text PRIMARY KEY,
        removed_at timestamptz NOT NULL
    )""",
    """CREATE TABLE agent_last_state (
        agent_id      text PRIMARY KEY,
        liveness      text NOT NULL,
        last_seen     double precision NOT NULL,
        report_fields text,
        report_json   text,
        saved_at      double precision NOT NULL
    )""",
    """CREATE TABLE admin_tokens (
        token_id      text PRIMARY KEY,
        name          text NOT NULL,
        role          text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
        secret_sha256 text NOT NULL,
        created_at    timestamptz NOT NULL,
        created_by    text NOT NULL DEFAULT '',
        revoked_at    timestamptz
    )""",
    """CREATE TABLE audit_log (
        seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at         timestamptz NOT NULL,
        actor_id   text NOT NULL DEFAULT '',
        actor_name text NOT NULL DEFAULT '',
        role       text NOT NULL DEFAULT '',
        action     text NOT NULL,
        target     text NOT NULL DEFAULT '',
        peer       text NOT NULL DEFAULT '',
        outcome    text NOT NULL,
        status     bigint NOT NULL DEFAULT 0,
        detail     text NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX audit_log_at ON audit_log (at)",
    # Append-only: no path in the code updates or deletes, and the database refuses to.
    """CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the audit log is append-only (% refused)', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END $$""",
    """CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()""",
    """CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
        FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()""",
    """CREATE TABLE request_records (
        agent_id          text NOT NULL,
        seq               bigint NOT NULL,
        received_at       double precision NOT NULL,
        at                double precision NOT NULL DEFAULT 0,
        key_id            text,
        model             text NOT NULL DEFAULT '',
        version           text NOT NULL DEFAULT '',
        prompt_tokens     bigint NOT NULL DEFAULT 0,
        completion_tokens bigint NOT NULL DEFAULT 0,
        latency_ms        double precision NOT NULL DEFAULT 0,
        ttft_ms           double precision,
        served_by         text NOT NULL DEFAULT '',
        endpoint          text NOT NULL DEFAULT '',
        status            bigint NOT NULL DEFAULT 0,
        dropped           bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (agent_id, seq)
    )""",
    "CREATE INDEX request_records_received ON request_records (received_at)",
    """CREATE TABLE api_keys (
        key_id                 text PRIMARY KEY,
        secret_sha256          text NOT NULL,
        created_at             timestamptz NOT NULL,
        name                   text NOT NULL DEFAULT '',
        models_json            text NOT NULL DEFAULT '[]',
        allow_cloud            boolean NOT NULL DEFAULT false,
        max_priority           text NOT NULL DEFAULT 'normal',
        max_tokens_per_request bigint NOT NULL DEFAULT 0,
        requests_per_minute    double precision NOT NULL DEFAULT 0,
        tokens_per_minute      double precision NOT NULL DEFAULT 0,
        expires_at             timestamptz,
        revoked_at             timestamptz
    )""",
    """CREATE TABLE api_key_usage (
        key_id            text NOT NULL REFERENCES api_keys (key_id) ON DELETE CASCADE,
        -- the coordinator instance that added these (each adds to its own row only)
        instance          text NOT NULL,
        requests          bigint NOT NULL DEFAULT 0,
        prompt_tokens     bigint NOT NULL DEFAULT 0,
        completion_tokens bigint NOT NULL DEFAULT 0,
        rejected          bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, instance)
    )""",
    """CREATE TABLE section_generations (
        id             integer PRIMARY KEY CHECK (id = 1),
        issued_through bigint NOT NULL
    )""",
    """CREATE TABLE model_versions (
        name         text NOT NULL,
        version      text NOT NULL,
        task         text NOT NULL DEFAULT '',
        manifest     bytea NOT NULL,
        signature    bytea NOT NULL,
        sha256       text NOT NULL,
        size_bytes   bigint NOT NULL,
        gate_passed  boolean NOT NULL,
        deprecated   boolean NOT NULL DEFAULT false,
        published_at timestamptz NOT NULL,
        PRIMARY KEY (name, version)
    )""",
    """CREATE TABLE model_files (
        name    text NOT NULL,
        version text NOT NULL,
        path    text NOT NULL,
        sha256  text NOT NULL,
        size    bigint NOT NULL,
        PRIMARY KEY (name, version, path),
        FOREIGN KEY (name, version) REFERENCES model_versions (name, version)
            ON DELETE CASCADE
    )""",
    "CREATE INDEX model_files_sha256 ON model_files (sha256)",
    """CREATE TABLE model_rules (
        seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name       text NOT NULL,
        selector   text NOT NULL,
        version    text NOT NULL,
        rollout_id text NOT NULL DEFAULT '',
        set_at     timestamptz NOT NULL,
        UNIQUE (name, selector)
    )""",
    """CREATE TABLE model_assignments (
        agent_id   text NOT NULL,
        name       text NOT NULL,
        version    text NOT NULL,
        rollout_id text NOT NULL DEFAULT '',
        set_at     timestamptz NOT NULL,
        PRIMARY KEY (agent_id, name)
    )""",
    """CREATE TABLE rollouts (
        rollout_id text PRIMARY KEY,
        model      text NOT NULL,
        version    text NOT NULL,
        state      text NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        body_json  text NOT NULL
    )""",
    "CREATE INDEX rollouts_state ON rollouts (state, created_at)",
]


@_migration(1)
async def _schema_of_sqlite_version_8(db: Connection) -> None:
    """Every table the SQLite backend had at its version 8. The generation counter starts
    GENERATION_MARGIN_MS above the database server's clock (a copy from SQLite brings its
    own counter: coordinator/store/copy.py)."""
    for statement in _SCHEMA_1:
        await db.execute(statement)
    await db.execute(
        "INSERT INTO section_generations (id, issued_through) VALUES "
        "(1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + %s)",
        (GENERATION_MARGIN_MS,),
    )


@_migration(2)
async def _coordinators_and_leases(db: Connection) -> None:
    """Coordinators sharing the database and the leases they hold (store/membership.py):
    times by the server's clock."""
    await db.execute("""
        CREATE TABLE coordinators (
            coordinator_id text PRIMARY KEY,
            incarnation    text NOT NULL,
            grpc_address   text NOT NULL,
            http_address   text NOT NULL,
            version        text NOT NULL,
            started_at     timestamptz NOT NULL,
            heartbeat_at   timestamptz NOT NULL
        )""")  # fmt: skip
    await db.execute("""
        CREATE TABLE leases (
            name        text PRIMARY KEY,
            holder      text NOT NULL,
            incarnation text NOT NULL,
            epoch       bigint NOT NULL,
            acquired_at timestamptz NOT NULL,
            expires_at  timestamptz NOT NULL
        )""")  # fmt: skip


@_migration(3)
async def _changes_and_dashboard_sessions(db: Connection) -> None:
    """The change feed (store/changes.py) and dashboard sign-ins kept in the database (a
    hash of the session id, never the admin token); times by the server's clock."""
    await db.execute("""
        CREATE TABLE changes (
            seq     bigserial PRIMARY KEY,
            kind    text NOT NULL,
            subject text NOT NULL,
            detail  text NOT NULL,
            origin  text NOT NULL,
            at      timestamptz NOT NULL
        )""")  # fmt: skip
    await db.execute("CREATE INDEX changes_at ON changes (at)")
    await db.execute("""
        CREATE TABLE dashboard_sessions (
            session_hash text PRIMARY KEY,
            token_id     text NOT NULL,
            created_at   timestamptz NOT NULL,
            expires_at   timestamptz NOT NULL
        )""")  # fmt: skip
    await db.execute("CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at)")


@_migration(4)
async def _key_demand(db: Connection) -> None:
    """Each coordinator's smoothed per-key demand and agent count (store/key_demand.py)."""
    await db.execute("""
        CREATE TABLE key_demand (
            coordinator_id text NOT NULL,
            key_id         text NOT NULL,
            agents         integer NOT NULL,
            request_rate   double precision NOT NULL,
            token_rate     double precision NOT NULL,
            updated_at     timestamptz NOT NULL,
            PRIMARY KEY (coordinator_id, key_id)
        )""")  # fmt: skip


@_migration(5)
async def _agent_owners(db: Connection) -> None:
    """Which coordinator an agent's session is on, with an epoch (store/ownership.py)."""
    await db.execute("""
        CREATE TABLE agent_owners (
            agent_id       text PRIMARY KEY,
            coordinator_id text NOT NULL,
            epoch          bigint NOT NULL,
            claimed_at     timestamptz NOT NULL
        )""")  # fmt: skip


@_migration(6)
async def _model_holders(db: Connection) -> None:
    """Which coordinators hold every blob of a model version (store/catalog.py)."""
    await db.execute("""
        CREATE TABLE model_holders (
            name           text NOT NULL,
            version        text NOT NULL,
            coordinator_id text NOT NULL,
            held_at        timestamptz NOT NULL,
            PRIMARY KEY (name, version, coordinator_id),
            FOREIGN KEY (name, version) REFERENCES model_versions (name, version)
        )""")  # fmt: skip


@_migration(7)
async def _shared_live_view(db: Connection) -> None:
    """``agent_last_state`` as the coordinators' shared live view (store/last_state.py):
    who wrote each row at which ownership epoch, its version (from a sequence the column
    owns, taken in commit order), the summed model stats, and when it was written by the
    database's clock (POSIX seconds)."""
    await db.execute("CREATE SEQUENCE agent_last_state_version")
    await db.execute("""
        ALTER TABLE agent_last_state
            ADD COLUMN owner      text,
            ADD COLUMN epoch      bigint NOT NULL DEFAULT 0,
            ADD COLUMN version    bigint NOT NULL DEFAULT nextval('agent_last_state_version'),
            ADD COLUMN stats_json text,
            ADD COLUMN written_at double precision""")  # fmt: skip
    await db.execute("ALTER SEQUENCE agent_last_state_version OWNED BY agent_last_state.version")
    await db.execute("CREATE INDEX agent_last_state_version_idx ON agent_last_state (version)")


@_migration(8)
async def _models_on_demand(db: Connection) -> None:
    """Issue 26: a model target's residency on selector rules and explicit assignments,
    and each API key's keep-alive cap and pin right (existing rows: on demand, the
    agent's own cap, no pin)."""
    for table in ("model_rules", "model_assignments"):
        await db.execute(
            f"ALTER TABLE {table} ADD COLUMN residency text NOT NULL DEFAULT 'on_demand'"
        )
    await db.execute("""
        ALTER TABLE api_keys
            ADD COLUMN max_keep_alive_s double precision NOT NULL DEFAULT 0,
            ADD COLUMN may_pin_models   boolean NOT NULL DEFAULT false""")  # fmt: skip


@_migration(9)
async def _key_policy(db: Connection) -> None:
    """Issue 28: each API key's policy as JSON text (NULL for existing keys: the default
    policy, block sexual/minors and flag the rest)."""
    await db.execute("ALTER TABLE api_keys ADD COLUMN policy_json text")


SCHEMA_VERSION = len(MIGRATIONS)


async def schema_version(db: Connection) -> int:
    """The database's schema version; 0 for an empty database."""
    cursor = await db.execute("SELECT to_regclass('edgefleet_schema') IS NOT NULL AS kept")
    row = await cursor.fetchone()
    if row is None or not row["kept"]:
        return 0
    cursor = await db.execute("SELECT version FROM edgefleet_schema WHERE id = 1")
    row = await cursor.fetchone()
    return 0 if row is None else int(row["version"])


async def migrate(db: Connection, name: str) -> None:
    """Bring the database to SCHEMA_VERSION, one transaction per migration, each under the
    advisory lock (``db`` is in autocommit mode). Refuses a database written by a newer
    coordinator, before and after."""
    _refuse_newer(await schema_version(db), name)
    for version in range(1, SCHEMA_VERSION + 1):
        async with db.transaction():
            # No deadline while migrating: another coordinator may be at it.
            await db.execute("SET LOCAL statement_timeout = 0")
            await db.execute("SET LOCAL lock_timeout = 0")
            await db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            await db.execute(
                "CREATE TABLE IF NOT EXISTS edgefleet_schema ("
                " id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL)"
            )
            found = await schema_version(db)
            _refuse_newer(found, name)
            if found >= version:
                continue
            await MIGRATIONS[version - 1](db)
            await db.execute(
                "INSERT INTO edgefleet_schema (id, version) VALUES (1, %s) "
                "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                (version,),
            )
            logger.info("fleet database %s: schema migrated to version %d", name, version)


def _refuse_newer(found: int, name: str) -> None:
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"the fleet database {name} has schema version {found}, newer than this "
            f"coordinator's {SCHEMA_VERSION}: run a coordinator at least as new as the one "
            "that wrote it (or point store_url elsewhere)"
        )
