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
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from coordinator.errors import UnknownAgentError
from coordinator.fleet.registry import FleetRegistry, utc_now
from coordinator.rpc.service import CoordinatorServicer
from coordinator.store.agents import AgentTable, StoredAgent
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
        self, store: AgentTable, registry: FleetRegistry, servicer: CoordinatorServicer
    ) -> None:
        self._store = store
        self._registry = registry
        self._servicer = servicer

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
        return LifecycleResult(agent_id, ended, None)
