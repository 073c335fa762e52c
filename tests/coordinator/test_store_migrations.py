"""Schema migrations: a database written before versions were kept is upgraded in place.

The "before" database is written by the coordinator's own code as it was at commit
9bb823e (vendored in tests/data/old_trees/, see tests/old_trees.py, and run in a child
process), with real rows: join tokens, an enrolled agent, an agent that connected without
enrolling, sites.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator.errors import StoreError
from coordinator.fleet.records import Liveness
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.store import migrations
from coordinator.store.interface import AgentLastState, StoredAgent
from coordinator.store.migrations import SCHEMA_VERSION
from coordinator.store.sqlite import DB_FILE, SQLiteFleetStore
from devtools.process import REPO_ROOT
from edgefleet.contract import KeyUsage, LoadReport
from tests.old_trees import COORDINATOR_BEFORE_VERSIONS, extract

pytestmark = pytest.mark.timeout(60)

# The last commit before schema versions: its schema is migration 1's result.
BEFORE_VERSIONS = COORDINATOR_BEFORE_VERSIONS.commit
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# Runs inside the old code (cwd = its checkout): writes rows, prints what it wrote.
_WRITE_WITH_OLD_CODE = """
import json, sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import coordinator
from coordinator.fleet import AgentHello, Hardware, LoadedModel, Location
from coordinator.sqlite_store import SQLiteFleetStore
from coordinator.store import JoinToken, StoredAgent

assert Path(coordinator.__file__).resolve().parent.parent == Path.cwd().resolve()
now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
store = SQLiteFleetStore(Path(sys.argv[1]))
store.add_token(JoinToken("tok-berlin", "ab" * 32, now, now + timedelta(days=1), 2,
                          site="berlin", note="lab boxes"))
store.add_token(JoinToken("tok-old", "cd" * 32, now - timedelta(days=2), None, 1))
store.revoke_token("tok-old")
assert store.enroll("tok-berlin", now, StoredAgent(
    "edge-1", enrolled_at=now, token_id="tok-berlin", credential_sha256="ef" * 32,
    cert_serial="1f2e", site="berlin"))
hello = AgentHello(
    agent_id="edge-1", site="berlin", http_url="http://10.0.0.7:8000", agent_version="0.9",
    location=Location(52.52, 13.405),
    hardware=Hardware(cpu_count=8, memory_bytes=16 << 30,
                      execution_providers=("CPUExecutionProvider",)),
    models=(LoadedModel("smollm2-135m", "int8-abc", "text-generation", "int8"),),
    token="secret")
store.save_hello(hello, now + timedelta(minutes=1))
store.save_hello(AgentHello(agent_id="loose-1", site="munich", http_url="http://10.0.0.8:8000",
                            models=(LoadedModel("m", "v1"),)), now + timedelta(minutes=2))
store.set_draining("loose-1", True)
print(json.dumps({
    "tokens": [asdict(t) for t in store.list_tokens()],
    "agents": [asdict(a) for a in store.list_agents()],
    "sites": [asdict(s) for s in store.list_sites()],
}, default=str))
store.close()
"""


def _old_checkout(into: Path) -> Path:
    """The coordinator package as it was at BEFORE_VERSIONS, extracted under ``into``."""
    return extract(COORDINATOR_BEFORE_VERSIONS, into)


def _written_by_old_code(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    old = _old_checkout(tmp_path / "old")
    db = tmp_path / "data" / DB_FILE
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_WITH_OLD_CODE, str(db)],
        cwd=old, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return db, json.loads(done.stdout)


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


async def _opened(path: Path) -> SQLiteFleetStore:
    store = SQLiteFleetStore(path)
    await store.open()
    return store


async def _open_close(path: Path) -> None:
    await (await _opened(path)).close()


async def test_a_database_written_before_versions_is_upgraded_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    db, before = _written_by_old_code(tmp_path)
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 0

    store = await _opened(db)
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        # Every field the old code stored, unchanged (later versions add fields).
        tokens = _as_json([asdict(t) for t in await store.list_tokens()])
        assert [
            {k: t[k] for k in old} for t, old in zip(tokens, before["tokens"], strict=True)
        ] == before["tokens"]
        assert _as_json([asdict(s) for s in await store.list_sites()]) == before["sites"]
        agents = await store.list_agents()
        # Everything the old code stored about each agent, its Hello included.
        for old, new in zip(before["agents"], agents, strict=True):
            new_view = _as_json(asdict(new))
            for key, value in old.items():
                if key != "hello":
                    assert new_view[key] == value, key
            assert new.hello is not None
            assert new.hello.agent_id == old["hello"]["agent_id"]
            assert new.hello.http_url == old["hello"]["http_url"]
            assert new.hello.site == old["hello"]["site"]
            assert [(m.name, m.version) for m in new.hello.models] == [
                (m["name"], m["version"]) for m in old["hello"]["models"]
            ]
        edge = await store.get_agent("edge-1")
        assert edge is not None and edge.enrolled and edge.credential_sha256 == "ef" * 32
        assert edge.hello is not None and edge.hello.location is not None
        assert edge.hello.location.lat == 52.52

        # The upgraded database works: the token's second use, and live states.
        assert await store.enroll("tok-berlin", NOW, _enrolled("edge-2")) is True
        assert await store.enroll("tok-old", NOW, _enrolled("edge-3")) is False  # still revoked
        await store.save_last_states(
            [AgentLastState("edge-1", Liveness.LIVE, NOW, LoadReport())], NOW
        )
        assert [s.agent_id for s in await store.list_last_states()] == ["edge-1"]
    finally:
        await store.close()


async def test_agents_from_before_versions_restore_as_down_not_unconfirmed(tmp_path: Path) -> None:
    """Nothing says they were alive when the old coordinator stopped: as before."""
    db, _ = _written_by_old_code(tmp_path)
    store = await _opened(db)
    try:
        registry = await LiveFleetRegistry.open(store, clock=lambda: NOW)
        assert {r.agent_id: r.liveness for r in registry.agents()} == {
            "edge-1": Liveness.DOWN,
            "loose-1": Liveness.DOWN,
        }
        assert registry.get("loose-1").draining
    finally:
        await store.close()


def _columns(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(db) as raw:
        tables = [
            r[0]
            for r in raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: raw.execute(f"PRAGMA table_info({t})").fetchall() for t in tables}


async def test_migration_1_gives_the_schema_the_old_code_wrote(tmp_path: Path) -> None:
    old_db, _ = _written_by_old_code(tmp_path)
    fresh = tmp_path / "fresh.db"
    with sqlite3.connect(fresh, isolation_level=None) as raw:
        migrations.MIGRATIONS[0](raw)
    assert _columns(fresh) == _columns(old_db)


async def test_a_fresh_and_an_upgraded_database_have_the_same_schema(tmp_path: Path) -> None:
    old_db, _ = _written_by_old_code(tmp_path)
    await _open_close(old_db)
    fresh = tmp_path / "fresh" / DB_FILE
    await _open_close(fresh)
    assert _columns(fresh) == _columns(old_db)


async def test_opening_again_or_concurrently_migrates_once(tmp_path: Path) -> None:
    # Eight stores, each on a thread of its own, opening and migrating one new file at
    # once (switching it to WAL together: SQLite answers BUSY there without waiting), on
    # several new files: it failed about once in 40 files before the switch was retried.
    for attempt in range(40):
        db = tmp_path / f"{attempt}-{DB_FILE}"
        await asyncio.gather(*(_open_close(db) for _ in range(8)))
        store = await _opened(db)
        try:
            assert await store.schema_version() == SCHEMA_VERSION
        finally:
            await store.close()


async def test_a_database_from_a_newer_coordinator_is_refused(tmp_path: Path) -> None:
    db = tmp_path / DB_FILE
    await _open_close(db)
    with sqlite3.connect(db) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        await _opened(db)


async def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / DB_FILE
    await _open_close(db)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        conn.execute("ALTER TABLE no_such_table ADD COLUMN y INTEGER")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, broken])
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match="no such table"):
        await _opened(db)
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "half_done" not in [
            r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]


async def test_migration_numbers_must_follow_on() -> None:
    with pytest.raises(RuntimeError, match="the next free number is"):

        @migrations._migration(SCHEMA_VERSION + 2)
        def skipped(conn: sqlite3.Connection) -> None:
            """Never registered."""

    assert len(migrations.MIGRATIONS) == SCHEMA_VERSION


def _enrolled(agent_id: str) -> StoredAgent:
    return StoredAgent(agent_id=agent_id, enrolled_at=NOW, token_id="tok-berlin", site="berlin")


async def test_last_states_round_trip_and_tolerate_renamed_report_fields(tmp_path: Path) -> None:
    store = await _opened(tmp_path / DB_FILE)
    try:
        report = LoadReport(
            waiting_sequences=3,
            running_sequences=2,
            tokens_per_second=41.5,
            key_usage=(KeyUsage("key_1", 4, 100, 50, 1),),
            redactions=(("EMAIL", 2), ("PERSON", 1)),
        )
        states = [
            AgentLastState("a", Liveness.LIVE, NOW, report),
            AgentLastState("b", Liveness.DOWN, NOW - timedelta(minutes=3), None),
        ]
        await store.save_last_states(states, NOW + timedelta(seconds=1))
        saved = await store.list_last_states()
        # per-key usage is per interval (the key's totals keep it), not saved state
        assert [(s.agent_id, s.liveness, s.last_seen, s.report) for s in saved] == [
            ("a", Liveness.LIVE, NOW, report._replace(key_usage=())),
            ("b", Liveness.DOWN, NOW - timedelta(minutes=3), None),
        ]
        assert {s.saved_at for s in saved} == {NOW + timedelta(seconds=1)}
        # A row written by another version: one field renamed, a liveness unknown here.
        with sqlite3.connect(store.path) as raw:
            raw.execute(
                "UPDATE agent_last_state SET report_fields = "
                "'queue_depth,waiting_sequences,renamed_field', report_json = '[null, 5, 7]', "
                "liveness = 'from-the-future' WHERE agent_id = 'a'"
            )
        (a, _) = await store.list_last_states()
        assert a.report is not None and a.report.waiting_sequences == 5
        assert a.liveness is Liveness.DOWN
    finally:
        await store.close()


async def test_the_coordinator_refuses_a_newer_database_with_one_clear_line(tmp_path: Path) -> None:
    await _open_close(tmp_path / DB_FILE)
    with sqlite3.connect(tmp_path / DB_FILE) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "--data-dir", str(tmp_path),
         "--grpc-port", "0", "--http-port", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"has schema version {SCHEMA_VERSION + 5}, newer than" in done.stderr
