"""The fleet store's conformance suite, API-key demand per coordinator (table
``key_demand``): two store instances on one database stand for two coordinators (both
backends). Each sees the sums of the others' rows, never its own, and only rows written
within the freshness window by the database's clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from coordinator.store.interface import FleetStore
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def trio(
    store_factory: StoreFactory,
) -> AsyncIterator[tuple[FleetStore, FleetStore, FleetStore]]:
    stores = (store_factory(), store_factory(), store_factory())
    for s in stores:
        await s.open()
    yield stores
    for s in stores:
        await s.close()


async def test_each_coordinator_sees_the_others_demand_while_fresh(
    trio: tuple[FleetStore, FleetStore, FleetStore],
) -> None:
    a, b, c = trio
    assert (await a.other_key_demand("a", 5.0)).agents == 0
    await a.save_key_demand("a", 3, {"key_1": (30.0, 300.0)})
    await b.save_key_demand("b", 2, {"key_1": (10.0, 100.0), "key_2": (5.0, 0.0)})
    seen_by_c = await c.other_key_demand("c", 5.0)
    assert (seen_by_c.agents, seen_by_c.coordinators) == (5, 2)
    assert dict(seen_by_c.demand) == {"key_1": (40.0, 400.0), "key_2": (5.0, 0.0)}
    seen_by_a = await a.other_key_demand("a", 5.0)
    assert seen_by_a.agents == 2 and dict(seen_by_a.demand) == {
        "key_1": (10.0, 100.0),
        "key_2": (5.0, 0.0),
    }
    # a's rows are replaced, not added to: key_1 gone from a, a count of 1
    await a.save_key_demand("a", 1, {})
    again = await c.other_key_demand("c", 5.0)
    assert again.agents == 3 and dict(again.demand) == {"key_1": (10.0, 100.0), "key_2": (5.0, 0.0)}
    # stale rows (a coordinator that died) stop counting
    await asyncio.sleep(0.4)
    await b.save_key_demand("b", 2, {"key_1": (10.0, 100.0)})
    fresh = await c.other_key_demand("c", 0.3)
    assert (fresh.agents, fresh.coordinators) == (2, 1)
    assert dict(fresh.demand) == {"key_1": (10.0, 100.0)}
