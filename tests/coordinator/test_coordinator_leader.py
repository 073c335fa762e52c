"""Two real coordinator processes on one PostgreSQL database: one leads, the other takes the
leader lease over when the first is frozen (SIGSTOP), and the first steps down when it
resumes (SIGCONT), as its /healthz and metrics say. Defaults on: TLS on gRPC and HTTPS,
enrollment required, an admin token; a short lease (2 s, renewed every 0.5 s) keeps it to
seconds. Takeover is judged by the database's clock (the lease's expiry); the bound checked
here is the lease plus one renewal period, with room for a loaded machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from tests.postgres_cluster import PostgresCluster

pytestmark = pytest.mark.timeout(120)

LEASE_S = 2.0
HEARTBEAT_S = 0.5
# A new leader within the lease plus one renewal period, plus slack for a loaded machine.
TAKEOVER_BOUND_S = LEASE_S + HEARTBEAT_S + 2.0


def _coordinator(url: str, coordinator_id: str) -> CoordinatorProcess:
    return CoordinatorProcess(
        report_interval_ms=200,
        tls=True,
        coordinator_id=coordinator_id,
        extra_args=[
            "--set", f"store_url={url}",
            "--set", f"leader_lease_s={LEASE_S}",
            "--set", f"coordinator_heartbeat_s={HEARTBEAT_S}",
        ],
    )  # fmt: skip


async def _cluster_view(coordinator: CoordinatorProcess) -> dict[str, Any]:
    health = await coordinator.get_json("/healthz")
    view: dict[str, Any] = health["coordinator"]
    return view


async def _metrics(coordinator: CoordinatorProcess) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics", ssl=coordinator.http_context()) as response,
    ):
        text = await response.text()
    wanted = ("members", "is_leader", "lease_epoch")
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(f"edgefleet_coordinator_{name} "):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


async def test_a_frozen_leader_is_replaced_and_steps_down_when_it_resumes(
    postgres_cluster: PostgresCluster,
) -> None:
    url = await asyncio.to_thread(postgres_cluster.create_database)
    async with _coordinator(url, "coord-a") as a:

        async def a_leads() -> bool:
            return bool((await _cluster_view(a))["is_leader"])

        await wait_until(a_leads, timeout_s=10, message="coord-a leads")
        async with _coordinator(url, "coord-b") as b:

            async def b_sees_both() -> bool:
                view = await _cluster_view(b)
                return bool(view["members_alive"] == 2 and view["leader"] == "coord-a")

            await wait_until(b_sees_both, timeout_s=10, message="coord-b sees both, a leading")
            await wait_until(lambda: _members_alive(a, 2), timeout_s=5, message="a sees b")
            view_a, view_b = await _cluster_view(a), await _cluster_view(b)
            assert (view_a["id"], view_b["id"]) == ("coord-a", "coord-b")
            assert (view_a["is_leader"], view_b["is_leader"]) == (True, False)
            epoch = view_a["lease_epoch"]
            assert view_b["lease_epoch"] == epoch >= 1
            assert await _metrics(a) == {"members": 2.0, "is_leader": 1.0, "lease_epoch": epoch}
            assert (await _metrics(b))["is_leader"] == 0.0

            os.kill(a.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:

                async def b_leads() -> bool:
                    return bool((await _cluster_view(b))["is_leader"])

                await wait_until(
                    b_leads, timeout_s=TAKEOVER_BOUND_S + 5, message="coord-b takes over"
                )
                took_s = time.monotonic() - frozen_at
                view_b = await _cluster_view(b)
                assert view_b["lease_epoch"] == epoch + 1 and view_b["leader"] == "coord-b"
                assert took_s <= TAKEOVER_BOUND_S, took_s
                # a, silent for longer than the lease, is dead to b
                await wait_until(lambda: _members_alive(b, 1), timeout_s=5, message="a dead to b")
            finally:
                os.kill(a.pid, signal.SIGCONT)

            # a resumes: its first answer already says it does not lead (its own clock)
            view_a = await _cluster_view(a)
            assert view_a["is_leader"] is False

            async def a_knows_b_leads() -> bool:
                view = await _cluster_view(a)
                return bool(view["leader"] == "coord-b" and view["lease_epoch"] == epoch + 1)

            await wait_until(a_knows_b_leads, timeout_s=10, message="coord-a steps down")
            assert (await _cluster_view(b))["is_leader"] is True

            async def metrics_agree() -> bool:
                after = {"members": 2.0, "lease_epoch": float(epoch + 1)}
                return (await _metrics(a), await _metrics(b)) == (
                    after | {"is_leader": 0.0}, after | {"is_leader": 1.0},
                )  # fmt: skip

            await wait_until(metrics_agree, timeout_s=5, message="both coordinators' metrics")

        # b stopped cleanly: it gave the lease up, a takes it at once (no lease wait)
        stopped_at = time.monotonic()
        await wait_until(a_leads, timeout_s=LEASE_S, message="coord-a leads again")
        assert time.monotonic() - stopped_at < LEASE_S
        assert (await _cluster_view(a))["lease_epoch"] == epoch + 2


async def _members_alive(coordinator: CoordinatorProcess, count: int) -> bool:
    return bool((await _cluster_view(coordinator))["members_alive"] == count)
