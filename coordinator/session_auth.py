"""Who may open a Session: enrolled credentials and, with TLS, the client certificate."""

from __future__ import annotations

import hmac
from dataclasses import replace

from coordinator.errors import AuthenticationError, PermissionDeniedError
from coordinator.fleet_store import FleetStore
from coordinator.tokens import sha256_hex
from edgefleet.contract import Hello


class SessionAuthenticator:
    """Checks a Hello against the store; raises EnrollmentError subclasses when refused."""

    def __init__(self, store: FleetStore, *, require_enrollment: bool, require_mtls: bool) -> None:
        self._store = store
        self.require_enrollment = require_enrollment
        self.require_mtls = require_mtls

    def authenticate(self, hello: Hello, peer_agent_id: str | None) -> tuple[Hello, bool]:
        """Return the Hello to register (site fixed by enrollment) and whether it is enrolled.

        ``peer_agent_id`` is the common name of the verified client certificate, or
        None when the connection has none (plaintext, or TLS without a client cert).
        """
        if self.require_mtls and peer_agent_id is None:
            raise AuthenticationError(
                "Session requires mutual TLS: connect to the session port with the client "
                "certificate issued by Enroll"
            )
        if peer_agent_id is not None and peer_agent_id != hello.agent_id:
            raise PermissionDeniedError(
                f"the client certificate is for agent {peer_agent_id!r}, not for {hello.agent_id!r}"
            )
        stored = self._store.get_agent(hello.agent_id)
        if stored is None or not stored.enrolled:
            if self.require_enrollment:
                raise AuthenticationError(
                    f"agent {hello.agent_id!r} is not enrolled: enroll with a join token first"
                )
            return hello, False
        if not hello.token:
            raise AuthenticationError(
                f"agent {hello.agent_id!r} is enrolled; Hello.token must carry its credentials"
            )
        if not hmac.compare_digest(stored.credential_sha256, sha256_hex(hello.token)):
            raise AuthenticationError(f"the credentials do not belong to agent {hello.agent_id!r}")
        if stored.site and hello.site != stored.site:
            hello = replace(hello, site=stored.site)
        return hello, True
