"""Tables ``api_keys`` and ``api_key_usage`` in PostgreSQL.

Usage totals are kept per (key, coordinator instance): each coordinator adds only to its
own rows (``INSERT ... ON CONFLICT DO UPDATE``, keys in one order, so two batches never
wait on each other in a cycle), and a key's totals are the sum of its rows. Several
coordinators reporting usage never update one hot row per key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from coordinator.errors import StoreError
from coordinator.store.api_keys import ApiKeyRecord
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection
from edgefleet.contract import KeyPolicy
from edgefleet.key_policy import key_policy_from_json, key_policy_to_json

Usage = tuple[str, int, int, int, int]


class PostgresApiKeys(PostgresTable):
    async def add_api_key(self, key: ApiKeyRecord) -> None:
        await self._pool.call(_add_api_key, key)

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        return await self._pool.call(_list_api_keys)

    async def revoke_api_key(self, key_id: str, now: datetime) -> bool:
        return await self._pool.call(_revoke_api_key, key_id, now)

    async def set_api_key_keep_alive(
        self, key_id: str, max_keep_alive_s: float | None, may_pin_models: bool | None
    ) -> bool:
        return await self._pool.call(_set_keep_alive, key_id, max_keep_alive_s, may_pin_models)

    async def set_api_key_policy(self, key_id: str, policy: KeyPolicy) -> bool:
        return await self._pool.call(_set_policy, key_id, policy)

    async def add_api_key_usage(self, usage: Sequence[Usage]) -> None:
        if usage:
            await self._pool.call(_add_api_key_usage, self._instance, list(usage))


async def _add_api_key(db: Connection, key: ApiKeyRecord) -> None:
    async with db.transaction():
        await db.execute(
            "INSERT INTO api_keys (key_id, secret_sha256, created_at, name, models_json,"
            " allow_cloud, max_priority, max_tokens_per_request, requests_per_minute,"
            " tokens_per_minute, expires_at, revoked_at, max_keep_alive_s, may_pin_models,"
            " policy_json)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (key.key_id, key.secret_sha256, key.created_at, key.name,
             json.dumps(list(key.models)), key.allow_cloud, key.max_priority,
             key.max_tokens_per_request, key.requests_per_minute, key.tokens_per_minute,
             key.expires_at, key.revoked_at, key.max_keep_alive_s, key.may_pin_models,
             _policy_text(key.policy)),
        )  # fmt: skip
        if key.requests or key.prompt_tokens or key.completion_tokens or key.rejected:
            # a copied key brings its totals (coordinator/store/copy.py)
            await db.execute(
                "INSERT INTO api_key_usage VALUES (%s, '', %s, %s, %s, %s)",
                (key.key_id, key.requests, key.prompt_tokens, key.completion_tokens,
                 key.rejected),
            )  # fmt: skip


async def _list_api_keys(db: Connection) -> list[ApiKeyRecord]:
    cursor = await db.execute(
        "SELECT k.*, COALESCE(u.requests, 0) AS requests,"
        " COALESCE(u.prompt_tokens, 0) AS prompt_tokens,"
        " COALESCE(u.completion_tokens, 0) AS completion_tokens,"
        " COALESCE(u.rejected, 0) AS rejected FROM api_keys k LEFT JOIN ("
        "  SELECT key_id, sum(requests) AS requests, sum(prompt_tokens) AS prompt_tokens,"
        "  sum(completion_tokens) AS completion_tokens, sum(rejected) AS rejected"
        "  FROM api_key_usage GROUP BY key_id) u ON u.key_id = k.key_id"
        " ORDER BY k.created_at, k.key_id"
    )
    return [_api_key(r) for r in await cursor.fetchall()]


async def _revoke_api_key(db: Connection, key_id: str, now: datetime) -> bool:
    cursor = await db.execute(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, %s) WHERE key_id = %s",
        (now, key_id),
    )
    return cursor.rowcount == 1


async def _set_keep_alive(
    db: Connection, key_id: str, max_keep_alive_s: float | None, may_pin: bool | None
) -> bool:
    cursor = await db.execute(
        "UPDATE api_keys SET max_keep_alive_s = COALESCE(%s, max_keep_alive_s),"
        " may_pin_models = COALESCE(%s, may_pin_models) WHERE key_id = %s",
        (max_keep_alive_s, may_pin, key_id),
    )
    return cursor.rowcount == 1


async def _set_policy(db: Connection, key_id: str, policy: KeyPolicy) -> bool:
    cursor = await db.execute(
        "UPDATE api_keys SET policy_json = %s WHERE key_id = %s", (_policy_text(policy), key_id)
    )
    return cursor.rowcount == 1


def _policy_text(policy: KeyPolicy) -> str | None:
    """None for the default policy (a row that says nothing, as before migration 9)."""
    return None if policy == KeyPolicy() else json.dumps(key_policy_to_json(policy))


def _policy(key_id: str, raw: str | None) -> KeyPolicy:
    if raw is None:
        return KeyPolicy()
    try:
        return key_policy_from_json(json.loads(raw))
    except ValueError as exc:  # KeyPolicyError and JSONDecodeError
        raise StoreError(f"API key {key_id} has an unreadable policy: {exc}") from exc


async def _add_api_key_usage(db: Connection, instance: str, usage: list[Usage]) -> None:
    # Unknown keys are ignored, as an UPDATE of no row is in SQLite.
    async with db.transaction():
        cursor = db.cursor()
        await cursor.executemany(
            "INSERT INTO api_key_usage (key_id, instance, requests, prompt_tokens,"
            " completion_tokens, rejected)"
            " SELECT key_id, %s, %s, %s, %s, %s FROM api_keys WHERE key_id = %s"
            " ON CONFLICT (key_id, instance) DO UPDATE SET"
            " requests = api_key_usage.requests + excluded.requests,"
            " prompt_tokens = api_key_usage.prompt_tokens + excluded.prompt_tokens,"
            " completion_tokens = api_key_usage.completion_tokens + excluded.completion_tokens,"
            " rejected = api_key_usage.rejected + excluded.rejected",
            [(instance, r, p, c, x, k) for k, r, p, c, x in sorted(usage)],
        )


def _api_key(row: dict[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=row["key_id"],
        secret_sha256=row["secret_sha256"],
        created_at=row["created_at"],
        name=row["name"],
        models=tuple(json.loads(row["models_json"])),
        allow_cloud=row["allow_cloud"],
        max_priority=row["max_priority"],
        max_tokens_per_request=row["max_tokens_per_request"],
        requests_per_minute=row["requests_per_minute"],
        tokens_per_minute=row["tokens_per_minute"],
        expires_at=row["expires_at"],
        max_keep_alive_s=row["max_keep_alive_s"],
        may_pin_models=row["may_pin_models"],
        policy=_policy(row["key_id"], row["policy_json"]),
        revoked_at=row["revoked_at"],
        requests=int(row["requests"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        rejected=int(row["rejected"]),
    )
