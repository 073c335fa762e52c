"""The change feed (table ``changes``) and dashboard sign-ins (table ``dashboard_sessions``):
what coordinators sharing one database tell each other.

**Changes.** A coordinator that changes something other coordinators hold in memory or
act on for their own agents' sessions (an API key minted or revoked, an agent drained,
revoked or removed) appends a row: a ``kind``, its ``subject`` (a key id, an agent id),
a ``detail`` and its ``origin`` (the appending process). Rows get increasing ``seq``
numbers, in the order they commit: PostgreSQL appends under a transaction-level advisory
lock, so a reader that has seen ``seq`` n never later finds a row below n committing (a
plain sequence can commit out of order and be skipped). PostgreSQL also sends
``NOTIFY edgefleet_changes`` with the row; the notice only wakes the others, who read
the rows after the last they applied (``changes_after``), and a periodic read catches
up on notices lost while a listener reconnects. Rows are pruned after a retention
period (``prune_changes``).

**Dashboard sessions.** A sign-in is kept as the SHA-256 of its session id, the id of
the admin token it was made with, and its expiry: never the session id or the token
itself, so the table grants nothing to whoever reads it, and any coordinator sharing the
database honours a sign-in another one made (a coordinator killed does not sign its
operators out).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["CHANGES_CHANNEL", "Change", "ChangeTable", "DashboardSessionRecord"]

#: The PostgreSQL notification channel.
CHANGES_CHANNEL = "edgefleet_changes"


@dataclass(frozen=True, slots=True)
class Change:
    seq: int
    kind: str
    subject: str
    detail: str
    #: The process that appended it (a coordinator's incarnation).
    origin: str
    #: When it was appended, by the database's clock.
    at: datetime


@dataclass(frozen=True, slots=True)
class DashboardSessionRecord:
    session_hash: str
    token_id: str
    created_at: datetime
    expires_at: datetime


class ChangeTable(Protocol):
    async def append_change(self, kind: str, subject: str, detail: str, origin: str) -> int:
        """Append one change (committed when this returns); its ``seq``."""
        ...

    async def changes_after(self, seq: int, limit: int) -> list[Change]:
        """The first ``limit`` changes after ``seq``, oldest first."""
        ...

    async def last_change_seq(self) -> int:
        """The newest change's ``seq`` (0 when there is none)."""
        ...

    async def prune_changes(self, older_than_s: float) -> int:
        """Delete changes older than ``older_than_s`` by the database's clock; how many."""
        ...

    async def wait_for_changes(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a notice that changes were appended (by any
        coordinator); True when one came. A store without notices (SQLite: one
        coordinator) sleeps and says False. StoreError when the listener failed."""
        ...

    async def create_dashboard_session(
        self, session_hash: str, token_id: str, ttl_s: float
    ) -> DashboardSessionRecord:
        """Keep a sign-in until ``ttl_s`` from now (the database's clock)."""
        ...

    async def get_dashboard_session(self, session_hash: str) -> DashboardSessionRecord | None:
        """The sign-in, None when there is none or it expired."""
        ...

    async def delete_dashboard_session(self, session_hash: str) -> bool:
        """Sign out: False when there was no such sign-in."""
        ...

    async def delete_dashboard_sessions(self, *, token_id: str = "", expired: bool = False) -> int:
        """Delete the sign-ins made with ``token_id``, or (``expired``) those expired."""
        ...

    async def count_dashboard_sessions(self) -> int:
        """Sign-ins not expired."""
        ...
