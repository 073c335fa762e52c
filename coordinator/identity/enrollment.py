"""Enrollment: a join token becomes an agent id, a bearer credential and a client certificate.

What the agent is (its site, and optionally its location and URL) is fixed here, from
the join token (or, for the site, from the request when the token names none), and
afterwards only by an operator (``agents set``); Hello cannot change it.

- v1.2 agents send a CSR: their certificate is for their own key, and the coordinator
  never makes or sends a private key. Agents that send none (older than v1.2) get a
  key made here ("legacy" in the log).
- Idempotent: an agent that enrolled but lost the answer (a crash before saving)
  enrolls again with the same token and the same key (a CSR signed by it) and gets the
  same agent id, a fresh credential and certificate, and the token is not used again.
- Renewal: ``renew`` signs a new CSR for an enrolled, unrevoked agent (over its session).
- Re-enrollment after the certificate expired: ``EnrollRequest.join_token`` may carry
  ``efa_<credential>`` (the agent's enrollment credential) with ``requested_name`` = its
  agent id: accepted while the agent is not revoked and its certificate expired less
  than ``grace`` ago. The enroll port needs no client certificate, so an agent that was
  offline past its certificate's expiry comes back without an operator.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from coordinator.errors import (
    AgentRevokedError,
    AuthenticationError,
    SiteMismatchError,
    TokenExhaustedError,
    UnknownTokenError,
)
from coordinator.fleet.records import valid_agent_id
from coordinator.fleet.registry import utc_now
from coordinator.identity.ca import (
    CLIENT_VALID_DAYS,
    CertificateAuthority,
    IssuedCertificate,
    public_key_of_csr,
    public_key_sha256,
)
from coordinator.identity.join_tokens import JoinTokens, TokenStore, parse_token, sha256_hex
from coordinator.store.agents import StoredAgent
from edgefleet.contract import Location

logger = logging.getLogger(__name__)

# EnrollRequest.join_token prefix for re-enrollment with the agent's own credential.
CREDENTIAL_PREFIX = "efa_"


@dataclass(frozen=True, slots=True)
class Enrollment:
    """What an enrolled agent receives."""

    agent_id: str
    site: str
    # Bearer credential for Hello.token.
    credentials: str = field(repr=False)
    ca_cert_pem: str = field(repr=False)
    client_cert_pem: str = field(repr=False)
    # Empty for agents that sent a CSR (their key never leaves them).
    client_key_pem: str = field(repr=False)
    not_after: datetime | None = None
    location: Location | None = None
    http_url: str = ""


class EnrollmentService:
    """Checks join tokens and enrolls agents into the store."""

    def __init__(
        self,
        store: TokenStore,
        tokens: JoinTokens,
        ca: CertificateAuthority,
        *,
        cert_days: float = CLIENT_VALID_DAYS,
        grace: timedelta = timedelta(days=90),
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._store = store
        self._tokens = tokens
        self._ca = ca
        self._cert_days = cert_days
        self._grace = grace
        self._clock = clock or utc_now

    async def enroll(
        self, join_token: str, requested_name: str, site: str, csr_pem: str = ""
    ) -> Enrollment:
        """Enroll one agent; raises an EnrollmentError (nothing stored) when refused."""
        if join_token.startswith(CREDENTIAL_PREFIX):
            return await self._reenroll(
                requested_name, join_token[len(CREDENTIAL_PREFIX) :], csr_pem
            )
        record = await self._tokens.verify(join_token)
        key_sha = ""
        if csr_pem:
            key_sha = public_key_sha256(public_key_of_csr(csr_pem))
            again = await self._store.find_enrolled_key(record.token_id, key_sha)
            if again is not None and not record.revoked:
                return await self._enroll_again(again, csr_pem)
        self._tokens.explain(record)
        if record.site and site and site != record.site:
            raise SiteMismatchError(
                f"join token {record.token_id} is for site {record.site!r}, not {site!r}"
            )
        site = record.site or site
        agent_id = await self._choose_id(requested_name)
        credentials = secrets.token_urlsafe(32)
        cert = self._issue(agent_id, csr_pem, record.http_url)
        now = self._clock()
        agent = StoredAgent(
            agent_id=agent_id,
            enrolled_at=now,
            token_id=record.token_id,
            credential_sha256=sha256_hex(credentials),
            cert_serial=cert.serial,
            site=site,
            location=record.location,
            http_url=record.http_url,
            public_key_sha256=key_sha,
            cert_not_after=cert.not_after,
        )
        if not await self._store.enroll(record.token_id, now, agent):
            # Lost a race (another enrollment used the token up, or took the id).
            latest = await self._store.get_token(record.token_id)
            if latest is None:
                raise UnknownTokenError(f"join token {record.token_id} is not known")
            self._tokens.explain(latest)
            raise TokenExhaustedError(f"join token {record.token_id} could not be used; retry")
        logger.info(
            "agent %s enrolled with join token %s (site %r, certificate %s%s)",
            agent_id,
            record.token_id,
            site,
            cert.serial,
            "" if csr_pem else ", legacy: key made by the coordinator",
        )
        return self._answer(agent, credentials, cert)

    async def renew(self, agent_id: str, csr_pem: str) -> IssuedCertificate:
        """A new certificate for an enrolled, unrevoked agent's CSR (its own key)."""
        stored = await self._store.get_agent(agent_id)
        if stored is None or not stored.enrolled:
            raise AuthenticationError(f"agent {agent_id!r} is not enrolled; it cannot renew")
        if stored.revoked:
            raise AgentRevokedError(f"agent {agent_id!r} was revoked")
        key_sha = public_key_sha256(public_key_of_csr(csr_pem))
        cert = self._issue(agent_id, csr_pem, stored.http_url)
        if not await self._store.reissue(
            agent_id,
            credential_sha256=None,
            cert_serial=cert.serial,
            cert_not_after=cert.not_after,
            public_key_sha256=key_sha,
        ):
            raise AgentRevokedError(f"agent {agent_id!r} was revoked or removed")
        logger.info(
            "agent %s renewed its certificate (serial %s, until %s)",
            agent_id,
            cert.serial,
            cert.not_after.isoformat(timespec="seconds"),
        )
        return cert

    @property
    def ca_cert_pem(self) -> str:
        return self._ca.cert_pem

    def token_id_of(self, join_token: str) -> str:
        """The id part of a token, for logs ("?" when malformed)."""
        if join_token.startswith(CREDENTIAL_PREFIX):
            return "(agent credential)"
        try:
            return parse_token(join_token)[0]
        except UnknownTokenError:
            return "?"

    # --------------------------------------------------------------- helpers

    def _issue(self, agent_id: str, csr_pem: str, http_url: str = "") -> IssuedCertificate:
        """The agent's certificate; with a URL fixed at enrollment, also its HTTPS server
        certificate, naming that URL's host (and ``agent_server_name(agent_id)``)."""
        host = urlsplit(http_url).hostname if http_url else None
        return self._ca.issue_client(
            agent_id,
            csr_pem=csr_pem,
            days=self._cert_days,
            server_names=[host] if host else None,
        )

    async def _enroll_again(self, stored: StoredAgent, csr_pem: str) -> Enrollment:
        """The same token and key enrolled before: same id, new credential, no token use."""
        credentials = secrets.token_urlsafe(32)
        cert = self._issue(stored.agent_id, csr_pem, stored.http_url)
        if not await self._store.reissue(
            stored.agent_id,
            credential_sha256=sha256_hex(credentials),
            cert_serial=cert.serial,
            cert_not_after=cert.not_after,
        ):
            raise AgentRevokedError(f"agent {stored.agent_id!r} was revoked")
        logger.info(
            "agent %s enrolled again with join token %s and the same key (no token use)",
            stored.agent_id,
            stored.token_id,
        )
        return self._answer(stored, credentials, cert)

    async def _reenroll(self, agent_id: str, credential: str, csr_pem: str) -> Enrollment:
        stored = await self._store.get_agent(agent_id)
        if (
            stored is None
            or not stored.enrolled
            or not stored.credential_sha256
            or not hmac.compare_digest(stored.credential_sha256, sha256_hex(credential))
        ):
            if stored is not None and stored.revoked:
                raise AgentRevokedError(f"agent {agent_id!r} was revoked")
            raise AuthenticationError(f"the credential does not belong to agent {agent_id!r}")
        if stored.revoked:
            raise AgentRevokedError(f"agent {agent_id!r} was revoked")
        if not csr_pem:
            raise AuthenticationError("re-enrollment with a credential needs a CSR")
        expiry = stored.cert_not_after
        if expiry is not None and self._clock() > expiry + self._grace:
            raise AuthenticationError(
                f"agent {agent_id!r}: its certificate expired at {expiry.isoformat()}, more "
                f"than the grace period ({self._grace.days} days) ago; enroll with a new join "
                "token"
            )
        cert = await self.renew(agent_id, csr_pem)
        latest = await self._store.get_agent(agent_id) or stored
        logger.info("agent %s re-enrolled with its credential", agent_id)
        return self._answer(latest, credential, cert)

    def _answer(self, agent: StoredAgent, credentials: str, cert: IssuedCertificate) -> Enrollment:
        return Enrollment(
            agent_id=agent.agent_id,
            site=agent.site,
            credentials=credentials,
            ca_cert_pem=self._ca.cert_pem,
            client_cert_pem=cert.cert_pem,
            client_key_pem=cert.key_pem,
            not_after=cert.not_after,
            location=agent.location,
            http_url=agent.http_url,
        )

    async def _choose_id(self, requested: str) -> str:
        if requested and valid_agent_id(requested):
            existing = await self._store.get_agent(requested)
            if existing is None or not existing.enrolled:
                return requested
        base = requested if requested and valid_agent_id(requested) else "agent"
        return f"{base[:100]}-{secrets.token_hex(4)}"
