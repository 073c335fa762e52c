"""Fixtures for coordinator tests: in-process coordinators, one fresh app per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.coordinator.coordinator_testing import MakeCoordinator, coordinator_factory


@pytest.fixture
async def make_coordinator(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[MakeCoordinator]:
    """In-process coordinators on SQLite; a module that marks itself with
    ``pytest.mark.parametrize("make_coordinator", BACKENDS, indirect=True)``
    (tests/coordinator/store_backends.py) runs each test on PostgreSQL too (a fresh
    database per data_dir on the test cluster)."""
    backend = getattr(request, "param", "sqlite")
    new_database = None
    if backend == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
        new_database = cluster.create_database
    async for make in coordinator_factory(tmp_path, new_database):
        yield make
