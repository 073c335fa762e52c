"""gRPC's own I/O threads run behind the event loop (coordinator.grpc_threads): in a
real coordinator process every ``event_engine`` thread has niceness ``grpc_thread_nice``
(10 by default) and the event loop's thread keeps 0; set to 0, nothing is changed. The
metric says how many threads were lowered."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import aiohttp
import pytest

from coordinator.grpc_threads import GRPC_THREAD_NAMES, lower_grpc_threads
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness"),
]


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """Thread id -> (name, niceness) of a process."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            nice = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError):
            continue
        threads[int(task.name)] = (name, nice)
    return threads


async def _lowered(coordinator: CoordinatorProcess) -> float:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics") as response,
    ):
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("edgefleet_coordinator_grpc_threads_lowered "):
            return float(line.split()[1])
    raise AssertionError("no edgefleet_coordinator_grpc_threads_lowered in /metrics")


async def test_grpc_threads_run_at_niceness_10_and_the_loop_at_0() -> None:
    async with CoordinatorProcess() as coordinator:

        async def lowered() -> bool:
            return await _lowered(coordinator) >= 1

        await wait_until(lowered, message="gRPC threads lowered")
        threads = _threads(coordinator.pid)
        grpc_threads = {t: v for t, v in threads.items() if v[0] in GRPC_THREAD_NAMES}
        assert grpc_threads, threads
        # those started after the last look are lowered at the next (every 5 s)
        assert sum(nice == 10 for _, nice in grpc_threads.values()) >= await _lowered(coordinator)
        assert threads[coordinator.pid][1] == 0  # the event loop's thread
        others = [v for v in threads.values() if v[0] not in GRPC_THREAD_NAMES]
        assert all(nice == 0 for _, nice in others), others


async def test_grpc_thread_nice_0_leaves_every_thread_as_it_starts() -> None:
    async with CoordinatorProcess(extra_args=["--set", "grpc_thread_nice=0"]) as coordinator:
        assert await _lowered(coordinator) == 0
        assert all(nice == 0 for _, nice in _threads(coordinator.pid).values())


def test_a_niceness_out_of_range_is_refused_and_0_changes_nothing() -> None:
    before = _threads(os.getpid())
    lower_grpc_threads(0)  # nothing at all
    assert _threads(os.getpid()) == before
    with pytest.raises(ValueError, match=r"0\.\.19"):
        lower_grpc_threads(20)
