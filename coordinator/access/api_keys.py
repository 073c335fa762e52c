"""API keys for client apps: minted here, pushed to agents, checked at the agents.

A key's secret reads ``ef-<key_id>-<random>`` (256 random bits, ``secrets.token_urlsafe``);
it is shown once, when minted, and stored only as its SHA-256 (a fast digest, not a
password hash: the secret is random, and agents check it in microseconds). ``key_id`` is
public (logs, usage, the admin API).

``ApiKeys`` mints, lists, shows and revokes keys in the store. ``KeyDistributor``
turns the active keys into each connected agent's ``keys`` desired-state section and
pushes it: to an agent when it connects, to every connected agent when a key is minted
or revoked, and from a periodic tick (every report interval) that also catches expiries,
changes made by the CLI straight in the database, and rebalanced shares. So a revocation
reaches every connected agent within one report interval (the admin API pushes at once).
The distributor holds the active keys in memory (read from the store by ``load`` and
each tick): an agent's connect and its reports never wait for the store.

Fleet-wide rate limits are approximate by design. Each agent enforces its *share* of a
key's ``requests_per_minute`` and ``tokens_per_minute`` with a local sliding 60-second
window per limit (no round trip per request; agent/auth/keys.py). Shares sum to the key's
budget:

    share(agent) = budget * (FLOOR / n + (1 - FLOOR) * demand(agent) / total demand)

over the ``n`` connected agents, where ``demand`` is an exponentially weighted moving
average (``USAGE_SMOOTHING`` per report interval) of what the agent reported for the key
(requests plus rejected requests for the request budget; prompt plus completion tokens
for the token budget). With no demand anywhere the split is equal (``budget / n``). The
floor (``FLOOR`` = 25 % of the budget, split evenly) lets an idle agent serve a key's first
requests at once. A share moves when it differs from the one last pushed by more than
``RESHARE_TOLERANCE`` (10 %), or when agents come and go; a rebalance alone (no key
changed) re-sends at most ``RESHARE_MAX_FRACTION`` of the agents per report interval
(at least ``RESHARE_MIN_AGENTS``), the largest moves first, so a fleet whose usage keeps
shifting does not turn into a stream of section pushes (5,000 agents with uneven usage
re-sent about 1,150 sections a second before this cap). Consequences: no minute holds
more than the budget while shares stay put; when they move, a key can briefly exceed it by
the shares that moved (an agent keeps its window's last minute under its new share), and
a client that moves to an agent with a small share is refused sooner, until the next
rebalance (within a report interval or two).

With several coordinators on one database (``share_fleet_wide``), ``n`` and the total
demand are the whole fleet's: each coordinator writes its agent count and its agents'
smoothed demand per key every tick and reads the others' (coordinator/store/
key_demand.py), so the shares its agents get, added to the shares the others' agents
get, still sum to the budget (never the budget once per coordinator).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from coordinator.errors import StoreError, UnknownApiKeyError
from coordinator.identity.join_tokens import sha256_hex
from coordinator.store.api_keys import ApiKeyRecord, ApiKeyTable
from coordinator.store.key_demand import FleetDemand, KeyDemandTable
from edgefleet.contract import ApiKey, KeyPolicy, KeysSection, KeyUsage
from edgefleet.key_policy import blocks_a_category

logger = logging.getLogger(__name__)

PRIORITIES = ("high", "normal", "low")
# The largest max_tokens_per_request the wire carries (ApiKey.max_tokens_per_request is a
# uint32); any cap near it is beyond every model's context anyway.
MAX_TOKENS_PER_REQUEST = 2**32 - 1
# The longest keep-alive cap a key may carry (a week): a request's keep_alive only keeps
# an idle model loaded (never protects it from eviction for room), and the agent's own cap
# (residency.max_request_keep_alive_s) bounds it again.
MAX_KEEP_ALIVE_S = 7 * 86_400
SECRET_PREFIX = "ef-"
FLOOR = 0.25
USAGE_SMOOTHING = 0.3
RESHARE_TOLERANCE = 0.10
RESHARE_MAX_FRACTION = 0.05
RESHARE_MIN_AGENTS = 50

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


def check_keep_alive_scopes(max_keep_alive_s: object, may_pin_models: object) -> None:
    """ValueError unless ``max_keep_alive_s`` is seconds in [0, MAX_KEEP_ALIVE_S] (0: the
    agent's own cap) and ``may_pin_models`` a boolean."""
    if (
        isinstance(max_keep_alive_s, bool)
        or not isinstance(max_keep_alive_s, int | float)
        or not 0 <= max_keep_alive_s <= MAX_KEEP_ALIVE_S  # NaN and inf too
    ):
        raise ValueError(
            f"max_keep_alive_s must be seconds within [0, {MAX_KEEP_ALIVE_S:g}] (0: the "
            f"agent's own cap), got {max_keep_alive_s!r}"
        )
    if not isinstance(may_pin_models, bool):
        raise ValueError(f"may_pin_models must be true or false, got {may_pin_models!r}")


@dataclass(frozen=True, slots=True)
class NewApiKey:
    """A key just minted: the secret is only available here."""

    secret: str = field(repr=False)
    record: ApiKeyRecord


class ApiKeys:
    """Mint, list, show and revoke API keys in the store."""

    def __init__(self, store: ApiKeyTable, *, clock: Clock = _now) -> None:
        self._store = store
        self._clock = clock

    async def mint(
        self,
        *,
        name: str = "",
        models: Iterable[str] = (),
        allow_cloud: bool = False,
        max_priority: str = "normal",
        max_tokens_per_request: int = 0,
        requests_per_minute: float = 0.0,
        tokens_per_minute: float = 0.0,
        expires_in: timedelta | None = None,
        max_keep_alive_s: float = 0.0,
        may_pin_models: bool = False,
        policy: KeyPolicy | None = None,
    ) -> NewApiKey:
        """A new key; ValueError for a scope out of range."""
        models = tuple(models)
        check_keep_alive_scopes(max_keep_alive_s, may_pin_models)
        if max_priority not in PRIORITIES:
            raise ValueError(f"max_priority must be high, normal or low, got {max_priority!r}")
        if not 0 <= max_tokens_per_request <= MAX_TOKENS_PER_REQUEST:
            raise ValueError(f"max_tokens_per_request must be within [0, {MAX_TOKENS_PER_REQUEST}]")
        if not (0 <= requests_per_minute < math.inf and 0 <= tokens_per_minute < math.inf):
            raise ValueError("rate limits must be 0 (none) or finite and positive")
        if expires_in is not None and expires_in <= timedelta(0):
            raise ValueError("expires_in must be positive")
        if any(not m or len(m) > 200 or m.count("@") > 1 for m in models) or len(models) > 100:
            raise ValueError("models are up to 100 names, each 'name' or 'name@version'")
        if len(name) > 200:
            raise ValueError("name is at most 200 characters")
        now = self._clock()
        key_id = secrets.token_hex(6)
        secret = f"{SECRET_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"
        record = ApiKeyRecord(
            key_id=key_id,
            secret_sha256=sha256_hex(secret),
            created_at=now,
            name=name,
            models=models,
            allow_cloud=allow_cloud,
            max_priority=max_priority,
            max_tokens_per_request=max_tokens_per_request,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            expires_at=None if expires_in is None else now + expires_in,
            max_keep_alive_s=float(max_keep_alive_s),
            may_pin_models=may_pin_models,
            policy=policy or KeyPolicy(),
        )
        await self._store.add_api_key(record)
        logger.info("API key %s minted (name %r)", key_id, name)
        return NewApiKey(secret=secret, record=record)

    async def list_all(self) -> list[ApiKeyRecord]:
        return await self._store.list_api_keys()

    async def get(self, key_id: str) -> ApiKeyRecord:
        found = next((k for k in await self._store.list_api_keys() if k.key_id == key_id), None)
        if found is None:
            raise UnknownApiKeyError(key_id)
        return found

    async def set_keep_alive(
        self,
        key_id: str,
        *,
        max_keep_alive_s: float | None = None,
        may_pin_models: bool | None = None,
    ) -> ApiKeyRecord:
        """Change a key's keep-alive cap and pin right (None: as it is); ValueError for a
        value out of range, UnknownApiKeyError for no such key."""
        check_keep_alive_scopes(
            0 if max_keep_alive_s is None else max_keep_alive_s,
            False if may_pin_models is None else may_pin_models,
        )
        cap = None if max_keep_alive_s is None else float(max_keep_alive_s)
        if not await self._store.set_api_key_keep_alive(key_id, cap, may_pin_models):
            raise UnknownApiKeyError(key_id)
        record = await self.get(key_id)
        logger.info("API key %s: keep-alive cap %g s, may pin models %s", key_id,
                    record.max_keep_alive_s, record.may_pin_models)  # fmt: skip
        return record

    async def set_policy(self, key_id: str, policy: KeyPolicy) -> ApiKeyRecord:
        """Replace a key's policy (validated by edgefleet.key_policy before it gets here);
        UnknownApiKeyError for no such key."""
        if not await self._store.set_api_key_policy(key_id, policy):
            raise UnknownApiKeyError(key_id)
        logger.info("API key %s: policy changed", key_id)
        return await self.get(key_id)

    async def revoke(self, key_id: str) -> ApiKeyRecord:
        if not await self._store.revoke_api_key(key_id, self._clock()):
            raise UnknownApiKeyError(key_id)
        logger.info("API key %s revoked", key_id)
        return await self.get(key_id)

    async def active(self) -> list[ApiKeyRecord]:
        return self.active_of(await self._store.list_api_keys())

    def active_of(self, keys: Iterable[ApiKeyRecord]) -> list[ApiKeyRecord]:
        now = self._clock()
        return [k for k in keys if k.state(now) == "active"]

    async def add_usage(self, usage: Iterable[tuple[str, int, int, int, int]]) -> None:
        await self._store.add_api_key_usage(list(usage))


@dataclass(slots=True)
class _Demand:
    """One agent's recent use of one key: counts since the last tick, and smoothed rates."""

    requests: int = 0
    tokens: int = 0
    request_rate: float = 0.0
    token_rate: float = 0.0


Push = Callable[[str, KeysSection], object]


class KeyDistributor:
    """Each connected agent's keys section: the active keys with its share of the budgets."""

    def __init__(
        self,
        keys: ApiKeys,
        *,
        set_section: Push,
        current_section: Callable[[str], KeysSection | None],
    ) -> None:
        """``set_section(agent_id, section)`` stores the agent's section in its desired
        state (for its next connect) without pushing it; ``current_section(agent_id)`` is
        the one stored."""
        self._keys = keys
        self._set_section = set_section
        self._current_section = current_section
        self._push: Push | None = None
        self._connected: Callable[[], Collection[str]] = tuple
        # Read from the store by load() and every refresh.
        self._active: list[ApiKeyRecord] = []
        # the active keys by their secret's sha256 (hex), built from _active when it changes
        self._by_digest: tuple[list[ApiKeyRecord], dict[str, ApiKeyRecord]] = ([], {})
        self._known_ids: set[str] = set()
        # Per agent, per key id.
        self._demand: dict[str, dict[str, _Demand]] = {}
        # Built once per refresh: key templates, and key tuples by their shares.
        self._template_keys: list[ApiKey] | None = None
        self._shared: dict[tuple[float, ...], tuple[ApiKey, ...]] = {}
        self._pushed: dict[str, tuple[ApiKey, ...]] = {}
        self._unsaved: dict[str, list[int]] = {}
        self._totals: dict[str, tuple[float, float]] = {}
        self._agent_count = 0
        # Several coordinators: where demand is exchanged, and the others' as last read.
        self._fleet: KeyDemandTable | None = None
        self._coordinator_id = ""
        self._fresh_s = 0.0
        self.others = FleetDemand()

    def policy_of_secret(self, secret: str) -> KeyPolicy | None:
        """The policy of the active key whose secret this is; None when no active key has
        it (route lookups that present a key: coordinator/api/route_lookup.py)."""
        active = self._active
        if self._by_digest[0] is not active:  # the active keys were read again
            self._by_digest = (active, {r.secret_sha256: r for r in active})
        record = self._by_digest[1].get(sha256_hex(secret))
        return None if record is None else record.policy

    def needs_content_safety(self, authorization: str) -> bool:
        """Whether a route lookup presenting ``authorization`` (an ``Authorization`` header
        or gRPC metadata value: ``Bearer ef-...``, the key the client sends to agents) must
        go only to agents that enforce content safety: the active key's policy blocks a
        moderation category. A key this coordinator does not know (revoked, or one an
        agent's own keys file holds) reads as none: the agent accepts or refuses it. Any
        other bearer (an admin token) is not read."""
        scheme, _, secret = authorization.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret.startswith(SECRET_PREFIX):
            return False
        policy = self.policy_of_secret(secret)
        return policy is not None and blocks_a_category(policy)

    def share_fleet_wide(self, table: KeyDemandTable, coordinator_id: str) -> None:
        """Split budgets over every coordinator's agents: exchange demand through
        ``table`` each tick, as ``coordinator_id``."""
        self._fleet = table
        self._coordinator_id = coordinator_id

    async def load(self) -> None:
        """Read the keys from the store (before agents connect)."""
        every = await self._keys.list_all()
        self._active = self._keys.active_of(every)
        self._known_ids = {k.key_id for k in every}
        self._template_keys = None

    def bind(self, push: Push, connected: Callable[[], Collection[str]]) -> None:
        """``push(agent_id, section)`` sets and pushes a live agent's section;
        ``connected()`` names the agents with a live session."""
        self._push = push
        self._connected = connected

    # ----------------------------------------------------------------- shares

    def _sum_demand(self, agents: Collection[str]) -> None:
        """Each key's total demand over ``agents`` (once per refresh, not per agent), and
        the template of each active key (its scopes; shares are filled in per agent)."""
        totals: dict[str, list[float]] = {}
        for agent_id, by_key in self._demand.items():
            if agent_id not in agents:
                continue
            for key_id, demand in by_key.items():
                total = totals.setdefault(key_id, [0.0, 0.0])
                total[0] += demand.request_rate
                total[1] += demand.token_rate
        for key_id, (requests, tokens) in self.others.demand.items():
            total = totals.setdefault(key_id, [0.0, 0.0])
            total[0] += requests
            total[1] += tokens
        self._totals = {k: (v[0], v[1]) for k, v in totals.items()}
        self._agent_count = len(agents) + self.others.agents
        self._shared.clear()

    def _templates(self) -> list[ApiKey]:
        """The active keys as agents get them, before shares (rebuilt when keys change)."""
        if self._template_keys is None:
            self._template_keys = [
                ApiKey(
                    key_id=r.key_id,
                    secret_sha256=bytes.fromhex(r.secret_sha256),
                    models=r.models,
                    allow_cloud=r.allow_cloud,
                    max_priority=r.max_priority,
                    # a key stored before the cap was checked must not fail every
                    # agent's keys section (any cap that large is beyond every context)
                    max_tokens_per_request=min(r.max_tokens_per_request, MAX_TOKENS_PER_REQUEST),
                    requests_per_minute=r.requests_per_minute,
                    tokens_per_minute=r.tokens_per_minute,
                    expires_at_unix=0 if r.expires_at is None else int(r.expires_at.timestamp()),
                    name=r.name,
                    # a cap stored out of range (by hand) reads as the agent's own cap
                    max_keep_alive_s=r.max_keep_alive_s
                    if 0 <= r.max_keep_alive_s <= MAX_KEEP_ALIVE_S
                    else 0.0,
                    may_pin_models=r.may_pin_models,
                    policy=r.policy,
                )
                for r in self._active
            ]
        return self._template_keys

    def _shares(self, agent_id: str, n: int) -> tuple[ApiKey, ...]:
        """The agent's keys with its shares; agents with the same shares (e.g. an equal
        split) get the same tuple, built once per refresh."""
        n = max(1, n)
        templates = self._templates()
        mine = self._demand.get(agent_id, {})
        values: list[float] = []
        for key in templates:
            demand = mine.get(key.key_id)
            totals = self._totals.get(key.key_id, (0.0, 0.0))
            rpm, tpm = key.requests_per_minute, key.tokens_per_minute
            if rpm > 0:
                rpm = _share(rpm, n, 0.0 if demand is None else demand.request_rate, totals[0])
            if tpm > 0:
                tpm = _share(tpm, n, 0.0 if demand is None else demand.token_rate, totals[1])
            values += (rpm, tpm)
        signature = (n, *values)
        found = self._shared.get(signature)
        if found is None:
            found = tuple(
                key
                if (key.requests_per_minute, key.tokens_per_minute) == (rpm, tpm)
                else replace(key, requests_per_minute=rpm, tokens_per_minute=tpm)
                for key, rpm, tpm in zip(templates, values[::2], values[1::2], strict=True)
            )
            self._shared[signature] = found
        return found

    def _section(self, keys: tuple[ApiKey, ...]) -> KeysSection:
        # generation 0: set_section gives it the next of the store's counter
        return KeysSection(generation=0, keys=keys)

    # ------------------------------------------------------------------ events

    def on_connect(self, agent_id: str) -> None:
        """An agent opened a session: set its section (sent with its full desired state).

        Unchanged keys keep their generation (a reconnect re-applies nothing). While no key
        was ever minted here no section is set: no agent can hold keys of ours to drop (the
        first key, minted by the CLI straight in the database, reaches the agents connected
        by then with the next tick's refresh).
        """
        if not self._known_ids:
            return
        # Demand totals from the last refresh: a reconnect storm costs O(keys) per agent.
        keys = self._shares(agent_id, max(len(self._connected()) + self.others.agents, 1))
        current = self._current_section(agent_id)
        if current is None or not _close(current.keys, keys):
            self._set_section(agent_id, self._section(keys))
        else:
            keys = current.keys
        self._pushed[agent_id] = keys

    def on_disconnect(self, agent_id: str) -> None:
        self._pushed.pop(agent_id, None)
        self._demand.pop(agent_id, None)

    def record_usage(self, agent_id: str, usage: Iterable[KeyUsage]) -> None:
        """A load report's per-key usage: counted for shares and for the key's totals."""
        for u in usage:
            if u.key_id not in self._known_ids:
                continue  # an agent cannot grow our tables with made-up key ids
            by_key = self._demand.setdefault(agent_id, {})
            demand = by_key.get(u.key_id)
            if demand is None:
                demand = by_key[u.key_id] = _Demand()
            demand.requests += u.requests + u.rejected
            demand.tokens += u.prompt_tokens + u.completion_tokens
            totals = self._unsaved.setdefault(u.key_id, [0, 0, 0, 0])
            totals[0] += u.requests
            totals[1] += u.prompt_tokens
            totals[2] += u.completion_tokens
            totals[3] += u.rejected

    async def refresh(self, *, force: bool = False) -> int:
        """Reload the active keys and push each connected agent's section when it changed
        (any key added, removed or changed; a share moved by over RESHARE_TOLERANCE).
        Returns the number of agents pushed to."""
        previous = {k.key_id: _without_usage(k) for k in self._active}
        self._active = await self._keys.active()
        self._known_ids |= {k.key_id for k in self._active}
        # usage totals grow every tick: only a change of the keys or their scopes counts
        changed = force or previous != {k.key_id: _without_usage(k) for k in self._active}
        if changed:
            self._template_keys = None
        if self._push is None or not self._known_ids:
            return 0  # no key was ever minted here: no agent holds keys of ours
        agents = set(self._connected())
        self._sum_demand(agents)
        budgets = any(k.requests_per_minute or k.tokens_per_minute for k in self._active)
        if not changed and not budgets:
            return 0  # nothing to share: connecting agents got the set in on_connect
        n = self._agent_count  # the fleet's (this coordinator's and the others')
        if changed:
            for agent_id in agents:
                keys = self._shares(agent_id, n)
                self._push(agent_id, self._section(keys))
                self._pushed[agent_id] = keys
            return len(agents)
        moved: list[tuple[float, str, tuple[ApiKey, ...]]] = []
        for agent_id in agents:
            keys = self._shares(agent_id, n)
            old = self._pushed.get(agent_id)
            if not _close(old, keys):
                moved.append((_largest_move(old, keys), agent_id, keys))
        limit = max(RESHARE_MIN_AGENTS, int(RESHARE_MAX_FRACTION * len(agents)))
        moved.sort(key=lambda m: m[0], reverse=True)
        for _, agent_id, keys in moved[:limit]:
            self._push(agent_id, self._section(keys))
            self._pushed[agent_id] = keys
        return min(len(moved), limit)

    async def tick(self, interval_s: float) -> int:
        """Every report interval: smooth the demand, save usage, push what changed."""
        per_minute = 60.0 / max(interval_s, 1e-3)
        for by_key in self._demand.values():
            for demand in by_key.values():
                demand.request_rate += USAGE_SMOOTHING * (
                    demand.requests * per_minute - demand.request_rate
                )
                demand.token_rate += USAGE_SMOOTHING * (
                    demand.tokens * per_minute - demand.token_rate
                )
                demand.requests = demand.tokens = 0
        await self.save_usage()
        if self._fleet is not None:
            await self._exchange_demand(interval_s)
        return await self.refresh()

    async def _exchange_demand(self, interval_s: float) -> None:
        """Write this coordinator's agent count and demand; read the others' (fresh
        within three report intervals). On a store error the others' last read stays."""
        assert self._fleet is not None
        agents = set(self._connected())
        mine: dict[str, list[float]] = {}
        for agent_id, by_key in self._demand.items():
            if agent_id in agents:
                for key_id, demand in by_key.items():
                    total = mine.setdefault(key_id, [0.0, 0.0])
                    total[0] += demand.request_rate
                    total[1] += demand.token_rate
        try:
            await self._fleet.save_key_demand(
                self._coordinator_id, len(agents), {k: (v[0], v[1]) for k, v in mine.items()}
            )
            self.others = await self._fleet.other_key_demand(
                self._coordinator_id, max(3.0 * interval_s, 3.0)
            )
        except StoreError as exc:
            logger.warning("API key demand: could not exchange with the others: %s", exc)

    async def save_usage(self) -> None:
        unsaved, self._unsaved = self._unsaved, {}
        try:
            await self._keys.add_usage((k, *v) for k, v in unsaved.items())  # type: ignore[misc]
        except BaseException:  # kept for the next save
            for key_id, counts in unsaved.items():
                totals = self._unsaved.setdefault(key_id, [0, 0, 0, 0])
                for i, count in enumerate(counts):
                    totals[i] += count
            raise

    def shares_of(self, key_id: str) -> dict[str, tuple[float, float]]:
        """Each connected agent's (requests/min, tokens/min) share of a key, as pushed."""
        out = {}
        for agent_id, keys in self._pushed.items():
            for key in keys:
                if key.key_id == key_id:
                    out[agent_id] = (key.requests_per_minute, key.tokens_per_minute)
        return out


def _share(budget: float, n: int, mine: float, total: float) -> float:
    """The module docstring's formula: an equal split without demand, else a floor plus
    the rest in proportion to demand."""
    if total <= 0:
        return budget / n
    return budget * (FLOOR / n + (1 - FLOOR) * mine / total)


def _scopes(key: ApiKey) -> tuple[object, ...]:
    return (key.key_id, key.secret_sha256, key.models, key.allow_cloud, key.max_priority,
            key.max_tokens_per_request, key.expires_at_unix, key.name, key.max_keep_alive_s,
            key.may_pin_models)  # fmt: skip


def _without_usage(record: ApiKeyRecord) -> ApiKeyRecord:
    """The record without its usage totals (what agents are sent does not include them)."""
    return replace(record, requests=0, prompt_tokens=0, completion_tokens=0, rejected=0)


def _largest_move(old: tuple[ApiKey, ...] | None, new: tuple[ApiKey, ...]) -> float:
    """How far the largest share moved, relative to the larger of the two (1.0 when the
    keys themselves differ): which agents a capped rebalance serves first."""
    if old is None or len(old) != len(new):
        return 1.0
    largest = 0.0
    for a, b in zip(old, new, strict=True):
        if a.key_id != b.key_id:
            return 1.0
        for x, y in ((a.requests_per_minute, b.requests_per_minute),
                     (a.tokens_per_minute, b.tokens_per_minute)):  # fmt: skip
            if max(x, y) > 0:
                largest = max(largest, abs(x - y) / max(x, y))
    return largest


def _close(old: tuple[ApiKey, ...] | None, new: tuple[ApiKey, ...]) -> bool:
    """Same keys and scopes, every share within RESHARE_TOLERANCE of the one pushed."""
    if old is None or len(old) != len(new):
        return False
    if old is new:
        return True
    for a, b in zip(old, new, strict=True):
        if a is b:
            continue
        if _scopes(a) != _scopes(b):
            return False
        for x, y in ((a.requests_per_minute, b.requests_per_minute),
                     (a.tokens_per_minute, b.tokens_per_minute)):  # fmt: skip
            if abs(x - y) > RESHARE_TOLERANCE * max(x, y):
                return False
    return True
