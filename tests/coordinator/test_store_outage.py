"""A coordinator on PostgreSQL whose database becomes slow, then goes away, then comes back.

Real processes: a PostgreSQL cluster of this test's own (tests/postgres_cluster.py), a
coordinator on it (API keys on, the defaults), two agents serving the tiny model. The
database is frozen (every server process SIGSTOPped: it accepts nothing and answers
nothing), then stopped for real (pg_ctl stop), then started again. Throughout: route
lookups answer, agents keep their sessions (no reconnect) and are never shown down, admin
writes get a clear 503 (the admin API's error body, Retry-After) within the store's
timeouts, /healthz says degraded; and once the database is back, without a restart, the
request records the agents sent during the outage (acknowledged only once stored) and
their live state are in the database, and /healthz says ok again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil  # type: ignore[import-untyped, unused-ignore]
import psycopg
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until
from tests.postgres_cluster import PostgresCluster

AGENTS = {"edge-paris": (48.86, 2.35), "edge-berlin": (52.52, 13.40)}
STATEMENT_TIMEOUT_S = 1.0
LIVE = "live/connected"
# What a store call may take at most when the server answers nothing: its statement
# timeout, as long again for a connection, and the pool's client-side grace (pool.py).
CALL_LIMIT_S = STATEMENT_TIMEOUT_S * 2 + 2.0


def _server_processes(cluster: PostgresCluster) -> list[psutil.Process]:
    pid = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    return [postmaster, *postmaster.children(recursive=True)]


@contextlib.contextmanager
def frozen(cluster: PostgresCluster) -> Any:
    """Every process of the server stopped (SIGSTOP) for the block: a database that takes
    connections into its backlog and answers nothing, as a hung server does."""
    processes = _server_processes(cluster)
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)


async def _get(coordinator: CoordinatorProcess, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + path) as response,
    ):
        return response.status, await response.json()


async def _route(coordinator: CoordinatorProcess) -> list[str]:
    """Route lookups (public) for the tiny model; the agents answered, nearest first."""
    started = time.monotonic()
    status, body = await _get(coordinator, "/v1/route?model=tiny-llama&lat=48.8&lon=2.3")
    assert status == 200, body
    assert time.monotonic() - started < 0.5  # from memory, never waiting for the database
    return [a["agent_id"] for a in body["agents"]]


async def _admin_write(coordinator: CoordinatorProcess) -> tuple[int, dict[str, str], Any, float]:
    """Mint an API key (a write the database must take): status, headers, body, seconds."""
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.post(coordinator.http_url + "/v1/admin/keys", json={"name": "in-outage"}) as response,
    ):
        body = await response.json()
        return response.status, dict(response.headers), body, time.monotonic() - started


def _assert_store_unavailable(status: int, headers: dict[str, str], body: Any, took: float) -> None:
    assert status == 503, body
    assert headers["Retry-After"] == "5"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "store_unavailable"
    assert body["error"]["type"] == "server_error"
    assert body["error"]["message"].startswith("The fleet database is unavailable")
    assert took < CALL_LIMIT_S + 1.0  # bounded by the store's timeouts, never a hang


async def _statuses(coordinator: CoordinatorProcess) -> dict[str, str]:
    """Each agent's liveness and session, as the fleet view shows them."""
    return {a["agent_id"]: f"{a['liveness']}/{a['status']}" for a in await coordinator.agents()}


async def _metric(coordinator: CoordinatorProcess, line_start: str) -> float:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics") as response,
    ):
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start!r}")


async def _chat(agent: AgentProcess, api_key: str) -> None:
    async with (
        aiohttp.ClientSession(headers=agent.headers(api_key)) as http,
        http.post(
            agent.url + "/v1/chat/completions",
            json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
        ) as response,
    ):  # fmt: skip
        assert response.status == 200, await response.text()


def _stored(url: str) -> tuple[int, dict[str, float]]:
    """Request records in the database, and each agent's last saved live state's time."""
    with psycopg.connect(url, connect_timeout=5) as db:
        records = db.execute("SELECT count(*) FROM request_records").fetchone()
        states = db.execute("SELECT agent_id, saved_at FROM agent_last_state").fetchall()
    assert records is not None
    return int(records[0]), {agent_id: float(saved) for agent_id, saved in states}


@pytest.mark.slow  # 18 s: PostgreSQL slowed, then stopped and started again
@pytest.mark.postgres  # a cluster of its own
async def test_postgres_slow_then_away_stops_nothing_that_serves_and_catches_up(
    tiny_artifacts: Path,
) -> None:
    cluster = await asyncio.to_thread(PostgresCluster.start)
    agents: list[AgentProcess] = []
    try:
        url = await asyncio.to_thread(cluster.create_database)
        async with CoordinatorProcess(
            report_interval_ms=200,
            extra_args=["--set", f"store_url={url}",
                        "--set", f"store_statement_timeout_s={STATEMENT_TIMEOUT_S}"],
        ) as coordinator:  # fmt: skip
            for agent_id, (lat, lon) in AGENTS.items():
                agents.append(AgentProcess(
                    models_dir=str(tiny_artifacts), serve=["tiny-llama"], agent_id=agent_id,
                    coordinator=coordinator.grpc_target, site=agent_id, lat=lat, lon=lon,
                ))  # fmt: skip
            await asyncio.gather(*(agent.start() for agent in agents))
            api_key = await coordinator.api_key_for(agents)
            await wait_until(
                lambda: _statuses_are(coordinator, LIVE), timeout_s=20, message="agents live"
            )
            health = (await _get(coordinator, "/healthz"))[1]
            assert health["status"] == "ok" and health["store"]["backend"] == "postgresql"
            sessions = await _metric(coordinator, "edgefleet_coordinator_sessions_total")
            served = 0

            # --- slow: the server answers nothing
            with frozen(cluster):
                for _ in range(2):  # served at once, recorded behind
                    await _chat(agents[0], api_key)
                    served += 1
                assert await _route(coordinator) == ["edge-paris", "edge-berlin"]
                _assert_store_unavailable(*await _admin_write(coordinator))
                await wait_until(
                    lambda: _health_is(coordinator, "degraded"), timeout_s=5,
                    message="/healthz degraded while the database is frozen",
                )  # fmt: skip
                assert await _route(coordinator) == ["edge-paris", "edge-berlin"]
                assert set((await _statuses(coordinator)).values()) == {LIVE}

            # the server thawed: answered again, without a restart of anything
            await wait_until(
                lambda: _health_is(coordinator, "ok"), timeout_s=15,
                message="/healthz ok once the database answers again",
            )  # fmt: skip

            # --- away: the server stopped
            await asyncio.to_thread(cluster.stop_server)
            outage_started = time.time()
            _assert_store_unavailable(*await _admin_write(coordinator))
            for agent in agents:
                for _ in range(3):
                    await _chat(agent, api_key)
                    served += 1
            for _ in range(10):  # several liveness windows (down after 5 reports: 1 s)
                assert await _route(coordinator) == ["edge-paris", "edge-berlin"]
                assert set((await _statuses(coordinator)).values()) == {LIVE}
                await asyncio.sleep(0.3)
            health = (await _get(coordinator, "/healthz"))[1]
            assert health["status"] == "degraded"
            store = health["store"]
            assert store["last_error"] and store["down_since"] and store["outages"] == 2
            assert store["pending_writes"] > 0  # the records sent meanwhile, kept
            assert await _metric(coordinator, "edgefleet_coordinator_store_up") == 0.0
            assert await _metric(
                coordinator, 'edgefleet_coordinator_agents{site="",status="down"}'
            ) == 0.0  # fmt: skip

            # --- back: no restart of anything
            await asyncio.to_thread(cluster.restart)
            await wait_until(
                lambda: _health_is(coordinator, "ok"), timeout_s=15,
                message="/healthz ok once the database is back",
            )  # fmt: skip

            async def caught_up() -> bool:
                records, states = await asyncio.to_thread(_stored, url)
                return records >= served and all(
                    states.get(agent_id, 0.0) > outage_started for agent_id in AGENTS
                )

            await wait_until(caught_up, timeout_s=20, message="records and live state written")
            records, _ = await asyncio.to_thread(_stored, url)
            assert records == served  # each once (stored by agent and seq)
            status, body = await _get(coordinator, "/v1/admin/request-records?limit=100")
            assert status == 200 and len(body["data"]) == served

            async def nothing_kept() -> bool:
                store = (await _get(coordinator, "/healthz"))[1]["store"]
                assert store["dropped_writes"] == 0 and store["deferred_writes"] == 0
                return bool(store["pending_writes"] == 0)

            await wait_until(nothing_kept, timeout_s=10, message="every kept write written")
            # the audit entries of the refused writes, kept and appended once it was back
            status, body = await _get(coordinator, "/v1/admin/audit?limit=1000")
            refused = [e for e in body["data"] if e["action"] == "POST /v1/admin/keys"]
            assert [e["status"] for e in refused][-2:] == [503, 503], refused
            # the agents kept their sessions: none reconnected, none needed the database
            assert await _metric(coordinator, "edgefleet_coordinator_sessions_total") == sessions
            status, _, body, _ = await _admin_write(coordinator)
            assert status == 201, body
    finally:
        for agent in agents:
            if agent.returncode is None:
                await agent.terminate()
        with contextlib.suppress(Exception):
            for process in _server_processes(cluster):
                process.send_signal(signal.SIGCONT)
        await asyncio.to_thread(cluster.stop)
        assert os.path.exists(cluster.root) is False


async def _statuses_are(coordinator: CoordinatorProcess, wanted: str) -> bool:
    statuses = await _statuses(coordinator)
    return len(statuses) == len(AGENTS) and set(statuses.values()) == {wanted}


async def _health_is(coordinator: CoordinatorProcess, wanted: str) -> bool:
    return bool((await _get(coordinator, "/healthz"))[1]["status"] == wanted)
