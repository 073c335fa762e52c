"""``python -m coordinator rollouts start|list|show|pause|resume|abort``: model rollouts
over a running coordinator's admin API (the engine lives in the coordinator process).

The admin token comes from ``$EDGEFLEET_ADMIN_TOKEN`` or ``--admin-token-file`` (never a
flag); ``--url`` defaults to the configured HTTP address. Over HTTPS the fleet CA is
trusted beside the system's CAs (``--ca-file``, default ``<data_dir>/ca/ca.pem``:
coordinator/cli/client.py). start/pause/resume/abort need the operator role, list/show the
viewer role.

    python -m coordinator rollouts start smollm2@2 --canary 1 --waves 25,50,100 --soak 10m
    python -m coordinator rollouts show ro-3f2a...
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinator.cli.client import AdminClient, AdminRequestError, add_client_arguments
from coordinator.cli.durations import parse_duration
from coordinator.config import load_config
from coordinator.errors import ConfigError


def _waves(text: str) -> list[float]:
    try:
        return [float(w) for w in text.split(",") if w.strip()]
    except ValueError:
        message = f"waves are percentages, e.g. 25,50,100: {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def _seconds(text: str) -> float:
    duration = parse_duration(text)
    if duration is None:
        raise argparse.ArgumentTypeError("give a duration, e.g. 10m (not never)")
    return duration.total_seconds()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-coordinator rollouts",
        description="Staged model rollouts (canary, waves, soak, gates, automatic rollback).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start rolling NAME@VERSION out")
    start.add_argument("target", metavar="NAME@VERSION")
    start.add_argument("--from", dest="from_version", default="",
                       help="version to compare with and roll back to (default: the one most "
                       "selected agents run)")  # fmt: skip
    start.add_argument("--site", action="append", default=[], help="only agents at this site")
    start.add_argument("--label", action="append", default=[], help="only agents with k=v")
    start.add_argument("--agent", action="append", default=[], help="only this agent id")
    canary = start.add_mutually_exclusive_group()
    canary.add_argument("--canary", type=int, help="canary agents (default 1)")
    canary.add_argument("--canary-percent", type=float, help="canary as a percentage")
    start.add_argument("--waves", type=_waves, help="cumulative percentages (default 100)")
    start.add_argument("--soak", type=_seconds, help="soak per step, e.g. 10m (default 10m)")
    start.add_argument("--min-requests", type=int, help="per step (default 200)")
    start.add_argument("--max-error-rate", type=float, help="e.g. 0.02 (the default)")
    start.add_argument("--max-ttft-ratio", type=float,
                       help="TTFT p99 vs the previous version (default 1.5)")  # fmt: skip
    start.add_argument("--step-timeout", type=_seconds, help="fail a step not passed by then")
    start.add_argument("--no-self-check", action="store_true",
                       help="do not require a passed on-box self-check")  # fmt: skip
    listing = sub.add_parser("list", help="list rollouts")
    listing.add_argument("--state", default="", help="e.g. running,paused")
    leaves = [start, listing]
    for action, text in (("show", "show one rollout and its gate now"),
                         ("pause", "pause (no step moves; the soak clock stops)"),
                         ("resume", "resume a paused rollout"),
                         ("abort", "abort; moved agents go back unless --keep")):  # fmt: skip
        command = sub.add_parser(action, help=text)
        command.add_argument("rollout_id")
        if action == "abort":
            command.add_argument("--keep", action="store_true",
                                 help="leave the moved agents on the new version")  # fmt: skip
            command.add_argument("--reason", default="", help="shown in the rollout and audit")
        leaves.append(command)
    for command in leaves:
        command.add_argument("--config", type=Path, metavar="FILE", help="coordinator config")
        add_client_arguments(command, url_help="the coordinator's HTTP address (default: config)")
        command.add_argument("--json", action="store_true", help="print JSON")
    return parser


def policy_body(args: argparse.Namespace) -> dict[str, Any]:
    name, _, version = args.target.partition("@")
    if not name or not version:
        raise AdminRequestError(f"give the target as NAME@VERSION, got {args.target!r}")
    body: dict[str, Any] = {"model": name, "version": version}
    selector = {k: v for k, v in (("sites", args.site), ("labels", args.label),
                                  ("agent_ids", args.agent)) if v}  # fmt: skip
    if selector:
        body["selector"] = selector
    optional = {
        "from_version": args.from_version or None,
        "canary_count": args.canary,
        "canary_percent": args.canary_percent,
        "waves": args.waves,
        "soak_s": args.soak,
        "min_requests": args.min_requests,
        "max_error_rate": args.max_error_rate,
        "max_ttft_p99_ratio": args.max_ttft_ratio,
        "step_timeout_s": args.step_timeout,
        "require_self_check": False if args.no_self_check else None,
    }
    return body | {k: v for k, v in optional.items() if v is not None}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 2
    try:
        client = AdminClient.from_args(args, config)
        if args.action == "start":
            result = client.call("POST", "/v1/admin/rollouts", policy_body(args))
        elif args.action == "list":
            query = f"?state={args.state}" if args.state else ""
            result = client.call("GET", f"/v1/admin/rollouts{query}")
        elif args.action == "show":
            result = client.call("GET", f"/v1/admin/rollouts/{args.rollout_id}")
        else:
            body = None
            if args.action == "abort":
                body = {"rollback": not args.keep, "reason": args.reason}
            path = f"/v1/admin/rollouts/{args.rollout_id}/{args.action}"
            result = client.call("POST", path, body)
    except AdminRequestError as exc:
        print(f"edgefleet-coordinator: error: {exc}", file=sys.stderr)
        return 1
    _print(args, result)
    return 0


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if result.get("object") == "list":
        # columns as wide as their widest cell (a model@version is often over 40 characters)
        rows = [
            (r["rollout_id"], f"{r['model']}@{r['version']}", r["previous_version"] or "-",
             r["state"], f"{r['step'] + 1}/{r['steps']}", f"{r['moved']}/{r['agents']}",
             r["detail"])
            for r in result["data"]
        ]  # fmt: skip
        head = ("ROLLOUT", "TARGET", "FROM", "STATE", "STEP", "MOVED", "DETAIL")
        widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head) - 1)]
        for row in [head, *rows]:
            cells = [f"{cell!s:<{w}}" for cell, w in zip(row, widths, strict=False)]
            print("  ".join([*cells, str(row[-1])]))
        return
    print(f"rollout {result['rollout_id']}: {result['model']}@{result['version']} "
          f"(from {result['previous_version'] or 'nothing'}) {result['state']}, "
          f"{result['step_name']} ({result['step'] + 1}/{result['steps']}), "
          f"{result['moved']}/{result['agents']} agents moved")  # fmt: skip
    print(f"  {result['detail']}")
    if args.action == "show":
        print(f"  created {_when(result['created_at'])} by {result['created_by'] or '-'}; "
              f"step started {_when(result['step_started_at'])}")  # fmt: skip
        gate = result.get("gate") or result.get("last_gate")
        if gate:
            ratio = "-" if gate["ttft_ratio"] is None else f"{gate['ttft_ratio']:.2f}x"
            rate = "-" if gate["error_rate"] is None else f"{gate['error_rate']:.4f}"
            print(f"  gate: {gate['verdict']}; {gate['requests']} requests, error rate {rate}, "
                  f"TTFT p99 ratio {ratio}, {gate['loaded']}/{gate['agents']} loaded, soak "
                  f"{gate['soak_elapsed_s']:.0f}/{gate['soak_s']:.0f} s")  # fmt: skip
            for reason in gate["reasons"]:
                print(f"    - {reason}")
        for index, agents in enumerate(result["plan"]):
            name = "canary" if index == 0 else f"wave {index}"
            print(f"  {name}: {', '.join(agents)}")
