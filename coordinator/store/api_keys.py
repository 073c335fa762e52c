"""API keys for client apps as stored (table ``api_keys``): the sha256 of each secret,
its scopes and usage totals (coordinator/access/api_keys.py mints and distributes them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from edgefleet.contract import KeyPolicy


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
    # Longest keep_alive a request with this key may ask, seconds; 0: the agent's own cap
    # (residency.max_request_keep_alive_s, which bounds this one too).
    max_keep_alive_s: float = 0.0
    # Requests with this key may pin a model (keep_alive < 0: loaded until an operator
    # unloads it or the agent restarts).
    may_pin_models: bool = False
    # What agents do for this key's requests beyond its scopes (moderation per category
    # and direction, stream mode); stored as JSON (edgefleet/key_policy.py).
    policy: KeyPolicy = field(default_factory=KeyPolicy)
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


class ApiKeyTable(Protocol):
    async def add_api_key(self, key: ApiKeyRecord) -> None: ...

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        """Oldest first."""
        ...

    async def revoke_api_key(self, key_id: str, now: datetime) -> bool:
        """Mark a key revoked (once); False when there is no such key."""
        ...

    async def set_api_key_keep_alive(
        self, key_id: str, max_keep_alive_s: float | None, may_pin_models: bool | None
    ) -> bool:
        """Change a key's keep-alive cap and pin right (None: as it is); False when there is
        no such key."""
        ...

    async def set_api_key_policy(self, key_id: str, policy: KeyPolicy) -> bool:
        """Replace a key's policy; False when there is no such key."""
        ...

    async def add_api_key_usage(self, usage: Sequence[tuple[str, int, int, int, int]]) -> None:
        """Add (key_id, requests, prompt_tokens, completion_tokens, rejected) to the totals."""
        ...
