"""The dashboard's server side: the fleet series (percentiles from merged histogram
buckets), cookie sessions (HttpOnly, SameSite=Strict, expiry, revocation, Origin check),
static files under a CSP limited to the coordinator, and the new /metrics families."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from coordinator.api.dashboard import COOKIE, CSP, VENDOR_DIR
from coordinator.api.events import EVENTS_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.fleet.series import (
    HOUR_POINTS,
    MAX_AGENT_SERIES,
    STEP_S,
    AgentSeries,
    FleetSeries,
    histogram_quantile,
)
from edgefleet.contract import Histogram, KeyUsage, LoadReport, ModelStats, OverflowUsage

pytestmark = pytest.mark.timeout(60)

ADMIN_TOKEN = "dashboard-admin-token-of-32-chars-at-least"
BOUNDS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def _histogram(values: list[float]) -> Histogram:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[next((i for i, b in enumerate(BOUNDS) if v <= b), len(BOUNDS))] += 1
    return Histogram(BOUNDS, tuple(counts), sum(values))


def _report(
    values: list[float], *, requests: int = 0, tokens: int = 0, rejected: int = 0
) -> LoadReport:
    stats = ModelStats(
        "m",
        "v1",
        requests=requests or len(values),
        completion_tokens=tokens,
        ttft_seconds=_histogram(values),
    )
    usage = (KeyUsage("k1", rejected=rejected),) if rejected else ()
    return LoadReport(model_stats=(stats,), key_usage=usage)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_percentiles_come_from_merged_buckets_not_averaged_percentiles() -> None:
    """One fast agent with many requests and one slow agent with few: the fleet p50 is the
    fast agent's, and the p99 the slow agent's, as the merged buckets say; the mean of the
    two agents' p50s would be far off."""
    clock = Clock()
    series = FleetSeries(clock=clock)
    fast = [0.015] * 980
    slow = [1.5] * 20
    series.record(_report(fast, tokens=5000))
    series.record(_report(slow, tokens=50, rejected=3))
    clock.now += STEP_S
    point = series.points()[-1]
    assert point["requests_per_s"] == pytest.approx(1000 / STEP_S)
    assert point["tokens_per_s"] == pytest.approx(5050 / STEP_S)  # completion tokens
    assert point["rejections_per_s"] == pytest.approx(3 / STEP_S)
    assert point["ttft_observations"] == 1000
    assert 0.01 <= point["ttft_p50_s"] <= 0.02  # the fast bucket
    assert 1.0 <= point["ttft_p99_s"] <= 2.0  # the slow bucket holds the top 1 %
    averaged_p50 = (0.015 + 1.5) / 2
    assert abs(point["ttft_p50_s"] - averaged_p50) > 0.5


def test_quantile_matches_the_exact_value_within_its_bucket() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(-2.5, 0.8) for _ in range(5000)]
    histogram = _histogram(values)
    exact = sorted(values)
    for q in (0.5, 0.9, 0.99):
        got = histogram_quantile(list(BOUNDS), list(histogram.counts), q)
        want = exact[int(q * len(exact)) - 1]
        assert got is not None
        bucket = next(i for i, b in enumerate(BOUNDS) if want <= b)
        low = 0.0 if bucket == 0 else BOUNDS[bucket - 1]
        assert low <= got <= BOUNDS[bucket], (q, got, want)
    assert histogram_quantile(list(BOUNDS), [0] * 9, 0.5) is None


def test_different_bucket_bounds_merge_onto_their_union() -> None:
    clock = Clock()
    series = FleetSeries(clock=clock)
    series.record(
        LoadReport(
            model_stats=(
                ModelStats("a", "1", 10, ttft_seconds=Histogram((0.1, 1.0), (10, 0, 0), 0.5)),
            )
        )
    )
    series.record(
        LoadReport(
            model_stats=(
                ModelStats("b", "1", 10, ttft_seconds=Histogram((0.05, 0.5), (0, 0, 10), 30.0)),
            )
        )
    )
    clock.now += STEP_S
    point = series.points()[-1]
    assert point["ttft_observations"] == 20
    assert point["ttft_p50_s"] is not None and point["ttft_p50_s"] <= 0.1
    assert point["ttft_p99_s"] == 1.0  # above every bound: the highest bound


def test_the_series_keeps_one_hour_without_holes_and_tells_subscribers() -> None:
    clock = Clock()
    series = FleetSeries(clock=clock)
    seen: list[dict[str, Any]] = []
    unsubscribe = series.subscribe(seen.append)
    series.record(_report([0.1]))
    clock.now += 5 * STEP_S
    series.record(_report([0.1]))
    assert len(series.points()) == 5  # one with data, four empty: no holes
    assert [p["requests_per_s"] for p in series.points()] == [0.1, 0, 0, 0, 0]
    assert len(seen) == 5
    unsubscribe()
    clock.now += 2 * HOUR_POINTS * STEP_S  # asleep for two hours
    points = series.points()
    assert len(points) == HOUR_POINTS
    assert all(p["requests_per_s"] == 0 for p in points)
    assert points[-1]["t"] == int(clock.now // STEP_S) * STEP_S - STEP_S
    assert len(seen) == 5


def test_each_agent_has_its_own_hour_of_tokens_queue_ttft_and_errors() -> None:
    clock = Clock(1_000_000.0)  # a step boundary
    series = AgentSeries(clock=clock)
    stats = ModelStats("m", "v1", requests=4, failed=1, completion_tokens=50,
                       ttft_seconds=_histogram([0.015, 0.015, 0.015, 0.4]))  # fmt: skip
    series.record("a", LoadReport(waiting_sequences=7, model_stats=(stats,)))
    series.record("a", LoadReport(waiting_sequences=3))  # the step keeps the most waiting
    series.record("b", LoadReport(waiting_sequences=1))
    points, current = series.history("a")
    assert points == [] and current is not None and current["queue"] == 7
    clock.now += STEP_S
    series.record("a", LoadReport(waiting_sequences=0))
    clock.now += 3 * STEP_S  # two steps without a report from "a", then one with
    series.record("a", LoadReport(waiting_sequences=2, model_stats=(stats,)))
    clock.now += STEP_S
    points, current = series.history("a")
    assert [p["t"] for p in points] == [1_000_000 + i * STEP_S for i in range(5)]
    first = points[0]
    assert first["requests_per_s"] == 0.4 and first["failed_per_s"] == 0.1
    assert first["tokens_per_s"] == 5.0 and first["queue"] == 7.0
    # TTFT from the agent's histogram: 3 of 4 in (0.01, 0.02], one in (0.2, 0.5]
    assert first["ttft_p50_s"] == pytest.approx(0.01 + 0.01 * (2 / 3), rel=1e-5)
    assert first["ttft_p99_s"] == pytest.approx(0.2 + 0.3 * (0.96 / 1), rel=1e-5)
    assert points[1]["queue"] == 0 and points[1]["ttft_p50_s"] is None  # a report, no request
    assert all(v is None for p in points[2:4] for k, v in p.items() if k != "t")  # gaps
    assert points[4]["queue"] == 2 and points[4]["tokens_per_s"] == 5.0
    assert series.history("b")[0] == [{"t": 1_000_000, "requests_per_s": 0.0,
        "failed_per_s": 0.0, "tokens_per_s": 0.0, "queue": 1.0, "ttft_p50_s": None,
        "ttft_p99_s": None}] + [dict.fromkeys(("requests_per_s", "failed_per_s",
        "tokens_per_s", "queue", "ttft_p50_s", "ttft_p99_s")) | {"t": 1_000_000 + i * STEP_S}
        for i in range(1, 5)]  # fmt: skip
    assert series.history("nobody") == ([], None)
    # An hour keeps HOUR_POINTS steps; asleep for longer, only the last step's report.
    for _ in range(HOUR_POINTS + 20):
        clock.now += STEP_S
        series.record("a", LoadReport(waiting_sequences=1))
    points, _ = series.history("a")
    assert len(points) == HOUR_POINTS and all(p["queue"] == 1 for p in points)
    clock.now += 3 * HOUR_POINTS * STEP_S
    series.record("a", LoadReport(waiting_sequences=9))
    clock.now += STEP_S
    assert [p["queue"] for p in series.history("a")[0]] == [9]
    series.forget("a")
    assert "a" not in series and len(series) == 1


def test_agent_histories_are_bounded() -> None:
    series = AgentSeries(clock=Clock())
    for i in range(MAX_AGENT_SERIES + 5):
        series.record(f"agent-{i}", LoadReport())
    assert len(series) == MAX_AGENT_SERIES
    assert "agent-0" not in series and f"agent-{MAX_AGENT_SERIES + 4}" in series


async def test_the_agent_series_route_answers_an_agents_steps(
    client: Callable[[], Awaitable[Client]],
) -> None:
    c = await client()
    events = cast(Any, c.server.app)[EVENTS_KEY]
    stats = ModelStats("m", "v1", requests=10, completion_tokens=30)
    events.agent_series._clock = lambda: 1_000_000.0
    events.on_report("edge-1", LoadReport(waiting_sequences=4, model_stats=(stats,)))
    events.agent_series._clock = lambda: 1_000_000.0 + STEP_S
    bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    status, body, _ = await c.call("GET", "/v1/admin/agents/edge-1/series", headers=bearer)
    assert status == 200, body
    assert body["object"] == "agent_series" and body["step_s"] == STEP_S
    assert body["points"][0]["tokens_per_s"] == 3.0 and body["points"][0]["queue"] == 4.0
    status, body, _ = await c.call("GET", "/v1/admin/agents/nobody/series", headers=bearer)
    assert status == 404 and body["error"]["code"] == "agent_not_found"
    status, _, _ = await c.call("GET", "/v1/admin/agents/edge-1/series")
    assert status == 401


class Client:
    def __init__(self, server: TestServer) -> None:
        self.server = server
        self.base = str(server.make_url("")).rstrip("/")
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def call(
        self, method: str, path: str, *, json: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        async with self.http.request(
            method, self.base + path, json=json, headers=headers or {}, allow_redirects=False
        ) as r:
            body: Any = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body, r


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Callable[[], Awaitable[Client]]]:
    made: list[tuple[TestServer, Client]] = []

    async def make() -> Client:
        config = CoordinatorConfig(
            grpc_port=0,
            http_port=0,
            enroll_port=0,
            data_dir=str(tmp_path / "c"),
            admin_token=ADMIN_TOKEN,
        )
        server = TestServer(create_app(config), host="127.0.0.1", port=0)
        await server.start_server()
        c = Client(server)
        made.append((server, c))
        return c

    yield make
    for server, c in made:
        await c.http.close()
        await server.close()


async def test_sign_in_sets_an_httponly_strict_cookie_and_the_token_is_not_echoed(
    client: Callable[[], Awaitable[Client]],
) -> None:
    c = await client()
    status, body, _ = await c.call("GET", "/v1/admin/whoami")
    assert status == 401
    status, body, _ = await c.call("POST", "/v1/dashboard/session", json={"token": "nope"})
    assert status == 401 and body["error"]["code"] == "invalid_admin_token"
    status, body, response = await c.call(
        "POST", "/v1/dashboard/session", json={"token": ADMIN_TOKEN}
    )
    assert status == 201 and body["role"] == "admin"
    assert ADMIN_TOKEN not in str(body)
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=") and ADMIN_TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    # The cookie stands for the token on reads...
    status, body, _ = await c.call("GET", "/v1/admin/whoami")
    assert status == 200 and body["role"] == "admin"
    status, series, _ = await c.call("GET", "/v1/admin/fleet/series")
    assert status == 200 and series["step_s"] == 10 and "current" in series
    # A plain client of the event stream gets its first event and the end, not a hang.
    status, text, response = await c.call("GET", "/v1/admin/fleet/events")
    assert status == 200 and response.content_type == "text/event-stream"
    assert text.startswith("retry: 2000\nevent: ready\n")
    # ...and on state changes only from the coordinator's own origin.
    status, body, _ = await c.call(
        "POST", "/v1/admin/tokens", json={"site": "x"}, headers={"Origin": "https://evil.example"}
    )
    assert status == 403 and body["error"]["code"] == "cross_origin"
    status, body, _ = await c.call("POST", "/v1/admin/tokens", json={"site": "x"})
    assert status == 403 and body["error"]["code"] == "cross_origin"  # no Origin at all
    status, body, _ = await c.call(
        "POST", "/v1/admin/tokens", json={"site": "lab"}, headers={"Origin": c.base}
    )
    assert status == 201 and body["site"] == "lab" and body["token"]
    _, audit, _ = await c.call("GET", "/v1/admin/audit")
    actions = [(e["action"], e["outcome"]) for e in audit["data"]]
    assert ("POST /v1/dashboard/session", "ok") in actions
    assert ("POST /v1/admin/tokens", "ok") in actions
    # Sign-in from another origin is refused; sign-out ends the session.
    status, _, _ = await c.call(
        "POST",
        "/v1/dashboard/session",
        json={"token": ADMIN_TOKEN},
        headers={"Origin": "http://evil.example"},
    )
    assert status == 403
    status, body, _ = await c.call("DELETE", "/v1/dashboard/session", headers={"Origin": c.base})
    assert status == 200 and body["signed_out"] is True
    assert (await c.call("GET", "/v1/admin/whoami"))[0] == 401


async def test_static_files_carry_a_self_only_csp_and_nothing_else_is_served(
    client: Callable[[], Awaitable[Client]],
) -> None:
    c = await client()
    status, text, response = await c.call("GET", "/dashboard")
    assert status == 404  # one address: /dashboard/
    for path, kind in (
        ("/dashboard/", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/style.css", "text/css"),
        ("/dashboard/map.js", "text/javascript"),
        ("/dashboard/charts.js", "text/javascript"),
        ("/dashboard/vendor/d3-geo.min.js", "text/javascript"),
        ("/dashboard/vendor/uPlot.min.css", "text/css"),
        ("/dashboard/vendor/countries-110m.json", "application/json"),
    ):
        status, text, response = await c.call("GET", path)
        assert status == 200 and response.content_type == kind
        assert response.headers["Content-Security-Policy"] == CSP
        assert "default-src 'self'" in CSP and "script-src 'self'" in CSP
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        # Nothing from elsewhere (the SVG namespace name is a name, not a fetch).
        if kind == "text/html":
            assert response.headers["Cache-Control"] == "no-store"
        else:  # kept by the browser, revalidated by its ETag on each load
            assert response.headers["Cache-Control"] == "no-cache"
            etag = response.headers["ETag"]
            again, _, revalidated = await c.call("GET", path, headers={"If-None-Match": etag})
            assert again == 304 and revalidated.headers["Content-Security-Policy"] == CSP
            assert (await c.call("GET", path, headers={"If-None-Match": '"other"'}))[0] == 200
        if "/vendor/" in path:  # the committed bytes, as the manifest hashes them
            committed = (VENDOR_DIR / path.rsplit("/", 1)[1]).read_bytes()
            assert (text if isinstance(text, str) else "").encode() == committed or (
                text == json.loads(committed)
            )
            continue
        assert "https://" not in text
        assert text.replace("http://www.w3.org/2000/svg", "").count("http://") == 0
    for path in (
        "/dashboard/..%2Fapp.py",
        "/dashboard/.hidden",
        "/dashboard/nope.js",
        "/dashboard/%2e%2e%2fconfig.py",
        "/dashboard/" + "0" * 300,  # longer than a file name may be
        "/dashboard/vendor/MANIFEST.json",  # the source tree's, not the page's
        "/dashboard/vendor/LICENSE.uplot.txt",
        "/dashboard/vendor/..%2Fapp.js",
        "/dashboard/vendor/app.js",  # each folder's own files only
        "/dashboard/d3-geo.min.js",
    ):
        status, _body, _ = await c.call("GET", path)
        assert status == 404, path
    _, html, _ = await c.call("GET", "/dashboard/")
    assert '<script src="/dashboard/app.js"' in html and "innerHTML" not in html
    _, script, _ = await c.call("GET", "/dashboard/app.js")
    assert "innerHTML" not in script and "localStorage" not in script


async def test_metrics_count_agents_by_status_and_site(
    client: Callable[[], Awaitable[Client]],
) -> None:
    c = await client()
    status, text, _ = await c.call(
        "GET", "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert status == 200
    for state in ("live", "suspect", "down", "draining"):
        assert f'edgefleet_coordinator_agents{{site="",status="{state}"}} 0.0' in text
    assert "edgefleet_coordinator_load_reports_total" in text
    assert "edgefleet_coordinator_route_seconds_bucket" in text


def test_overflow_use_and_cost_by_target() -> None:
    from coordinator.fleet.metrics import CoordinatorMetrics
    from coordinator.fleet.registry import FleetRegistry

    clock = Clock()
    series = FleetSeries(clock=clock)
    report = _wire(
        LoadReport(
            overflow_usage=(
                OverflowUsage("openai", requests=20, cost=0.5),
                OverflowUsage("peer-lyon", requests=10),
            )
        )
    )
    series.record(report)
    series.record(report)
    clock.now += STEP_S
    point = series.points()[-1]
    assert point["overflow_per_s"] == {"openai": 4.0, "peer-lyon": 2.0}
    assert point["overflow_cost"] == {"openai": 1.0, "peer-lyon": 0.0}
    metrics = CoordinatorMetrics(cast(FleetRegistry, _NoAgents()))
    metrics.record_overflow(report.overflow_usage)
    text = metrics.exposition().decode()
    assert (
        'edgefleet_coordinator_overflow_requests_total{outcome="ok",target="openai"} 20.0' in text
    )
    assert 'edgefleet_coordinator_overflow_cost_total{target="openai"} 0.5' in text
    many = LoadReport(overflow_usage=tuple(OverflowUsage(f"t{i}", requests=1) for i in range(150)))
    metrics.record_overflow(many.overflow_usage)  # agents name targets: the label set stays bounded
    text = metrics.exposition().decode()
    assert 'target="other"' in text and 'target="t120"' not in text
    series.record(many)  # and so does one bucket of the series
    clock.now += STEP_S
    point = series.points()[-1]
    assert len(point["overflow_per_s"]) == 32
    assert point["overflow_per_s"]["other"] == pytest.approx((150 - 31) / STEP_S)


class _NoAgents:
    def agents(self) -> list[Any]:
        return []

    def connected_count(self) -> int:
        return 0

    def known_count(self) -> int:
        return 0


def test_agents_without_model_stats_count_by_their_request_totals() -> None:
    clock = Clock()
    series = FleetSeries(clock=clock)
    series.record(LoadReport(requests_total=10, requests_failed_total=1), "a")
    series.record(LoadReport(requests_total=25, requests_failed_total=3), "a")
    series.record(LoadReport(requests_total=5), "b")  # first report: a baseline only
    series.record(LoadReport(requests_total=2), "b")  # restarted: no negative count
    series.record(LoadReport(requests_total=7), "b")
    clock.now += STEP_S
    point = series.points()[-1]
    assert point["requests_per_s"] == pytest.approx((15 + 5) / STEP_S)
    assert point["failed_per_s"] == pytest.approx(2 / STEP_S)


def _wire(report: LoadReport) -> LoadReport:
    """The report as the coordinator gets it: through protobuf and its validation."""
    from coordinator.rpc.convert import load_report_from_pb
    from edgefleet.contract_pb import load_report_to_pb

    return load_report_from_pb(load_report_to_pb(report))


def test_redactions_by_type_are_the_growth_of_each_agents_totals_per_bucket() -> None:
    """Agents report redaction totals since they started (LoadReport.redactions); the
    series turns them into counts and rates per 10 s bucket, by type."""
    clock = Clock()
    series = FleetSeries(clock=clock)
    series.record(_wire(LoadReport(redactions=(("EMAIL", 7),))), "a")  # a baseline only
    series.record(_wire(LoadReport(redactions=(("EMAIL", 10), ("PHONE", 2)))), "a")
    series.record(_wire(LoadReport(redactions=(("US_SSN", 4),))), "b")  # baseline
    series.record(_wire(LoadReport(redactions=(("US_SSN", 9),))), "b")
    series.record(_wire(LoadReport()), "c")  # never redacted anything
    series.record(_wire(LoadReport()), "c")
    clock.now += STEP_S
    series.record(_wire(LoadReport(redactions=(("EMAIL", 10), ("PHONE", 2)))), "a")  # no change
    series.record(_wire(LoadReport(redactions=(("EMAIL", 1),))), "a")  # restarted: 1 new
    clock.now += STEP_S
    first, second = series.points()[-2:]
    assert first["redactions"] == {"EMAIL": 3, "PHONE": 2, "US_SSN": 5}
    assert first["redactions_per_s"] == {"EMAIL": 0.3, "PHONE": 0.2, "US_SSN": 0.5}
    assert second["redactions"] == {"EMAIL": 1}
    assert second["redactions_per_s"] == {"EMAIL": pytest.approx(0.1)}
    # The rate survives the JSON of the series and of its SSE points.
    assert json.loads(json.dumps(first))["redactions_per_s"]["US_SSN"] == 0.5
    # What GET /v1/admin/fleet/series answers is what the OpenAPI document says.
    import jsonschema_rs

    from coordinator.api.routes import api_document

    schema = {"$ref": "#/components/schemas/FleetSeries",
              "components": api_document()["components"]}  # fmt: skip
    body = {"object": "fleet_series", "step_s": STEP_S, "points": series.points(),
            "current": series.current()}  # fmt: skip
    assert list(jsonschema_rs.validator_for(schema).iter_errors(body)) == []
    broken = {**body, "current": {**first, "redactions": {"EMAIL": "three"}}}
    assert not jsonschema_rs.validator_for(schema).is_valid(broken)


def test_hostile_redaction_type_names_are_bounded() -> None:
    """The wire refuses a type name that is not 1-32 upper-case letters, digits and _ and
    more than 32 types in one report; the series bounds what the whole fleet can add to
    one bucket (OTHER beyond 32 names), and re-checks names reaching it another way."""
    from coordinator.errors import ProtocolError

    for bad in ("<img src=x onerror=alert(1)>", "A" * 33, "email"):
        with pytest.raises(ProtocolError, match="redactions"):
            _wire(LoadReport(redactions=((bad, 1),)))
    with pytest.raises(ProtocolError, match="redactions"):
        _wire(LoadReport(redactions=tuple((f"T{i}", 1) for i in range(33))))
    clock = Clock()
    series = FleetSeries(clock=clock)
    for agent in range(3):  # each agent reports 32 distinct valid names: 96 in all
        names = [f"T{agent}_{i}" for i in range(32)]
        series.record(
            _wire(LoadReport(redactions=tuple((n, 0) for n in sorted(names)))), f"{agent}"
        )
        series.record(
            _wire(LoadReport(redactions=tuple((n, 1) for n in sorted(names)))), f"{agent}"
        )
    # Not through the wire (a report built in the coordinator): re-checked all the same.
    series.record(LoadReport(redactions=(("<b>x</b>", 0),)), "d")
    series.record(LoadReport(redactions=(("<b>x</b>", 5),)), "d")
    clock.now += STEP_S
    point = series.points()[-1]
    assert len(point["redactions"]) == 32
    assert point["redactions"]["OTHER"] == 96 - 31 + 5
    assert sum(point["redactions"].values()) == 96 + 5
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]{0,31}", name) for name in point["redactions"])
