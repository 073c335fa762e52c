"""Who may open a Session, and what it may say about itself.

An enrolled agent proves its id with its enrollment credential (``Hello.token``) and,
with TLS, a client certificate from the coordinator's CA that is not revoked. What the
operator fixed (site, location, URL: on the join token or with ``agents set``) replaces
what the Hello says; a Hello whose ``http_url`` differs from a fixed URL is refused.
When no URL is fixed, the URL's host must be the agent's gRPC peer address (an IP
literal equal to it, or a name that resolves to it); agents connecting over loopback
are exempt (they run on the coordinator's own host). A name is resolved before the
check by :func:`resolve_url_host`, off the event loop and within
:data:`RESOLVE_TIMEOUT_S` (a Hello naming a slow DNS name must not stall the
coordinator); one that does not resolve in time fails the check.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from coordinator.errors import (
    AgentRevokedError,
    AuthenticationError,
    FixedIdentityError,
    PermissionDeniedError,
)
from coordinator.identity.join_tokens import sha256_hex
from coordinator.store.agents import AgentTable, StoredAgent
from edgefleet.contract import Hello

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: How long the name in an agent's URL may take to resolve.
RESOLVE_TIMEOUT_S = 2.0


async def resolve_url_host(http_url: str) -> frozenset[IpAddress] | None:
    """The addresses the host of ``http_url`` resolves to, looked up off the event loop
    (asyncio's getaddrinfo runs in the default executor); None when the host is an IP
    literal or absent (nothing to resolve). Empty when it does not resolve in time."""
    host = (urlsplit(http_url).hostname or "") if http_url else ""
    if not host or _ip_literal(host) is not None:
        return None
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None, proto=socket.IPPROTO_TCP),
            RESOLVE_TIMEOUT_S,
        )
    except (OSError, UnicodeError, TimeoutError, ValueError):
        return frozenset()
    return frozenset(_info_addresses(infos))


@dataclass(frozen=True, slots=True)
class Peer:
    """What the transport knows about the other end of a Session."""

    # Common name of the verified client certificate; None without one.
    agent_id: str | None = None
    # Hex serial of that certificate; "" without one.
    cert_serial: str = ""
    # The peer's IP address; "" when unknown.
    address: str = ""
    # What the name in Hello.http_url resolved to (resolve_url_host); None: not resolved
    # (an IP literal, or a caller without a loop: then it is resolved here).
    url_addresses: frozenset[IpAddress] | None = None


class SessionAuthenticator:
    """Checks a Hello against the store; raises EnrollmentError subclasses when refused."""

    def __init__(
        self,
        store: AgentTable,
        *,
        require_enrollment: bool,
        require_mtls: bool,
        check_url_host: bool = True,
    ) -> None:
        self._store = store
        self.require_enrollment = require_enrollment
        self.require_mtls = require_mtls
        self.check_url_host = check_url_host

    async def authenticate(self, hello: Hello, peer: Peer | str | None) -> tuple[Hello, bool]:
        """Return the Hello to register (what the operator fixed wins) and whether it is
        enrolled. ``peer`` may be given as just the certificate's common name."""
        if not isinstance(peer, Peer):
            peer = Peer(agent_id=peer)
        if self.require_mtls and peer.agent_id is None:
            raise AuthenticationError(
                "Session requires mutual TLS: connect to the session port with the client "
                "certificate issued by Enroll"
            )
        if peer.agent_id is not None and peer.agent_id != hello.agent_id:
            raise PermissionDeniedError(
                f"the client certificate is for agent {peer.agent_id!r}, not for {hello.agent_id!r}"
            )
        if peer.cert_serial and await self._store.certificate_revoked(peer.cert_serial):
            raise AgentRevokedError(
                f"the client certificate {peer.cert_serial} of agent {hello.agent_id!r} was revoked"
            )
        stored = await self._store.get_agent(hello.agent_id)
        if stored is not None and stored.revoked:
            raise AgentRevokedError(f"agent {hello.agent_id!r} was revoked by an operator")
        if stored is None and await self._store.agent_removed(hello.agent_id):
            raise AgentRevokedError(
                f"agent {hello.agent_id!r} was revoked and removed by an operator"
            )
        if stored is None or not stored.enrolled:
            if self.require_enrollment:
                raise AuthenticationError(
                    f"agent {hello.agent_id!r} is not enrolled: enroll with a join token first"
                )
            self._check_url_host(hello, peer)
            return hello, False
        if not hello.token:
            raise AuthenticationError(
                f"agent {hello.agent_id!r} is enrolled; Hello.token must carry its credentials"
            )
        if not hmac.compare_digest(stored.credential_sha256, sha256_hex(hello.token)):
            raise AuthenticationError(f"the credentials do not belong to agent {hello.agent_id!r}")
        return self._fixed(hello, stored, peer), True

    def _fixed(self, hello: Hello, stored: StoredAgent, peer: Peer) -> Hello:
        if stored.http_url:
            if hello.http_url and hello.http_url != stored.http_url:
                raise FixedIdentityError(
                    f"agent {hello.agent_id!r} says its URL is {hello.http_url!r}, but the "
                    f"operator fixed {stored.http_url!r} "
                    f"(agents set {hello.agent_id} --http-url ...)"
                )
            hello = replace(hello, http_url=stored.http_url)
        else:
            self._check_url_host(hello, peer)
        if stored.site and hello.site != stored.site:
            hello = replace(hello, site=stored.site)
        if stored.location is not None:
            hello = replace(hello, location=stored.location)
        return hello

    def _check_url_host(self, hello: Hello, peer: Peer) -> None:
        if not self.check_url_host or not hello.http_url or not peer.address:
            return
        try:
            peer_ip = ipaddress.ip_address(peer.address)
        except ValueError:
            return  # a unix socket or the like: nothing to compare with
        if peer_ip.is_loopback:
            return
        host = urlsplit(hello.http_url).hostname or ""
        literal = _ip_literal(host)
        if literal is not None:
            addresses: frozenset[IpAddress] = frozenset({literal})
        elif peer.url_addresses is not None:
            addresses = peer.url_addresses
        else:
            addresses = _resolve_blocking(host)
        if peer_ip in addresses:
            return
        raise FixedIdentityError(
            f"agent {hello.agent_id!r} says its URL is {hello.http_url!r}, but it connects "
            f"from {peer.address}: the URL host must be the agent's own address (or the "
            f"operator fixes the URL: agents set {hello.agent_id} --http-url ...)"
        )


def _ip_literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _resolve_blocking(host: str) -> frozenset[IpAddress]:
    """Synchronous lookup, for callers with no event loop (tools and unit tests)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return frozenset()
    return frozenset(_info_addresses(infos))


def _info_addresses(infos: Sequence[tuple[object, ...]]) -> set[IpAddress]:
    found: set[IpAddress] = set()
    for info in infos:
        sockaddr = info[4]
        if not isinstance(sockaddr, tuple) or not sockaddr:
            continue
        try:
            found.add(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
        except ValueError:
            continue
    return found


def peer_address(peer: str) -> str:
    """The IP in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); "" otherwise."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0]
        return host.strip("[]").split("%", 1)[0]
    return ""
