"""The coordinator's own picture of each agent: its record, connection status and liveness.

What agents say (Hello, LoadReport) and what the coordinator sends (DesiredState) are
the shared contract types of ``edgefleet.contract``; transport code converts wire
messages into them (``coordinator.rpc.convert``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from edgefleet.contract import DesiredState, Hello, LoadedModel, LoadReport, ModelInventoryState

_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def valid_agent_id(agent_id: str) -> bool:
    """1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit."""
    return _AGENT_ID.match(agent_id) is not None


class AgentStatus(enum.StrEnum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


class Liveness(enum.StrEnum):
    """How recently an agent reported, in report intervals (see coordinator.liveness)."""

    # Reported within the last `suspect_after_reports` intervals: routed normally.
    LIVE = "live"
    # Missed `suspect_after_reports` reports: still routed, after every live agent.
    SUSPECT = "suspect"
    # Known before a coordinator restart, not reconnected yet: routed with its last
    # saved state, after every live agent, until `restart_grace_s` ends (then down).
    UNCONFIRMED = "unconfirmed"
    # Missed `down_after_reports` reports, said Bye, or not heard of since a restart.
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """Everything the registry knows about one agent."""

    hello: Hello
    status: AgentStatus
    # Id of the current (or last) session.
    session_id: str
    # When the current session opened; None while disconnected.
    connected_since: datetime | None
    # Last time any message from the agent arrived (UTC).
    last_seen: datetime
    # Latest load sample; None until the first one arrives.
    last_report: LoadReport | None = None
    # Reason from the agent's Bye, if it said goodbye.
    bye_reason: str | None = None
    liveness: Liveness = Liveness.LIVE
    # An operator drained the agent: it finishes running work and gets no new routes.
    draining: bool = False
    # The agent enrolled with a join token (its sessions are authenticated).
    enrolled: bool = False
    # What the coordinator wants the agent to run (each section with its generation);
    # what the agent applied is ``last_report.applied``.
    desired: DesiredState = field(default_factory=DesiredState)
    # The coordinator the agent's session is on ("" : not known) and its ownership epoch
    # there (coordinator/store/ownership.py; 0: not claimed or not known).
    owner: str = ""
    epoch: int = 0
    # Its session is on another coordinator: this record is that coordinator's, read
    # from the shared live view (coordinator/cluster/live_view.py). Routed to; never
    # pushed to, drained or swept here.
    remote: bool = False

    @property
    def unhealthy_reason(self) -> str:
        """Why the agent says it cannot serve; empty while it is healthy (or has not said)."""
        return "" if self.last_report is None else self.last_report.unhealthy_reason

    @property
    def agent_id(self) -> str:
        return self.hello.agent_id

    @property
    def served(self) -> tuple[LoadedModel, ...]:
        """The model versions the agent serves now: those its latest inventory lists as
        loaded, or (an agent that reports no inventory) those its Hello lists."""
        return served_models(self.hello, self.last_report)

    def reported(self, report: LoadReport, now: datetime) -> AgentRecord:
        """This record once ``report`` arrived at ``now``: its last report, seen then, live.

        ``dataclasses.replace(self, last_report=report, last_seen=now, liveness=LIVE)``
        made directly, at half the cost (a coordinator makes thousands a second); the
        fields in their declared order (a test compares it with ``replace``)."""
        return AgentRecord(
            self.hello,
            self.status,
            self.session_id,
            self.connected_since,
            now,
            report,
            self.bye_reason,
            Liveness.LIVE,
            self.draining,
            self.enrolled,
            self.desired,
            self.owner,
            self.epoch,
            self.remote,
        )

    def serves(self, name: str, version: str | None = None) -> bool:
        """It serves ``name`` (at ``version``, when given)."""
        return any(
            m.name == name and (version is None or m.version == version) for m in self.served
        )


def served_models(hello: Hello, report: LoadReport | None) -> tuple[LoadedModel, ...]:
    """See ``AgentRecord.served``."""
    if report is None or not report.inventory:
        return hello.models
    return tuple(
        LoadedModel(name=i.name, version=i.version)
        for i in report.inventory
        if i.state is ModelInventoryState.LOADED
    )


def routing_hello(hello: Hello, report: LoadReport | None) -> Hello:
    """The Hello the fleet index keys the agent by: its models are what it serves now."""
    served = served_models(hello, report)
    return hello if served == hello.models else replace(hello, models=served)
