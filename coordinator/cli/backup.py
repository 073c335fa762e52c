"""``python -m coordinator backup DIR`` (works while the coordinator runs) and ``restore
DIR`` (wants it stopped), on SQLite or on PostgreSQL (``store_url``: the database dumped
with pg_dump into the backup, restored with pg_restore into the database store_url names):
coordinator.store.backup says what a backup holds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from coordinator.cli.client import AdminClient
from coordinator.config import CoordinatorConfig
from coordinator.store.backup import backup, restore


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    leaves = []
    for action, text in (
        ("backup", "write a consistent backup (database, CA, keys, blobs) into a new DIR"),
        ("restore", "restore a backup DIR into an empty data directory and database "
                    "(coordinator stopped)"),
    ):  # fmt: skip
        command = sub.add_parser(action, help=text)
        command.add_argument("directory", type=Path, metavar="DIR")
        if action == "restore":
            command.add_argument(
                "--force",
                action="store_true",
                help="replace an existing database (SQLite file, or the tables in the "
                "PostgreSQL database) and CA",
            )
        leaves.append(command)
    return leaves


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    where = config.store_location()
    if args.command == "backup":
        result = backup(where, args.directory)
    else:
        result = restore(args.directory, where, force=args.force)
    _print(args, result)
    return 0


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.command == "backup":
        count, version = len(result["files"]), result["schema_version"]
        database = result.get("database", {})
        dumped = (
            f"; {database['dumped_from']} dumped with pg_dump {database['pg_dump_version']}"
            if "dumped_from" in database
            else ""
        )
        print(f"backup written to {args.directory} ({count} files, schema version {version}"
              f"{dumped}); it holds the CA key: keep it private")  # fmt: skip
    else:
        print(f"restored the backup of {result['created_at']} into the data directory"
              + (" and the database" if result.get("backend") == "postgresql" else ""))  # fmt: skip
