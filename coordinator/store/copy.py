"""Copying a SQLite fleet database into an empty PostgreSQL one, verified
(``python -m coordinator store migrate --from sqlite:DATA_DIR --to postgresql://...``).

What it does, in order:

1. brings the SQLite database to this version's schema and takes a consistent copy of it
   (SQLite's online backup: the coordinator may still be running; what it writes after
   the copy is not carried over, so stop it first for a cut-over);
2. brings the PostgreSQL database to this version's schema (its migrations) and refuses
   one that holds any rows;
3. copies every table in one transaction (COPY; sequence numbers kept, so audit entries
   and model rules keep their order and ids), API keys' usage totals as one usage row per
   key, and the generation counter at least where SQLite's was;
4. verifies, reading both back before it commits (a copy that does not verify is rolled
   back, nothing of it kept): for every table, its row count and a sha256 of its rows
   in primary-key order (values in one canonical form: times as UTC ISO 8601, flags as
   booleans, bytes as hex), and the API keys' usage totals.

Nothing else of ``data_dir`` moves: the CA, the model-signing key and the blobs stay
there, and the coordinator restarted with ``store_url`` set uses them as before (agents
reconnect with their certificates; nothing is enrolled again).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinator.errors import StoreError
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from coordinator.store.offline import run_offline
from coordinator.store.postgres.bulk import PostgresBulk, bulk_transaction
from coordinator.store.sqlite.export import SQLiteReader, reading

#: Every table copied, parents before children (model_files names model_versions). Not
#: copied: what running coordinators keep for each other (coordinators, leases, changes,
#: dashboard_sessions, key_demand, agent_owners, model_holders), which a cut-over starts
#: without.
TABLES = (
    "join_tokens", "agents", "sites", "revoked_certificates", "removed_agents",
    "agent_last_state", "admin_tokens", "audit_log", "request_records", "api_keys",
    "model_versions", "model_files", "model_rules", "model_assignments", "rollouts",
)  # fmt: skip
#: Identity columns whose values are kept (their sequences then moved past them).
IDENTITIES = {"audit_log": "seq", "model_rules": "seq", "agent_last_state": "version"}
#: The usage rows a copy writes carry this instance name.
COPY_INSTANCE = "copied-from-sqlite"
USAGE = ("requests", "prompt_tokens", "completion_tokens", "rejected")


@dataclass
class TableCopy:
    table: str
    rows: int
    sha256: str


@dataclass
class CopyReport:
    source: str
    target: str
    tables: list[TableCopy] = field(default_factory=list)
    usage_totals: dict[str, int] = field(default_factory=dict)
    generations_issued_through: int = 0

    def json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "tables": {t.table: {"rows": t.rows, "sha256": t.sha256} for t in self.tables},
            "usage_totals": self.usage_totals,
            "generations_issued_through": self.generations_issued_through,
            "verified": True,
        }


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _converter(kind: str) -> Callable[[Any], Any]:
    """SQLite's value -> the PostgreSQL column's (by information_schema data type)."""
    if kind == "timestamp with time zone":
        return _time
    if kind == "boolean":
        return lambda v: None if v is None else bool(v)
    if kind == "bytea":
        return lambda v: None if v is None else bytes(v)
    if kind == "double precision":
        return lambda v: None if v is None else float(v)
    if kind in ("bigint", "integer"):
        return lambda v: None if v is None else int(v)
    return lambda v: v


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    return value


class _Checksum:
    def __init__(self) -> None:
        self.rows = 0
        self._hash = hashlib.sha256()

    def add(self, batch: Iterable[tuple[Any, ...]]) -> None:
        for row in batch:
            line = json.dumps([_canonical(v) for v in row], ensure_ascii=False)
            self._hash.update(line.encode() + b"\n")
            self.rows += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def copy_sqlite_to_postgres(
    data_dir: Path, target: StoreLocation, *, progress: Callable[[str], None] = lambda _: None
) -> CopyReport:
    """Copy ``data_dir``'s SQLite database into ``target`` (empty), verified; StoreError
    when the target holds rows, or when any table's count or checksum differs."""
    if not target.url:
        raise StoreError("the copy's target must be a PostgreSQL URL (postgresql://...)")
    with tempfile.TemporaryDirectory(prefix="edgefleet-copy-") as scratch:
        snapshot = Path(scratch) / "fleet.db"

        async def take(store: FleetStore) -> int:
            return await store.backup_to(snapshot)

        run_offline(data_dir, take)  # migrated to this version first
        progress(f"took a consistent copy of {data_dir / 'fleet.db'}")

        async def prepare(store: FleetStore) -> None:
            return None

        run_offline(target, prepare)  # this version's schema on PostgreSQL
        report = CopyReport(source=f"sqlite:{data_dir}", target=target.url)
        # One transaction: a copy that does not verify is rolled back, nothing of it kept.
        with reading(snapshot) as source, bulk_transaction(target.url, target.password) as pg:
            _refuse_rows(pg)
            for table in TABLES:
                rows = _copy_table(source, pg, table)
                progress(f"copied {table}: {rows} rows")
            _copy_usage(source, pg)
            _copy_generations(source, pg)
            for table in TABLES:
                report.tables.append(_verify_table(source, pg, table))
            report.usage_totals = _verify_usage(source, pg)
            report.generations_issued_through = int(
                pg.execute("SELECT issued_through FROM section_generations")[0][0]
            )
        progress("verified: every table's row count and checksum match")
        return report


def _refuse_rows(pg: PostgresBulk) -> None:
    full = [t for t in (*TABLES, "api_key_usage") if pg.count(t)]
    if full:
        raise StoreError(
            f"the fleet database {pg.name} already holds rows (in {', '.join(full)}): a copy "
            "goes into an empty database only"
        )


def _plan(
    source: SQLiteReader, pg: PostgresBulk, table: str
) -> tuple[list[str], list[str], dict[str, str]]:
    types = pg.column_types(table)
    have = set(source.columns(table))
    columns = [c for c in types if c in have]
    return columns, pg.primary_key(table), types


def _converted(
    table: str, batches: Iterator[list[tuple[Any, ...]]], converters: list[Callable[[Any], Any]]
) -> Iterator[list[tuple[Any, ...]]]:
    for batch in batches:
        try:
            yield [tuple(f(v) for f, v in zip(converters, row, strict=True)) for row in batch]
        except (TypeError, ValueError) as exc:
            raise StoreError(f"table {table} holds a value PostgreSQL cannot take: {exc}") from exc


def _copy_table(source: SQLiteReader, pg: PostgresBulk, table: str) -> int:
    columns, key, types = _plan(source, pg, table)
    converters = [_converter(types[c]) for c in columns]
    written = pg.copy_in(
        table, columns, _converted(table, source.rows(table, columns, key), converters)
    )
    if table in IDENTITIES:
        pg.move_identity_past(table, IDENTITIES[table])
    return written


def _verify_table(source: SQLiteReader, pg: PostgresBulk, table: str) -> TableCopy:
    columns, key, types = _plan(source, pg, table)
    converters = [_converter(types[c]) for c in columns]
    text = {c for c, kind in types.items() if kind == "text"}
    mine, theirs = _Checksum(), _Checksum()
    for batch in _converted(table, source.rows(table, columns, key), converters):
        mine.add(batch)
    for batch in pg.rows(table, columns, key, text):
        theirs.add(batch)
    if (mine.rows, mine.hexdigest()) != (theirs.rows, theirs.hexdigest()):
        raise StoreError(
            f"the copy of table {table} differs: {mine.rows} rows in SQLite, {theirs.rows} in "
            f"PostgreSQL (checksums {mine.hexdigest()[:12]} and {theirs.hexdigest()[:12]}); "
            "the copy was rolled back, nothing of it kept"
        )
    return TableCopy(table, mine.rows, mine.hexdigest())


def _copy_usage(source: SQLiteReader, pg: PostgresBulk) -> None:
    batches = source.rows("api_keys", ["key_id", *USAGE], ["key_id"])
    rows = [
        (key_id, COPY_INSTANCE, *usage)
        for batch in batches
        for key_id, *usage in batch
        if any(usage)
    ]
    pg.copy_in("api_key_usage", ["key_id", "instance", *USAGE], [rows])


def _verify_usage(source: SQLiteReader, pg: PostgresBulk) -> dict[str, int]:
    sums = ", ".join(f"COALESCE(sum({c}), 0)" for c in USAGE)
    mine = dict(zip(USAGE, (int(source.scalar(f"SELECT COALESCE(sum({c}), 0) FROM api_keys"))
                            for c in USAGE), strict=True))  # fmt: skip
    theirs = dict(zip(USAGE, (int(v) for v in pg.execute(f"SELECT {sums} FROM api_key_usage")[0]),
                      strict=True))  # fmt: skip
    if mine != theirs:
        raise StoreError(
            f"the copied usage totals differ: {mine} in SQLite, {theirs} in PostgreSQL"
        )
    return mine


def _copy_generations(source: SQLiteReader, pg: PostgresBulk) -> None:
    issued = source.scalar("SELECT issued_through FROM section_generations WHERE id = 1")
    if issued is not None:
        pg.execute(
            "UPDATE section_generations SET issued_through = GREATEST(issued_through, %s)"
            " WHERE id = 1",
            (int(issued),),
        )
