"""Where work goes when an edge agent cannot take it: the coordinator's overflow targets.

The coordinator holds three kinds of target and pushes them to each agent in the
desired state's ``overflow_targets`` section (:class:`OverflowDistributor`, every report
interval, only when an agent's list changed):

- peers: the other agents at the agent's site, from the registry, with the room the
  coordinator last saw (``free_slots``, in coarse steps so a busy fleet is not re-sent
  its section every interval); connected (to this coordinator or, through the shared
  live view, another), live, healthy and not draining only;
- cloud GPU pools: lists of OpenAI-compatible endpoints (vLLM, TGI, llama.cpp ...) with
  a weight and a capacity each;
- hosted providers through adapters: OpenAI-compatible, or Anthropic's Messages API.

Pools and providers come from the JSON file ``overflow_targets_file`` names
(:class:`OverflowTargetsFile`). Credentials are named there, never given: the NAME of an
environment variable and/or the PATH of a secret file, read by the agent that calls the
target. A value that looks like a key instead of a name is refused, and no error here
ever repeats what it refused. Prices are per 1,000 prompt and completion tokens.

The route answer's ``overflow`` (what a client is told when no agent fits) is the first
pool or provider serving the model (:class:`FleetOverflowPolicy`), or the static
``overflow_url`` of older configs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError, UnknownAgentError
from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from edgefleet.contract import (
    Hello,
    OverflowApi,
    OverflowEndpoint,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
)

logger = logging.getLogger(__name__)


class OverflowPolicy(Protocol):
    def target_for(self, model: str) -> OverflowTarget | None:
        """The target to name when no edge agent fits; None when there is none."""
        ...


class StaticOverflowPolicy:
    def __init__(self, name: str = "", url: str = "") -> None:
        self._target = (
            OverflowTarget(name=name or url, kind=OverflowKind.GPU_POOL, url=url) if url else None
        )

    def target_for(self, model: str) -> OverflowTarget | None:
        return self._target


# ------------------------------------------------------------------ the targets file

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Price = Annotated[float, Field(ge=0, le=1_000_000)]
Millis = Annotated[int, Field(ge=0, le=3_600_000)]


def _base_url(value: str) -> str:
    if not _URL.match(value):
        raise ValueError("must be an http:// or https:// base URL (e.g. http://gpu:8000/v1)")
    return value.rstrip("/")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointConfig(_Strict):
    url: str
    weight: float = Field(default=1.0, gt=0, le=1_000_000)
    capacity: int = Field(default=0, ge=0, le=1_000_000)  # requests in flight; 0: no cap

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _base_url(value)


class _TargetConfig(_Strict):
    name: Name
    models: tuple[str, ...] = ()  # empty: any model
    # the NAME of an environment variable / the PATH of a secret file, on the agents
    credential_env: str = ""
    credential_file: str = ""
    prompt_price_per_1k: Price = 0.0
    completion_price_per_1k: Price = 0.0
    supports_continuation: bool = False
    supports_constraints: bool = False
    model_names: dict[str, str] = Field(default_factory=dict)  # fleet name -> target's
    connect_timeout_ms: Millis = 0
    first_token_timeout_ms: Millis = 0
    total_timeout_ms: Millis = 0

    @field_validator("credential_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if value and not _ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (letters, digits, _), not a credential"
            )
        return value

    @field_validator("credential_file")
    @classmethod
    def _file_path(cls, value: str) -> str:
        if value and not (value.startswith("/") or value.startswith("~/")):
            raise ValueError("must be the absolute PATH of a secret file, not a credential")
        return value


class PoolConfig(_TargetConfig):
    endpoints: Annotated[tuple[EndpointConfig, ...], Field(min_length=1, max_length=256)]


class ProviderConfig(_TargetConfig):
    api: Literal["openai", "anthropic"] = "openai"
    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _base_url(value)


class OverflowTargetsFile(_Strict):
    """``overflow_targets_file``: pools and providers, each list in the order to try."""

    pools: tuple[PoolConfig, ...] = ()
    providers: tuple[ProviderConfig, ...] = ()
    # peers at the site are offered to agents (from the registry)
    peers: bool = True

    def cloud_targets(self) -> tuple[OverflowTarget, ...]:
        return tuple(_pool_target(p) for p in self.pools) + tuple(
            _provider_target(p) for p in self.providers
        )


class OverflowConfigError(ValueError):
    """The targets file cannot be used; the message names the file and field only."""


def load_targets_file(path: Path) -> OverflowTargetsFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OverflowConfigError(f"overflow targets file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise OverflowConfigError(f"overflow targets file {path}: not JSON ({exc})") from None
    try:
        parsed = OverflowTargetsFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise OverflowConfigError(
            f"overflow targets file {path}: {where}: {first['msg']}"
        ) from None
    names = [t.name for t in parsed.cloud_targets()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise OverflowConfigError(f"overflow targets file {path}: names repeat: {dupes}")
    return parsed


def _common(c: _TargetConfig) -> dict[str, object]:
    return {
        "models": tuple(c.models),
        "credential_env": c.credential_env,
        "credential_file": c.credential_file,
        "prompt_price_per_1k": c.prompt_price_per_1k,
        "completion_price_per_1k": c.completion_price_per_1k,
        "supports_continuation": c.supports_continuation,
        "supports_constraints": c.supports_constraints,
        "model_names": dict(c.model_names),
        "connect_timeout_ms": c.connect_timeout_ms,
        "first_token_timeout_ms": c.first_token_timeout_ms,
        "total_timeout_ms": c.total_timeout_ms,
    }


def _pool_target(p: PoolConfig) -> OverflowTarget:
    return OverflowTarget(
        name=p.name,
        kind=OverflowKind.GPU_POOL,
        url=p.endpoints[0].url,
        api=OverflowApi.OPENAI,
        endpoints=tuple(OverflowEndpoint(e.url, e.weight, e.capacity) for e in p.endpoints),
        **_common(p),  # type: ignore[arg-type]
    )


def _provider_target(p: ProviderConfig) -> OverflowTarget:
    return OverflowTarget(
        name=p.name,
        kind=OverflowKind.HOSTED_PROVIDER,
        url=p.url,
        api=OverflowApi(p.api),
        **_common(p),  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ per agent

#: free_slots is sent in these steps (at most the last), so small load changes do not
#: re-send every agent its section.
SLOT_STEPS = (0, 1, 2, 4, 8, 16)


def coarse_slots(free: int) -> int:
    """The largest of SLOT_STEPS at most ``free`` (0 when none is)."""
    for step in reversed(SLOT_STEPS):
        if step <= free:
            return step
    return 0


def peer_free_slots(record: AgentRecord, saturation_queue_depth: int) -> int:
    """Room as the coordinator sees it: queue depth below saturation, 0 when unknown."""
    report = record.last_report
    if report is None:
        return 0
    return coarse_slots(saturation_queue_depth - report.waiting_sequences)


# A peer that missed a report (suspect) keeps its place until it is down: when the
# coordinator itself is starved of CPU, reports come late fleet-wide, and dropping each late
# peer (and adding it back at its next report) re-sent every agent at its site its section
# each interval, the pushes starving the coordinator further. The agents' forwarders have
# breakers for a peer that really went away.
_PEER_LIVENESS = frozenset({Liveness.LIVE, Liveness.SUSPECT})


def can_take_peer_work(record: AgentRecord) -> bool:
    # connected here, or to another coordinator (the shared live view: cluster/live_view.py)
    return (
        (record.status is AgentStatus.CONNECTED or record.remote)
        and record.liveness in _PEER_LIVENESS
        and not record.draining
        and not record.unhealthy_reason
        and bool(record.hello.http_url)
        and not (record.last_report is not None and record.last_report.draining)
    )


def peer_target(record: AgentRecord, free_slots: int) -> OverflowTarget:
    url = record.hello.http_url.rstrip("/")
    return OverflowTarget(
        name=record.agent_id,
        kind=OverflowKind.PEER,
        url=url if url.endswith("/v1") else url + "/v1",
        models=tuple(sorted({m.name for m in record.hello.models})),
        api=OverflowApi.EDGEFLEET,
        site=record.hello.site,
        free_slots=free_slots,
        supports_continuation=True,
    )


def peers_by_site(
    agents: list[AgentRecord], saturation_queue_depth: int
) -> dict[str, list[OverflowTarget]]:
    """Agents that can take peer work, by site, most room first."""
    sites: dict[str, list[OverflowTarget]] = {}
    _add_peers(sites, agents, saturation_queue_depth, peer_target)
    _most_room_first(sites)
    return sites


def _add_peers(
    sites: dict[str, list[OverflowTarget]],
    agents: list[AgentRecord],
    saturation_queue_depth: int,
    target_of: Callable[[AgentRecord, int], OverflowTarget],
) -> None:
    """Each of ``agents`` that can take peer work, its target (``target_of``) added to
    its site's list."""
    for record in agents:
        if not can_take_peer_work(record):
            continue
        free = peer_free_slots(record, saturation_queue_depth)
        if free:
            sites.setdefault(record.hello.site, []).append(target_of(record, free))


def _most_room_first(sites: dict[str, list[OverflowTarget]]) -> None:
    for peers in sites.values():
        peers.sort(key=lambda t: (-t.free_slots, t.name))


#: Agents an OverflowDistributor tick works through, or sections it pushes, before it
#: lets the event loop serve. At 100 agents a slice held the loop 2-3 ms (up to 12 ms when
#: the coordinator's other threads took the CPU meanwhile) on the scale benchmark's machine
#: (5,000 agents, one CPU), each time a route lookup waiting behind it: 25 is under 1 ms.
TICK_SLICE = 25
PUSH_SLICE = 10


class OverflowDistributor:
    """Pushes each connected agent its targets when they change.

    An agent whose list is empty and was never pushed one by this distributor is left
    alone (a section set another way stays). A peer's target is made once and reused
    while its Hello and room stay the same, so that a tick over a fleet whose peers did
    not change compares identical objects and makes none; and a tick works through the
    fleet ``TICK_SLICE`` agents at a time, letting the event loop serve in between (on
    5,000 agents, one pass making and comparing every peer's target anew held the loop
    130-180 ms each interval on the benchmark's Intel VM; reusing them, 30-60 ms). With
    ``spread_s``, the slices are spread over that long (the coordinator gives half a report
    interval): back to back, a tick's 30-160 ms of work on 5,000 agents came on top of
    everything else at once, every interval, and route lookups in that stretch waited
    behind the rest of the loop's work for longer."""

    def __init__(
        self,
        targets: OverflowTargetsFile,
        agents: Callable[[], list[AgentRecord]],
        set_section: Callable[[str, OverflowTargetsSection], object],
        *,
        saturation_queue_depth: int,
        spread_s: float = 0.0,
    ) -> None:
        self.targets = targets
        # a tick's slices are spread over this long (0: one after another)
        self._spread_s = spread_s
        self._cloud = targets.cloud_targets()
        self._agents = agents
        self._set_section = set_section
        self._saturation = saturation_queue_depth
        self._owned: set[str] = set()
        self.pushed = 0
        # agent id -> (its Hello, its free slots, its target) as last made, and as made
        # during the tick under way (what is not made again is forgotten after it)
        self._peer_targets: dict[str, tuple[Hello, int, OverflowTarget]] = {}
        self._made: dict[str, tuple[Hello, int, OverflowTarget]] = {}
        # site -> its peers' targets, the same tuple while they are the same targets
        self._site_peers: dict[str, tuple[OverflowTarget, ...]] = {}
        # agent id -> (its site's tuple, the targets it wants: its peers and the cloud's)
        self._wanted: dict[str, tuple[tuple[OverflowTarget, ...], tuple[OverflowTarget, ...]]] = {}

    def _peer_target(self, record: AgentRecord, free_slots: int) -> OverflowTarget:
        """``peer_target(record, free_slots)``: last tick's object while both are the same."""
        made = self._peer_targets.get(record.agent_id)
        if made is None or made[0] is not record.hello or made[1] != free_slots:
            made = (record.hello, free_slots, peer_target(record, free_slots))
        self._made[record.agent_id] = made
        return made[2]

    async def tick(self) -> int:
        """Send the changed sections; returns how many were sent."""
        agents = self._agents()  # records are immutable: a consistent view across slices
        passes = 2 if self.targets.peers else 1
        pause = self._spread_s / max(1, passes * -(-len(agents) // TICK_SLICE))
        site_peers: dict[str, tuple[OverflowTarget, ...]] = {}
        if self.targets.peers:
            self._made = {}
            sites: dict[str, list[OverflowTarget]] = {}
            for start in range(0, len(agents), TICK_SLICE):
                if start:
                    await asyncio.sleep(pause)
                _add_peers(
                    sites, agents[start : start + TICK_SLICE], self._saturation, self._peer_target
                )
            _most_room_first(sites)
            for site, peers in sites.items():
                before = self._site_peers.get(site)
                # equal: the same target objects (compared by identity first), kept as is
                site_peers[site] = before if before == tuple(peers) else tuple(peers)
            self._peer_targets, self._made = self._made, {}
        self._site_peers = site_peers
        wanted_before, self._wanted = self._wanted, {}
        sent = pushed_since = 0
        for index, agent in enumerate(agents):
            if index and not index % TICK_SLICE:
                await asyncio.sleep(pause)
                pushed_since = 0
            elif pushed_since >= PUSH_SLICE:
                await asyncio.sleep(0)
                pushed_since = 0
            if agent.status is not AgentStatus.CONNECTED:
                continue
            agent_id = agent.agent_id
            at_site = site_peers.get(agent.hello.site, ())
            known = wanted_before.get(agent_id)
            if known is not None and known[0] is at_site:
                wanted = known[1]
            else:
                wanted = tuple(t for t in at_site if t.name != agent_id) + self._cloud
            self._wanted[agent_id] = (at_site, wanted)
            if not wanted and agent_id not in self._owned:
                continue
            current = agent.desired.overflow_targets
            if current is not None and current.targets == wanted:
                continue
            try:
                self._set_section(agent_id, OverflowTargetsSection(0, wanted))
            except UnknownAgentError:  # removed meanwhile
                continue
            self._owned.add(agent_id)
            sent += 1
            pushed_since += 1
        self.pushed += sent
        return sent


class FleetOverflowPolicy:
    """The route answer's overflow: the first pool or provider that serves the model."""

    def __init__(self, targets: OverflowTargetsFile) -> None:
        self._targets = targets.cloud_targets()

    def target_for(self, model: str) -> OverflowTarget | None:
        return next((t for t in self._targets if not t.models or model in t.models), None)


def targets_file_for(config: CoordinatorConfig) -> OverflowTargetsFile:
    """The configured pools and providers (none without ``overflow_targets_file``)."""
    if not config.overflow_targets_file:
        return OverflowTargetsFile()
    try:
        return load_targets_file(Path(config.overflow_targets_file).expanduser())
    except OverflowConfigError as exc:
        raise ConfigError(str(exc)) from None


def overflow_policy_for(config: CoordinatorConfig) -> OverflowPolicy:
    if config.overflow_targets_file:
        return FleetOverflowPolicy(targets_file_for(config))
    return StaticOverflowPolicy(config.overflow_name, config.overflow_url)


OVERFLOW_DISTRIBUTOR_KEY = web.AppKey("overflow_distributor", OverflowDistributor)
