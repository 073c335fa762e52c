"""Fixtures for coordinator tests: in-process coordinators, one fresh app per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.coordinator.coordinator_testing import MakeCoordinator, coordinator_factory


@pytest.fixture
async def make_coordinator(tmp_path: Path) -> AsyncIterator[MakeCoordinator]:
    async for make in coordinator_factory(tmp_path):
        yield make
