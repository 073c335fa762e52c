"""Tables ``agents``, ``sites``, ``removed_agents`` and ``revoked_certificates`` in SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from coordinator.store.agents import Site, StoredAgent
from coordinator.store.fleet_json import hello_from_json, hello_to_json
from coordinator.store.sqlite.base import SQLiteTable, parse_time, text
from coordinator.store.sqlite.join_tokens import location_of
from coordinator.store.sqlite.worker import write
from edgefleet.contract import Hello, Location


class SQLiteAgents(SQLiteTable):
    async def enroll(self, token_id: str, now: datetime, agent: StoredAgent) -> bool:
        return await self._worker.call(_enroll, token_id, now, agent)

    async def get_agent(self, agent_id: str) -> StoredAgent | None:
        return await self._worker.call(_get_agent, agent_id)

    async def list_agents(self) -> list[StoredAgent]:
        return await self._worker.call(_list_agents)

    async def find_enrolled_key(self, token_id: str, public_key_sha256: str) -> StoredAgent | None:
        return await self._worker.call(_find_enrolled_key, token_id, public_key_sha256)

    async def reissue(
        self,
        agent_id: str,
        *,
        credential_sha256: str | None,
        cert_serial: str,
        cert_not_after: datetime,
        public_key_sha256: str | None = None,
    ) -> bool:
        return await self._worker.call(
            _reissue, agent_id, credential_sha256, cert_serial, cert_not_after, public_key_sha256
        )

    async def set_fixed(
        self, agent_id: str, *, site: str | None, location: Location | None, http_url: str | None
    ) -> StoredAgent | None:
        return await self._worker.call(_set_fixed, agent_id, site, location, http_url)

    async def revoke_agent(self, agent_id: str, now: datetime) -> bool:
        return await self._worker.call(_revoke_agent, agent_id, now)

    async def remove_agent(self, agent_id: str) -> bool:
        return await self._worker.call(_remove_agent, agent_id)

    async def agent_removed(self, agent_id: str) -> bool:
        return await self._worker.call(_agent_removed, agent_id)

    async def agents_of_token(self, token_id: str) -> list[str]:
        return await self._worker.call(_agents_of_token, token_id)

    async def certificate_revoked(self, serial: str) -> bool:
        return await self._worker.call(_certificate_revoked, serial)

    async def save_hello(self, hello: Hello, seen: datetime) -> None:
        await self._worker.call(_save_hello, hello, seen)

    async def save_last_seen(self, agent_id: str, seen: datetime) -> None:
        await self._worker.call(_save_last_seen, agent_id, seen)

    async def delete_unenrolled_agents(self, agent_ids: Sequence[str]) -> int:
        return await self._worker.call(_delete_unenrolled_agents, list(agent_ids))

    async def set_draining(self, agent_id: str, draining: bool) -> bool:
        return await self._worker.call(_set_draining, agent_id, draining)

    async def list_sites(self) -> list[Site]:
        return await self._worker.call(_list_sites)


def _enroll(db: sqlite3.Connection, token_id: str, now: datetime, agent: StoredAgent) -> bool:
    with write(db):
        taken = db.execute(
            "SELECT 1 FROM agents WHERE agent_id = ? AND enrolled_at IS NOT NULL",
            (agent.agent_id,),
        ).fetchone()
        if taken is not None:
            return False
        used = db.execute(
            "UPDATE join_tokens SET uses = uses + 1 WHERE token_id = ? AND revoked = 0 "
            "AND uses < max_uses AND (expires_at IS NULL OR expires_at > ?)",
            (token_id, text(now)),
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
                text(agent.enrolled_at),
                agent.token_id,
                agent.credential_sha256,
                agent.cert_serial,
                agent.site,
                None if agent.location is None else agent.location.lat,
                None if agent.location is None else agent.location.lon,
                agent.http_url,
                agent.public_key_sha256,
                text(agent.cert_not_after),
            ),
        )
        if agent.site:
            _add_site(db, agent.site, now)
        return True


def _get_agent(db: sqlite3.Connection, agent_id: str) -> StoredAgent | None:
    row = db.execute("SELECT * FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    return None if row is None else _agent(row)


def _list_agents(db: sqlite3.Connection) -> list[StoredAgent]:
    return [_agent(r) for r in db.execute("SELECT * FROM agents ORDER BY agent_id")]


def _find_enrolled_key(
    db: sqlite3.Connection, token_id: str, public_key_sha256: str
) -> StoredAgent | None:
    row = db.execute(
        "SELECT * FROM agents WHERE token_id = ? AND public_key_sha256 = ? "
        "AND enrolled_at IS NOT NULL",
        (token_id, public_key_sha256),
    ).fetchone()
    return None if row is None else _agent(row)


def _reissue(
    db: sqlite3.Connection,
    agent_id: str,
    credential_sha256: str | None,
    cert_serial: str,
    cert_not_after: datetime,
    public_key_sha256: str | None,
) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE agents SET cert_serial = ?, cert_not_after = ?, "
            "credential_sha256 = COALESCE(?, credential_sha256), "
            "public_key_sha256 = COALESCE(?, public_key_sha256) "
            "WHERE agent_id = ? AND enrolled_at IS NOT NULL AND revoked_at IS NULL",
            (cert_serial, text(cert_not_after), credential_sha256, public_key_sha256, agent_id),
        )
        return cursor.rowcount == 1


def _set_fixed(
    db: sqlite3.Connection,
    agent_id: str,
    site: str | None,
    location: Location | None,
    http_url: str | None,
) -> StoredAgent | None:
    with write(db):
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
            db.execute("UPDATE agents SET http_url = ? WHERE agent_id = ?", (http_url, agent_id))
    return _get_agent(db, agent_id)


def _revoke_agent(db: sqlite3.Connection, agent_id: str, now: datetime) -> bool:
    with write(db):
        row = db.execute(
            "SELECT cert_serial FROM agents WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        if row is None:
            return False
        db.execute(
            "UPDATE agents SET revoked_at = COALESCE(revoked_at, ?), credential_sha256 = '' "
            "WHERE agent_id = ?",
            (text(now), agent_id),
        )
        if row["cert_serial"]:
            db.execute(
                "INSERT OR IGNORE INTO revoked_certificates VALUES (?, ?, ?)",
                (row["cert_serial"], agent_id, text(now)),
            )
        return True


def _remove_agent(db: sqlite3.Connection, agent_id: str) -> bool:
    with write(db):
        db.execute("DELETE FROM agent_last_state WHERE agent_id = ?", (agent_id,))
        if db.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,)).rowcount != 1:
            return False
        db.execute(
            "INSERT OR REPLACE INTO removed_agents VALUES (?, ?)",
            (agent_id, text(datetime.now(UTC))),
        )
        return True


def _agent_removed(db: sqlite3.Connection, agent_id: str) -> bool:
    found = db.execute("SELECT 1 FROM removed_agents WHERE agent_id = ?", (agent_id,))
    return found.fetchone() is not None


def _agents_of_token(db: sqlite3.Connection, token_id: str) -> list[str]:
    rows = db.execute(
        "SELECT agent_id FROM agents WHERE token_id = ? ORDER BY agent_id", (token_id,)
    )
    return [r["agent_id"] for r in rows]


def _certificate_revoked(db: sqlite3.Connection, serial: str) -> bool:
    found = db.execute("SELECT 1 FROM revoked_certificates WHERE serial = ?", (serial,))
    return found.fetchone() is not None


def _save_hello(db: sqlite3.Connection, hello: Hello, seen: datetime) -> None:
    with write(db):
        db.execute(
            "INSERT INTO agents (agent_id, site, hello_json, last_seen) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(agent_id) DO UPDATE SET hello_json = excluded.hello_json, "
            "last_seen = excluded.last_seen, "
            "site = CASE WHEN agents.enrolled_at IS NULL "
            "THEN excluded.site ELSE agents.site END",
            (hello.agent_id, hello.site, hello_to_json(hello), text(seen)),
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


def _save_last_seen(db: sqlite3.Connection, agent_id: str, seen: datetime) -> None:
    with write(db):
        db.execute("UPDATE agents SET last_seen = ? WHERE agent_id = ?", (text(seen), agent_id))


def _delete_unenrolled_agents(db: sqlite3.Connection, agent_ids: list[str]) -> int:
    ids = [(agent_id,) for agent_id in agent_ids]
    with write(db):
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


def _set_draining(db: sqlite3.Connection, agent_id: str, draining: bool) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE agents SET draining = ? WHERE agent_id = ?", (int(draining), agent_id)
        )
        return cursor.rowcount == 1


def _list_sites(db: sqlite3.Connection) -> list[Site]:
    return [
        Site(name=r["name"], first_seen=datetime.fromisoformat(r["first_seen"]))
        for r in db.execute("SELECT * FROM sites ORDER BY name")
    ]


def _add_site(db: sqlite3.Connection, name: str, now: datetime) -> None:
    db.execute(
        "INSERT INTO sites (name, first_seen) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
        (name, text(now)),
    )


def _agent(row: sqlite3.Row) -> StoredAgent:
    return StoredAgent(
        agent_id=row["agent_id"],
        enrolled_at=parse_time(row["enrolled_at"]),
        token_id=row["token_id"],
        credential_sha256=row["credential_sha256"],
        cert_serial=row["cert_serial"],
        site=row["site"],
        hello=None if row["hello_json"] is None else hello_from_json(row["hello_json"]),
        last_seen=parse_time(row["last_seen"]),
        draining=bool(row["draining"]),
        location=location_of(row),
        http_url=row["http_url"],
        public_key_sha256=row["public_key_sha256"],
        cert_not_after=parse_time(row["cert_not_after"]),
        revoked_at=parse_time(row["revoked_at"]),
    )
