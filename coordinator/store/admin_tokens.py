"""Admin tokens as stored (table ``admin_tokens``): id, name, role and the sha256 of the
secret (coordinator/access/admin_tokens.py mints and checks them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class AdminTokenRecord:
    token_id: str
    name: str
    # "viewer", "operator" or "admin"
    role: str
    secret_sha256: str = field(repr=False)  # hex
    created_at: datetime
    created_by: str = ""
    revoked_at: datetime | None = None


class AdminTokenTable(Protocol):
    async def add_admin_token(self, token: AdminTokenRecord) -> None: ...

    async def get_admin_token(self, token_id: str) -> AdminTokenRecord | None: ...

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        """Oldest first."""
        ...

    async def revoke_admin_token(self, token_id: str, now: datetime) -> bool:
        """Mark the token revoked (once); False when there is no such token."""
        ...
