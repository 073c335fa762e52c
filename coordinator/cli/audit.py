"""``python -m coordinator audit export [--since TIME]``: the audit log as JSON lines, read
from the database (whoever can read the data directory already holds every secret) or over
``--url``; and the audit entries for what the CLI changes in the database (the peer
``cli``, the local user's name)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from datetime import UTC, datetime
from typing import Any

from coordinator.access.audit import AuditLog, to_jsonl
from coordinator.cli.client import AdminClient
from coordinator.config import CoordinatorConfig
from coordinator.store.audit import AuditTable
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from coordinator.store.offline import run_offline

_PAGE = 10_000


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    audit = sub.add_parser("audit", help="export the audit log")
    audit_sub = audit.add_subparsers(dest="action", required=True)
    export = audit_sub.add_parser("export", help="print the audit log as JSON lines")
    export.add_argument("--since", help="ISO 8601 time, e.g. 2026-01-02T00:00:00Z")
    return [export]


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    if args.url:
        since = f"&since={args.since}" if args.since else ""
        sys.stdout.write(client.text(f"/v1/admin/audit?format=jsonl{since}"))
        return 0
    return _export(args, config.store_location())


def cli_actor() -> str:
    """The local user's name, for the audit log."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


async def record_cli_change(store: AuditTable, action: str, target: str, detail: str = "") -> None:
    """Audit a change the CLI made in the database."""
    await AuditLog(store).append(action=action, outcome="ok", actor_id="cli",
                                 actor_name=cli_actor(), role="admin", target=target, peer="cli",
                                 detail=detail)  # fmt: skip


def _export(args: argparse.Namespace, where: StoreLocation) -> int:
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

    async def export(store: FleetStore) -> int:
        after = 0
        while True:
            page = await AuditLog(store).entries(since=since, after_seq=after, limit=_PAGE)
            sys.stdout.writelines(to_jsonl(page))
            if len(page) < _PAGE:
                return 0
            after = page[-1].seq

    return run_offline(where, export)
