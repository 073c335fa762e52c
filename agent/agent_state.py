"""The agent's operational state: serving normally, draining, or unhealthy.

A coordinator ``Command`` (drain / resume) changes it. While draining the agent keeps
serving (requests in flight finish; a client that still comes is answered) but says
it is draining everywhere a router looks: ``GET /healthz`` (``"status": "draining"``),
its load reports to the coordinator and its mDNS TXT record, so no new routes come.

An engine that fails past its restart policy marks the agent unhealthy for good (the app
wires :meth:`AgentState.mark_unhealthy` as the engines' ``on_dead``): ``GET /healthz``
answers 503 with ``"status": "unhealthy"`` and the reason, and the load reports carry it.
"""

from __future__ import annotations

import logging
from typing import Literal

from edgefleet.contract import Command, CommandKind

log = logging.getLogger(__name__)


class AgentState:
    """Whether the agent is draining or unhealthy; read by /healthz, load reports and mDNS."""

    def __init__(self) -> None:
        self._draining = False
        self._unhealthy_reason = ""

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def unhealthy_reason(self) -> str:
        """Why the agent cannot serve (e.g. its engine died); empty while it is healthy."""
        return self._unhealthy_reason

    @property
    def status(self) -> Literal["ok", "draining", "unhealthy"]:
        """``"unhealthy"``, ``"draining"`` or ``"ok"``, as /healthz and mDNS say it."""
        if self._unhealthy_reason:
            return "unhealthy"
        return "draining" if self._draining else "ok"

    def mark_unhealthy(self, reason: str) -> None:
        """The agent cannot serve any more (a dead engine); it says so everywhere. Each
        distinct reason is logged once and kept (two dead engines: both are named)."""
        reason = reason or "unhealthy"
        if reason in self._unhealthy_reason.split("; "):
            return
        log.error("agent unhealthy: %s", reason)
        self._unhealthy_reason = (
            f"{self._unhealthy_reason}; {reason}" if self._unhealthy_reason else reason
        )

    def set_draining(self, draining: bool, reason: str = "") -> None:
        if draining and not self._draining:
            log.info("agent draining: %s", reason or "-")
        elif self._draining and not draining:
            log.info("agent resumed")
        self._draining = draining

    def apply(self, command: Command) -> None:
        """Follow a coordinator command (drain, resume); other kinds are not state."""
        if command.kind is CommandKind.DRAIN:
            self.set_draining(True, command.reason or "drained by the coordinator")
        elif command.kind is CommandKind.RESUME:
            self.set_draining(False)
