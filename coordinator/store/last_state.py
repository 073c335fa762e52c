"""The agents' live state as last saved (table ``agent_last_state``): what a restarted
coordinator starts from. Live state reaches the store only as periodic, batched
snapshots (the registry's ``save_last_states``), never per report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from coordinator.fleet.records import Liveness
from coordinator.store.report_json import report_from_json
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


def last_state_from_row(row: Mapping[str, Any]) -> AgentLastState:
    """An ``agent_last_state`` row as either backend reads it (POSIX seconds, the report as
    coordinator/store/report_json.py writes it); an unknown liveness reads as down."""
    try:
        liveness = Liveness(row["liveness"])
    except ValueError:
        liveness = Liveness.DOWN
    return AgentLastState(
        agent_id=row["agent_id"],
        liveness=liveness,
        last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
        report=report_from_json(row["agent_id"], row["report_fields"], row["report_json"]),
        saved_at=datetime.fromtimestamp(row["saved_at"], UTC),
    )
