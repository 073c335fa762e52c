"""The durable store behind the coordinator: join tokens, enrolled agents, sites.

``FleetStore`` is the interface; ``coordinator.store.sqlite.SQLiteFleetStore`` is the
default implementation. A PostgreSQL store implements the same methods (each one is a
single statement or one transaction) without touching the rest of the coordinator.
Live state (sessions, load reports) goes through the store only as a periodic,
batched snapshot (``AgentLastState``), so that a restarted coordinator can keep
routing to the agents it knew until they reconnect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from coordinator.fleet.records import Liveness
from edgefleet.contract import Hello, LoadReport, Location


@dataclass(frozen=True, slots=True)
class JoinToken:
    """A join token as stored. The secret itself is never stored, only its sha256."""

    token_id: str
    secret_sha256: str = field(repr=False)
    created_at: datetime
    # None: never expires.
    expires_at: datetime | None
    # How many enrollments the token allows.
    max_uses: int
    uses: int = 0
    # Agents enrolled with this token belong to this site; "" lets the agent choose.
    site: str = ""
    revoked: bool = False
    # Free text for operators.
    note: str = ""
    # What the operator fixes for agents enrolled with this token (None / "": not fixed).
    location: Location | None = None
    http_url: str = ""

    def state(self, now: datetime) -> str:
        """ "active", "expired", "exhausted" or "revoked"."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        if self.uses >= self.max_uses:
            return "exhausted"
        return "active"


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key for client apps as stored: the sha256 of its secret, never the secret."""

    key_id: str
    secret_sha256: str = field(repr=False)  # hex
    created_at: datetime
    name: str = ""
    # "name" or "name@version"; empty: every model.
    models: tuple[str, ...] = ()
    allow_cloud: bool = False
    max_priority: str = "normal"  # "high", "normal" or "low"
    max_tokens_per_request: int = 0  # 0: the model's limit
    # Fleet-wide budgets, split among agents (coordinator/access/api_keys.py); 0: unlimited.
    requests_per_minute: float = 0.0
    tokens_per_minute: float = 0.0
    expires_at: datetime | None = None  # None: never
    revoked_at: datetime | None = None
    # Usage reported by agents, summed.
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected: int = 0

    def state(self, now: datetime) -> str:
        """ "active", "expired" or "revoked"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"


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
class AgentLastState:
    """An agent's live state as last saved: what a restarted coordinator starts from."""

    agent_id: str
    liveness: Liveness
    # Last time any message from the agent arrived (UTC).
    last_seen: datetime
    # Latest load sample; None when there was none (or it cannot be read back).
    report: LoadReport | None = None
    # When the snapshot holding this state was written; None before it is saved.
    saved_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    first_seen: datetime


class FleetStore(Protocol):
    """Durable fleet state. Every method is short and synchronous."""

    # ---------------------------------------------------------------- tokens
    def add_token(self, token: JoinToken) -> None: ...

    def get_token(self, token_id: str) -> JoinToken | None: ...

    def list_tokens(self) -> list[JoinToken]: ...

    def revoke_token(self, token_id: str) -> bool:
        """Mark a token revoked; False when there is no such token."""
        ...

    def enroll(self, token_id: str, now: datetime, agent: StoredAgent) -> bool:
        """In one transaction: use the token once and add the agent.

        Returns False (and changes nothing) when the token is not usable at ``now``
        (unknown, revoked, expired or exhausted) or the agent id is taken.
        """
        ...

    # -------------------------------------------------------------- API keys
    def add_api_key(self, key: ApiKeyRecord) -> None: ...

    def list_api_keys(self) -> list[ApiKeyRecord]: ...

    def revoke_api_key(self, key_id: str, now: datetime) -> bool:
        """Mark a key revoked (once); False when there is no such key."""
        ...

    def add_api_key_usage(self, usage: Sequence[tuple[str, int, int, int, int]]) -> None:
        """Add (key_id, requests, prompt_tokens, completion_tokens, rejected) to the totals."""
        ...

    # -------------------------------------------------- section generations
    def reserve_generations(self, count: int, at_least: int) -> int:
        """In one transaction: mark ``count`` more desired-state section generations as
        issued and return the first of them: the larger of one past the last issued and
        ``at_least`` (coordinator/store/generations.py)."""
        ...

    # ---------------------------------------------------------------- agents
    def get_agent(self, agent_id: str) -> StoredAgent | None: ...

    def find_enrolled_key(self, token_id: str, public_key_sha256: str) -> StoredAgent | None:
        """The agent enrolled with this token and this public key, if any."""
        ...

    def reissue(
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

    def set_fixed(
        self, agent_id: str, *, site: str | None, location: Location | None, http_url: str | None
    ) -> StoredAgent | None:
        """Fix the agent's site / location / URL (None: leave as is); None when unknown."""
        ...

    def revoke_agent(self, agent_id: str, now: datetime) -> bool:
        """Mark revoked, forget its credential, refuse its certificate; False when unknown."""
        ...

    def remove_agent(self, agent_id: str) -> bool:
        """Delete the agent's record (its id is refused until enrolled again); False when
        unknown."""
        ...

    def agent_removed(self, agent_id: str) -> bool:
        """True for the id of a removed agent not enrolled again since."""
        ...

    def agents_of_token(self, token_id: str) -> list[str]: ...

    def certificate_revoked(self, serial: str) -> bool: ...

    def backup_to(self, path: Path) -> None:
        """Write a consistent copy of the whole store to ``path``."""
        ...

    def list_agents(self) -> list[StoredAgent]: ...

    def save_hello(self, hello: Hello, seen: datetime) -> None:
        """Remember the agent's latest Hello (creating an un-enrolled agent if new), and
        in its last state that it is live as of ``seen`` (its saved report is kept)."""
        ...

    def save_last_seen(self, agent_id: str, seen: datetime) -> None: ...

    def delete_unenrolled_agents(self, agent_ids: Sequence[str]) -> int:
        """Delete these agents' records (and live states, and sites nothing names any
        more) where they never enrolled; the number deleted."""
        ...

    def set_draining(self, agent_id: str, draining: bool) -> bool:
        """False when there is no such agent."""
        ...

    def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        """Write these agents' live states in one transaction (replacing older ones)."""
        ...

    def list_last_states(self) -> list[AgentLastState]:
        """Every saved live state, ordered by agent id."""
        ...

    # ----------------------------------------------------------------- sites
    def list_sites(self) -> list[Site]: ...

    def close(self) -> None: ...
