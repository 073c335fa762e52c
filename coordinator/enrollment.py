"""Enrollment: a join token becomes an agent id, a bearer credential and a client certificate."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from coordinator.ca import CertificateAuthority
from coordinator.errors import SiteMismatchError, TokenExhaustedError, UnknownTokenError
from coordinator.fleet import valid_agent_id
from coordinator.fleet_store import FleetStore, StoredAgent
from coordinator.registry import utc_now
from coordinator.tokens import JoinTokens, parse_token, sha256_hex

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Enrollment:
    """What an enrolled agent receives."""

    agent_id: str
    site: str
    # Bearer credential for Hello.token.
    credentials: str = field(repr=False)
    ca_cert_pem: str = field(repr=False)
    client_cert_pem: str = field(repr=False)
    client_key_pem: str = field(repr=False)


class EnrollmentService:
    """Checks join tokens and enrolls agents into the store."""

    def __init__(
        self,
        store: FleetStore,
        tokens: JoinTokens,
        ca: CertificateAuthority,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._store = store
        self._tokens = tokens
        self._ca = ca
        self._clock = clock or utc_now

    def enroll(self, join_token: str, requested_name: str, site: str) -> Enrollment:
        """Enroll one agent; raises an EnrollmentError (nothing stored) when refused."""
        record = self._tokens.check(join_token)
        if record.site and site and site != record.site:
            raise SiteMismatchError(
                f"join token {record.token_id} is for site {record.site!r}, not {site!r}"
            )
        site = record.site or site
        agent_id = self._choose_id(requested_name)
        credentials = secrets.token_urlsafe(32)
        cert = self._ca.issue_client(agent_id)
        now = self._clock()
        agent = StoredAgent(
            agent_id=agent_id,
            enrolled_at=now,
            token_id=record.token_id,
            credential_sha256=sha256_hex(credentials),
            cert_serial=cert.serial,
            site=site,
        )
        if not self._store.enroll(record.token_id, now, agent):
            # Lost a race (another enrollment used the token up, or took the id).
            latest = self._store.get_token(record.token_id)
            if latest is None:
                raise UnknownTokenError(f"join token {record.token_id} is not known")
            self._tokens.explain(latest)
            raise TokenExhaustedError(f"join token {record.token_id} could not be used; retry")
        logger.info(
            "agent %s enrolled with join token %s (site %r, certificate %s)",
            agent_id,
            record.token_id,
            site,
            cert.serial,
        )
        return Enrollment(
            agent_id=agent_id,
            site=site,
            credentials=credentials,
            ca_cert_pem=self._ca.cert_pem,
            client_cert_pem=cert.cert_pem,
            client_key_pem=cert.key_pem,
        )

    def token_id_of(self, join_token: str) -> str:
        """The id part of a token, for logs ("?" when malformed)."""
        try:
            return parse_token(join_token)[0]
        except UnknownTokenError:
            return "?"

    def _choose_id(self, requested: str) -> str:
        if requested and valid_agent_id(requested):
            existing = self._store.get_agent(requested)
            if existing is None or not existing.enrolled:
                return requested
        base = requested if requested and valid_agent_id(requested) else "agent"
        return f"{base[:100]}-{secrets.token_hex(4)}"
