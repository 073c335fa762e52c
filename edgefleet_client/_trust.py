"""Which agents may get this client's requests (and so its API key).

An agent proves its fleet identity by serving HTTPS with a certificate that chains to the
fleet CA (the coordinator's CA) and names the host of its URL; that proof happens in the
TLS handshake (:func:`agent_ssl_context`), before a byte of the request is sent. A plain
HTTP agent proves nothing: whatever a route answer or an mDNS responder says, it gets no
request, except a loopback one when the caller opted in (``allow_insecure_agents=True``,
for development).
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from edgefleet_client._exceptions import EdgefleetClientError
from edgefleet_client._models import Agent


def load_ca_pem(ca_file: str | Path | None, ca_pem: str | None) -> str | None:
    """The fleet CA's PEM text, from ``ca_pem`` or ``ca_file`` (not both)."""
    if ca_file and ca_pem:
        raise EdgefleetClientError("give the fleet CA as ca_file or ca_pem, not both")
    if ca_file:
        try:
            return Path(ca_file).expanduser().read_text(encoding="ascii")
        except (OSError, ValueError) as exc:
            raise EdgefleetClientError(f"cannot read the fleet CA {ca_file}: {exc}") from exc
    return ca_pem or None


def agent_ssl_context(ca_pem: str | None) -> ssl.SSLContext:
    """Verifies agents against the fleet CA only (not the system's CAs), host names checked.

    Without a fleet CA nothing verifies: every HTTPS agent fails its handshake.
    """
    # not create_default_context: the system CAs would let any public web certificate in
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if ca_pem:
        try:
            context.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise EdgefleetClientError(f"the fleet CA is not a PEM certificate: {exc}") from exc
    return context


def coordinator_ssl_context(ca_pem: str | None) -> ssl.SSLContext:
    """For the coordinator's HTTPS: the system CAs (an operator's certificate) and the fleet CA."""
    context = ssl.create_default_context()
    if ca_pem:
        try:
            context.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise EdgefleetClientError(f"the fleet CA is not a PEM certificate: {exc}") from exc
    return context


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refusal(agent: Agent, *, allow_insecure_agents: bool) -> str | None:
    """Why ``agent`` gets no request, or None when it may (its TLS proof still to come)."""
    parts = urlsplit(agent.url)
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname:
        if allow_insecure_agents and _is_loopback(parts.hostname):
            return None
        if allow_insecure_agents:
            return "plain HTTP beyond loopback (allow_insecure_agents covers loopback only)"
        return "plain HTTP cannot prove fleet identity (allow_insecure_agents=True for loopback)"
    return f"not an http(s) URL: {agent.url!r}"
