"""The agent's operational state: serving normally, or draining.

A coordinator ``Command`` (drain / resume) changes it. While draining the agent keeps
serving (requests in flight finish; a client that still comes is answered) but says
it is draining everywhere a router looks: ``GET /healthz`` (``"status": "draining"``),
its load reports to the coordinator and its mDNS TXT record, so no new routes come.
"""

from __future__ import annotations

import logging
from typing import Literal

from agent.coordinator_session import Command

log = logging.getLogger(__name__)


class AgentState:
    """Whether the agent is draining; read by /healthz, load reports and mDNS."""

    def __init__(self) -> None:
        self._draining = False

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def status(self) -> Literal["ok", "draining"]:
        """``"draining"`` or ``"ok"``, as /healthz and the mDNS TXT record say it."""
        return "draining" if self._draining else "ok"

    def set_draining(self, draining: bool, reason: str = "") -> None:
        if draining and not self._draining:
            log.info("agent draining: %s", reason or "-")
        elif self._draining and not draining:
            log.info("agent resumed")
        self._draining = draining

    def apply(self, command: Command) -> None:
        """Follow a coordinator command (drain, resume); other kinds are not state."""
        if command.kind == "drain":
            self.set_draining(True, command.reason or "drained by the coordinator")
        elif command.kind == "resume":
            self.set_draining(False)
