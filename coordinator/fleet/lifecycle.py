"""What an operator does to an agent's record: fix its place and URL, revoke, remove.

- ``set``: fix the site, location and/or URL the agent is routed by; its live session
  is ended so that it reconnects and announces the fixed values (Hello cannot override
  them).
- ``revoke``: the agent's live session ends at once (PERMISSION_DENIED, "revoked"), its
  certificate serial is refused from then on, its credential forgotten (no session, no
  renewal, no re-enrollment with it), and it is no longer routed to. The record stays,
  marked revoked, until ``remove``.
- ``remove``: deletes the record; an agent that is not revoked yet is revoked first
  (its certificate serial stays on the refused list).

With several coordinators on one database, the agent's session may be on another one:
each action is published to the change feed (coordinator/cluster/changes.py), and the
coordinator holding the session acts on it (``apply_change``): ends the session for
``set``, ``revoke`` and ``remove``; for ``drain`` and ``resume`` (which the HTTP handler
makes) sets the flag in its registry and sends the agent the command. A session opened
on one coordinator is published as ``claimed OWNER EPOCH``: a coordinator still holding
an older session for that agent ends it (coordinator/store/ownership.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.cluster.changes import KIND_AGENT, ChangeFeed
from coordinator.errors import UnknownAgentError
from coordinator.fleet.registry import FleetRegistry, utc_now
from coordinator.rpc.service import CoordinatorServicer
from coordinator.store.agents import AgentTable, StoredAgent
from coordinator.store.changes import Change
from edgefleet.contract import Location

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    agent_id: str
    # A live session was ended.
    session_ended: bool
    stored: StoredAgent | None


class AgentLifecycle:
    """Operator actions on agents, across the store, the registry and live sessions."""

    def __init__(
        self,
        store: AgentTable,
        registry: FleetRegistry,
        servicer: CoordinatorServicer,
        *,
        changes: ChangeFeed | None = None,
        on_change: Callable[[str], None] = lambda agent_id: None,
    ) -> None:
        """``changes``: where actions are published for the other coordinators;
        ``on_change(agent_id)``: told when a published action changed an agent here (the
        dashboard's live rows)."""
        self._store = store
        self._registry = registry
        self._servicer = servicer
        self._changes = changes
        self._on_change = on_change

    async def publish(self, agent_id: str, action: str) -> None:
        """Tell the other coordinators (no-op without a change feed)."""
        if self._changes is not None:
            await self._changes.publish(KIND_AGENT, agent_id, action)

    async def apply_change(self, change: Change) -> None:
        """What another coordinator did to an agent, applied to its session here (if it
        is here: every coordinator gets every change)."""
        agent_id, action = change.subject, change.detail
        if action.startswith("claimed "):  # "claimed OWNER EPOCH": its session moved
            _, owner, epoch = action.split(" ", 2)
            self._servicer.end_superseded(agent_id, owner, int(epoch))
            return
        if action in ("drain", "resume"):
            draining = action == "drain"
            try:
                self._registry.set_draining(agent_id, draining)
            except UnknownAgentError:
                return  # never seen here: its session is elsewhere
            self._servicer.send_command(agent_id, action, f"{action} requested by an operator")
        elif action in ("revoke", "remove"):
            self._servicer.end_session(
                agent_id, revoked=f"agent {agent_id!r} was revoked by an operator"
            )
            with contextlib.suppress(UnknownAgentError):
                self._registry.remove(agent_id)
        elif action == "set":
            self._servicer.end_session(agent_id)  # it reconnects with the fixed values
        else:
            logger.warning("change feed: unknown agent action %r for %s", action, agent_id)
            return
        self._on_change(agent_id)

    async def set_fixed(
        self,
        agent_id: str,
        *,
        site: str | None = None,
        location: Location | None = None,
        http_url: str | None = None,
    ) -> LifecycleResult:
        stored = await self._store.set_fixed(
            agent_id, site=site, location=location, http_url=http_url
        )
        if stored is None:
            raise UnknownAgentError(agent_id)
        ended = self._servicer.end_session(agent_id)
        logger.info(
            "agent %s: operator fixed site=%r location=%s url=%r",
            agent_id,
            stored.site,
            stored.location,
            stored.http_url,
        )
        await self.publish(agent_id, "set")
        return LifecycleResult(agent_id, ended, stored)

    async def revoke(self, agent_id: str) -> LifecycleResult:
        if not await self._store.revoke_agent(agent_id, utc_now()):
            raise UnknownAgentError(agent_id)
        ended = self._servicer.end_session(
            agent_id, revoked=f"agent {agent_id!r} was revoked by an operator"
        )
        with contextlib.suppress(UnknownAgentError):
            self._registry.remove(agent_id)
        logger.warning("agent %s revoked (live session ended: %s)", agent_id, ended)
        await self.publish(agent_id, "revoke")
        return LifecycleResult(agent_id, ended, await self._store.get_agent(agent_id))

    async def revoke_agents_of_token(self, token_id: str) -> list[str]:
        agents = await self._store.agents_of_token(token_id)
        for agent_id in agents:
            await self.revoke(agent_id)
        return agents

    async def remove(self, agent_id: str) -> LifecycleResult:
        stored = await self._store.get_agent(agent_id)
        if stored is None:
            raise UnknownAgentError(agent_id)
        ended = False
        if not stored.revoked:
            ended = (await self.revoke(agent_id)).session_ended
        await self._store.remove_agent(agent_id)
        logger.warning("agent %s removed", agent_id)
        await self.publish(agent_id, "remove")
        return LifecycleResult(agent_id, ended, None)
