"""Table ``agent_owners``: which coordinator an agent's session is on.

Coordinators sharing a database each hold some agents' sessions. When an agent opens a
session, its coordinator *claims* it: one statement records itself as the owner and bumps
the agent's epoch. A coordinator whose session for an agent is older than the owner's
epoch, or whose agent is now owned by another, holds a stale session (the agent moved
while its old connection looked alive: a paused coordinator, a half-open TCP
connection) and ends it (coordinator/rpc/service.py ``end_superseded``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class OwnershipTable(Protocol):
    async def claim_agent(self, agent_id: str, coordinator_id: str) -> int:
        """Make ``coordinator_id`` the agent's owner; the new epoch (1 for the first)."""
        ...

    async def agent_owners(self, agent_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """(owner, epoch) of each of these agents that was ever claimed."""
        ...
