"""``python -m coordinator store migrate --from sqlite:DATA_DIR --to postgresql://...``: copy
a SQLite installation's database into an empty PostgreSQL database, verified by row counts
and checksums (coordinator/store/copy.py says what moves and how it is checked). The
password comes from the configuration (``store_password`` in the environment, or
``store_password_file``), never a flag; ``--to`` defaults to the configured ``store_url``,
``--from`` to ``sqlite:`` and the configured ``data_dir``. Then set ``store_url`` and
restart the coordinator on the same ``data_dir`` (its CA, keys and blobs stay there)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coordinator.cli.client import AdminClient
from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError
from coordinator.store.location import check_store_url


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    store = sub.add_parser("store", help="move the fleet database between backends")
    store_sub = store.add_subparsers(dest="action", required=True)
    migrate = store_sub.add_parser(
        "migrate", help="copy a SQLite database into an empty PostgreSQL one, verified"
    )
    migrate.add_argument(
        "--from", dest="source", metavar="sqlite:DATA_DIR",
        help="the SQLite installation (default: sqlite: and the configured data_dir)",
    )  # fmt: skip
    migrate.add_argument(
        "--to", dest="target", metavar="postgresql://USER@HOST:PORT/DB",
        help="an empty PostgreSQL database (default: the configured store_url); the password "
        "from EDGEFLEET_COORDINATOR_STORE_PASSWORD or store_password_file",
    )  # fmt: skip
    return [migrate]


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    source = args.source or f"sqlite:{config.data_path}"
    if not source.startswith("sqlite:") or source == "sqlite:":
        raise ConfigError(f"--from must be sqlite:DATA_DIR, got {source!r}")
    data_dir = Path(source.removeprefix("sqlite:")).expanduser()
    target = args.target or config.store_url
    if not target:
        raise ConfigError("--to postgresql://USER@HOST:PORT/DB is needed (or store_url set)")
    try:
        check_store_url(target)
    except ValueError as exc:
        raise ConfigError(f"--to: {exc}") from None

    def progress(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr)

    # psycopg only when asked to copy: a SQLite-only install (no postgres extra) runs
    from coordinator.store.copy import copy_sqlite_to_postgres

    report = copy_sqlite_to_postgres(data_dir, config.store_location(target), progress=progress)
    if args.json:
        print(json.dumps(report.json(), indent=2))
    else:
        total = sum(t.rows for t in report.tables)
        print(f"copied {total} rows in {len(report.tables)} tables from {report.source} to "
              f"{target}, verified; now set store_url and restart the coordinator")  # fmt: skip
    return 0
