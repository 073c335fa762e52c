"""``python -m coordinator`` / ``edgefleet-coordinator``: run the fleet coordinator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from coordinator.admin_cli import add_admin_commands, run_admin_command
from coordinator.config import LOG_LEVELS, CoordinatorConfig, load_config, log_level_number
from coordinator.errors import ConfigError, CoordinatorError
from coordinator.server import serve

logger = logging.getLogger("coordinator")

_DEFAULTS = CoordinatorConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-coordinator",
        description="Run the edgefleet coordinator (gRPC control plane + HTTP admin API). "
        "Operator commands: `tokens create|list|revoke`, `agents drain|resume ID` "
        "(see `python -m coordinator tokens --help`).",
        epilog="Precedence: defaults < --config file < EDGEFLEET_COORDINATOR_<KEY> "
        "environment variables < flags.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config file (default: $EDGEFLEET_COORDINATOR_CONFIG, else none)",
    )
    add = parser.add_argument
    add("--grpc-host", metavar="HOST", help=f"gRPC listen host (default {_DEFAULTS.grpc_host})")
    add("--grpc-port", type=int, metavar="PORT", help=f"gRPC port (default {_DEFAULTS.grpc_port})")
    add("--http-host", metavar="HOST", help=f"HTTP listen host (default {_DEFAULTS.http_host})")
    add("--http-port", type=int, metavar="PORT", help=f"HTTP port (default {_DEFAULTS.http_port})")
    add(
        "--report-interval-ms",
        type=int,
        metavar="MS",
        help=f"agent load-report interval (default {_DEFAULTS.report_interval_ms})",
    )
    add(
        "--hello-timeout-s",
        type=float,
        metavar="S",
        help=f"time a new session has to send Hello (default {_DEFAULTS.hello_timeout_s:g})",
    )
    add(
        "--shutdown-grace-s",
        type=float,
        metavar="S",
        help=f"grace for in-flight RPCs at shutdown (default {_DEFAULTS.shutdown_grace_s:g})",
    )
    add(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help=f"log level (default {_DEFAULTS.log_level})",
    )
    add(
        "--data-dir",
        metavar="DIR",
        help=f"database and CA directory (default {_DEFAULTS.data_dir})",
    )
    add(
        "--tls",
        type=str.lower,
        choices=("auto", "on", "off"),
        help="gRPC TLS: auto = on unless grpc-host is loopback (default auto)",
    )
    add("--enroll-port", type=int, metavar="PORT", help="TLS enrollment port (default 50052)")
    add("--admin-token", metavar="TOKEN", help="bearer token for the admin API (default none)")
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any config key, e.g. --set down_after_reports=8",
    )
    return parser


def _admin_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-coordinator", description="edgefleet coordinator operator commands."
    )
    add_admin_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("tokens", "agents"):
        return run_admin_command(_admin_parser().parse_args(argv))
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    config_path = args.pop("config")
    for item in args.pop("set"):
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        args[key.strip().replace("-", "_")] = value
    try:
        config = load_config(config_path, overrides=args)
    except ConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    logging.basicConfig(
        level=log_level_number(config),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(serve(config))
    except CoordinatorError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
