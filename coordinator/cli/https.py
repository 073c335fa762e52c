"""How the operator CLI reaches a running coordinator's admin API over HTTPS.

Beyond loopback the coordinator serves HTTPS (``http_tls = auto``) with a certificate its
own fleet CA issued, unless the operator gave one (``http_tls_cert_file``). So every
command that talks to it (``keys``, ``tokens``, ``admin-tokens``, ``agents``, ``audit``,
``models``, ``rollouts`` with ``--url``) trusts the system's CAs (an operator's certificate)
and the fleet CA: ``--ca-file``, by default the data directory's ``ca/ca.pem``. Only the
``models`` commands did; the others trusted the system's CAs alone and could not reach a
coordinator serving its own certificate. Without ``--url`` the address is the configured
one, https when the configuration serves HTTPS.
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

from coordinator.config import CoordinatorConfig


def add_ca_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-file", type=Path, metavar="FILE",
        help="CA certificate for an https --url, trusted beside the system's (default: the "
        "data directory's ca/ca.pem)",
    )  # fmt: skip


def default_url(config: CoordinatorConfig) -> str:
    """The configured admin API address (https when the configuration serves HTTPS)."""
    scheme = "https" if config.http_tls_enabled else "http"
    return f"{scheme}://{config.http_host}:{config.http_port}"


def ca_file_of(args: argparse.Namespace, config: CoordinatorConfig) -> Path:
    """``--ca-file``, else the fleet CA in the configured data directory."""
    given: Path | None = getattr(args, "ca_file", None)
    return given if given is not None else config.data_path / "ca" / "ca.pem"


def client_context(url: str, ca_file: Path | None) -> ssl.SSLContext | None:
    """For an https ``url``: the system's CAs and ``ca_file`` when it exists (None for
    http)."""
    if not url.startswith("https://"):
        return None
    context = ssl.create_default_context()
    if ca_file is not None and ca_file.is_file():
        context.load_verify_locations(cafile=str(ca_file))
    return context
