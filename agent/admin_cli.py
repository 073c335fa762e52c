"""``python -m agent models list|load NAME|unload NAME``: the agent's loopback admin API.

Run on the agent's box, with the agent's configuration (``--config``, environment) to
find its port, scheme and admin token file (``auth.admin_token_file``, default
``<coordinator.state_dir>/admin-token``). Over HTTPS the agent's certificate is pinned
(the file the agent serves, compared byte for byte) instead of checked against a host
name: the name in it is the LAN one. The call goes to 127.0.0.1, or to ``server.host``
when the agent is bound to one address only (a LAN address: it does not listen on
loopback then, and takes a call made from the box to that address).
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import ssl
import sys
from pathlib import Path
from typing import Any

from agent.api.admin import admin_token_path, read_admin_token
from agent.config import AgentConfig, load_config
from agent.errors import AgentError
from edgefleet.addresses import is_loopback_host

TIMEOUT_S = 150.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-agent models",
        description="Load or unload a model's weights on this box's agent now (loopback only).",
    )
    parser.add_argument("--config", type=Path, default=None, help="the agent's config file")
    parser.add_argument("--port", type=int, default=None, help="default: server.port")
    parser.add_argument("--admin-token-file", type=Path, default=None,
                        help="default: auth.admin_token_file")  # fmt: skip
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every text model's state, memory, expiry and pin")
    for action, text in (
        ("load", "load NAME's weights now (waits for the load)"),
        ("unload", "unload NAME's weights once its requests are done (it stays served)"),
    ):
        sub.add_parser(action, help=text).add_argument("name")
    return parser


def _pinned_certificate(config: AgentConfig) -> bytes:
    cert = config.server.tls_cert_file or str(
        Path(config.coordinator.state_dir).expanduser() / "agent.crt"
    )
    pem = Path(cert).expanduser().read_text("ascii")
    first = pem[: pem.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")]
    return ssl.PEM_cert_to_DER_cert(first)


def admin_host(config: AgentConfig) -> str:
    """Where the agent takes calls from this box: loopback, unless it is bound to one
    non-loopback address only."""
    host = config.server.host.strip().strip("[]")
    if host in ("", "localhost") or is_loopback_host(host):
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name: whatever it resolves to on this box
        return host
    return "127.0.0.1" if address.is_unspecified else host


def call(config: AgentConfig, port: int, token: str, method: str, path: str) -> tuple[int, Any]:
    https = config.server.tls == "on" or (
        config.server.tls == "auto" and not is_loopback_host(config.server.host)
    )
    conn: http.client.HTTPConnection
    host = admin_host(config)
    if https:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # pinned below instead
        conn = http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=context)
        conn.connect()
        presented = conn.sock.getpeercert(binary_form=True)
        if presented != _pinned_certificate(config):
            raise AgentError("the agent on this port does not present this agent's certificate")
    else:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(body)
    except ValueError:  # not JSON (not the agent's admin API on this port?): said as it came
        return response.status, body.decode("utf-8", "replace")[:500]


def run_models_command(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        token = read_admin_token(args.admin_token_file or admin_token_path(config))
        port = args.port or config.server.port
        if args.action == "list":
            status, body = call(config, port, token, "GET", "/v1/admin/models")
        else:
            path = f"/v1/admin/models/{args.name}/{args.action}"
            status, body = call(config, port, token, "POST", path)
    except (OSError, AgentError, ValueError) as exc:
        message = exc.message if isinstance(exc, AgentError) else str(exc)
        print(f"edgefleet-agent models: error: {message}", file=sys.stderr)
        return 1
    if status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        said = error.get("message", body) if isinstance(error, dict) else body
        print(f"edgefleet-agent models: error {status}: {said}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=1))
    return 0
