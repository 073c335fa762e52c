"""API-key budgets split over the whole fleet when several coordinators share a database.

Two key distributors on one database (both backends) stand for coordinators A (three
agents) and B (one agent). A key of 600 requests/min: the four agents' shares, pushed by
two coordinators, sum to 600 (not 600 per coordinator, LiteLLM's replica failure); demand
through B's agent moves share towards it, the sum staying the budget; when B stops
writing (it died), A's agents share the whole budget again once B's rows are stale.
"""

from __future__ import annotations

import asyncio

import pytest

from coordinator.access.api_keys import ApiKeys, KeyDistributor
from coordinator.store.interface import FleetStore
from edgefleet.contract import KeysSection, KeyUsage
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)

BUDGET = 600.0
INTERVAL_S = 1.0  # the report interval the distributors tick at (stale after 3 s)


def _distributor(
    store: FleetStore, name: str, agents: list[str]
) -> tuple[KeyDistributor, dict[str, KeysSection]]:
    sections: dict[str, KeysSection] = {}

    def push(agent_id: str, section: KeysSection) -> None:  # type: ignore[misc]
        sections[agent_id] = section

    distributor = KeyDistributor(
        ApiKeys(store),
        set_section=push,
        current_section=sections.get,  # type: ignore[arg-type]
    )
    distributor.bind(push, lambda: agents)  # type: ignore[arg-type]
    distributor.share_fleet_wide(store, name)
    return distributor, sections


def _rpm(sections: dict[str, KeysSection], key_id: str) -> dict[str, float]:
    return {
        agent: key.requests_per_minute
        for agent, section in sections.items()
        for key in section.keys
        if key.key_id == key_id
    }


async def test_shares_sum_to_the_budget_over_every_coordinators_agents(
    store_factory: StoreFactory,
) -> None:
    a_store, b_store = store_factory(), store_factory()
    await a_store.open()
    await b_store.open()
    try:
        key_id = (
            await ApiKeys(a_store).mint(name="shared", requests_per_minute=BUDGET)
        ).record.key_id
        a, a_sections = _distributor(a_store, "coord-a", ["a1", "a2", "a3"])
        b, b_sections = _distributor(b_store, "coord-b", ["b1"])
        for d in (a, b):
            await d.load()
        for _ in range(2):  # each reads what the other wrote
            await a.tick(INTERVAL_S)
            await b.tick(INTERVAL_S)
        await a.refresh(force=True)
        shares = _rpm(a_sections, key_id) | _rpm(b_sections, key_id)
        assert shares == pytest.approx({"a1": 150.0, "a2": 150.0, "a3": 150.0, "b1": 150.0})

        # demand through B's agent: its share grows, the fleet's sum stays the budget
        for _ in range(6):
            b.record_usage("b1", [KeyUsage(key_id, requests=200)])
            a.record_usage("a1", [KeyUsage(key_id, requests=10)])
            await b.tick(INTERVAL_S)
            await a.tick(INTERVAL_S)
        await a.refresh(force=True)
        await b.refresh(force=True)
        shares = _rpm(a_sections, key_id) | _rpm(b_sections, key_id)
        assert shares["b1"] > 300.0, shares
        assert sum(shares.values()) == pytest.approx(BUDGET, rel=0.02), shares

        # B dies: once its rows are stale, A's three agents share the whole budget
        await asyncio.sleep(3.2)
        await a.tick(INTERVAL_S)
        await a.refresh(force=True)
        assert a.others.agents == 0
        assert sum(_rpm(a_sections, key_id).values()) == pytest.approx(BUDGET, rel=0.02)
    finally:
        await a_store.close()
        await b_store.close()
