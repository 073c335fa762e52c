"""API keys over HTTP: mint (the secret shown once), list, show with each agent's share, revoke."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.access.api_keys import MAX_KEEP_ALIVE_S, MAX_TOKENS_PER_REQUEST, PRIORITIES
from coordinator.api.app_keys import (
    API_KEYS_KEY,
    CHANGES_KEY,
    KEY_DISTRIBUTOR_KEY,
    REGISTRY_KEY,
)
from coordinator.api.common import InvalidParameter, error_response, int_field, json_body
from coordinator.api.join_tokens import TEN_YEARS_S
from coordinator.api.views import api_key_json
from coordinator.cluster.changes import KIND_API_KEYS
from coordinator.errors import UnknownApiKeyError
from edgefleet.contract import KeyPolicy
from edgefleet.key_policy import KeyPolicyError, key_policy_from_json


def _number(body: dict[str, Any], name: str) -> float:
    value = body.get(name, 0)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= sys.float_info.max  # NaN, inf and ints beyond a double too
    ):
        raise InvalidParameter(name, f"{name} must be a finite number >= 0 (0: unlimited)")
    return float(value)


def _keep_alive_cap(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_KEEP_ALIVE_S  # NaN and inf too
    ):
        raise InvalidParameter(
            "max_keep_alive_s",
            f"max_keep_alive_s must be seconds within [0, {MAX_KEEP_ALIVE_S:g}] (0: the "
            "agent's own cap, residency.max_request_keep_alive_s)",
        )
    return float(value)


def _pin_right(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameter("may_pin_models", "may_pin_models must be true or false")
    return value


def _policy(value: Any) -> KeyPolicy:
    """``policy`` as edgefleet/key_policy.py reads it; 400 naming the part at fault."""
    try:
        return key_policy_from_json(value)
    except KeyPolicyError as exc:
        raise InvalidParameter(exc.field, exc.message) from None


def _key_not_found(exc: UnknownApiKeyError) -> web.Response:
    return error_response(
        404, str(exc), type_="invalid_request_error", code="api_key_not_found", param="key_id"
    )


async def mint_key(request: web.Request) -> web.Response:
    """Mint an API key; the secret is in this response only."""
    body = await json_body(request)
    name, models = body.get("name", ""), body.get("models", [])
    if not isinstance(name, str):
        raise InvalidParameter("name", "name must be a string")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise InvalidParameter("models", "models must be a list of 'name' or 'name@version'")
    priority = body.get("max_priority", "normal")
    if priority not in PRIORITIES:
        raise InvalidParameter("max_priority", "max_priority must be high, normal or low")
    allow_cloud = body.get("allow_cloud", False)
    if not isinstance(allow_cloud, bool):
        raise InvalidParameter("allow_cloud", "allow_cloud must be true or false")
    # The wire's limit (ApiKey.max_tokens_per_request is a uint32): a larger cap was
    # stored, then failed every conversion of the keys section for an agent (a 500 here,
    # and every agent's session ended at its first message, at every reconnect).
    max_tokens = int_field(body, "max_tokens_per_request", 0, 0, MAX_TOKENS_PER_REQUEST) or 0
    expires_in_s = int_field(body, "expires_in_s", None, 1, TEN_YEARS_S)  # null: never
    requests_per_minute = _number(body, "requests_per_minute")
    tokens_per_minute = _number(body, "tokens_per_minute")
    max_keep_alive_s = _keep_alive_cap(body.get("max_keep_alive_s", 0))
    may_pin_models = _pin_right(body.get("may_pin_models", False))
    policy = _policy(body.get("policy"))
    try:
        minted = await request.config_dict[API_KEYS_KEY].mint(
            name=name,
            models=models,
            allow_cloud=allow_cloud,
            max_priority=priority,
            max_tokens_per_request=max_tokens,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            expires_in=None if expires_in_s is None else timedelta(seconds=expires_in_s),
            max_keep_alive_s=float(max_keep_alive_s),
            may_pin_models=may_pin_models,
            policy=policy,
        )
    except ValueError as exc:
        raise InvalidParameter("body", str(exc)) from None
    pushed = await request.config_dict[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    await request.config_dict[CHANGES_KEY].publish(KIND_API_KEYS, minted.record.key_id, "minted")
    data = api_key_json(minted.record, datetime.now(UTC))
    return web.json_response(data | {"secret": minted.secret, "agents_updated": pushed}, status=201)


def _moderation_flags(request: web.Request) -> dict[str, int]:
    """Requests flagged or blocked by content safety, by key id: the totals the fleet's
    agents last reported (LoadReport.moderation_flags_by_key, since each agent started)."""
    totals: dict[str, int] = {}
    for record in request.config_dict[REGISTRY_KEY].agents():
        report = record.last_report
        for key_id, count in () if report is None else report.moderation_flags_by_key:
            totals[key_id] = totals.get(key_id, 0) + count
    return totals


async def list_keys(request: web.Request) -> web.Response:
    now = datetime.now(UTC)
    flags = _moderation_flags(request)
    data = [
        api_key_json(k, now) | {"moderation_flags": flags.get(k.key_id, 0)}
        for k in await request.config_dict[API_KEYS_KEY].list_all()
    ]
    return web.json_response({"object": "list", "data": data})


async def show_key(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    try:
        record = await request.config_dict[API_KEYS_KEY].get(key_id)
    except UnknownApiKeyError as exc:
        return _key_not_found(exc)
    shares = request.config_dict[KEY_DISTRIBUTOR_KEY].shares_of(key_id)
    view = api_key_json(record, datetime.now(UTC))
    view["moderation_flags"] = _moderation_flags(request).get(key_id, 0)
    view["agent_shares"] = {
        agent: {"requests_per_minute": rpm, "tokens_per_minute": tpm}
        for agent, (rpm, tpm) in sorted(shares.items())
    }
    return web.json_response(view)


async def update_key(request: web.Request) -> web.Response:
    """Change a key's keep-alive cap, pin right and policy (fields absent: as they are; a
    policy given replaces the whole policy); every connected agent gets the new key set at
    once."""
    body = await json_body(request)
    unknown = sorted(set(body) - {"max_keep_alive_s", "may_pin_models", "policy"})
    if unknown:
        raise InvalidParameter(
            unknown[0], "only max_keep_alive_s, may_pin_models and policy can be changed "
            "(mint a new key for other scopes)"
        )  # fmt: skip
    cap = None if "max_keep_alive_s" not in body else _keep_alive_cap(body["max_keep_alive_s"])
    pin = None if "may_pin_models" not in body else _pin_right(body["may_pin_models"])
    policy = None if "policy" not in body else _policy(body["policy"])
    keys = request.config_dict[API_KEYS_KEY]
    key_id = request.match_info["key_id"]
    try:
        record = await keys.set_keep_alive(key_id, max_keep_alive_s=cap, may_pin_models=pin)
        if policy is not None:
            record = await keys.set_policy(key_id, policy)
    except UnknownApiKeyError as exc:
        return _key_not_found(exc)
    pushed = await request.config_dict[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    await request.config_dict[CHANGES_KEY].publish(KIND_API_KEYS, record.key_id, "updated")
    data = api_key_json(record, datetime.now(UTC))
    return web.json_response(data | {"agents_updated": pushed})


async def revoke_key(request: web.Request) -> web.Response:
    """Revoke a key; every connected agent gets the new key set at once."""
    try:
        record = await request.config_dict[API_KEYS_KEY].revoke(request.match_info["key_id"])
    except UnknownApiKeyError as exc:
        return _key_not_found(exc)
    pushed = await request.config_dict[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    await request.config_dict[CHANGES_KEY].publish(KIND_API_KEYS, record.key_id, "revoked")
    data = api_key_json(record, datetime.now(UTC))
    return web.json_response(data | {"agents_updated": pushed})
