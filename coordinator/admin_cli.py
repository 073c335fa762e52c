"""``python -m coordinator tokens|keys|agents ...``: operator commands.

Token and API key commands work on the coordinator's SQLite database directly (default: the
configured ``data_dir``), or on a running coordinator's admin API with ``--url``.
Drain and resume need the running coordinator (they push a command to the agent).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from coordinator.admin_api import api_key_json, token_json
from coordinator.api_keys import PRIORITIES, ApiKeys
from coordinator.config import load_config
from coordinator.errors import ConfigError, CoordinatorError
from coordinator.sqlite_store import SQLiteFleetStore
from coordinator.tokens import JoinTokens

ADMIN_TOKEN_ENV = "EDGEFLEET_ADMIN_TOKEN"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta | None:
    """``90s``, ``15m``, ``24h``, ``7d`` or ``never``."""
    text = text.strip().lower()
    if text == "never":
        return None
    unit = text[-1:]
    try:
        amount = float(text[:-1]) if unit in _UNITS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 24h)") from None
    seconds = amount * _UNITS.get(unit, 1)
    if seconds <= 0:
        raise argparse.ArgumentTypeError("the duration must be positive")
    return timedelta(seconds=seconds)


def add_admin_commands(sub: Any) -> None:
    tokens = sub.add_parser("tokens", help="create, list or revoke join tokens")
    tokens_sub = tokens.add_subparsers(dest="action", required=True)
    leaves = []
    create = tokens_sub.add_parser("create", help="create a join token (printed once)")
    leaves.append(create)
    create.add_argument(
        "--expires-in", type=parse_duration, default=timedelta(hours=24),
        help="lifetime, e.g. 30m, 24h, 7d or never (default 24h)",
    )  # fmt: skip
    create.add_argument("--uses", type=int, default=1, help="enrollments allowed (default 1)")
    create.add_argument("--site", default="", help="bind enrolled agents to this site")
    create.add_argument("--note", default="", help="free text for operators")
    leaves.append(tokens_sub.add_parser("list", help="list join tokens"))
    revoke = tokens_sub.add_parser("revoke", help="revoke a join token")
    revoke.add_argument("token_id")
    leaves.append(revoke)

    keys = sub.add_parser("keys", help="mint, list, show or revoke API keys for client apps")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    mint = keys_sub.add_parser("mint", help="mint an API key (the secret is printed once)")
    leaves.append(mint)
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
    leaves.append(keys_sub.add_parser("list", help="list API keys"))
    for action in ("show", "revoke"):
        command = keys_sub.add_parser(action, help=f"{action} an API key")
        command.add_argument("key_id")
        leaves.append(command)

    agents = sub.add_parser("agents", help="drain or resume an agent (needs the coordinator)")
    agents_sub = agents.add_subparsers(dest="action", required=True)
    for action in ("drain", "resume"):
        command = agents_sub.add_parser(action, help=f"{action} an agent")
        command.add_argument("agent_id")
        leaves.append(command)

    for parser in leaves:
        parser.add_argument("--config", type=Path, metavar="FILE", help="coordinator TOML config")
        parser.add_argument("--data-dir", help="coordinator data directory (token commands)")
        parser.add_argument(
            "--url",
            help="admin API of a running coordinator, e.g. http://127.0.0.1:8080 "
            "(tokens: default is the database; agents: default from the config)",
        )
        parser.add_argument(
            "--admin-token", default=os.environ.get(ADMIN_TOKEN_ENV, ""),
            help=f"admin API bearer token (default ${ADMIN_TOKEN_ENV})",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="print JSON")


def run_admin_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides={"data_dir": args.data_dir})
    except ConfigError as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "agents":
            url = args.url or f"http://{config.http_host}:{config.http_port}"
            result = _http(url, "POST", f"/v1/admin/agents/{args.agent_id}/{args.action}", args)
        elif args.command == "keys":
            in_db = not args.url
            result = _keys_in_database(args, config.data_path) if in_db else _keys_over_http(args)
        elif args.url:
            result = _tokens_over_http(args)
        else:
            result = _tokens_in_database(args, config.data_path)
    except (CoordinatorError, AdminRequestError) as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 1
    _print(args, result)
    return 0


class AdminRequestError(Exception):
    """The admin API answered with an error or could not be reached."""


def _tokens_in_database(args: argparse.Namespace, data_dir: Path) -> Any:
    store = SQLiteFleetStore.in_directory(data_dir)
    try:
        tokens = JoinTokens(store)
        now = datetime.now(UTC)
        if args.action == "create":
            created = tokens.create(
                expires_in=args.expires_in, max_uses=args.uses, site=args.site, note=args.note
            )
            return token_json(created.record, now) | {"token": created.token}
        if args.action == "list":
            return {"object": "list", "data": [token_json(t, now) for t in tokens.list()]}
        tokens.revoke(args.token_id)
        return {"object": "join_token", "token_id": args.token_id, "state": "revoked"}
    except ValueError as exc:
        raise AdminRequestError(str(exc)) from exc
    finally:
        store.close()


def _keys_in_database(args: argparse.Namespace, data_dir: Path) -> Any:
    """Work on the database; a running coordinator pushes the change to its agents within
    one report interval (the admin API, ``--url``, pushes at once)."""
    store = SQLiteFleetStore.in_directory(data_dir)
    try:
        keys = ApiKeys(store)
        now = datetime.now(UTC)
        if args.action == "mint":
            minted = keys.mint(
                name=args.name,
                models=args.models,
                allow_cloud=args.allow_cloud,
                max_priority=args.max_priority,
                max_tokens_per_request=args.max_tokens,
                requests_per_minute=args.requests_per_minute,
                tokens_per_minute=args.tokens_per_minute,
                expires_in=args.expires_in,
            )
            return api_key_json(minted.record, now) | {"secret": minted.secret}
        if args.action == "list":
            return {"object": "list", "data": [api_key_json(k, now) for k in keys.list_all()]}
        if args.action == "show":
            return api_key_json(keys.get(args.key_id), now)
        return api_key_json(keys.revoke(args.key_id), now)
    except ValueError as exc:
        raise AdminRequestError(str(exc)) from exc
    finally:
        store.close()


def _keys_over_http(args: argparse.Namespace) -> Any:
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
        }
        return _http(args.url, "POST", "/v1/admin/keys", args, body)
    if args.action == "list":
        return _http(args.url, "GET", "/v1/admin/keys", args)
    if args.action == "show":
        return _http(args.url, "GET", f"/v1/admin/keys/{args.key_id}", args)
    return _http(args.url, "DELETE", f"/v1/admin/keys/{args.key_id}", args)


def _print_keys(args: argparse.Namespace, result: Any) -> None:
    if result.get("object") == "list":
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


def _tokens_over_http(args: argparse.Namespace) -> Any:
    if args.action == "create":
        expires = None if args.expires_in is None else int(args.expires_in.total_seconds())
        body = {
            "expires_in_s": expires,
            "max_uses": args.uses,
            "site": args.site,
            "note": args.note,
        }
        return _http(args.url, "POST", "/v1/admin/tokens", args, body)
    if args.action == "list":
        return _http(args.url, "GET", "/v1/admin/tokens", args)
    return _http(args.url, "DELETE", f"/v1/admin/tokens/{args.token_id}", args)


def _http(url: str, method: str, path: str, args: argparse.Namespace, body: Any = None) -> Any:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if args.admin_token:
        headers["Authorization"] = f"Bearer {args.admin_token}"
    request = urllib.request.Request(
        url.rstrip("/") + path, data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            message = json.load(exc)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise AdminRequestError(f"{method} {path}: {exc.code} {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise AdminRequestError(f"cannot reach the coordinator at {url}: {exc}") from exc


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if args.command == "keys":
        _print_keys(args, result)
        return
    if args.command == "agents":
        sent = "sent" if result.get("command_sent") else "not sent (agent not connected)"
        print(f"agent {result['agent_id']}: draining={result['draining']}; command {sent}")
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
