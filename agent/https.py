"""Whether and how the agent's HTTP API serves HTTPS (``server.tls``).

The certificate is the agent's own, from the coordinator's CA, naming the host of the URL
fixed at enrollment. It comes from ``server.tls_cert_file``/``tls_key_file``, else from the
files enrollment keeps in ``coordinator.state_dir`` (:func:`enrollment_cert_files`). Renewals
rewrite those files; :class:`edgefleet.tls.CertificateReloader` loads them without restart.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from agent.config import AgentConfig
from agent.enrollment import CA_FILE, CERT_FILE, KEY_FILE, state_dir_of
from agent.errors import ConfigError
from edgefleet.addresses import is_loopback_host
from edgefleet.tls import CertFiles, TlsError, server_context

logger = logging.getLogger(__name__)


def enrollment_cert_files(state_dir: Path) -> CertFiles:
    """Where enrollment keeps this agent's certificate and key (and the fleet CA, ca.pem).

    The boundary with enrollment (agent/enrollment.py): it writes these atomically (key
    first, 0600) when it enrolls and when it renews; this module only reads them.
    """
    state_dir = state_dir.expanduser()
    return CertFiles(cert=state_dir / CERT_FILE, key=state_dir / KEY_FILE)


def server_cert_files(config: AgentConfig) -> CertFiles | None:
    """The certificate the API serves HTTPS with, or None for plain HTTP.

    Raises ConfigError when HTTPS is required (``tls = "on"``, or ``"auto"`` beyond
    loopback) and there is no certificate.
    """
    s = config.server
    loopback = is_loopback_host(s.host)
    if s.tls == "off":
        if not loopback:
            logger.warning(
                "serving plain HTTP on %s (server.tls = off): API keys and prompts travel "
                "unencrypted and clients cannot verify this agent",
                s.host,
            )
        return None
    if s.tls_cert_file:
        files = CertFiles(Path(s.tls_cert_file).expanduser(), Path(s.tls_key_file).expanduser())
        source = "server.tls_cert_file / server.tls_key_file"
    else:
        if s.tls == "auto" and loopback:
            return None
        state_dir = state_dir_of(config)
        files = enrollment_cert_files(state_dir)
        source = f"enrollment (coordinator.state_dir {state_dir})"
    if not (files.cert.is_file() and files.key.is_file()):
        why = "on" if s.tls == "on" else f"auto and server.host {s.host} is beyond loopback"
        raise ConfigError(
            f"server.tls is {why}, but there is no certificate from {source}: enroll "
            "this agent with the coordinator (coordinator.join_token), or set "
            "server.tls_cert_file and server.tls_key_file; to serve plain HTTP knowingly, "
            "pass --insecure-no-tls (server.tls = off)"
        )
    return files


def build_server_context(config: AgentConfig, files: CertFiles) -> ssl.SSLContext:
    """The API's TLS context: the agent's certificate; peers may present fleet client certs."""
    ca_pem: str | None = None
    ca_path = files.cert.parent / CA_FILE
    if config.coordinator.ca_file:
        ca_path = Path(config.coordinator.ca_file).expanduser()
    try:
        if ca_path.is_file():
            ca_pem = ca_path.read_text(encoding="ascii")
        return server_context(files, ca_pem, client_certs="optional" if ca_pem else "none")
    except (OSError, TlsError) as exc:
        raise ConfigError(f"cannot serve HTTPS: {exc}") from exc
