"""``python -m coordinator backup DIR`` (works while the coordinator runs) and ``restore
DIR`` (wants it stopped): coordinator.store.backup says what a backup holds. On PostgreSQL
(``store_url`` set) both refuse and say what to do instead (pg_dump, and data_dir)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from coordinator.cli.client import AdminClient
from coordinator.config import CoordinatorConfig
from coordinator.store.backup import BackupError, backup, restore

#: What backup and restore say on a coordinator whose store is PostgreSQL.
POSTGRES_BACKUP = (
    "the fleet database is on PostgreSQL (store_url): back it up with pg_dump and restore "
    "it with pg_restore (docs/operators/postgresql.md), and copy data_dir (the CA, the "
    "model-signing key, the model blobs) with it; backup and restore here are for SQLite "
    "installations"
)


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    leaves = []
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
    return leaves


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    if config.store_url:
        raise BackupError(POSTGRES_BACKUP)
    if args.command == "backup":
        result = backup(config.data_path, args.directory)
    else:
        result = restore(args.directory, config.data_path, force=args.force)
    _print(args, result)
    return 0


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.command == "backup":
        count, version = len(result["files"]), result["schema_version"]
        print(f"backup written to {args.directory} ({count} files, schema version {version}); "
              "it holds the CA key: keep it private")  # fmt: skip
    else:
        print(f"restored the backup of {result['created_at']} into the data directory")
