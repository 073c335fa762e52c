"""The agents' live state as last saved (table ``agent_last_state``): what a restarted
coordinator starts from. Live state reaches the store only as periodic, batched
snapshots (the registry's ``save_last_states``), never per report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from coordinator.fleet.records import Liveness
from edgefleet.contract import LoadReport


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


class LastStateTable(Protocol):
    async def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        """Write these agents' live states in one transaction (replacing older ones)."""
        ...

    async def list_last_states(self) -> list[AgentLastState]:
        """Every saved live state, ordered by agent id."""
        ...
