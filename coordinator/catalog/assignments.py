"""Which model versions each agent should run, and pushing that to it.

Two layers, both kept in memory and persisted (coordinator/store/assignments.py; each
change is written to the store first):

- rules: ``set_rule(selector, name, version)`` says every agent the selector matches
  (sites, labels, agent ids; an empty selector is the whole fleet) should run
  ``name@version``, agents that join later included. When several rules for one name
  match an agent, the one set most recently wins; setting a rule for the same selector
  replaces it.
- explicit per-agent assignments (``assign``; rollouts move agents one by one with them)
  override the rules for that name until ``clear``.

After any change the affected agents' ModelsSection is rebuilt (each ModelTarget with the
signed manifest from the catalog, the coordinator's blob base URL, the site peers that
hold or are fetching that version, and the rollout id) and pushed on their live session
(``bind``'s push: the servicer's ``set_section``); an agent that is not connected gets it
when it connects (``on_connect``). A section is pushed only when it differs from the one
the agent has.

Several coordinators on one database: each change made here is told to the others
(``bind_changes``: the change feed, coordinator/cluster/changes.py); ``apply_change`` is
their end: read the catalog or the rules and assignments again, and push the sections of
the agents whose sessions are there that changed.

Site peers: connected agents at the same site whose latest inventory lists the version
as on disk, loading, checking or loaded (first), or downloading (after them); at most
``MAX_PEERS``. When an agent's holdings change (its reports, through ``on_report``), the
agents of its site that desire those versions get their peer lists refreshed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from coordinator.catalog.catalog import CATALOG_CHANGES, ModelCatalog, Notify
from coordinator.config import CoordinatorConfig
from coordinator.errors import ModelCatalogError, UnknownAgentError
from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from coordinator.fleet.registry import FleetRegistry
from coordinator.store.assignments import AssignmentRecord, AssignmentTable, RuleRecord
from coordinator.store.changes import Change
from edgefleet.contract import (
    LoadReport,
    ModelInventoryState,
    ModelsSection,
    ModelTarget,
    Residency,
    Section,
)
from edgefleet.model_signing import check_name

logger = logging.getLogger(__name__)

#: Most site peers named in one ModelTarget.
MAX_PEERS = 8
#: Inventory states in which an agent holds every file of a version (a peer to ask first).
HOLDING = frozenset(
    {
        ModelInventoryState.ON_DISK,
        ModelInventoryState.LOADING,
        ModelInventoryState.CHECKING,
        ModelInventoryState.LOADED,
    }
)
#: Also named as a peer (after the holders): it serves what it has verified so far.
FETCHING = frozenset({ModelInventoryState.DOWNLOADING})
BLOB_PATH = "/v1/blobs"

Push = Callable[[str, Section], object]
#: The ``detail`` of a rules or assignments change told to the other coordinators
#: (subject: the model's name, or name@version when one is set).
ASSIGNMENT_CHANGES = ("rule", "rule_cleared", "assigned", "assignment_cleared")


class BlobBaseUrl:
    """The blob base URL agents are sent (ModelTarget.artifact_url): ``blob_base_url``
    from the config, else derived from the HTTP address the server really listens on."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self._fixed = config.blob_base_url.rstrip("/")
        scheme = "https" if config.http_tls_enabled else "http"
        self._derived = _base(scheme, config.http_host, config.http_port)

    def listening(self, scheme: str, host: str, port: int) -> None:
        """Called once the HTTP site listens (the real port when http_port is 0)."""
        self._derived = _base(scheme, host, port)

    def __call__(self) -> str:
        return self._fixed or self._derived

    def http_url(self) -> str:
        """This coordinator's own HTTP address (scheme, host, port), whatever the blobs'."""
        return self._derived.removesuffix(BLOB_PATH)


def _base(scheme: str, host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{BLOB_PATH}"


def residency_of(value: str) -> Residency:
    """A stored residency; one this version does not know reads as on demand."""
    try:
        return Residency(value)
    except ValueError:
        logger.warning("model residency %r is not known here: read as on_demand", value)
        return Residency.ON_DEMAND


@dataclass(frozen=True, slots=True)
class Selector:
    """Which agents: every non-empty field must match (empty fields: no constraint)."""

    sites: tuple[str, ...] = ()
    # "key=value" labels; agents' labels come from their enrollment record (none yet).
    labels: tuple[str, ...] = ()
    agent_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for label in self.labels:
            if "=" not in label:
                raise ValueError(f"label {label!r} must look like key=value")

    def matches(self, record: AgentRecord | None, labels: Iterable[str] = ()) -> bool:
        """``record``: the agent (None: unknown, matches only a selector without sites or
        labels, by id)."""
        if record is None:
            return not self.sites and not self.labels and not self.agent_ids
        if self.agent_ids and record.agent_id not in self.agent_ids:
            return False
        if self.sites and record.hello.site not in self.sites:
            return False
        return not self.labels or set(self.labels) <= set(labels)

    @property
    def everything(self) -> bool:
        return not (self.sites or self.labels or self.agent_ids)

    def key(self) -> str:
        """Canonical JSON (the rule's identity with the model name)."""
        return json.dumps(self.json(), sort_keys=True, separators=(",", ":"))

    def json(self) -> dict[str, list[str]]:
        return {
            "sites": sorted(self.sites),
            "labels": sorted(self.labels),
            "agent_ids": sorted(self.agent_ids),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Selector:
        """From {"sites": [...], "labels": [...], "agent_ids": [...]}; ValueError if bad."""
        fields: dict[str, tuple[str, ...]] = {}
        for name in ("sites", "labels", "agent_ids"):
            value = data.get(name, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"selector.{name} must be a list of strings")
            if len(value) > 10_000 or any(len(v) > 256 for v in value):
                raise ValueError(f"selector.{name} is too long")
            fields[name] = tuple(sorted(set(value)))
        unknown = set(data) - {"sites", "labels", "agent_ids"}
        if unknown:
            raise ValueError(f"selector has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A model version an agent should run, the rollout that set it ("": none), and how
    the agent holds its weights in memory."""

    name: str
    version: str
    rollout_id: str = ""
    residency: Residency = Residency.ON_DEMAND


@dataclass(frozen=True, slots=True)
class Rule:
    seq: int
    name: str
    selector: Selector
    version: str
    rollout_id: str
    set_at: datetime
    residency: Residency = Residency.ON_DEMAND

    def json(self) -> dict[str, Any]:
        return {
            "object": "model_rule",
            "name": self.name,
            "version": self.version,
            "selector": self.selector.json(),
            "rollout_id": self.rollout_id,
            "residency": str(self.residency),
            "set_at": self.set_at.isoformat(),
        }


class ModelAssignments:
    """Rules and explicit assignments; builds and pushes each agent's ModelsSection.

    ``await load()`` before use: it reads the rules and assignments from the store.
    """

    def __init__(
        self,
        store: AssignmentTable,
        catalog: ModelCatalog,
        registry: FleetRegistry,
        *,
        blob_base_url: Callable[[], str],
        labels_of: Callable[[str], tuple[str, ...]] = lambda agent_id: (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._registry = registry
        self._blob_base_url = blob_base_url
        self._labels_of = labels_of
        self._clock = clock
        self._push: Push | None = None
        self._connected: Callable[[], Iterable[str]] | None = None
        self._notify: Notify | None = None
        # name -> rules for it, oldest first (the last match wins).
        self._rules: dict[str, list[Rule]] = {}
        # agent id -> name -> explicit assignment.
        self._explicit: dict[str, dict[str, Assignment]] = {}
        # agent id -> what its last report said it holds: (name, version) -> holding?
        self._holdings: dict[str, dict[tuple[str, str], bool]] = {}
        # One change at a time: each writes the store, then memory, then pushes.
        self._changing = asyncio.Lock()

    def bind(self, push: Push, connected: Callable[[], Iterable[str]] | None = None) -> None:
        """``push(agent_id, section)`` sets a section and sends it on the live session;
        ``connected()``: the agents whose sessions are here (``apply_change`` pushes to
        those only)."""
        self._push = push
        self._connected = connected

    def bind_changes(self, notify: Notify) -> None:
        """After each change made here: ``notify(subject, detail)`` (ASSIGNMENT_CHANGES)."""
        self._notify = notify

    async def load(self) -> None:
        self._replace(
            await self._store.list_model_rules(), await self._store.list_model_assignments()
        )

    def _replace(self, rows: Iterable[RuleRecord], assigned: Iterable[AssignmentRecord]) -> None:
        rules: dict[str, list[Rule]] = {}
        for row in rows:
            rule = Rule(
                seq=row.seq,
                name=row.name,
                selector=Selector.from_json(json.loads(row.selector)),
                version=row.version,
                rollout_id=row.rollout_id,
                set_at=row.set_at,
                residency=residency_of(row.residency),
            )
            rules.setdefault(rule.name, []).append(rule)
        explicit: dict[str, dict[str, Assignment]] = {}
        for a in assigned:
            explicit.setdefault(a.agent_id, {})[a.name] = Assignment(
                a.name, a.version, a.rollout_id, residency_of(a.residency)
            )
        self._rules, self._explicit = rules, explicit

    async def apply_change(self, change: Change) -> None:
        """A change another coordinator made (the change feed's ``models`` kind): read
        the catalog (a version published, deprecated or deleted) or the rules and
        assignments again from the store, then push the sections that changed of the
        agents whose sessions are here."""
        if change.detail in CATALOG_CHANGES:
            await self._catalog.reload()
        async with self._changing:
            if change.detail not in CATALOG_CHANGES:
                self._replace(
                    await self._store.list_model_rules(),
                    await self._store.list_model_assignments(),
                )
                if self._unknown_versions():  # a catalog change not read here (yet)
                    await self._catalog.reload()
            here = None if self._connected is None else self._connected()
            pushed = self.refresh(here)
        if pushed:
            logger.info("model %s %s (another coordinator): pushed to %s", change.subject,
                        change.detail, ", ".join(pushed))  # fmt: skip

    def _unknown_versions(self) -> bool:
        wanted = {(r.name, r.version) for rules in self._rules.values() for r in rules}
        wanted |= {(a.name, a.version) for held in self._explicit.values() for a in held.values()}
        return any(self._catalog.get(name, version) is None for name, version in wanted)

    async def _told(self, subject: str, detail: str) -> None:
        if self._notify is not None:
            await self._notify(subject, detail)

    # ------------------------------------------------------------------ changing

    async def set_rule(
        self,
        selector: Selector,
        name: str,
        version: str,
        rollout_id: str = "",
        residency: Residency | None = None,
    ) -> list[str]:
        """Agents matching ``selector`` without an explicit assignment for ``name`` run
        ``version``, holding it as ``residency`` (None: as the rule it replaces did, else
        as the newest rule for ``name``, else on demand: a rollout keeps what the operator
        chose); returns the agents whose section was pushed."""
        self._check_version(name, version)
        async with self._changing:
            now = self._clock()
            key = selector.key()
            if residency is None:
                before = self._rules.get(name, [])
                same = [r for r in before if r.selector.key() == key]
                residency = (same or before)[-1].residency if before else Residency.ON_DEMAND
            seq = await self._store.set_model_rule(
                name, key, version, rollout_id, now, str(residency)
            )
            rules = [r for r in self._rules.get(name, []) if r.selector.key() != key]
            rules.append(Rule(seq, name, selector, version, rollout_id, now, residency))
            self._rules[name] = rules
            logger.info("model rule: %s -> %s@%s (%s)", key, name, version, residency)
            pushed = self.refresh(self._matching(selector))
        await self._told(f"{name}@{version}", "rule")
        return pushed

    async def clear_rule(self, selector: Selector, name: str) -> list[str]:
        """Drop the rule for exactly this selector and name (agents fall back to older
        rules, or to none); returns the agents whose section was pushed."""
        key = selector.key()
        async with self._changing:
            await self._store.delete_model_rule(name, key)
            self._rules[name] = [r for r in self._rules.get(name, []) if r.selector.key() != key]
            if not self._rules[name]:
                del self._rules[name]
            pushed = self.refresh(self._matching(selector))
        await self._told(name, "rule_cleared")
        return pushed

    def rules(self, name: str | None = None) -> list[Rule]:
        names = sorted(self._rules) if name is None else [name]
        return [r for n in names for r in self._rules.get(n, [])]

    async def assign(
        self,
        agent_ids: Iterable[str],
        name: str,
        version: str,
        rollout_id: str = "",
        residency: Residency | None = None,
    ) -> list[str]:
        """Explicit per-agent override, held as ``residency`` (None: as each agent holds
        ``name`` now, else on demand); returns the agents whose section was pushed."""
        self._check_version(name, version)
        ids = sorted(set(agent_ids))
        async with self._changing:
            now = self._clock()
            chosen = {}
            for agent_id in ids:
                held = self.desired_for(agent_id).get(name) if residency is None else None
                chosen[agent_id] = residency or (
                    held.residency if held is not None else Residency.ON_DEMAND
                )
            await self._store.set_model_assignments([
                AssignmentRecord(agent_id, name, version, rollout_id, now, str(chosen[agent_id]))
                for agent_id in ids
            ])  # fmt: skip
            for agent_id in ids:
                self._explicit.setdefault(agent_id, {})[name] = Assignment(
                    name, version, rollout_id, chosen[agent_id]
                )
            pushed = self.refresh(ids)
        await self._told(f"{name}@{version}", "assigned")
        return pushed

    async def clear(self, agent_ids: Iterable[str], name: str) -> list[str]:
        """Drop explicit assignments (the rules apply again)."""
        ids = sorted(set(agent_ids))
        async with self._changing:
            await self._store.delete_model_assignments(ids, name)
            for agent_id in ids:
                held = self._explicit.get(agent_id)
                if held is not None:
                    held.pop(name, None)
                    if not held:
                        del self._explicit[agent_id]
            pushed = self.refresh(ids)
        await self._told(name, "assignment_cleared")
        return pushed

    def _check_version(self, name: str, version: str) -> None:
        try:
            check_name("model name", name)
            check_name("version", version)
        except ValueError as exc:
            raise ModelCatalogError(str(exc)) from exc
        self._catalog.require(name, version)

    # ------------------------------------------------------------------ reading

    def desired_for(self, agent_id: str) -> dict[str, Assignment]:
        """name -> what the agent should run (explicit assignments over rules)."""
        record = self._record(agent_id)
        labels = self._labels_of(agent_id)
        desired: dict[str, Assignment] = {}
        for name, rules in self._rules.items():
            for rule in reversed(rules):
                if rule.selector.matches(record, labels) or (
                    record is None and agent_id in rule.selector.agent_ids
                    and not rule.selector.sites and not rule.selector.labels
                ):  # fmt: skip
                    desired[name] = Assignment(name, rule.version, rule.rollout_id, rule.residency)
                    break
        desired.update(self._explicit.get(agent_id, {}))
        return desired

    def agents_desiring(self, name: str, version: str) -> set[str]:
        found = set()
        for agent_id in self._known_agents():
            wanted = self.desired_for(agent_id).get(name)
            if wanted is not None and wanted.version == version:
                found.add(agent_id)
        return found

    def agents_holding(self, name: str, version: str) -> set[str]:
        """Agents whose latest inventory lists the version loaded (or being loaded or
        checked), or whose Hello lists it (agents without inventory)."""
        loaded = {
            ModelInventoryState.LOADED,
            ModelInventoryState.LOADING,
            ModelInventoryState.CHECKING,
        }
        found = set()
        for record in self._registry.agents():
            report = record.last_report
            if report is not None and report.inventory:
                if any(i.name == name and i.version == version and i.state in loaded
                       for i in report.inventory):  # fmt: skip
                    found.add(record.agent_id)
            elif any(m.name == name and m.version == version for m in record.hello.models):
                found.add(record.agent_id)
        return found

    def in_use_by(self, name: str, version: str) -> set[str]:
        """Agents that desire the version or have it loaded, and rules that name it
        (as "rule <selector>"): delete is refused while any is left."""
        rules = {f"rule {r.selector.key()}" for r in self.rules(name) if r.version == version}
        return self.agents_desiring(name, version) | self.agents_holding(name, version) | rules

    def section_for(self, agent_id: str, *, peers: _SitePeers | None = None) -> ModelsSection:
        """The agent's ModelsSection now (generation 0: ``refresh`` gives it one)."""
        record = self._record(agent_id)
        site = "" if record is None else record.hello.site
        if peers is None:  # only this agent's site
            peers = _SitePeers(self._registry.find(self._registry.index.at_site(site)))
        base = self._blob_base_url()
        targets = []
        for name, wanted in sorted(self.desired_for(agent_id).items()):
            version = self._catalog.get(name, wanted.version)
            if version is None:
                logger.warning(
                    "agent %s should run %s@%s, which is not in the catalog: left out",
                    agent_id, name, wanted.version,
                )  # fmt: skip
                continue
            targets.append(
                ModelTarget(
                    name=name,
                    version=wanted.version,
                    artifact_url=base,
                    sha256=version.sha256,
                    manifest=version.manifest,
                    signature=version.signature,
                    peer_urls=peers.urls(site, name, wanted.version, agent_id),
                    rollout_id=wanted.rollout_id,
                    residency=wanted.residency,
                )
            )
        return ModelsSection(generation=0, models=tuple(targets))

    # ------------------------------------------------------------------ pushing

    def refresh(self, agent_ids: Iterable[str] | None = None) -> list[str]:
        """Rebuild the sections of ``agent_ids`` (default: every known agent) and push
        those that changed; returns the agents pushed to."""
        ids = self._known_agents() if agent_ids is None else set(agent_ids)
        peers = _SitePeers(self._registry.agents()) if len(ids) > 1 else None
        pushed = []
        for agent_id in sorted(ids):
            if self._update(agent_id, peers, push=True):
                pushed.append(agent_id)
        return pushed

    def on_connect(self, agent_id: str) -> None:
        """An agent's session opened: set its section (sent with the full desired state
        the session starts with, so not pushed separately)."""
        self._holdings.pop(agent_id, None)
        self._update(agent_id, None, push=False)

    def on_report(self, agent_id: str, report: LoadReport) -> None:
        """ReportHooks hook: when what the agent holds changed, refresh the peer lists of
        the agents at its site that desire those versions."""
        holdings = {
            (i.name, i.version): i.state in HOLDING
            for i in report.inventory
            if i.state in HOLDING or i.state in FETCHING
        }
        before = self._holdings.get(agent_id)
        if before == holdings or (before is None and not holdings):
            return
        self._holdings[agent_id] = holdings
        changed = {k for k in holdings.keys() | (before or {}).keys()
                   if holdings.get(k) != (before or {}).get(k)}  # fmt: skip
        record = self._record(agent_id)
        if record is None or not record.hello.site or not changed:
            return
        site = record.hello.site
        affected = []
        for other in self._registry.find(self._registry.index.at_site(site)):
            if other.agent_id == agent_id or other.hello.site != site:
                continue
            desired = self.desired_for(other.agent_id)
            if any((a.name, a.version) in changed for a in desired.values()):
                affected.append(other.agent_id)
        if affected:
            self.refresh(affected)

    def _update(self, agent_id: str, peers: _SitePeers | None, *, push: bool) -> bool:
        try:
            current = self._registry.desired_state(agent_id).models
            self._registry.get(agent_id)
        except UnknownAgentError:
            return False
        if (current is None or not current.models) and not self.desired_for(agent_id):
            return False  # nothing wanted, nothing held: the common case at connect
        section = self.section_for(agent_id, peers=peers)
        if current is not None and current.models == section.models:
            return False
        if current is None and not section.models:
            return False
        # The generation is set by the registry (the store's counter: a restarted
        # coordinator's sections stay newer than what its agents hold).
        if push and self._push is not None:
            self._push(agent_id, section)
        else:
            self._registry.set_section(agent_id, section)
        return True

    # ------------------------------------------------------------------ helpers

    def _record(self, agent_id: str) -> AgentRecord | None:
        try:
            return self._registry.get(agent_id)
        except UnknownAgentError:
            return None

    def _known_agents(self) -> set[str]:
        return {r.agent_id for r in self._registry.agents()} | set(self._explicit)

    def _matching(self, selector: Selector) -> set[str]:
        return {
            r.agent_id
            for r in self._registry.agents()
            if selector.matches(r, self._labels_of(r.agent_id))
        }


class _SitePeers:
    """(site, name, version) -> blob base URLs of connected agents there that hold the
    version (first) or are fetching it, built once per refresh."""

    def __init__(self, records: Iterable[AgentRecord]) -> None:
        self._by_key: dict[tuple[str, str, str], list[tuple[int, str, str]]] = {}
        for record in records:
            hello, report = record.hello, record.last_report
            if (
                not hello.site
                or not hello.http_url
                or report is None
                or record.status is not AgentStatus.CONNECTED
                or record.liveness is Liveness.DOWN
            ):
                continue
            url = hello.http_url.rstrip("/") + BLOB_PATH
            for item in report.inventory:
                if item.state in HOLDING:
                    rank = 0
                elif item.state in FETCHING:
                    rank = 1
                else:
                    continue
                key = (hello.site, item.name, item.version)
                self._by_key.setdefault(key, []).append((rank, record.agent_id, url))

    def urls(self, site: str, name: str, version: str, agent_id: str) -> tuple[str, ...]:
        if not site:
            return ()
        found = sorted(self._by_key.get((site, name, version), []))
        return tuple(url for _, other, url in found if other != agent_id)[:MAX_PEERS]
