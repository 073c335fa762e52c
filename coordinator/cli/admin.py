"""``python -m coordinator tokens|keys|agents|admin-tokens|audit|backup|restore ...``:
operator commands (``models ...``: coordinator.cli.models).

Token and API key commands work on the coordinator's SQLite database directly (default: the
configured ``data_dir``), or on a running coordinator's admin API with ``--url``.
Agent commands (drain, resume, set, revoke, remove) need the running coordinator
(they act on live sessions). ``admin-tokens mint|list|revoke`` and ``audit export`` work
on the database (whoever can read the data directory already holds every secret), or over
``--url``. ``backup DIR`` works while the coordinator runs; ``restore DIR`` wants it
stopped (coordinator.store.backup says what they hold).

Over ``--url`` the CLI presents an admin token from ``$EDGEFLEET_ADMIN_TOKEN`` or
``--admin-token-file``, never from a flag (``/proc/PID/cmdline`` is readable by every
user of the host), and over HTTPS trusts the fleet CA beside the system's CAs
(``--ca-file``, default ``<data_dir>/ca/ca.pem``: coordinator/cli/https.py). What the CLI
changes in the database is written to the audit log with the peer ``cli`` and the local
user's name.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from coordinator.access.admin_tokens import AdminTokens, Role
from coordinator.access.api_keys import PRIORITIES, ApiKeys
from coordinator.access.audit import AuditLog, to_jsonl
from coordinator.api.views import api_key_json, token_json
from coordinator.cli.https import add_ca_file_argument, ca_file_of, client_context, default_url
from coordinator.cli.models import (
    ModelsCommandError,
    add_models_command,
    print_result,
    run_models_command,
)
from coordinator.config import load_config
from coordinator.errors import ConfigError, CoordinatorError, ProtocolError
from coordinator.identity.join_tokens import JoinTokens
from coordinator.rpc.convert import location_checked
from coordinator.store.admin_db import AdminDatabase
from coordinator.store.backup import backup, restore
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import Location

ADMIN_TOKEN_ENV = "EDGEFLEET_ADMIN_TOKEN"
ADMIN_COMMANDS = (
    "tokens", "keys", "agents", "admin-tokens", "audit", "backup", "restore", "models",
)  # fmt: skip
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
    create.add_argument("--lat", type=float, help="fix the enrolled agent's latitude")
    create.add_argument("--lon", type=float, help="fix the enrolled agent's longitude")
    create.add_argument(
        "--http-url", default="", help="fix the enrolled agent's URL (with --uses 1)"
    )
    leaves.append(tokens_sub.add_parser("list", help="list join tokens"))
    revoke = tokens_sub.add_parser(
        "revoke",
        help="revoke a join token: no new enrollments; with --agents, revoke the agents "
        "enrolled with it too (their sessions end)",
    )
    revoke.add_argument("token_id")
    revoke.add_argument(
        "--agents", action="store_true", help="also revoke the agents enrolled with it"
    )
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

    agents = sub.add_parser(
        "agents", help="drain, resume, set, revoke or remove an agent (needs the coordinator)"
    )
    agents_sub = agents.add_subparsers(dest="action", required=True)
    helps = {
        "drain": "drain an agent",
        "resume": "resume an agent",
        "revoke": "end the agent's session and refuse its certificate and credential",
        "remove": "revoke the agent and delete its record",
        "set": "fix the agent's site, location or URL (it reconnects with them)",
    }
    for action, text in helps.items():
        command = agents_sub.add_parser(action, help=text)
        command.add_argument("agent_id")
        if action == "set":
            command.add_argument("--site")
            command.add_argument("--lat", type=float)
            command.add_argument("--lon", type=float)
            command.add_argument("--http-url", help="the agent's URL, e.g. https://10.0.0.7:8000")
        leaves.append(command)

    for action, text in (
        ("backup", "write a consistent backup (database, CA, keys) into a new DIR"),
        ("restore", "restore a backup DIR into an empty data directory (coordinator stopped)"),
    ):
        command = sub.add_parser(action, help=text)
        command.add_argument("directory", type=Path, metavar="DIR")
        if action == "restore":
            command.add_argument(
                "--force", action="store_true", help="replace an existing database and CA"
            )
        leaves.append(command)

    admin_tokens = sub.add_parser("admin-tokens", help="mint, list or revoke admin tokens")
    admin_sub = admin_tokens.add_subparsers(dest="action", required=True)
    mint = admin_sub.add_parser("mint", help="mint an admin token with a role (printed once)")
    mint.add_argument("--role", required=True, choices=["viewer", "operator", "admin"])
    mint.add_argument("--name", required=True, help="who or what holds it (shown in the audit)")
    leaves.append(mint)
    leaves.append(admin_sub.add_parser("list", help="list admin tokens"))
    revoke_admin = admin_sub.add_parser("revoke", help="revoke an admin token")
    revoke_admin.add_argument("token_id")
    leaves.append(revoke_admin)

    audit = sub.add_parser("audit", help="export the audit log")
    audit_sub = audit.add_subparsers(dest="action", required=True)
    export = audit_sub.add_parser("export", help="print the audit log as JSON lines")
    export.add_argument("--since", help="ISO 8601 time, e.g. 2026-01-02T00:00:00Z")
    leaves.append(export)

    leaves.extend(add_models_command(sub))

    for parser in leaves:
        parser.add_argument("--config", type=Path, metavar="FILE", help="coordinator TOML config")
        parser.add_argument("--data-dir", help="coordinator data directory (token commands)")
        parser.add_argument(
            "--url",
            help="admin API of a running coordinator, e.g. http://127.0.0.1:8080 "
            "(tokens: default is the database; agents: default from the config)",
        )
        parser.add_argument(
            "--admin-token-file", type=Path, metavar="FILE",
            help=f"file holding the admin token for --url (default: ${ADMIN_TOKEN_ENV})",
        )  # fmt: skip
        add_ca_file_argument(parser)
        parser.add_argument("--json", action="store_true", help="print JSON")


def run_admin_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides={"data_dir": args.data_dir})
    except ConfigError as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 2
    args.ca_file = ca_file_of(args, config)
    try:
        args.admin_token = _client_token(args)
        if args.command == "audit" and not args.url:
            return _export_audit(args, config.data_path)
        if args.command == "models":
            print_result(args, run_models_command(args, config))
            return 0
        if args.command == "backup":
            result = backup(config.data_path, args.directory)
        elif args.command == "restore":
            result = restore(args.directory, config.data_path, force=args.force)
        elif args.command == "agents":
            result = _agents_over_http(args.url or default_url(config), args)
        elif args.command == "admin-tokens":
            result = (
                _admin_tokens_over_http(args)
                if args.url
                else _admin_tokens_in_database(args, config.data_path)
            )
        elif args.command == "audit":
            since = f"&since={args.since}" if args.since else ""
            return _print_text(_http(args.url, "GET", f"/v1/admin/audit?format=jsonl{since}",
                                     args, raw=True))  # fmt: skip
        elif args.command == "keys":
            in_db = not args.url
            result = _keys_in_database(args, config.data_path) if in_db else _keys_over_http(args)
        elif args.url:
            result = _tokens_over_http(args)
        else:
            result = _tokens_in_database(args, config.data_path)
    except (CoordinatorError, AdminRequestError, ModelsCommandError) as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 1
    _print(args, result)
    return 0


class AdminRequestError(Exception):
    """The admin API answered with an error or could not be reached."""


def _client_token(args: argparse.Namespace) -> str:
    if args.admin_token_file is not None:
        try:
            lines = args.admin_token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise AdminRequestError(f"cannot read {args.admin_token_file}: {exc}") from exc
        return lines[0].strip() if lines else ""
    return os.environ.get(ADMIN_TOKEN_ENV, "")


def _cli_actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _audit_cli(data_dir: Path, action: str, target: str, detail: str = "") -> None:
    db = AdminDatabase.in_directory(data_dir)
    try:
        AuditLog(db).append(action=action, outcome="ok", actor_id="cli", actor_name=_cli_actor(),
                            role="admin", target=target, peer="cli", detail=detail)  # fmt: skip
    finally:
        db.close()


def _admin_tokens_in_database(args: argparse.Namespace, data_dir: Path) -> Any:
    db = AdminDatabase.in_directory(data_dir)
    try:
        tokens = AdminTokens(db)
        if args.action == "mint":
            created = tokens.mint(Role.parse(args.role), args.name,
                                  created_by=f"cli ({_cli_actor()})")  # fmt: skip
            AuditLog(db).append(
                action="cli admin-tokens mint", outcome="ok", actor_id="cli",
                actor_name=_cli_actor(), role="admin", peer="cli",
                target=f"token_id={created.record.token_id}",
                detail=f"role={args.role} name={created.record.name}",
            )  # fmt: skip
            return created.record.json() | {"token": created.token}
        if args.action == "list":
            return {"object": "list", "data": [t.json() for t in tokens.list()]}
        record = tokens.revoke(args.token_id)
        AuditLog(db).append(action="cli admin-tokens revoke", outcome="ok", actor_id="cli",
                            actor_name=_cli_actor(), role="admin", peer="cli",
                            target=f"token_id={args.token_id}")  # fmt: skip
        return record.json()
    except ValueError as exc:
        raise AdminRequestError(str(exc)) from exc
    finally:
        db.close()


def _admin_tokens_over_http(args: argparse.Namespace) -> Any:
    if args.action == "mint":
        body = {"role": args.role, "name": args.name}
        return _http(args.url, "POST", "/v1/admin/admin-tokens", args, body)
    if args.action == "list":
        return _http(args.url, "GET", "/v1/admin/admin-tokens", args)
    return _http(args.url, "DELETE", f"/v1/admin/admin-tokens/{args.token_id}", args)


def _export_audit(args: argparse.Namespace, data_dir: Path) -> int:
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
        except ValueError:
            print(f"edgefleet-coordinator: error: --since {args.since!r} is not an ISO time",
                  file=sys.stderr)  # fmt: skip
            return 2
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    db = AdminDatabase.in_directory(data_dir)
    try:
        after = 0
        while True:
            page = list(AuditLog(db).entries(since=since, after_seq=after, limit=10_000))
            sys.stdout.writelines(to_jsonl(iter(page)))
            if len(page) < 10_000:
                return 0
            after = page[-1].seq
    finally:
        db.close()


def _print_text(text: Any) -> int:
    sys.stdout.write(str(text))
    return 0


def _agents_over_http(url: str, args: argparse.Namespace) -> Any:
    path = f"/v1/admin/agents/{args.agent_id}"
    if args.action == "remove":
        return _http(url, "DELETE", path, args)
    if args.action == "set":
        body: dict[str, Any] = {}
        for name in ("site", "lat", "lon", "http_url"):
            if getattr(args, name) is not None:
                body[name] = getattr(args, name)
        return _http(url, "PATCH", path, args, body)
    return _http(url, "POST", f"{path}/{args.action}", args)


def _tokens_in_database(args: argparse.Namespace, data_dir: Path) -> Any:
    store = SQLiteFleetStore.in_directory(data_dir)
    try:
        tokens = JoinTokens(store)
        now = datetime.now(UTC)
        if args.action == "create":
            created = tokens.create(
                expires_in=args.expires_in,
                max_uses=args.uses,
                site=args.site,
                note=args.note,
                location=_location(args),
                http_url=args.http_url,
            )
            _audit_cli(data_dir, "cli tokens create", f"token_id={created.record.token_id}")
            return token_json(created.record, now) | {"token": created.token}
        if args.action == "list":
            return {"object": "list", "data": [token_json(t, now) for t in tokens.list()]}
        tokens.revoke(args.token_id)
        _audit_cli(data_dir, "cli tokens revoke", f"token_id={args.token_id}")
        result: dict[str, Any] = {
            "object": "join_token",
            "token_id": args.token_id,
            "state": "revoked",
        }
        if args.agents:
            # Without the running coordinator: the records are revoked; a live session
            # continues until the agent reconnects, and is refused then.
            agents = tokens.agents_of(args.token_id)
            for agent_id in agents:
                store.revoke_agent(agent_id, now)
            result["revoked_agents"] = agents
        return result
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
        body: dict[str, Any] = {
            "expires_in_s": expires,
            "max_uses": args.uses,
            "site": args.site,
            "note": args.note,
            "http_url": args.http_url,
        }
        if args.lat is not None or args.lon is not None:
            body |= {"lat": args.lat, "lon": args.lon}
        return _http(args.url, "POST", "/v1/admin/tokens", args, body)
    if args.action == "list":
        return _http(args.url, "GET", "/v1/admin/tokens", args)
    query = "?agents=true" if args.agents else ""
    return _http(args.url, "DELETE", f"/v1/admin/tokens/{args.token_id}{query}", args)


def _location(args: argparse.Namespace) -> Location | None:
    if args.lat is None and args.lon is None:
        return None
    if args.lat is None or args.lon is None:
        raise AdminRequestError("give --lat and --lon together")
    try:
        return location_checked(args.lat, args.lon, "--lat/--lon")
    except ProtocolError as exc:
        raise AdminRequestError(str(exc)) from exc


def _http(url: str, method: str, path: str, args: argparse.Namespace, body: Any = None,
          *, raw: bool = False) -> Any:  # fmt: skip
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
    context = client_context(url, getattr(args, "ca_file", None))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.read().decode() if raw else json.load(response)
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
    if args.command == "admin-tokens":
        if "token" in result:
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
        return
    if args.command == "backup":
        count, version = len(result["files"]), result["schema_version"]
        print(f"backup written to {args.directory} ({count} files, schema version {version}); "
              "it holds the CA key: keep it private")  # fmt: skip
    elif args.command == "restore":
        print(f"restored the backup of {result['created_at']} into the data directory")
    elif args.command == "agents" and args.action in ("revoke", "remove", "set"):
        ended = "session ended" if result.get("session_ended") else "no live session"
        print(f"agent {result['agent_id']}: {args.action} done; {ended}")
    elif args.command == "agents":
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
        if "revoked_agents" in result:
            print(f"revoked agents: {', '.join(result['revoked_agents']) or 'none'}")
