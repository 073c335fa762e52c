"""Both store backends for one test: the conformance suite's fixtures.

``store_factory`` (parametrized: ``sqlite``, ``postgres``) makes stores on one location
(a data directory's SQLite file, or a fresh database on the test cluster:
tests/postgres_cluster.py), as often as a test wants (reopening, a second coordinator's
connection); ``store`` is one of them, opened. A test that uses them runs once per
backend, so everything that passes on SQLite is shown to pass on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from coordinator.store.interface import FleetStore
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.sqlite import SQLiteFleetStore

BACKENDS = ("sqlite", "postgres")

#: ``make(**options)``: a new, unopened store on this test's location.
StoreFactory = Callable[..., FleetStore]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if backend == "sqlite":
        return lambda **options: SQLiteFleetStore.in_directory(tmp_path, **options)
    url = request.getfixturevalue("postgres_url")
    return lambda **options: PostgresFleetStore(url, **options)


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[FleetStore]:
    opened = store_factory()
    await opened.open()
    yield opened
    await opened.close()


def on_both_stores(metafunc: pytest.Metafunc) -> None:
    """``pytest_generate_tests = on_both_stores`` in a test module: its tests that use the
    ``make_coordinator`` fixture (tests/coordinator/conftest.py) run once per backend."""
    if "make_coordinator" in metafunc.fixturenames:
        metafunc.parametrize("make_coordinator", BACKENDS, indirect=True)
