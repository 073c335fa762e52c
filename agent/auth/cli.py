"""``python -m agent keys add|list|remove --file PATH``: a standalone agent's keys file.

``add`` makes a new key (256 random bits), appends its SHA-256 digest and scopes to the
file (created 0600 when missing) and prints the secret once; the file never holds it.
Point the agent at the file with ``auth.keys_file`` (a running agent reads it at start).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from agent.auth.key_files import MAX_KEEP_ALIVE_S, key_to_json, read_keys, write_keys
from agent.auth.keys import PRIORITY_RANK, new_secret, secret_digest
from agent.errors import ConfigError
from edgefleet.contract import ApiKey, KeyPolicy, KeysSection
from edgefleet.key_policy import KeyPolicyError, key_policy_from_json, policy_with_rules

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# a key's lifetime at most (an expiry further off is no expiry: leave --expires-in out)
MAX_DURATION_S = 100 * 365 * 86400


def _duration_s(text: str) -> int:
    unit = text[-1:].lower()
    try:
        seconds = float(text[:-1]) * _UNITS[unit] if unit in _UNITS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30d, 12h)") from None
    if not math.isfinite(seconds) or seconds < 1:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a whole second or more, e.g. 30d, 12h)"
        )
    if seconds > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text!r} is more than 100 years")
    return round(seconds)


def _keep_alive_cap(text: str) -> float:
    """``--max-keep-alive``: a duration within [0, 7d] (``0``: the agent's own cap)."""
    unit = text[-1:].lower()
    try:
        seconds = float(text[:-1]) * _UNITS[unit] if unit in _UNITS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 2h)") from None
    if not 0 <= seconds <= MAX_KEEP_ALIVE_S:  # NaN and inf too
        raise argparse.ArgumentTypeError(
            f"--max-keep-alive must be a duration up to 7d (0: the agent's own cap), got {text!r}"
        )
    return seconds


def _moderation_rule(text: str) -> str:
    """``--moderation``: one rule, checked whole (shape, category, action, threshold)."""
    try:
        key_policy_from_json(policy_with_rules(KeyPolicy(), [text]))
    except KeyPolicyError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-agent keys", description="Manage a standalone agent's API keys file."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="make a key, add it to the file, print the secret once")
    add.add_argument("--name", default="", help="label (not secret)")
    add.add_argument("--model", action="append", default=[], dest="models",
                     help="allowed model, name or name@version (repeat; default: all)")  # fmt: skip
    add.add_argument("--allow-cloud", action="store_true", help="may overflow beyond the site")
    add.add_argument("--max-priority", choices=sorted(PRIORITY_RANK), default="normal")
    add.add_argument("--max-tokens", type=int, default=0, help="per request (0: no cap)")
    add.add_argument("--requests-per-minute", type=float, default=0.0, help="0: unlimited")
    add.add_argument("--tokens-per-minute", type=float, default=0.0, help="0: unlimited")
    add.add_argument("--expires-in", type=_duration_s, default=None, help="e.g. 30d (never)")
    add.add_argument("--max-keep-alive", type=_keep_alive_cap, default=0.0,
                     dest="max_keep_alive_s", metavar="DURATION",
                     help="longest keep_alive a request may ask, e.g. 30m (at most 7d; "
                     "default 0: the agent's residency.max_request_keep_alive_s)")  # fmt: skip
    add.add_argument("--may-pin-models", action="store_true",
                     help="requests may pin a model (keep_alive < 0: loaded until an "
                     "operator unloads it or the agent restarts)")  # fmt: skip
    add.add_argument("--moderation", action="append", default=[], type=_moderation_rule,
                     metavar="RULE", help="moderation rule DIRECTION:CATEGORY=ACTION"
                     "[@THRESHOLD], e.g. input:harassment=block (repeat; ACTION block, flag "
                     "or off; a category left out: block sexual/minors, flag others)")  # fmt: skip
    add.add_argument("--moderation-stream", default=None, choices=["buffered", "unbuffered"],
                     help="streamed output checked before it is sent (buffered, default) or "
                     "behind it (unbuffered)")  # fmt: skip
    add.add_argument("--semantic-cache", action="store_true",
                     help="answer the key's deterministic requests from the semantic cache "
                     "too (reworded repeats)")  # fmt: skip
    sub.add_parser("list", help="list the keys in the file (never the secrets)")
    remove = sub.add_parser("remove", help="remove a key from the file")
    remove.add_argument("key_id")
    for command in sub.choices.values():
        command.add_argument("--file", type=Path, required=True, help="the keys file (JSON)")
    return parser


def run_keys_command(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    path: Path = args.file
    try:
        section = read_keys(path) if path.exists() or args.action != "add" else KeysSection(0)
        if args.action == "list":
            print(json.dumps([key_to_json(k) | {"secret_sha256": "..."} for k in section.keys],
                             indent=1))  # fmt: skip
            return 0
        if args.action == "remove":
            kept = tuple(k for k in section.keys if k.key_id != args.key_id)
            if len(kept) == len(section.keys):
                print(f"edgefleet-agent: error: no key {args.key_id} in {path}", file=sys.stderr)
                return 1
            write_keys(path, KeysSection(section.generation, kept))
            print(f"key {args.key_id} removed from {path} (restart the agent to apply)")
            return 0
        key_id, secret = new_secret()
        key = ApiKey(
            key_id=key_id,
            secret_sha256=secret_digest(secret),
            models=tuple(args.models),
            allow_cloud=args.allow_cloud,
            max_priority=args.max_priority,
            max_tokens_per_request=args.max_tokens,
            requests_per_minute=args.requests_per_minute,
            tokens_per_minute=args.tokens_per_minute,
            expires_at_unix=0 if args.expires_in is None else int(time.time()) + args.expires_in,
            name=args.name,
            max_keep_alive_s=args.max_keep_alive_s,
            may_pin_models=args.may_pin_models,
            policy=key_policy_from_json(
                policy_with_rules(KeyPolicy(), args.moderation, args.moderation_stream)
                | {"semantic_cache": args.semantic_cache}
            ),
        )
        write_keys(path, KeysSection(section.generation, (*section.keys, key)))
    except ConfigError as exc:
        print(f"edgefleet-agent: error: {exc}", file=sys.stderr)
        return 1
    print(secret)
    print(f"key {key_id} added to {path} (the secret is shown once; store it now)",
          file=sys.stderr)  # fmt: skip
    return 0
