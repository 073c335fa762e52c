"""``python -m coordinator admin-tokens mint|list|revoke``: the tokens operators present to
the admin API, each with a role. On the database (whoever can read the data directory
already holds every secret; written to the audit log as the peer ``cli``), or over
``--url``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from coordinator.access.admin_tokens import AdminTokens, Role
from coordinator.access.audit import AuditLog
from coordinator.cli.audit import cli_actor
from coordinator.cli.client import AdminClient
from coordinator.cli.database import on_database
from coordinator.config import CoordinatorConfig
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    admin_tokens = sub.add_parser("admin-tokens", help="mint, list or revoke admin tokens")
    admin_sub = admin_tokens.add_subparsers(dest="action", required=True)
    mint = admin_sub.add_parser("mint", help="mint an admin token with a role (printed once)")
    mint.add_argument("--role", required=True, choices=["viewer", "operator", "admin"])
    mint.add_argument("--name", required=True, help="who or what holds it (shown in the audit)")
    listing = admin_sub.add_parser("list", help="list admin tokens")
    revoke = admin_sub.add_parser("revoke", help="revoke an admin token")
    revoke.add_argument("token_id")
    return [mint, listing, revoke]


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    result = _over_http(args, client) if args.url else _in_database(args, config.store_location())
    _print(args, result)
    return 0


def _in_database(args: argparse.Namespace, where: StoreLocation) -> Any:
    return on_database(where, lambda store: _on_store(args, store))


async def _on_store(args: argparse.Namespace, store: FleetStore) -> Any:
    tokens = AdminTokens(store)
    if args.action == "mint":
        created = await tokens.mint(Role.parse(args.role), args.name,
                                    created_by=f"cli ({cli_actor()})")  # fmt: skip
        await AuditLog(store).append(
            action="cli admin-tokens mint", outcome="ok", actor_id="cli",
            actor_name=cli_actor(), role="admin", peer="cli",
            target=f"token_id={created.record.token_id}",
            detail=f"role={args.role} name={created.record.name}",
        )  # fmt: skip
        return created.record.json() | {"token": created.token}
    if args.action == "list":
        return {"object": "list", "data": [t.json() for t in await tokens.list()]}
    record = await tokens.revoke(args.token_id)
    await AuditLog(store).append(action="cli admin-tokens revoke", outcome="ok", actor_id="cli",
                                 actor_name=cli_actor(), role="admin", peer="cli",
                                 target=f"token_id={args.token_id}")  # fmt: skip
    return record.json()


def _over_http(args: argparse.Namespace, client: AdminClient) -> Any:
    if args.action == "mint":
        return client.call("POST", "/v1/admin/admin-tokens", {"role": args.role, "name": args.name})
    if args.action == "list":
        return client.call("GET", "/v1/admin/admin-tokens")
    return client.call("DELETE", f"/v1/admin/admin-tokens/{args.token_id}")


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif "token" in result:
        print(result["token"])
        print(f"admin token {result['token_id']} ({result['role']}, {result['name']}): "
              "shown once; store it now", file=sys.stderr)  # fmt: skip
    elif result.get("object") == "list":
        print(f"{'TOKEN ID':<14}{'ROLE':<10}{'STATE':<9}{'CREATED':<26}NAME")
        for t in result["data"]:
            print(f"{t['token_id']:<14}{t['role']:<10}{t['state']:<9}"
                  f"{t['created_at']:<26}{t['name']}")  # fmt: skip
    else:
        print(f"admin token {result['token_id']} revoked")
