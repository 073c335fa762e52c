"""``python -m coordinator`` / ``edgefleet-coordinator``: run the fleet coordinator."""

from __future__ import annotations

import argparse
import logging
import sys

from coordinator.cli.admin import ADMIN_COMMANDS, add_admin_commands, run_admin_command
from coordinator.cli.rollouts import main as rollouts_main
from coordinator.config import (
    ADMIN_TOKEN_FLAG_REFUSED,
    FLAGS,
    CoordinatorConfig,
    load_config,
    log_level_number,
)
from coordinator.errors import ConfigError, CoordinatorError
from coordinator.event_loop import runner_for
from coordinator.server import serve
from edgefleet.config_loading import add_arguments, overrides_from_args

logger = logging.getLogger("coordinator")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-coordinator",
        description="Run the edgefleet coordinator (gRPC control plane + HTTP admin API). "
        "Operator commands: `tokens create|list|revoke`, `keys mint|list|show|revoke`, "
        "`agents drain|resume|set|revoke|remove ID`, `backup DIR`, `restore DIR`, "
        "`models publish|list|show|deprecate|delete|export|deploy` "
        "`rollouts start|list|show|pause|resume|abort` "
        "(see `python -m coordinator tokens --help`).",
        epilog="Precedence: defaults < --config file < EDGEFLEET_COORDINATOR_<KEY> "
        "environment variables < flags.",
    )
    add_arguments(parser, CoordinatorConfig, FLAGS, example="down_after_reports=8")
    return parser


def _admin_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-coordinator", description="edgefleet coordinator operator commands."
    )
    add_admin_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--admin-token" or a.startswith(("--admin-token=", "admin_token=")) for a in argv):
        print(f"edgefleet-coordinator: error: {ADMIN_TOKEN_FLAG_REFUSED}", file=sys.stderr)
        return 2
    if argv and argv[0] == "rollouts":
        return rollouts_main(argv[1:])
    if argv and argv[0] in ADMIN_COMMANDS:
        return run_admin_command(_admin_parser().parse_args(argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, overrides=overrides_from_args(args, FLAGS))
    except (ConfigError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    logging.basicConfig(
        level=log_level_number(config),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        loop_name, run = runner_for(config.event_loop)
        logger.info("event loop: %s", loop_name)
        run(serve(config))
    except CoordinatorError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
