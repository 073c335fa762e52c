"""``python -m coordinator tokens|keys|agents|admin-tokens|audit|backup|restore|models|store``:
the operator commands, one module per command group (``rollouts ...``: cli/rollouts.py,
with a parser of its own).

| group | module | works on |
| --- | --- | --- |
| ``tokens`` (join tokens) | cli/tokens.py | the database, or ``--url`` |
| ``keys`` (API keys) | cli/keys.py | the database, or ``--url`` |
| ``agents`` | cli/agents.py | the running coordinator (live sessions) |
| ``admin-tokens`` | cli/admin_tokens.py | the database, or ``--url`` |
| ``audit export`` | cli/audit.py | the database, or ``--url`` |
| ``backup``, ``restore`` | cli/backup.py | the data directory (restore: coordinator stopped) |
| ``models`` | cli/models.py | the running coordinator |
| ``store migrate`` | cli/store.py | a SQLite data directory into an empty PostgreSQL database |

The database is the configured ``data_dir``'s (``--data-dir``, ``--config``); whoever can
read the data directory already holds every secret. What the CLI changes there is written
to the audit log with the peer ``cli`` and the local user's name. Over the admin API, every
group uses the one client in cli/client.py: the admin token from ``$EDGEFLEET_ADMIN_TOKEN``
or ``--admin-token-file`` (never a flag), and over HTTPS the fleet CA trusted beside the
system's CAs (``--ca-file``, default ``<data_dir>/ca/ca.pem``).

Exit status: 0 done, 1 the command failed (the message says why), 2 a usage or
configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.cli import admin_tokens, agents, audit, backup, keys, models, store, tokens
from coordinator.cli.client import AdminClient, AdminRequestError, add_client_arguments
from coordinator.config import CoordinatorConfig, load_config
from coordinator.errors import ConfigError, CoordinatorError

Run = Callable[[argparse.Namespace, CoordinatorConfig, AdminClient], int]

# in the order `--help` lists them
_GROUPS: dict[str, tuple[Callable[[Any], list[argparse.ArgumentParser]], Run]] = {
    "tokens": (tokens.add_commands, tokens.run),
    "keys": (keys.add_commands, keys.run),
    "agents": (agents.add_commands, agents.run),
    "backup": (backup.add_commands, backup.run),  # adds restore too
    "admin-tokens": (admin_tokens.add_commands, admin_tokens.run),
    "audit": (audit.add_commands, audit.run),
    "models": (models.add_commands, models.run),
    "store": (store.add_commands, store.run),
}
_RUN: dict[str, Run] = {name: run for name, (_, run) in _GROUPS.items()} | {"restore": backup.run}
ADMIN_COMMANDS = tuple(_RUN)


def add_admin_commands(sub: Any) -> None:
    for add, _ in _GROUPS.values():
        for parser in add(sub):
            parser.add_argument("--config", type=Path, metavar="FILE",
                                help="coordinator TOML config")  # fmt: skip
            parser.add_argument("--data-dir", help="coordinator data directory (token commands)")
            add_client_arguments(
                parser,
                url_help="admin API of a running coordinator, e.g. http://127.0.0.1:8080 "
                "(tokens: default is the database; agents: default from the config)",
            )
            parser.add_argument("--json", action="store_true", help="print JSON")


def run_admin_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides={"data_dir": args.data_dir})
    except ConfigError as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _RUN[args.command](args, config, AdminClient.from_args(args, config))
    except (CoordinatorError, AdminRequestError) as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 1
