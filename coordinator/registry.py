"""The fleet registry: which agents exist, their sessions, inventory and load.

``FleetRegistry`` is the interface transport code talks to;
``InMemoryFleetRegistry`` keeps everything in process memory (state is lost on
restart; agents re-announce themselves when they reconnect). A persistent
registry implements the same interface.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from coordinator.errors import UnknownAgentError
from coordinator.fleet import AgentHello, AgentRecord, AgentStatus, DesiredState, LoadReport

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class FleetRegistry(Protocol):
    """What the transports need from fleet state. Methods are quick and never block."""

    def open_session(self, hello: AgentHello) -> str:
        """Record that an agent connected; return the new session id.

        A newer session replaces an older one for the same agent.
        """
        ...

    def record_report(self, agent_id: str, session_id: str, report: LoadReport) -> None:
        """Store the latest load sample of a session (ignored when superseded)."""
        ...

    def record_bye(self, agent_id: str, session_id: str, reason: str) -> None:
        """Note that the agent said goodbye on purpose."""
        ...

    def close_session(self, agent_id: str, session_id: str) -> bool:
        """Mark the agent disconnected if this is its current session.

        Returns True when the agent is now disconnected, False when a newer
        session had already replaced this one.
        """
        ...

    def get(self, agent_id: str) -> AgentRecord:
        """One agent's record; raises UnknownAgentError."""
        ...

    def agents(self) -> list[AgentRecord]:
        """Every known agent, connected or not, ordered by agent id."""
        ...

    def connected_count(self) -> int: ...

    def desired_state(self, agent_id: str) -> DesiredState:
        """What the agent should run now."""
        ...


class InMemoryFleetRegistry:
    """FleetRegistry kept in a dict; for one coordinator process."""

    def __init__(self, *, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._agents: dict[str, AgentRecord] = {}

    def open_session(self, hello: AgentHello) -> str:
        now = self._clock()
        session_id = uuid.uuid4().hex
        previous = self._agents.get(hello.agent_id)
        if previous is not None and previous.status is AgentStatus.CONNECTED:
            logger.info(
                "agent %s opened session %s, replacing session %s",
                hello.agent_id,
                session_id,
                previous.session_id,
            )
        self._agents[hello.agent_id] = AgentRecord(
            hello=hello,
            status=AgentStatus.CONNECTED,
            session_id=session_id,
            connected_since=now,
            last_seen=now,
            # Keep the previous sample: better than nothing until the next one.
            last_report=previous.last_report if previous is not None else None,
        )
        return session_id

    def record_report(self, agent_id: str, session_id: str, report: LoadReport) -> None:
        record = self._current(agent_id, session_id)
        if record is not None:
            self._agents[agent_id] = replace(record, last_report=report, last_seen=self._clock())

    def record_bye(self, agent_id: str, session_id: str, reason: str) -> None:
        record = self._current(agent_id, session_id)
        if record is not None:
            self._agents[agent_id] = replace(record, bye_reason=reason, last_seen=self._clock())

    def close_session(self, agent_id: str, session_id: str) -> bool:
        record = self._current(agent_id, session_id)
        if record is None:
            return False
        self._agents[agent_id] = replace(
            record, status=AgentStatus.DISCONNECTED, connected_since=None
        )
        return True

    def get(self, agent_id: str) -> AgentRecord:
        try:
            return self._agents[agent_id]
        except KeyError:
            raise UnknownAgentError(agent_id) from None

    def agents(self) -> list[AgentRecord]:
        return [self._agents[key] for key in sorted(self._agents)]

    def connected_count(self) -> int:
        return sum(1 for r in self._agents.values() if r.status is AgentStatus.CONNECTED)

    def desired_state(self, agent_id: str) -> DesiredState:
        # Rollouts fill this in; until then every agent keeps what it has.
        return DesiredState()

    def _current(self, agent_id: str, session_id: str) -> AgentRecord | None:
        record = self._agents.get(agent_id)
        if record is None or record.session_id != session_id:
            return None
        return record
