"""Tables ``agents``, ``sites``, ``removed_agents`` and ``revoked_certificates`` in
PostgreSQL.

Enrollment is safe with several writers: the token's use is one conditional UPDATE (its
row lock orders racing enrollments; the loser sees the used-up row), and the agent row is
an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` not yet enrolled (the same id enrolled
by another transaction meanwhile: no row comes back, and the token's use is rolled back).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from coordinator.store.agents import Site, StoredAgent
from coordinator.store.fleet_json import hello_from_json, hello_to_json
from coordinator.store.postgres.base import PostgresTable, location_of
from coordinator.store.postgres.pool import Connection
from edgefleet.contract import Hello, Location


class PostgresAgents(PostgresTable):
    async def enroll(self, token_id: str, now: datetime, agent: StoredAgent) -> bool:
        return await self._pool.call(_enroll, token_id, now, agent)

    async def get_agent(self, agent_id: str) -> StoredAgent | None:
        return await self._pool.call(_get_agent, agent_id)

    async def list_agents(self) -> list[StoredAgent]:
        return await self._pool.call(_list_agents)

    async def find_enrolled_key(self, token_id: str, public_key_sha256: str) -> StoredAgent | None:
        return await self._pool.call(_find_enrolled_key, token_id, public_key_sha256)

    async def reissue(
        self,
        agent_id: str,
        *,
        credential_sha256: str | None,
        cert_serial: str,
        cert_not_after: datetime,
        public_key_sha256: str | None = None,
    ) -> bool:
        return await self._pool.call(
            _reissue, agent_id, credential_sha256, cert_serial, cert_not_after, public_key_sha256
        )

    async def set_fixed(
        self, agent_id: str, *, site: str | None, location: Location | None, http_url: str | None
    ) -> StoredAgent | None:
        return await self._pool.call(_set_fixed, agent_id, site, location, http_url)

    async def revoke_agent(self, agent_id: str, now: datetime) -> bool:
        return await self._pool.call(_revoke_agent, agent_id, now)

    async def remove_agent(self, agent_id: str) -> bool:
        return await self._pool.call(_remove_agent, agent_id)

    async def agent_removed(self, agent_id: str) -> bool:
        return await self._pool.call(_agent_removed, agent_id)

    async def agents_of_token(self, token_id: str) -> list[str]:
        return await self._pool.call(_agents_of_token, token_id)

    async def certificate_revoked(self, serial: str) -> bool:
        return await self._pool.call(_certificate_revoked, serial)

    async def save_hello(self, hello: Hello, seen: datetime) -> None:
        await self._pool.call(_save_hello, hello, seen)

    async def save_last_seen(self, agent_id: str, seen: datetime) -> None:
        await self._pool.call(_save_last_seen, agent_id, seen)

    async def delete_unenrolled_agents(self, agent_ids: Sequence[str]) -> int:
        if not agent_ids:
            return 0
        return await self._pool.call(_delete_unenrolled_agents, list(agent_ids))

    async def set_draining(self, agent_id: str, draining: bool) -> bool:
        return await self._pool.call(_set_draining, agent_id, draining)

    async def list_sites(self) -> list[Site]:
        return await self._pool.call(_list_sites)


async def _enroll(db: Connection, token_id: str, now: datetime, agent: StoredAgent) -> bool:
    location = agent.location
    async with db.transaction() as tx:
        used = await db.execute(
            "UPDATE join_tokens SET uses = uses + 1 WHERE token_id = %s AND NOT revoked"
            " AND uses < max_uses AND (expires_at IS NULL OR expires_at > %s)",
            (token_id, now),
        )
        if used.rowcount != 1:
            return False
        added = await db.execute(
            "INSERT INTO agents (agent_id, enrolled_at, token_id, credential_sha256,"
            " cert_serial, site, lat, lon, http_url, public_key_sha256, cert_not_after)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (agent_id)"
            " DO UPDATE SET enrolled_at = excluded.enrolled_at, token_id = excluded.token_id,"
            " credential_sha256 = excluded.credential_sha256,"
            " cert_serial = excluded.cert_serial, site = excluded.site,"
            " lat = excluded.lat, lon = excluded.lon, http_url = excluded.http_url,"
            " public_key_sha256 = excluded.public_key_sha256,"
            " cert_not_after = excluded.cert_not_after, revoked_at = NULL"
            " WHERE agents.enrolled_at IS NULL RETURNING agent_id",
            (agent.agent_id, agent.enrolled_at, agent.token_id, agent.credential_sha256,
             agent.cert_serial, agent.site, None if location is None else location.lat,
             None if location is None else location.lon, agent.http_url,
             agent.public_key_sha256, agent.cert_not_after),
        )  # fmt: skip
        if await added.fetchone() is None:  # the id is enrolled already: undo the token's use
            raise psycopg.Rollback(tx)
        await db.execute("DELETE FROM removed_agents WHERE agent_id = %s", (agent.agent_id,))
        if agent.site:
            await _add_site(db, agent.site, now)
        return True
    return False  # rolled back


async def _get_agent(db: Connection, agent_id: str) -> StoredAgent | None:
    cursor = await db.execute("SELECT * FROM agents WHERE agent_id = %s", (agent_id,))
    row = await cursor.fetchone()
    return None if row is None else _agent(row)


async def _list_agents(db: Connection) -> list[StoredAgent]:
    cursor = await db.execute('SELECT * FROM agents ORDER BY agent_id COLLATE "C"')
    return [_agent(r) for r in await cursor.fetchall()]


async def _find_enrolled_key(
    db: Connection, token_id: str, public_key_sha256: str
) -> StoredAgent | None:
    cursor = await db.execute(
        "SELECT * FROM agents WHERE token_id = %s AND public_key_sha256 = %s"
        " AND enrolled_at IS NOT NULL ORDER BY agent_id LIMIT 1",
        (token_id, public_key_sha256),
    )
    row = await cursor.fetchone()
    return None if row is None else _agent(row)


async def _reissue(
    db: Connection,
    agent_id: str,
    credential_sha256: str | None,
    cert_serial: str,
    cert_not_after: datetime,
    public_key_sha256: str | None,
) -> bool:
    cursor = await db.execute(
        "UPDATE agents SET cert_serial = %s, cert_not_after = %s,"
        " credential_sha256 = COALESCE(%s, credential_sha256),"
        " public_key_sha256 = COALESCE(%s, public_key_sha256)"
        " WHERE agent_id = %s AND enrolled_at IS NOT NULL AND revoked_at IS NULL",
        (cert_serial, cert_not_after, credential_sha256, public_key_sha256, agent_id),
    )
    return cursor.rowcount == 1


async def _set_fixed(
    db: Connection, agent_id: str, site: str | None, location: Location | None,
    http_url: str | None,
) -> StoredAgent | None:  # fmt: skip
    async with db.transaction():
        cursor = await db.execute(
            "UPDATE agents SET site = COALESCE(%s, site), lat = COALESCE(%s, lat),"
            " lon = COALESCE(%s, lon), http_url = COALESCE(%s, http_url)"
            " WHERE agent_id = %s RETURNING *",
            (site, None if location is None else location.lat,
             None if location is None else location.lon, http_url, agent_id),
        )  # fmt: skip
        row = await cursor.fetchone()
        if row is not None and site:
            await _add_site(db, site, datetime.now(UTC))
    return None if row is None else _agent(row)


async def _revoke_agent(db: Connection, agent_id: str, now: datetime) -> bool:
    async with db.transaction():
        cursor = await db.execute(
            "UPDATE agents SET revoked_at = COALESCE(revoked_at, %s), credential_sha256 = ''"
            " WHERE agent_id = %s RETURNING cert_serial",
            (now, agent_id),
        )
        row = await cursor.fetchone()
        if row is None:
            return False
        if row["cert_serial"]:
            await db.execute(
                "INSERT INTO revoked_certificates (serial, agent_id, revoked_at)"
                " VALUES (%s, %s, %s) ON CONFLICT (serial) DO NOTHING",
                (row["cert_serial"], agent_id, now),
            )
        return True


async def _remove_agent(db: Connection, agent_id: str) -> bool:
    async with db.transaction() as tx:
        await db.execute("DELETE FROM agent_last_state WHERE agent_id = %s", (agent_id,))
        deleted = await db.execute("DELETE FROM agents WHERE agent_id = %s", (agent_id,))
        if deleted.rowcount != 1:
            raise psycopg.Rollback(tx)
        await db.execute(
            "INSERT INTO removed_agents (agent_id, removed_at) VALUES (%s, %s)"
            " ON CONFLICT (agent_id) DO UPDATE SET removed_at = excluded.removed_at",
            (agent_id, datetime.now(UTC)),
        )
        return True
    return False


async def _agent_removed(db: Connection, agent_id: str) -> bool:
    cursor = await db.execute("SELECT 1 FROM removed_agents WHERE agent_id = %s", (agent_id,))
    return await cursor.fetchone() is not None


async def _agents_of_token(db: Connection, token_id: str) -> list[str]:
    cursor = await db.execute(
        'SELECT agent_id FROM agents WHERE token_id = %s ORDER BY agent_id COLLATE "C"',
        (token_id,),
    )
    return [r["agent_id"] for r in await cursor.fetchall()]


async def _certificate_revoked(db: Connection, serial: str) -> bool:
    cursor = await db.execute("SELECT 1 FROM revoked_certificates WHERE serial = %s", (serial,))
    return await cursor.fetchone() is not None


async def _save_hello(db: Connection, hello: Hello, seen: datetime) -> None:
    async with db.transaction():
        await db.execute(
            "INSERT INTO agents (agent_id, site, hello_json, last_seen) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (agent_id) DO UPDATE SET hello_json = excluded.hello_json,"
            " last_seen = excluded.last_seen,"
            " site = CASE WHEN agents.enrolled_at IS NULL"
            " THEN excluded.site ELSE agents.site END",
            (hello.agent_id, hello.site, hello_to_json(hello), seen),
        )
        # Live as of now, keeping the last saved report until the next snapshot.
        await db.execute(
            "INSERT INTO agent_last_state (agent_id, liveness, last_seen, saved_at)"
            " VALUES (%s, 'live', %s, %s) ON CONFLICT (agent_id) DO UPDATE SET"
            " liveness = excluded.liveness, last_seen = excluded.last_seen,"
            " saved_at = excluded.saved_at",
            (hello.agent_id, seen.timestamp(), seen.timestamp()),
        )
        if hello.site:
            await _add_site(db, hello.site, seen)


async def _save_last_seen(db: Connection, agent_id: str, seen: datetime) -> None:
    await db.execute("UPDATE agents SET last_seen = %s WHERE agent_id = %s", (seen, agent_id))


async def _delete_unenrolled_agents(db: Connection, agent_ids: list[str]) -> int:
    async with db.transaction():
        cursor = await db.execute(
            "DELETE FROM agents WHERE agent_id = ANY(%s) AND enrolled_at IS NULL"
            " RETURNING agent_id",
            (agent_ids,),
        )
        deleted = [r["agent_id"] for r in await cursor.fetchall()]
        if deleted:
            await db.execute("DELETE FROM agent_last_state WHERE agent_id = ANY(%s)", (deleted,))
        await db.execute(
            "DELETE FROM sites WHERE name NOT IN (SELECT site FROM agents)"
            " AND name NOT IN (SELECT site FROM join_tokens)"
        )
    return len(deleted)


async def _set_draining(db: Connection, agent_id: str, draining: bool) -> bool:
    cursor = await db.execute(
        "UPDATE agents SET draining = %s WHERE agent_id = %s", (draining, agent_id)
    )
    return cursor.rowcount == 1


async def _list_sites(db: Connection) -> list[Site]:
    cursor = await db.execute('SELECT * FROM sites ORDER BY name COLLATE "C"')
    return [Site(name=r["name"], first_seen=r["first_seen"]) for r in await cursor.fetchall()]


async def _add_site(db: Connection, name: str, now: datetime) -> None:
    await db.execute(
        "INSERT INTO sites (name, first_seen) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
        (name, now),
    )


def _agent(row: dict[str, Any]) -> StoredAgent:
    return StoredAgent(
        agent_id=row["agent_id"],
        enrolled_at=row["enrolled_at"],
        token_id=row["token_id"],
        credential_sha256=row["credential_sha256"],
        cert_serial=row["cert_serial"],
        site=row["site"],
        hello=None if row["hello_json"] is None else hello_from_json(row["hello_json"]),
        last_seen=row["last_seen"],
        draining=row["draining"],
        location=location_of(row),
        http_url=row["http_url"],
        public_key_sha256=row["public_key_sha256"],
        cert_not_after=row["cert_not_after"],
        revoked_at=row["revoked_at"],
    )
