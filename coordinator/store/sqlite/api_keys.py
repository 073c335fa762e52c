"""Table ``api_keys`` in SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from coordinator.errors import StoreError
from coordinator.store.api_keys import ApiKeyRecord
from coordinator.store.sqlite.base import SQLiteTable, parse_time, text
from coordinator.store.sqlite.worker import write
from edgefleet.contract import KeyPolicy
from edgefleet.key_policy import key_policy_from_json, key_policy_to_json


class SQLiteApiKeys(SQLiteTable):
    async def add_api_key(self, key: ApiKeyRecord) -> None:
        await self._worker.call(_add_api_key, key)

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        return await self._worker.call(_list_api_keys)

    async def revoke_api_key(self, key_id: str, now: datetime) -> bool:
        return await self._worker.call(_revoke_api_key, key_id, now)

    async def set_api_key_keep_alive(
        self, key_id: str, max_keep_alive_s: float | None, may_pin_models: bool | None
    ) -> bool:
        return await self._worker.call(_set_keep_alive, key_id, max_keep_alive_s, may_pin_models)

    async def set_api_key_policy(self, key_id: str, policy: KeyPolicy) -> bool:
        return await self._worker.call(_set_policy, key_id, policy)

    async def add_api_key_usage(self, usage: Sequence[tuple[str, int, int, int, int]]) -> None:
        if usage:
            await self._worker.call(_add_api_key_usage, list(usage))


def _add_api_key(db: sqlite3.Connection, key: ApiKeyRecord) -> None:
    with write(db):
        db.execute(
            "INSERT INTO api_keys (key_id, secret_sha256, created_at, name, models_json, "
            "allow_cloud, max_priority, max_tokens_per_request, requests_per_minute, "
            "tokens_per_minute, expires_at, max_keep_alive_s, may_pin_models, policy_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key.key_id,
                key.secret_sha256,
                text(key.created_at),
                key.name,
                json.dumps(list(key.models)),
                int(key.allow_cloud),
                key.max_priority,
                key.max_tokens_per_request,
                key.requests_per_minute,
                key.tokens_per_minute,
                text(key.expires_at),
                key.max_keep_alive_s,
                int(key.may_pin_models),
                _policy_text(key.policy),
            ),
        )


def _list_api_keys(db: sqlite3.Connection) -> list[ApiKeyRecord]:
    return [_api_key(r) for r in db.execute("SELECT * FROM api_keys ORDER BY created_at")]


def _revoke_api_key(db: sqlite3.Connection, key_id: str, now: datetime) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?",
            (text(now), key_id),
        )
        return cursor.rowcount == 1


def _set_keep_alive(
    db: sqlite3.Connection, key_id: str, max_keep_alive_s: float | None, may_pin: bool | None
) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE api_keys SET max_keep_alive_s = COALESCE(?, max_keep_alive_s), "
            "may_pin_models = COALESCE(?, may_pin_models) WHERE key_id = ?",
            (max_keep_alive_s, None if may_pin is None else int(may_pin), key_id),
        )
        return cursor.rowcount == 1


def _set_policy(db: sqlite3.Connection, key_id: str, policy: KeyPolicy) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE api_keys SET policy_json = ? WHERE key_id = ?", (_policy_text(policy), key_id)
        )
        return cursor.rowcount == 1


def _policy_text(policy: KeyPolicy) -> str | None:
    """None for the default policy (a row that says nothing, as before migration 16)."""
    return None if policy == KeyPolicy() else json.dumps(key_policy_to_json(policy))


def _add_api_key_usage(db: sqlite3.Connection, usage: list[tuple[str, int, int, int, int]]) -> None:
    with write(db):
        db.executemany(
            "UPDATE api_keys SET requests = requests + ?, prompt_tokens = prompt_tokens + ?, "
            "completion_tokens = completion_tokens + ?, rejected = rejected + ? "
            "WHERE key_id = ?",
            [(r, p, c, x, k) for k, r, p, c, x in usage],
        )


def _api_key(row: sqlite3.Row) -> ApiKeyRecord:
    created = parse_time(row["created_at"])
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
        expires_at=parse_time(row["expires_at"]),
        max_keep_alive_s=row["max_keep_alive_s"],
        may_pin_models=bool(row["may_pin_models"]),
        policy=_policy(row["key_id"], row["policy_json"]),
        revoked_at=parse_time(row["revoked_at"]),
        requests=row["requests"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        rejected=row["rejected"],
    )


def _policy(key_id: str, raw: str | None) -> KeyPolicy:
    if raw is None:
        return KeyPolicy()
    try:
        return key_policy_from_json(json.loads(raw))
    except ValueError as exc:  # KeyPolicyError and JSONDecodeError
        raise StoreError(f"API key {key_id} has an unreadable policy: {exc}") from exc
