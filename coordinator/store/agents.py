"""Agents as stored (tables ``agents``, ``sites``, ``removed_agents``,
``revoked_certificates``): enrollment, the latest Hello, what the operator fixed,
revocation. The live view (sessions, load) is the registry's (coordinator/fleet/); it
writes here as agents connect and leave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from edgefleet.contract import Hello, Location


@dataclass(frozen=True, slots=True)
class StoredAgent:
    """What the coordinator keeps about an agent across restarts."""

    agent_id: str
    # Enrollment (all empty / None for an agent that connected without enrolling).
    enrolled_at: datetime | None = None
    token_id: str = ""
    credential_sha256: str = field(default="", repr=False)
    # Hex serial of the client certificate issued at enrollment.
    cert_serial: str = ""
    site: str = ""
    # The agent's latest Hello; None until its first session.
    hello: Hello | None = None
    last_seen: datetime | None = None
    # Set by an operator: finish running work, take no new routes.
    draining: bool = False
    # Fixed by the operator (token or agent record); None / "": not fixed.
    location: Location | None = None
    http_url: str = ""
    # sha256 (hex) of the agent's public key (DER SubjectPublicKeyInfo); "" for legacy
    # agents whose key the coordinator made.
    public_key_sha256: str = ""
    cert_not_after: datetime | None = None
    # Set by ``agents revoke``: no session, no renewal, no re-enrollment from then on.
    revoked_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def enrolled(self) -> bool:
        return self.enrolled_at is not None


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    first_seen: datetime


class AgentTable(Protocol):
    async def enroll(self, token_id: str, now: datetime, agent: StoredAgent) -> bool:
        """In one transaction: use the token once and add the agent.

        Returns False (and changes nothing) when the token is not usable at ``now``
        (unknown, revoked, expired or exhausted) or the agent id is taken.
        """
        ...

    async def get_agent(self, agent_id: str) -> StoredAgent | None: ...

    async def list_agents(self) -> list[StoredAgent]:
        """Ordered by agent id."""
        ...

    async def find_enrolled_key(self, token_id: str, public_key_sha256: str) -> StoredAgent | None:
        """The agent enrolled with this token and this public key, if any."""
        ...

    async def reissue(
        self,
        agent_id: str,
        *,
        credential_sha256: str | None,
        cert_serial: str,
        cert_not_after: datetime,
        public_key_sha256: str | None = None,
    ) -> bool:
        """Record a new certificate (and credential, key when given) for an enrolled,
        unrevoked agent; False when there is none."""
        ...

    async def set_fixed(
        self, agent_id: str, *, site: str | None, location: Location | None, http_url: str | None
    ) -> StoredAgent | None:
        """Fix the agent's site / location / URL (None: leave as is); None when unknown."""
        ...

    async def revoke_agent(self, agent_id: str, now: datetime) -> bool:
        """Mark revoked, forget its credential, refuse its certificate; False when unknown."""
        ...

    async def remove_agent(self, agent_id: str) -> bool:
        """Delete the agent's record (its id is refused until enrolled again); False when
        unknown."""
        ...

    async def agent_removed(self, agent_id: str) -> bool:
        """True for the id of a removed agent not enrolled again since."""
        ...

    async def agents_of_token(self, token_id: str) -> list[str]: ...

    async def certificate_revoked(self, serial: str) -> bool: ...

    async def save_hello(self, hello: Hello, seen: datetime) -> None:
        """Remember the agent's latest Hello (creating an un-enrolled agent if new), and
        in its last state that it is live as of ``seen`` (its saved report is kept)."""
        ...

    async def save_last_seen(self, agent_id: str, seen: datetime) -> None: ...

    async def delete_unenrolled_agents(self, agent_ids: Sequence[str]) -> int:
        """Delete these agents' records (and live states, and sites nothing names any
        more) where they never enrolled; the number deleted."""
        ...

    async def set_draining(self, agent_id: str, draining: bool) -> bool:
        """False when there is no such agent."""
        ...

    async def list_sites(self) -> list[Site]: ...
