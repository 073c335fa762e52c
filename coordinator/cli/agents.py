"""``python -m coordinator agents drain|resume|set|revoke|remove AGENT_ID`` and
``agents load-model|unload-model AGENT_ID MODEL``: act on an agent's live session, so over
the running coordinator's admin API (``--url``, default the configured address)."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from coordinator.cli.client import AdminClient
from coordinator.config import CoordinatorConfig

_HELPS = {
    "drain": "drain an agent",
    "resume": "resume an agent",
    "revoke": "end the agent's session and refuse its certificate and credential",
    "remove": "revoke the agent and delete its record",
    "set": "fix the agent's site, location or URL (it reconnects with them)",
    "load-model": "load a model's weights on the agent now (it loads models on demand)",
    "unload-model": "unload a model's weights on the agent (it stays served)",
}


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    agents = sub.add_parser(
        "agents", help="drain, resume, set, revoke or remove an agent (needs the coordinator)"
    )
    agents_sub = agents.add_subparsers(dest="action", required=True)
    leaves = []
    for action, text in _HELPS.items():
        command = agents_sub.add_parser(action, help=text)
        command.add_argument("agent_id")
        if action in ("load-model", "unload-model"):
            command.add_argument("model", help="the model's name, e.g. smollm2-135m-instruct")
        if action == "set":
            command.add_argument("--site")
            command.add_argument("--lat", type=float)
            command.add_argument("--lon", type=float)
            command.add_argument("--http-url", help="the agent's URL, e.g. https://10.0.0.7:8000")
        leaves.append(command)
    return leaves


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    path = f"/v1/admin/agents/{args.agent_id}"
    if args.action == "remove":
        result = client.call("DELETE", path)
    elif args.action == "set":
        body: dict[str, Any] = {}
        for name in ("site", "lat", "lon", "http_url"):
            if getattr(args, name) is not None:
                body[name] = getattr(args, name)
        result = client.call("PATCH", path, body)
    elif args.action in ("load-model", "unload-model"):
        verb = args.action.removesuffix("-model")
        result = client.call("POST", f"{path}/models/{quote(args.model, safe='')}/{verb}")
    else:
        result = client.call("POST", f"{path}/{args.action}")
    _print(args, result)
    return 0


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.action in ("load-model", "unload-model"):
        print(f"agent {result['agent_id']}: {result['command']} {result['model']} sent")
    elif args.action in ("revoke", "remove", "set"):
        ended = "session ended" if result.get("session_ended") else "no live session"
        print(f"agent {result['agent_id']}: {args.action} done; {ended}")
    else:
        sent = "sent" if result.get("command_sent") else "not sent (agent not connected)"
        print(f"agent {result['agent_id']}: draining={result['draining']}; command {sent}")
