"""The agents' live state as last saved (table ``agent_last_state``): what a restarted
coordinator starts from, and the coordinators' shared live view.

Live state reaches the store only as periodic, batched snapshots (the registry's
``save_last_states``), never per report. With several coordinators on one database the
same rows are the **shared live view** (issue 24): each coordinator writes its own agents'
rows (``owner``: itself, ``epoch``: the agent's ownership epoch, coordinator/store/
ownership.py), fenced by ``agent_owners``, and every write gives the row a new
``version`` (one sequence for the table, taken in commit order); the others read the rows
changed since the last version they read (``live_states_after``) and route to those
agents too (coordinator/cluster/live_view.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from coordinator.fleet.records import Liveness
from coordinator.store.report_json import report_from_json
from edgefleet.contract import Histogram, LoadReport, ModelStats

logger = logging.getLogger(__name__)


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
    # The coordinator that wrote it ("" : written unfenced, before owners were kept) and
    # the agent's ownership epoch there (0: no session of this coordinator's run).
    owner: str = ""
    epoch: int = 0
    # The row's version: newer writes have higher ones (set by the store).
    version: int = 0
    # The per-version model stats the agent reported during its session at ``epoch``,
    # summed (cumulative since the session opened: a reader takes the difference).
    stats: tuple[ModelStats, ...] = ()
    # When the row was written, by the database's clock (set by the store).
    written_at: datetime | None = None


class LastStateTable(Protocol):
    async def save_last_states(
        self, states: Sequence[AgentLastState], saved_at: datetime, *, owner: str = ""
    ) -> list[str]:
        """Write these agents' live states in one transaction (replacing older ones), each
        with a new version; the ids of those NOT written.

        ``owner``: the writing coordinator. A state is written only while ``owner`` owns
        the agent (``agent_owners``) at the state's ``epoch`` (an ``epoch`` of 0: at any
        epoch), or when the agent was never claimed; a stale owner's state (the agent
        moved to another coordinator, or a newer session of it opened) is refused. With
        no ``owner`` every state is written (one coordinator, no owners kept)."""
        ...

    async def list_last_states(self) -> list[AgentLastState]:
        """Every saved live state, ordered by agent id."""
        ...

    async def live_states_after(self, version: int, limit: int) -> list[AgentLastState]:
        """At most ``limit`` states written after ``version``, in version order (a reader
        never skips a row committed late: writes take their versions in commit order)."""
        ...


def stats_to_json(stats: Sequence[ModelStats]) -> str | None:
    if not stats:
        return None
    rows = [
        [
            s.name,
            s.version,
            s.requests,
            s.failed,
            s.prompt_tokens,
            s.completion_tokens,
            list(s.ttft_seconds.upper_bounds),
            list(s.ttft_seconds.counts),
            s.ttft_seconds.sum,
        ]
        for s in stats
    ]
    return json.dumps(
        rows,
        separators=(",", ":"),
    )


def stats_from_json(agent_id: str, text: str | None) -> tuple[ModelStats, ...]:
    if not text:
        return ()
    try:
        return tuple(
            ModelStats(
                str(name),
                str(version),
                int(requests),
                int(failed),
                int(prompt),
                int(completion),
                Histogram(
                    tuple(float(b) for b in bounds), tuple(int(c) for c in counts), float(total)
                ),
            )
            for name, version, requests, failed, prompt, completion, bounds, counts, total in (
                json.loads(text)
            )
        )
    except (TypeError, ValueError) as exc:
        logger.info("ignoring the saved model stats of agent %s: %s", agent_id, exc)
        return ()


def last_state_from_row(row: Mapping[str, Any]) -> AgentLastState:
    """An ``agent_last_state`` row as either backend reads it (POSIX seconds, the report as
    coordinator/store/report_json.py writes it); an unknown liveness reads as down."""
    try:
        liveness = Liveness(row["liveness"])
    except ValueError:
        liveness = Liveness.DOWN
    written = row["written_at"]
    return AgentLastState(
        agent_id=row["agent_id"],
        liveness=liveness,
        last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
        report=report_from_json(row["agent_id"], row["report_fields"], row["report_json"]),
        saved_at=datetime.fromtimestamp(row["saved_at"], UTC),
        owner=row["owner"] or "",
        epoch=int(row["epoch"] or 0),
        version=int(row["version"] or 0),
        stats=stats_from_json(row["agent_id"], row["stats_json"]),
        written_at=None if written is None else datetime.fromtimestamp(written, UTC),
    )


def writable(
    states: Sequence[AgentLastState], owner: str, owners: Mapping[str, tuple[str, int]]
) -> tuple[list[AgentLastState], list[str]]:
    """(the states ``owner`` may write, the ids refused), given the agents' (owner, epoch)
    as ``agent_owners`` has them now (read under a lock by the backend)."""
    if not owner:
        return list(states), []
    kept: list[AgentLastState] = []
    refused: list[str] = []
    for state in states:
        held = owners.get(state.agent_id)
        if held is None or (held[0] == owner and state.epoch in (0, held[1])):
            kept.append(state)
        else:
            refused.append(state.agent_id)
    return kept, refused
