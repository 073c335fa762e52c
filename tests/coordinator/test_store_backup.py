"""``python -m coordinator backup DIR`` / ``restore DIR`` on PostgreSQL (store_url set): the
database dumped with pg_dump beside data_dir's files (CA, signing key, blobs) in one backup
directory, restored with pg_restore into a fresh database (coordinator/store/backup.py,
coordinator/store/postgres/dump.py); what restore refuses, and the desired-state
generation counter after a restore, on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent.enrollment import Enroller
from coordinator.errors import StoreError
from coordinator.store.backup import BackupError, backup, restore
from coordinator.store.generations import GenerationCounter, wall_clock_ms
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from coordinator.store.offline import run_offline
from coordinator.store.postgres import dump as dump_module
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from tests.coordinator.test_agent_lifecycle import session
from tests.coordinator.test_store_copy import NOW, everything, fill
from tests.postgres_cluster import PostgresCluster

pytestmark = pytest.mark.timeout(120)

MINUTE_MS = 60_000


def on_postgres(cluster: PostgresCluster, data_dir: Path) -> StoreLocation:
    """A fresh database on the test cluster, for the installation in ``data_dir``."""
    return StoreLocation(data_dir=data_dir, url=cluster.create_database())


def filled(location: StoreLocation) -> dict[str, Any]:
    async def work(store: FleetStore) -> dict[str, Any]:
        await fill(store)
        return await everything(store)

    return run_offline(location, work)


async def test_a_backup_restores_onto_a_fresh_database_with_everything_in_it(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """Every table read back through the store equal; the audit log goes on after its last
    entry and stays append-only; data_dir's files come back, the dump does not land there,
    and the restored data_dir names its new database."""
    source = on_postgres(postgres_cluster, tmp_path / "data")
    (source.data_dir / "ca").mkdir(parents=True)
    (source.data_dir / "ca" / "ca.key").write_bytes(b"the CA key")
    (source.data_dir / "model-signing.key").write_bytes(b"the signing key")
    before = filled(source)
    source.remember_backend()  # as the coordinator does: store.json names the database

    manifest = backup(source, tmp_path / "backup")
    assert manifest["backend"] == "postgresql" and manifest["database"]["file"] == "fleet.pgdump"
    assert (tmp_path / "backup" / "fleet.pgdump").stat().st_mode & 0o777 == 0o600
    assert "store.json" not in manifest["files"]

    target = on_postgres(postgres_cluster, tmp_path / "fresh")
    restore(tmp_path / "backup", target)
    assert (target.data_dir / "ca" / "ca.key").read_bytes() == b"the CA key"
    assert (target.data_dir / "model-signing.key").read_bytes() == b"the signing key"
    assert not (target.data_dir / "fleet.pgdump").exists()
    marker = json.loads((target.data_dir / "store.json").read_text())
    assert marker["url"].endswith("/" + target.url.rsplit("/", 1)[1])

    async def read_back(store: FleetStore) -> dict[str, Any]:
        after = await everything(store)
        await store.append_audit(
            at=NOW, actor_id="", actor_name="", role="", action="after-restore", target="",
            peer="", outcome="ok", status=0, detail="",
        )  # fmt: skip
        after["next_audit"] = await store.audit_entries(
            since=None, after_seq=before["audit"][-1].seq, limit=10
        )
        return after

    after = run_offline(target, read_back)
    for name, value in before.items():
        assert after[name] == value, name
    last = before["audit"][-1].seq
    assert [(e.seq, e.action) for e in after["next_audit"]] == [(last + 1, "after-restore")]
    with (
        psycopg.connect(target.url, autocommit=True) as raw,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"),
    ):
        raw.execute("DELETE FROM audit_log")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_restore_moves_the_generation_counter_past_what_agents_were_sent(
    tmp_path: Path, postgres_cluster: PostgresCluster, backend: str
) -> None:
    """After the backup, a burst of pushes sent generations ahead of the clock (half an
    hour's worth); the restored database does not know of them, and its next generation
    must still be newer, or agents would ignore what it sends."""

    def where(name: str) -> StoreLocation:
        if backend == "sqlite":
            return StoreLocation(data_dir=tmp_path / name)
        return on_postgres(postgres_cluster, tmp_path / name)

    source = where("data")

    async def sent_ahead(store: FleetStore) -> int:
        first = await store.reserve_generations(1000, wall_clock_ms() + 30 * MINUTE_MS)
        return first + 999

    run_offline(source, lambda store: store.reserve_generations(10, 0))
    backup(source, tmp_path / "backup")
    newest_sent = run_offline(source, sent_ahead)

    target = where("fresh")
    restore(tmp_path / "backup", target)

    async def next_generation(store: FleetStore) -> int:
        counter = GenerationCounter(store.reserve_generations)
        await counter.start()
        return counter.next()

    assert run_offline(target, next_generation) > newest_sent


def test_restore_refuses_a_database_with_tables_unless_forced(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    source = on_postgres(postgres_cluster, tmp_path / "data")
    before = filled(source)
    backup(source, tmp_path / "backup")
    target = on_postgres(postgres_cluster, tmp_path / "fresh")
    run_offline(target, lambda store: store.list_agents())  # a coordinator started there

    with pytest.raises(BackupError, match=r"is not empty \(it holds \d+ tables.*--force"):
        restore(tmp_path / "backup", target)

    restore(tmp_path / "backup", target, force=True)
    after = run_offline(target, everything)
    assert after["agents"] == before["agents"] and after["audit"] == before["audit"]


def test_a_missing_or_old_pg_dump_is_named_with_what_to_install(
    tmp_path: Path, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = on_postgres(postgres_cluster, tmp_path / "data")
    run_offline(source, lambda store: store.list_agents())
    with pytest.raises(StoreError, match=r"the pg_dump found \([\d.]+ at .*\) is older than 99"):
        dump_module.find_tool("pg_dump", 99)

    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(dump_module, "DEBIAN_LIB", tmp_path / "nothing-here")
    with pytest.raises(
        BackupError, match=r"pg_dump is not installed .* apt-get install postgresql-client-1\d"
    ):
        backup(source, tmp_path / "backup")
    assert not (tmp_path / "backup" / "fleet.pgdump").exists()


def test_restore_refuses_a_newer_schema_an_older_pg_restore_and_the_other_backend(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    source = on_postgres(postgres_cluster, tmp_path / "data")
    run_offline(source, lambda store: store.list_agents())
    taken = tmp_path / "backup"
    backup(source, taken)
    manifest_file = taken / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    target = on_postgres(postgres_cluster, tmp_path / "fresh")

    def edited(**changes: Any) -> None:
        edit = json.loads(json.dumps(manifest))
        for key, value in changes.items():
            section, _, field = key.partition("__")
            if field:
                edit[section][field] = value
            else:
                edit[key] = value
        manifest_file.write_text(json.dumps(edit))

    edited(schema_version=manifest["schema_version"] + 1)
    with pytest.raises(BackupError, match="newer than this coordinator's"):
        restore(taken, target)
    edited(database__pg_dump_version="99.1")
    with pytest.raises(
        BackupError, match=r"the pg_restore found \([\d.]+ at .*\) is older than 99"
    ):
        restore(taken, target)
    edited()
    with pytest.raises(BackupError, match="store_url is not set"):
        restore(taken, StoreLocation(data_dir=tmp_path / "sqlite"))
    sqlite_data = tmp_path / "sqlite-data"
    run_offline(sqlite_data, lambda store: store.list_agents())
    backup(sqlite_data, tmp_path / "sqlite-backup")
    with pytest.raises(BackupError, match="store migrate"):
        restore(tmp_path / "sqlite-backup", target)
    assert not (target.data_dir / "ca").exists()  # nothing restored by any of them


async def kept(store: FleetStore) -> dict[str, Any]:
    """What a restore must bring back of a fleet: its tokens, agents, keys, audit log."""
    return {
        "tokens": await store.list_tokens(),
        "agents": [(a.agent_id, a.enrolled_at) for a in await store.list_agents()],
        "api_keys": await store.list_api_keys(),
        "admin_tokens": await store.list_admin_tokens(),
        "audit": await store.audit_entries(since=None, after_seq=0, limit=1000),
    }


def admin(env: dict[str, str], data: Path, *args: str, ok: bool = True) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *args, "--data-dir", str(data)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if ok:
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert done.returncode == 1, done.stdout
    return done.stderr


@pytest.mark.slow
async def test_backup_while_running_then_restore_onto_a_fresh_database_keeps_the_fleet(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """TLS on, a role with a password: the agent enrolled before the backup reconnects to
    the coordinator started on the restored database and data_dir (same CA, its record
    known), and its tokens, API keys, admin tokens and audit log are all there."""
    role, password = "fleet_backup", "a-backup-password-not-in-argv"
    postgres_cluster.create_role(role, password)
    url = postgres_cluster.create_database(owner=role).replace("postgres@", f"{role}@", 1)
    fresh_url = postgres_cluster.create_database(owner=role).replace("postgres@", f"{role}@", 1)
    env = {"EDGEFLEET_COORDINATOR_STORE_URL": url,
           "EDGEFLEET_COORDINATOR_STORE_PASSWORD": password}  # fmt: skip
    data, state = tmp_path / "coordinator", tmp_path / "agent-state"
    tls = ["--tls", "on", "--enroll-port", "0"]
    first = CoordinatorProcess(report_interval_ms=200, data_dir=data, extra_args=tls, env=env)
    await first.start()
    try:
        token = admin(env, data, "tokens", "create", "--uses", "2").strip()
        enroller = Enroller(
            first.enroll_target, token, state_dir=state, requested_name="edge-1", tls=True,
            ca_pem=(data / "ca" / "ca.pem").read_bytes(),
        )  # fmt: skip
        agent = session(first.grpc_target, enroller)
        await agent.start()
        await wait_until(lambda: agent.connected, timeout_s=15, message="connected")
        await first.mint_api_key("app")  # over the admin API: audited
        admin(env, data, "admin-tokens", "mint", "--role", "viewer", "--name", "watcher")
        backup_dir = tmp_path / "backup"
        admin(env, data, "backup", str(backup_dir))  # while the coordinator runs
        before = run_offline(StoreLocation(data, url, password), kept)
        assert [(t.uses, t.max_uses) for t in before["tokens"]] == [(1, 2)]
        assert len(before["audit"]) >= 2 and before["api_keys"] and before["admin_tokens"]
    finally:
        await first.terminate()
    try:
        await wait_until(lambda: not agent.connected, message="coordinator gone")
        fresh = tmp_path / "fresh"
        fresh_env = env | {"EDGEFLEET_COORDINATOR_STORE_URL": fresh_url}
        admin(fresh_env, fresh, "restore", str(backup_dir))
        refused = admin(fresh_env, fresh, "restore", str(backup_dir), ok=False)
        assert "--force" in refused and password not in refused
        assert run_offline(StoreLocation(fresh, fresh_url, password), kept) == before
        second = CoordinatorProcess(
            grpc_port=first.grpc_port, report_interval_ms=200, data_dir=fresh, extra_args=tls,
            env=fresh_env,
        )  # fmt: skip
        await second.start()
        try:
            opened = agent.sessions_opened
            await wait_until(
                lambda: agent.connected and agent.sessions_opened > opened,
                timeout_s=20,
                message="the agent reconnects to the restored coordinator",
            )
            agents = await second.agents()
            assert [(a["agent_id"], a["enrolled"], a["status"]) for a in agents] == [
                ("edge-1", True, "connected")
            ]
        finally:
            await second.terminate()
    finally:
        await agent.stop()
