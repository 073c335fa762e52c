"""Routing: nearer first, less loaded of two equally near, never down/draining/saturated."""

from __future__ import annotations

from datetime import UTC, datetime

import aiohttp
import pytest
from coordinator_testing import MakeCoordinator, hello

from coordinator.app_keys import REGISTRY_KEY
from coordinator.fleet import (
    AgentHello,
    AgentRecord,
    AgentStatus,
    Liveness,
    LoadedModel,
    LoadReport,
    Location,
)
from coordinator.route_scorer import RouteQuery, RouteScorer, great_circle_km
from devtools.process import wait_until
from edgefleet.v1 import fleet_pb2 as pb

pytestmark = pytest.mark.timeout(30)

BERLIN = Location(52.52, 13.405)
POTSDAM = Location(52.39, 13.06)
MUNICH = Location(48.14, 11.58)


def record(
    agent_id: str,
    location: Location | None,
    *,
    site: str = "",
    queue: int = 0,
    kv: float = 0.0,
    tps: float = 50.0,
    liveness: Liveness = Liveness.LIVE,
    draining: bool = False,
    version: str = "v1",
) -> AgentRecord:
    now = datetime.now(UTC)
    return AgentRecord(
        hello=AgentHello(
            agent_id=agent_id,
            site=site,
            http_url=f"http://{agent_id}:8000",
            location=location,
            models=(LoadedModel("m", version),),
        ),
        status=AgentStatus.CONNECTED,
        session_id="s",
        connected_since=now,
        last_seen=now,
        last_report=LoadReport(
            timestamp=now, queue_depth=queue, kv_cache_used_fraction=kv, tokens_per_second=tps
        ),
        liveness=liveness,
        draining=draining,
    )


def ranked_ids(records: list[AgentRecord], query: RouteQuery) -> list[str]:
    return [a.agent_id for a in RouteScorer().rank(records, query).agents]


def test_great_circle_distance() -> None:
    assert great_circle_km(BERLIN, MUNICH) == pytest.approx(504, abs=5)


def test_picks_the_nearer_agent() -> None:
    agents = [record("munich", MUNICH), record("potsdam", POTSDAM)]
    assert ranked_ids(agents, RouteQuery("m", location=BERLIN)) == ["potsdam", "munich"]


def test_same_site_comes_first() -> None:
    agents = [record("near", POTSDAM, site="b"), record("site", MUNICH, site="a")]
    assert ranked_ids(agents, RouteQuery("m", location=BERLIN, site="a"))[0] == "site"


def test_less_loaded_of_two_equally_near() -> None:
    agents = [record("busy", BERLIN, queue=6, kv=0.7), record("idle", BERLIN, queue=1, kv=0.1)]
    decision = RouteScorer().rank(agents, RouteQuery("m", location=BERLIN))
    assert [a.agent_id for a in decision.agents] == ["idle", "busy"]
    idle, busy = decision.agents
    assert idle.score_parts["queue"] == 1.0 and busy.score_parts["queue"] == 0.0
    assert idle.predicted_wait_ms < busy.predicted_wait_ms


def test_client_rtt_overrides_distance() -> None:
    agents = [record("far", MUNICH), record("near", POTSDAM)]
    query = RouteQuery("m", location=BERLIN, client_rtt_ms={"far": 1.0, "near": 80.0})
    assert ranked_ids(agents, query) == ["far", "near"]


def test_never_down_draining_saturated_or_excluded() -> None:
    agents = [
        record("down", BERLIN, liveness=Liveness.DOWN),
        record("draining", BERLIN, draining=True),
        record("full-queue", BERLIN, queue=64),
        record("full-kv", BERLIN, kv=0.99),
        record("excluded", BERLIN),
        record("old-version", BERLIN, version="v0"),
        record("suspect", BERLIN, liveness=Liveness.SUSPECT),
        record("ok", MUNICH),
    ]
    query = RouteQuery("m", version="v1", location=BERLIN, exclude=frozenset({"excluded"}))
    decision = RouteScorer().rank(agents, query)
    assert [a.agent_id for a in decision.agents] == ["ok", "suspect"]
    assert decision.excluded == {
        "down": 1,
        "draining": 1,
        "saturated": 2,
        "excluded_by_client": 1,
        "model_not_loaded": 1,
    }


def test_max_wait_excludes_agents_that_cannot_start_in_time() -> None:
    agents = [record("slow", BERLIN, queue=10, tps=10.0)]  # 10 x 128 tokens / 10 tok/s = 128 s
    decision = RouteScorer().rank(agents, RouteQuery("m", max_wait_ms=5000))
    assert decision.agents == () and decision.excluded == {"over_max_wait": 1}


async def test_route_over_grpc_and_http_with_overflow_placeholder(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator(overflow_name="gpu-pool-eu", overflow_url="http://gpu.example/v1")
    calls = []
    for agent_id, where in [("berlin", BERLIN), ("munich", MUNICH)]:
        call = c.stub.Session()
        await call.write(hello(agent_id, location=pb.Location(lat=where.lat, lon=where.lon)))
        await call.read()
        await call.write(pb.AgentMessage(load_report=pb.LoadReport()))
        calls.append(call)
    await wait_until(
        lambda: all(r.last_report for r in c.app[REGISTRY_KEY].agents()), message="reports"
    )
    answer = await c.stub.Route(
        pb.RouteRequest(model="m", client_location=pb.Location(lat=52.4, lon=13.1))
    )
    assert [a.agent_id for a in answer.agents] == ["berlin", "munich"]
    assert answer.agents[0].HasField("distance_km") and answer.agents[0].liveness == "live"
    assert set(answer.agents[0].score_parts) >= {"proximity", "queue", "kv", "wait"}

    async with aiohttp.ClientSession() as http:
        munich = {"model": "m", "lat": "48.1", "lon": "11.6"}
        async with http.get(c.http_url + "/v1/route", params=munich) as response:
            body = await response.json()
        assert [a["agent_id"] for a in body["agents"]] == ["munich", "berlin"]
        async with http.get(c.http_url + "/v1/route", params={"model": "nope"}) as response:
            body = await response.json()
        assert body["agents"] == []
        assert body["overflow"]["name"] == "gpu-pool-eu"
        assert "overflow to gpu-pool-eu" in body["reason"]
        async with http.get(c.http_url + "/v1/route", params={"lat": "1"}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "model"
        # One gRPC and two HTTP lookups answered, each counted and timed once (the
        # malformed request never reached the router).
        async with http.get(c.http_url + "/metrics") as response:
            metrics = await response.text()
    assert "edgefleet_coordinator_route_requests_total 3.0" in metrics
    assert "edgefleet_coordinator_route_seconds_count 3.0" in metrics
    for call in calls:
        call.cancel()
