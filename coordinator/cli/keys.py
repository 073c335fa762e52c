"""``python -m coordinator keys mint|list|show|set|revoke``: API keys for client apps. On the
coordinator's database (default: the configured ``data_dir``; a running coordinator pushes
the change to its agents within one report interval), or on a running coordinator's admin
API with ``--url`` (pushed at once)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from coordinator.access.api_keys import MAX_KEEP_ALIVE_S, PRIORITIES, ApiKeys
from coordinator.api.views import api_key_json
from coordinator.cli.client import AdminClient
from coordinator.cli.database import on_database
from coordinator.cli.durations import parse_duration
from coordinator.config import CoordinatorConfig
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from edgefleet.contract import KeyPolicy, ModerationStreamMode
from edgefleet.key_policy import (
    KeyPolicyError,
    key_policy_from_json,
    key_policy_to_json,
    policy_with_rules,
)

_MODERATION_HELP = (
    "moderation rule DIRECTION:CATEGORY=ACTION[@THRESHOLD], e.g. input:harassment=block or "
    "output:violence=flag@0.6 (repeat; ACTION block, flag or off; a category left out keeps "
    "its default: block sexual/minors, flag the rest)"
)


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    keys = sub.add_parser("keys", help="mint, list, show, change or revoke client apps' API keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    mint = keys_sub.add_parser("mint", help="mint an API key (the secret is printed once)")
    mint.add_argument("--name", default="", help="label (not secret)")
    mint.add_argument("--model", action="append", default=[], dest="models",
                      help="allowed model, name or name@version (repeat; default all)")  # fmt: skip
    mint.add_argument("--allow-cloud", action="store_true", help="may overflow beyond the site")
    mint.add_argument("--max-priority", choices=PRIORITIES, default="normal")
    mint.add_argument("--max-tokens", type=int, default=0, help="per request (0: no cap)")
    mint.add_argument("--requests-per-minute", type=float, default=0.0,
                      help="fleet-wide, split among agents (0: unlimited)")  # fmt: skip
    mint.add_argument("--tokens-per-minute", type=float, default=0.0,
                      help="fleet-wide, split among agents (0: unlimited)")  # fmt: skip
    mint.add_argument("--expires-in", type=parse_duration, default=None,
                      help="lifetime, e.g. 30d (default never)")  # fmt: skip
    mint.add_argument("--max-keep-alive", type=_keep_alive_cap, default=0.0,
                      dest="max_keep_alive_s", metavar="DURATION",
                      help="longest keep_alive a request may ask, e.g. 30m (at most 7d; "
                      "default 0: the agent's own cap)")  # fmt: skip
    mint.add_argument("--may-pin-models", action="store_true",
                      help="requests may pin a model (keep_alive < 0: loaded until an "
                      "operator unloads it)")  # fmt: skip
    _policy_arguments(mint)
    leaves = [mint, keys_sub.add_parser("list", help="list API keys")]
    change = keys_sub.add_parser(
        "set", help="change an API key's keep-alive cap, pin right or moderation policy"
    )
    change.add_argument("key_id")
    change.add_argument("--max-keep-alive", type=_keep_alive_cap, default=None,
                        dest="max_keep_alive_s", metavar="DURATION",
                        help="longest keep_alive a request may ask, e.g. 30m (0: the agent's "
                        "own cap)")  # fmt: skip
    change.add_argument("--may-pin-models", action=argparse.BooleanOptionalAction,
                        default=None, help="requests may pin a model (keep_alive < 0)")  # fmt: skip
    _policy_arguments(change)
    leaves.append(change)
    for action in ("show", "revoke"):
        command = keys_sub.add_parser(action, help=f"{action} an API key")
        command.add_argument("key_id")
        leaves.append(command)
    return leaves


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--moderation", action="append", default=[], type=_moderation_rule,
                        metavar="RULE", help=_MODERATION_HELP)  # fmt: skip
    parser.add_argument("--moderation-stream", default=None,
                        choices=[m.value for m in ModerationStreamMode],
                        help="streamed output: buffered (a window held back and checked "
                        "before it is sent; default) or unbuffered (checked behind)")  # fmt: skip
    parser.add_argument("--semantic-cache", default=None, choices=["on", "off"],
                        help="answer the key's deterministic requests from the semantic "
                        "cache too (reworded repeats); default off")  # fmt: skip


def _moderation_rule(text: str) -> str:
    """``--moderation``: one rule, checked whole (its shape, category, action, threshold)."""
    try:
        key_policy_from_json(policy_with_rules(KeyPolicy(), [text]))
    except KeyPolicyError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _policy_change(args: argparse.Namespace, base: KeyPolicy) -> KeyPolicy | None:
    """``base`` with the command's rules laid over it; None when it gives none."""
    if not args.moderation and args.moderation_stream is None and args.semantic_cache is None:
        return None
    data = policy_with_rules(base, args.moderation, args.moderation_stream)
    if args.semantic_cache is not None:
        data["semantic_cache"] = args.semantic_cache == "on"
    return key_policy_from_json(data)


def _keep_alive_cap(text: str) -> float:
    """``--max-keep-alive``: a duration (``90s``, ``30m``, ``2h``, ``1d``; a bare number is
    seconds) within [0, 7d]; 0 is the agent's own cap."""
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        duration = parse_duration(text)
    except (ValueError, OverflowError):  # nan, inf
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m)") from None
    seconds = None if duration is None else duration.total_seconds()
    if seconds is None or not 0 < seconds <= MAX_KEEP_ALIVE_S:
        raise argparse.ArgumentTypeError(
            f"--max-keep-alive must be a duration up to 7d (0: the agent's own cap), got {text!r}"
        )
    return seconds


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    result = _over_http(args, client) if args.url else _in_database(args, config.store_location())
    _print(args, result)
    return 0


def _in_database(args: argparse.Namespace, where: StoreLocation) -> Any:
    return on_database(where, lambda store: _on_store(args, store))


async def _on_store(args: argparse.Namespace, store: FleetStore) -> Any:
    keys = ApiKeys(store)
    now = datetime.now(UTC)
    if args.action == "mint":
        minted = await keys.mint(
            name=args.name,
            models=args.models,
            allow_cloud=args.allow_cloud,
            max_priority=args.max_priority,
            max_tokens_per_request=args.max_tokens,
            requests_per_minute=args.requests_per_minute,
            tokens_per_minute=args.tokens_per_minute,
            expires_in=args.expires_in,
            max_keep_alive_s=args.max_keep_alive_s,
            may_pin_models=args.may_pin_models,
            policy=_policy_change(args, KeyPolicy()),
        )
        return api_key_json(minted.record, now) | {"secret": minted.secret}
    if args.action == "list":
        return {"object": "list", "data": [api_key_json(k, now) for k in await keys.list_all()]}
    if args.action == "show":
        return api_key_json(await keys.get(args.key_id), now)
    if args.action == "set":
        record = await keys.set_keep_alive(
            args.key_id, max_keep_alive_s=args.max_keep_alive_s, may_pin_models=args.may_pin_models
        )
        policy = _policy_change(args, record.policy)
        if policy is not None:
            record = await keys.set_policy(args.key_id, policy)
        return api_key_json(record, now)
    return api_key_json(await keys.revoke(args.key_id), now)


def _over_http(args: argparse.Namespace, client: AdminClient) -> Any:
    if args.action == "mint":
        expires = None if args.expires_in is None else int(args.expires_in.total_seconds())
        body = {
            "name": args.name,
            "models": args.models,
            "allow_cloud": args.allow_cloud,
            "max_priority": args.max_priority,
            "max_tokens_per_request": args.max_tokens,
            "requests_per_minute": args.requests_per_minute,
            "tokens_per_minute": args.tokens_per_minute,
            "expires_in_s": expires,
            "max_keep_alive_s": args.max_keep_alive_s,
            "may_pin_models": args.may_pin_models,
        }
        policy = _policy_change(args, KeyPolicy())
        if policy is not None:
            body["policy"] = key_policy_to_json(policy)
        return client.call("POST", "/v1/admin/keys", body)
    if args.action == "list":
        return client.call("GET", "/v1/admin/keys")
    if args.action == "show":
        return client.call("GET", f"/v1/admin/keys/{args.key_id}")
    if args.action == "set":
        change: dict[str, Any] = {}
        if args.max_keep_alive_s is not None:
            change["max_keep_alive_s"] = args.max_keep_alive_s
        if args.may_pin_models is not None:
            change["may_pin_models"] = args.may_pin_models
        if args.moderation or args.moderation_stream is not None or args.semantic_cache:
            # the rules given are laid over the key's policy as it is now
            shown = client.call("GET", f"/v1/admin/keys/{args.key_id}")
            base = key_policy_from_json(shown.get("policy"))
            policy = _policy_change(args, base)
            if policy is not None:
                change["policy"] = key_policy_to_json(policy)
        return client.call("PATCH", f"/v1/admin/keys/{args.key_id}", change)
    return client.call("DELETE", f"/v1/admin/keys/{args.key_id}")


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif result.get("object") == "list":
        print(f"{'KEY ID':<14}{'STATE':<9}{'PRIORITY':<10}{'RPM':<9}{'TPM':<10}{'EXPIRES':<26}NAME")
        for k in result["data"]:
            print(f"{k['key_id']:<14}{k['state']:<9}{k['max_priority']:<10}"
                  f"{k['requests_per_minute'] or '-':<9}{k['tokens_per_minute'] or '-':<10}"
                  f"{k['expires_at'] or 'never':<26}{k['name']}")  # fmt: skip
    elif "secret" in result:
        print(result["secret"])
        print(f"API key {result['key_id']} minted (the secret is shown once; store it now)",
              file=sys.stderr)  # fmt: skip
    elif args.action == "revoke":
        print(f"API key {result['key_id']} revoked")
    else:
        print(json.dumps(result, indent=2))
