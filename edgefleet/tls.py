"""TLS contexts for the fleet: agents' HTTPS, and agent-to-agent mutual TLS.

Every certificate here comes from the coordinator's CA (the *fleet CA*). An agent's
certificate (``coordinator.identity.ca.CertificateAuthority.issue_client(agent_id,
server_names=[url_host])``) carries:

- the URI SAN ``edgefleet://agent/<agent_id>``: who it is, read by a server from a peer's
  client certificate (:func:`peer_agent_id`);
- the host of the URL fixed at enrollment (IP or DNS SAN): clients reaching its HTTPS API
  check it like any web server's;
- the DNS SAN :func:`agent_server_name` (``<digest>.agent.edgefleet.invalid``, a name that
  never resolves): a peer that must reach *this* agent connects to its URL with
  ``server_hostname=agent_server_name(expected_id)``, so ordinary hostname verification
  proves the identity during the handshake, before a byte of the request is sent.

Both sides of agent-to-agent traffic (overflow, model files) use this module:
:func:`server_context` on the serving agent (``client_certs="required"`` for a peer-only
port, ``"optional"`` on the public API so peers can be told apart from apps) and
:func:`agent_client_context` on the calling one. :class:`CertificateReloader` loads a
renewed certificate into a live server context without a restart.

Every TLS server of the fleet (agents' HTTPS and the blobs they serve peers on it, the
coordinator's HTTPS, its gRPC ports) keeps to Mozilla's *intermediate* profile:
TLS 1.2 and 1.3 only; in TLS 1.2 only ECDHE key exchange with AEAD ciphers (AES-GCM,
ChaCha20-Poly1305; :data:`SERVER_TLS12_CIPHERS`; TLS 1.3's suites are all AEAD); one
key-exchange group, P-256 (:data:`SERVER_ECDH_CURVE`). :func:`harden_server_context` does
it to an ``ssl`` context, :func:`harden_grpc` to gRPC's suites (gRPC's groups cannot be
set: it also accepts P-521 in TLS 1.3).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

logger = logging.getLogger(__name__)

AGENT_URI_PREFIX = "edgefleet://agent/"
AGENT_NAME_SUFFIX = ".agent.edgefleet.invalid"
ClientCerts = Literal["none", "optional", "required"]
_VERIFY_MODES: Mapping[ClientCerts, ssl.VerifyMode] = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


#: TLS 1.2 suites a server accepts: ECDHE key exchange, AEAD ciphers (Mozilla's
#: intermediate list less its DHE suites), for ECDSA certificates (the fleet CA's) and RSA
#: ones (an operator's own, ``http_tls_cert_file``). No CBC suite (they were offered:
#: ECDHE-ECDSA-AES128-SHA256 and -AES256-SHA384). TLS 1.3 suites are not set here: all
#: of them are AEAD.
SERVER_TLS12_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)
#: The one key-exchange group a server accepts (Python 3.11's ``ssl`` sets one group; it
#: offered X448 and P-521 too). P-256: every TLS 1.3 client must support it (RFC 8446
#: 9.1), so no client is refused; one sending only an X25519 key share (OpenSSL's default)
#: is asked for P-256 (HelloRetryRequest) and completes.
SERVER_ECDH_CURVE = "prime256v1"
#: The same suites for gRPC's TLS (``GRPC_SSL_CIPHER_SUITES``, BoringSSL names, TLS 1.3's
#: included). grpcio 1.85's default is AEAD-only too (this less ChaCha20 in TLS 1.2); set,
#: the profile is the fleet's, not a library default that may change.
GRPC_CIPHER_SUITES = ":".join(
    (
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
        SERVER_TLS12_CIPHERS,
    )
)
GRPC_CIPHER_SUITES_ENV = "GRPC_SSL_CIPHER_SUITES"


class TlsError(Exception):
    """A certificate, key or CA file cannot be used."""


def agent_server_name(agent_id: str) -> str:
    """The DNS name an agent's certificate carries for its id (DNS-safe for any id)."""
    digest = hashlib.sha256(agent_id.encode("utf-8")).hexdigest()[:32]
    return digest + AGENT_NAME_SUFFIX


@dataclass(frozen=True, slots=True)
class CertFiles:
    """A PEM certificate (chain) and its private key, as files."""

    cert: Path
    key: Path

    def stamp(self) -> tuple[int, int, int, int]:
        """Changes whenever either file is replaced or rewritten."""
        c, k = self.cert.stat(), self.key.stat()
        return (c.st_mtime_ns, c.st_ino, k.st_mtime_ns, k.st_ino)


def _load_ca(context: ssl.SSLContext, ca_pem: str | bytes) -> None:
    text = ca_pem.decode("ascii") if isinstance(ca_pem, bytes) else ca_pem
    try:
        context.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError(f"the fleet CA is not a usable PEM certificate: {exc}") from exc


def _load_chain(context: ssl.SSLContext, files: CertFiles) -> None:
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load certificate {files.cert} with key {files.key}: {exc}") from exc


def harden_server_context(context: ssl.SSLContext) -> ssl.SSLContext:
    """Restrict a server context to the fleet's profile (TLS 1.2+, AEAD suites, P-256)."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(SERVER_TLS12_CIPHERS)
    context.set_ecdh_curve(SERVER_ECDH_CURVE)
    return context


def harden_grpc() -> bool:
    """Restrict gRPC's TLS suites to the fleet's: ``GRPC_SSL_CIPHER_SUITES``, unless the
    environment sets it already (an operator's choice stands).

    gRPC reads the variable once, when ``grpc`` is first imported (measured on grpcio
    1.85: set after the import, it had no effect), so call this before that; False when
    ``grpc`` was imported already (its default suites then stand: all AEAD too). gRPC's
    key-exchange groups cannot be set (no option, no variable): its BoringSSL accepts
    X25519, P-256, P-384 and P-521 in TLS 1.3 (P-256 alone in TLS 1.2), no X448.
    """
    os.environ.setdefault(GRPC_CIPHER_SUITES_ENV, GRPC_CIPHER_SUITES)
    return "grpc" not in sys.modules


def server_context(
    files: CertFiles, ca_pem: str | bytes | None = None, *, client_certs: ClientCerts = "none"
) -> ssl.SSLContext:
    """A TLS server context presenting ``files``; client certificates checked against ``ca_pem``."""
    context = harden_server_context(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    _load_chain(context, files)
    if client_certs != "none":
        if ca_pem is None:
            raise TlsError(f"client_certs={client_certs!r} needs the fleet CA")
        _load_ca(context, ca_pem)
    context.verify_mode = _VERIFY_MODES[client_certs]
    return context


def agent_client_context(files: CertFiles, ca_pem: str | bytes) -> ssl.SSLContext:
    """A client context presenting this agent's certificate and trusting only the fleet CA.

    Connect with ``server_hostname=agent_server_name(expected_agent_id)`` to require that
    exact peer (aiohttp: ``session.get(url, server_hostname=...)``).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, ca_pem)
    _load_chain(context, files)
    return context


def fleet_client_context(ca_pem: str | bytes) -> ssl.SSLContext:
    """A client context (no certificate of its own) trusting only the fleet CA."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, ca_pem)
    return context


class _HasExtraInfo(Protocol):
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def peer_agent_id(transport: _HasExtraInfo | None) -> str | None:
    """The agent id in the peer's verified fleet client certificate, or None.

    ``transport`` is e.g. an aiohttp ``request.transport``; None when the peer presented
    no certificate (an app, not an agent) or the connection is not TLS.
    """
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI" and isinstance(value, str) and value.startswith(AGENT_URI_PREFIX):
            return value[len(AGENT_URI_PREFIX) :]
    return None


class CertificateReloader:
    """Loads a renewed certificate into a live server context (no restart).

    New connections present the new certificate; open ones keep theirs. A half-written
    pair (certificate renewed, key not yet) fails to load: the old one stays and the
    next check tries again.
    """

    def __init__(self, context: ssl.SSLContext, files: CertFiles) -> None:
        self.context = context
        self.files = files
        self._stamp = files.stamp()
        self.reloads = 0

    def check(self) -> bool:
        """Reload when either file changed since the last load; True when reloaded."""
        try:
            stamp = self.files.stamp()
        except OSError as exc:
            logger.warning("cannot stat the TLS certificate %s: %s", self.files.cert, exc)
            return False
        if stamp == self._stamp:
            return False
        try:
            _load_chain(self.context, self.files)
        except TlsError as exc:
            logger.warning("keeping the current TLS certificate: %s", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        logger.info("loaded the renewed TLS certificate %s", self.files.cert)
        return True

    async def run(self, interval_s: float) -> None:
        """Check every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.check()


def write_atomically(path: Path, text: str, *, private: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (0600 if private)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
