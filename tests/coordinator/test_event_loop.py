"""The coordinator's event loop: uvloop by default (a dependency), asyncio's on request,
and a clear refusal when uvloop is asked for but missing."""

from __future__ import annotations

import sys

import aiohttp
import pytest

from coordinator.errors import ConfigError
from coordinator.event_loop import runner_for
from devtools.fleet import CoordinatorProcess

pytestmark = pytest.mark.timeout(60)


def test_auto_runs_on_uvloop_when_installed_and_asyncio_when_asked() -> None:
    import asyncio

    import uvloop

    assert runner_for("auto") == ("uvloop", uvloop.run)
    assert runner_for("uvloop") == ("uvloop", uvloop.run)
    assert runner_for("asyncio") == ("asyncio", asyncio.run)


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert runner_for("auto") == ("asyncio", asyncio.run)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        runner_for("uvloop")


async def _loop_info(coordinator: CoordinatorProcess) -> list[str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{coordinator.http_url}/metrics", headers=coordinator.admin_headers
        ) as response,
    ):
        assert response.status == 200
        text = await response.text()
    return [
        line
        for line in text.splitlines()
        if line.startswith("edgefleet_coordinator_event_loop_info{")
    ]


@pytest.mark.parametrize(
    ("args", "loop"), [((), "uvloop"), (("--set", "event_loop=asyncio"), "asyncio")]
)
async def test_the_coordinator_process_says_which_loop_it_runs_on(
    args: tuple[str, ...], loop: str
) -> None:
    async with CoordinatorProcess(extra_args=args) as coordinator:
        assert await _loop_info(coordinator) == [
            f'edgefleet_coordinator_event_loop_info{{loop="{loop}"}} 1.0'
        ]
        assert any(f"event loop: {loop}" in line for line in coordinator.log)
