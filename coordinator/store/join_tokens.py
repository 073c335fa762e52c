"""Join tokens as stored (table ``join_tokens``): what an operator hands an edge box so
it can enroll (coordinator/identity/join_tokens.py mints and checks them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from edgefleet.contract import Location


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


class JoinTokenTable(Protocol):
    async def add_token(self, token: JoinToken) -> None: ...

    async def get_token(self, token_id: str) -> JoinToken | None: ...

    async def list_tokens(self) -> list[JoinToken]:
        """Oldest first."""
        ...

    async def revoke_token(self, token_id: str) -> bool:
        """Mark a token revoked; False when there is no such token."""
        ...
