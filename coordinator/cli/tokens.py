"""``python -m coordinator tokens create|list|revoke``: join tokens, with which agents
enroll. On the coordinator's database (default: the configured ``data_dir``), or on a
running coordinator's admin API with ``--url``."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from coordinator.api.views import token_json
from coordinator.cli.audit import record_cli_change
from coordinator.cli.client import AdminClient, AdminRequestError
from coordinator.cli.database import on_database
from coordinator.cli.durations import parse_duration
from coordinator.config import CoordinatorConfig
from coordinator.errors import ProtocolError
from coordinator.identity.join_tokens import JoinTokens
from coordinator.rpc.convert import location_checked
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from edgefleet.contract import Location


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    tokens = sub.add_parser("tokens", help="create, list or revoke join tokens")
    tokens_sub = tokens.add_subparsers(dest="action", required=True)
    create = tokens_sub.add_parser("create", help="create a join token (printed once)")
    create.add_argument(
        "--expires-in", type=parse_duration, default=timedelta(hours=24),
        help="lifetime, e.g. 30m, 24h, 7d or never (default 24h)",
    )  # fmt: skip
    create.add_argument("--uses", type=int, default=1, help="enrollments allowed (default 1)")
    create.add_argument("--site", default="", help="bind enrolled agents to this site")
    create.add_argument("--note", default="", help="free text for operators")
    create.add_argument("--lat", type=float, help="fix the enrolled agent's latitude")
    create.add_argument("--lon", type=float, help="fix the enrolled agent's longitude")
    create.add_argument(
        "--http-url", default="", help="fix the enrolled agent's URL (with --uses 1)"
    )
    listing = tokens_sub.add_parser("list", help="list join tokens")
    revoke = tokens_sub.add_parser(
        "revoke",
        help="revoke a join token: no new enrollments; with --agents, revoke the agents "
        "enrolled with it too (their sessions end)",
    )
    revoke.add_argument("token_id")
    revoke.add_argument(
        "--agents", action="store_true", help="also revoke the agents enrolled with it"
    )
    return [create, listing, revoke]


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    result = _over_http(args, client) if args.url else _in_database(args, config.store_location())
    _print(args, result)
    return 0


def _in_database(args: argparse.Namespace, where: StoreLocation) -> Any:
    location = _location(args) if args.action == "create" else None
    return on_database(where, lambda store: _on_store(args, store, location))


async def _on_store(args: argparse.Namespace, store: FleetStore, location: Location | None) -> Any:
    tokens = JoinTokens(store)
    now = datetime.now(UTC)
    if args.action == "create":
        created = await tokens.create(
            expires_in=args.expires_in,
            max_uses=args.uses,
            site=args.site,
            note=args.note,
            location=location,
            http_url=args.http_url,
        )
        await record_cli_change(store, "cli tokens create", f"token_id={created.record.token_id}")
        return token_json(created.record, now) | {"token": created.token}
    if args.action == "list":
        return {"object": "list", "data": [token_json(t, now) for t in await tokens.list()]}
    await tokens.revoke(args.token_id)
    await record_cli_change(store, "cli tokens revoke", f"token_id={args.token_id}")
    result: dict[str, Any] = {
        "object": "join_token",
        "token_id": args.token_id,
        "state": "revoked",
    }
    if args.agents:
        # Without the running coordinator: the records are revoked; a live session
        # continues until the agent reconnects, and is refused then.
        agents = await tokens.agents_of(args.token_id)
        for agent_id in agents:
            await store.revoke_agent(agent_id, now)
        result["revoked_agents"] = agents
    return result


def _over_http(args: argparse.Namespace, client: AdminClient) -> Any:
    if args.action == "create":
        expires = None if args.expires_in is None else int(args.expires_in.total_seconds())
        body: dict[str, Any] = {
            "expires_in_s": expires,
            "max_uses": args.uses,
            "site": args.site,
            "note": args.note,
            "http_url": args.http_url,
        }
        if args.lat is not None or args.lon is not None:
            body |= {"lat": args.lat, "lon": args.lon}
        return client.call("POST", "/v1/admin/tokens", body)
    if args.action == "list":
        return client.call("GET", "/v1/admin/tokens")
    query = "?agents=true" if args.agents else ""
    return client.call("DELETE", f"/v1/admin/tokens/{args.token_id}{query}")


def _location(args: argparse.Namespace) -> Location | None:
    if args.lat is None and args.lon is None:
        return None
    if args.lat is None or args.lon is None:
        raise AdminRequestError("give --lat and --lon together")
    try:
        return location_checked(args.lat, args.lon, "--lat/--lon")
    except ProtocolError as exc:
        raise AdminRequestError(str(exc)) from exc


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif result.get("object") == "list":
        print(f"{'TOKEN ID':<14}{'STATE':<11}{'USES':<8}{'SITE':<14}{'EXPIRES':<26}NOTE")
        for t in result["data"]:
            uses = f"{t['uses']}/{t['max_uses']}"
            print(f"{t['token_id']:<14}{t['state']:<11}{uses:<8}{t['site'] or '-':<14}"
                  f"{t['expires_at'] or 'never':<26}{t['note']}")  # fmt: skip
    elif "token" in result:
        print(result["token"])
        print(
            f"token {result['token_id']}: {result['max_uses']} use(s), site "
            f"{result['site'] or 'any'}, expires {result['expires_at'] or 'never'} "
            "(shown once; store it now)",
            file=sys.stderr,
        )
    else:
        print(f"token {result['token_id']} revoked")
        if "revoked_agents" in result:
            print(f"revoked agents: {', '.join(result['revoked_agents']) or 'none'}")
