"""In-memory stand-ins for the model catalog's interfaces (MODELSYNC.md), for the rollout
tests while the catalog branch is not merged: ModelCatalog.get, ModelAssignments
(set_rule / assign / clear / desired_for / agents_desiring) and Selector. Tests only:
the product code takes the real ones as constructor arguments.

They keep the interface's semantics: an explicit per-agent assignment wins over a rule;
among rules for a model, the last one set that matches the agent wins; every change is
recorded in ``changes`` (what the real layer would push as a ModelsSection).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coordinator.fleet.records import AgentRecord
from coordinator.fleet.registry import FleetRegistry


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    name: str
    version: str
    deprecated: bool = False


class StandinCatalog:
    def __init__(self, *versions: tuple[str, str]) -> None:
        self.entries = {(n, v): CatalogVersion(n, v) for n, v in versions}

    def get(self, name: str, version: str) -> CatalogVersion | None:
        return self.entries.get((name, version))


@dataclass(frozen=True, slots=True)
class Selector:
    sites: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    agent_ids: tuple[str, ...] = ()

    def matches(self, record: AgentRecord) -> bool:
        if self.sites and record.hello.site not in self.sites:
            return False
        if self.agent_ids and record.agent_id not in self.agent_ids:
            return False
        return not self.labels  # these agents carry no labels


@dataclass(frozen=True, slots=True)
class Assignment:
    name: str
    version: str
    rollout_id: str = ""


@dataclass
class StandinAssignments:
    # The fleet registry (None until bound: create_app makes the registry after the
    # rollout engine's collaborators are given to it).
    registry: FleetRegistry | None = None
    rules: list[tuple[Selector, Assignment]] = field(default_factory=list)
    explicit: dict[tuple[str, str], Assignment] = field(default_factory=dict)
    changes: list[tuple[str, tuple[str, ...], str, str]] = field(default_factory=list)

    async def set_rule(
        self, selector: Selector, name: str, version: str, rollout_id: str = ""
    ) -> None:
        self.rules = [(s, a) for s, a in self.rules if not (s == selector and a.name == name)]
        self.rules.append((selector, Assignment(name, version, rollout_id)))
        self.changes.append(("rule", (), name, version))

    async def assign(
        self, agent_ids: Iterable[str], name: str, version: str, rollout_id: str = ""
    ) -> None:
        ids = tuple(agent_ids)
        for agent_id in ids:
            self.explicit[(agent_id, name)] = Assignment(name, version, rollout_id)
        self.changes.append(("assign", ids, name, version))

    async def clear(self, agent_ids: Iterable[str], name: str) -> None:
        ids = tuple(agent_ids)
        for agent_id in ids:
            self.explicit.pop((agent_id, name), None)
        self.changes.append(("clear", ids, name, ""))

    def desired_for(self, agent_id: str) -> dict[str, Assignment]:
        out: dict[str, Assignment] = {}
        records = self._registry().find([agent_id])
        if records:
            for selector, assignment in self.rules:
                if selector.matches(records[0]):
                    out[assignment.name] = assignment
        for (agent, name), assignment in self.explicit.items():
            if agent == agent_id:
                out[name] = assignment
        return out

    def agents_desiring(self, name: str, version: str) -> set[str]:
        return {
            r.agent_id
            for r in self._registry().agents()
            if (a := self.desired_for(r.agent_id).get(name)) is not None and a.version == version
        }

    def _registry(self) -> FleetRegistry:
        if self.registry is None:
            raise RuntimeError("bind the stand-in to the app's registry first")
        return self.registry
