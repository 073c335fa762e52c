"""``FleetClient``: find agents, pick the best, fail over between them.

::

    fleet = FleetClient(model="smollm2-135m", coordinator_url="https://coord:8080",
                        ca_file="fleet-ca.pem", api_key="ef-...")  # or $EDGEFLEET_API_KEY
    client = fleet.openai()          # an openai.OpenAI that fails over between agents
    fleet.base_url()                 # or just the best agent's OpenAI base URL

Several coordinators serving one fleet: ``coordinator_url=["https://coord-a:8080",
"https://coord-b:8080"]`` (or the same comma-separated); a lookup that cannot reach one, or
gets a 5xx, asks the next, and later lookups start with the one that answered last.

With ``cache_path``, the last discovered agents are kept on disk; when the coordinator
cannot be reached, the client keeps using the agents it discovered last (in memory, or from
that file after a restart). A streamed completion that breaks after some tokens resumes on
another agent serving the same model version; ``stream.response.extensions
["edgefleet_segments"]`` says which agent served which part.

Requests (and the API key in them) go only to agents that prove their fleet identity: an
https URL whose certificate chains to the fleet CA (``ca_file``/``ca_pem``: the
coordinator's ``<data_dir>/ca/ca.pem``) and names the URL's host. Plain-HTTP agents named
by a route answer or an mDNS responder are skipped; loopback ones are allowed with
``allow_insecure_agents=True`` (development).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from edgefleet_client._exceptions import DiscoveryError
from edgefleet_client._mdns import browse_mdns
from edgefleet_client._models import Agent
from edgefleet_client._probe import probe_all
from edgefleet_client._route import coordinator_urls, route_lookup_first
from edgefleet_client._trust import (
    agent_ssl_context,
    coordinator_ssl_context,
    load_ca_pem,
    refusal,
)

logger = logging.getLogger(__name__)

# Host of the placeholder base URL handed to openai; the failover transport swaps it out.
PLACEHOLDER_BASE_URL = "http://edgefleet.invalid/v1"


class FleetClient:
    """Knows the agents for one model, best first, and which of them failed lately."""

    def __init__(
        self,
        model: str,
        *,
        coordinator_url: str | Sequence[str] = "",
        site: str = "",
        lat: float | None = None,
        lon: float | None = None,
        mdns_timeout_s: float = 3.0,
        mdns_interfaces: Sequence[str] = (),
        probe_timeout_s: float = 1.0,
        cooldown_s: float = 10.0,
        refresh_s: float = 30.0,
        cache_path: str | Path | None = None,
        ca_file: str | Path | None = None,
        ca_pem: str | None = None,
        allow_insecure_agents: bool = False,
        api_key: str | None = None,
    ) -> None:
        """``coordinator_url``: one coordinator, or several (a list, or comma-separated),
        asked in turn. ``api_key``: the fleet API key sent to agents (``Authorization:
        Bearer``); default ``$EDGEFLEET_API_KEY``."""
        self.model = model
        self._api_key = api_key if api_key is not None else os.environ.get("EDGEFLEET_API_KEY", "")
        #: The coordinators, the one that answered last first.
        self.coordinator_urls = coordinator_urls(coordinator_url)
        self._site, self._lat, self._lon = site, lat, lon
        self._mdns_timeout_s = mdns_timeout_s
        self._mdns_interfaces = tuple(mdns_interfaces)
        self._probe_timeout_s = probe_timeout_s
        self._cooldown_s = cooldown_s
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._agents: list[Agent] = []
        self._failed_until: dict[str, float] = {}
        self._refreshed_at = 0.0
        # the last discovery, kept on disk: a client started while the coordinator is away
        # still finds the agents it knew
        self._cache_path = Path(cache_path) if cache_path is not None else None
        self.ca_pem = load_ca_pem(ca_file, ca_pem)
        self.allow_insecure_agents = allow_insecure_agents
        self._coordinator_ssl = coordinator_ssl_context(self.ca_pem)

    @property
    def coordinator_url(self) -> str:
        """The coordinator asked first (the one that answered last); "" for none."""
        return self.coordinator_urls[0] if self.coordinator_urls else ""

    def _route(self, **kwargs: Any) -> list[Agent]:
        """A route lookup on the coordinators, the one that answered last first."""
        urls = self.coordinator_urls
        url, found = route_lookup_first(urls, api_key=self._api_key, **kwargs)
        if url != urls[0]:
            logger.warning("coordinator %s did not answer; asking %s first now", urls[0], url)
            at = urls.index(url)
            self.coordinator_urls = urls[at:] + urls[:at]
        return found

    def _trusted(self, agents: list[Agent], where: str) -> list[Agent]:
        """The agents that may get requests; the others are skipped, with the reason logged.

        Raises DiscoveryError when there were agents and none may.
        """
        kept: list[Agent] = []
        refused: list[str] = []
        for agent in agents:
            why = refusal(agent, allow_insecure_agents=self.allow_insecure_agents)
            if why is None:
                kept.append(agent)
            else:
                refused.append(f"{agent.agent_id} at {agent.url}: {why}")
                logger.warning("skipping agent %s at %s: %s", agent.agent_id, agent.url, why)
        if refused and not kept:
            raise DiscoveryError(
                f"no agent from {where} proves its fleet identity; skipped " + "; ".join(refused)
            )
        return kept

    # ------------------------------------------------------------ discovery

    def discover(self) -> list[Agent]:
        """Look agents up (coordinator, else mDNS), probe their RTT, rank them; best first."""
        if self.coordinator_urls:
            found = self._route(
                model=self.model,
                site=self._site,
                lat=self._lat,
                lon=self._lon,
                ssl_context=self._coordinator_ssl,
            )
            found = self._trusted(found, self.coordinator_url)
            probed = probe_all(found, timeout_s=self._probe_timeout_s)
            if probed:
                # Ask again with our own RTTs: the coordinator folds them into proximity.
                rtts = {a.agent_id: a.rtt_ms for a in probed if a.rtt_ms is not None}
                ranked = self._route(
                    model=self.model,
                    site=self._site,
                    lat=self._lat,
                    lon=self._lon,
                    rtt_ms=rtts,
                    ssl_context=self._coordinator_ssl,
                )
                ranked = self._trusted(ranked, self.coordinator_url)
                agents = [a for a in ranked if a.agent_id in rtts]
                agents = [replace(a, rtt_ms=rtts[a.agent_id]) for a in agents] or probed
            else:
                agents = found
        else:
            found = browse_mdns(
                timeout_s=self._mdns_timeout_s, interfaces=self._mdns_interfaces, model=self.model
            )
            found = self._trusted(found, "mDNS")
            agents = probe_all(found, timeout_s=self._probe_timeout_s)
            agents.sort(key=lambda a: (a.load or 0, a.rtt_ms or 0.0, a.agent_id))
        if not agents:
            where = self.coordinator_url or "mDNS"
            raise DiscoveryError(f"no agent serving {self.model!r} found via {where}")
        with self._lock:
            self._agents = agents
            self._refreshed_at = time.monotonic()
        self._save(agents)
        return list(agents)

    def _save(self, agents: list[Agent]) -> None:
        if self._cache_path is None:
            return
        data = {"model": self.model, "agents": [asdict(a) for a in agents]}
        tmp = self._cache_path.with_name(self._cache_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._cache_path)
        except OSError as exc:
            logger.warning("cannot keep the discovered agents in %s: %s", self._cache_path, exc)

    def _load(self) -> list[Agent]:
        """The agents of the last discovery kept on disk (none when absent or unreadable)."""
        if self._cache_path is None:
            return []
        try:
            data = json.loads(self._cache_path.read_text())
            if data.get("model") != self.model:
                return []
            kept = [Agent(**{**a, "models": tuple(a.get("models", ()))}) for a in data["agents"]]
            return self._trusted(kept, str(self._cache_path))
        except DiscoveryError as exc:
            logger.warning("%s", exc)
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("cannot read the kept agents in %s: %s", self._cache_path, exc)
            return []

    @property
    def agents(self) -> list[Agent]:
        """The agents from the last discovery, best first."""
        with self._lock:
            return list(self._agents)

    def best(self) -> Agent:
        """The best agent not in cooldown (discovering first when needed)."""
        return self.candidates()[0]

    def base_url(self) -> str:
        """The best agent's OpenAI base URL, e.g. ``http://10.0.0.7:8000/v1``."""
        return self.best().url.rstrip("/") + "/v1"

    # ------------------------------------------------------------- failover

    def candidates(self) -> list[Agent]:
        """Agents to try, in order: healthy ones best first, then those in cooldown."""
        with self._lock:
            stale = not self._agents or time.monotonic() - self._refreshed_at > self._refresh_s
        if stale:
            try:
                self.discover()
            except DiscoveryError as exc:
                if not self.agents:
                    kept = self._load()
                    if not kept:
                        raise
                    with self._lock:
                        self._agents = kept
                    logger.warning("%s; using the %d agents discovered last", exc, len(kept))
                else:
                    logger.warning("rediscovery failed; keeping the last known agents")
        now = time.monotonic()
        with self._lock:
            healthy = [a for a in self._agents if self._failed_until.get(a.agent_id, 0) <= now]
            cooling = [a for a in self._agents if self._failed_until.get(a.agent_id, 0) > now]
        return healthy + cooling

    def mark_failed(self, agent: Agent, why: str) -> None:
        """Skip ``agent`` for ``cooldown_s``; rediscover when every agent has failed."""
        logger.warning("agent %s (%s) failed: %s; failing over", agent.agent_id, agent.url, why)
        now = time.monotonic()
        with self._lock:
            self._failed_until[agent.agent_id] = now + self._cooldown_s
            all_failed = all(self._failed_until.get(a.agent_id, 0) > now for a in self._agents)
            if all_failed:
                self._refreshed_at = 0.0

    def mark_ok(self, agent: Agent) -> None:
        with self._lock:
            self._failed_until.pop(agent.agent_id, None)

    # --------------------------------------------------------------- openai

    @property
    def api_key(self) -> str:
        """The API key this client presents to agents ("" for none)."""
        return self._api_key

    def http_client(self, **kwargs: Any) -> Any:
        """An ``httpx2.Client`` whose transport fails over between agents (it sends the
        API key, when there is one, as ``Authorization: Bearer``)."""
        import httpx2

        from edgefleet_client._failover import FailoverTransport

        if self._api_key:
            headers = dict(kwargs.pop("headers", None) or {})
            headers.setdefault("Authorization", f"Bearer {self._api_key}")
            kwargs["headers"] = headers
        inner = httpx2.HTTPTransport(verify=agent_ssl_context(self.ca_pem))
        return httpx2.Client(transport=FailoverTransport(self, inner), **kwargs)

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client for this fleet (needs the ``openai`` package).

        Its own retries are off: this library retries on the next agent instead.
        """
        import openai

        kwargs.setdefault("api_key", self._api_key or "edgefleet")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(
            base_url=PLACEHOLDER_BASE_URL, http_client=self.http_client(), **kwargs
        )
