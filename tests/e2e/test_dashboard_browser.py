"""The dashboard in a real browser (Playwright driving Debian's Chromium) against a real
coordinator and real agents (tiny model), as a fleet beyond loopback runs: the coordinator
with TLS (the dashboard over HTTPS, its certificate from the fleet CA, which the browser
trusts; enrollment required), agents enrolled with join tokens serving HTTPS, API keys
required. Screenshots of each view are written to test-artifacts/dashboard/."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devtools.browser import (
    chromium_path,
    poll,
    serious_accessibility_violations,
    sign_in,
    trusting_certificate,
)
from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.process import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts" / "dashboard"
XSS = "<img src=x onerror=alert(1)>"
PLACES = {"edge-paris": ("paris", 48.85, 2.35), "edge-tokyo": ("tokyo", 35.68, 139.69)}


class Fleet:
    def __init__(
        self,
        coordinator: CoordinatorProcess,
        agents: dict[str, AgentProcess],
        browser: Any,
        state: Path,
        artifacts: Path,
        api_key: str,
    ) -> None:
        self.coordinator, self.agents, self.browser = coordinator, agents, browser
        self.state, self.artifacts, self.api_key = state, artifacts, api_key
        self.dialogs: list[str] = []

    @property
    def url(self) -> str:
        return self.coordinator.http_url

    async def page(self, token: str | None = None, width: int = 1300, height: int = 900) -> Any:
        context = await self.browser.new_context(viewport={"width": width, "height": height})
        page = await context.new_page()
        page.on(
            "dialog", lambda d: (self.dialogs.append(d.message), asyncio.ensure_future(d.dismiss()))
        )
        if token is not None:
            await sign_in(page, self.url, token)
        else:
            await page.goto(f"{self.url}/dashboard/")
        return page

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method,
                self.url + path,
                json=body,
                headers=self.coordinator.admin_headers,
                ssl=self.coordinator.http_context(),
            ) as response,
        ):
            return response.status, await response.json()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(
    tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    from playwright.async_api import async_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    state = tmp_path_factory.mktemp("dashboard")
    async with CoordinatorProcess(
        report_interval_ms=400, extra_args=["--set", "down_after_reports=8"], tls=True
    ) as coordinator:
        agents = {
            agent_id: enrolled_agent(
                coordinator,
                agent_id=agent_id,
                site=site,
                lat=lat,
                lon=lon,
                state_dir=state / agent_id,
                models_dir=str(tiny_artifacts),
                serve=["tiny-llama"],
            )
            for agent_id, (site, lat, lon) in PLACES.items()
        }
        await asyncio.gather(*(a.start() for a in agents.values()))
        try:
            api_key = await coordinator.api_key_for(agents.values())
            # the dashboard's HTTPS certificate, issued by the fleet CA at the start
            trust = trusting_certificate((coordinator.data_dir / "tls" / "http.crt").read_bytes())
            async with async_playwright() as p:
                browser = await p.chromium.launch(
                    executable_path=chromium_path(), headless=True, args=trust
                )
                yield Fleet(coordinator, agents, browser, state, tiny_artifacts, api_key)
                await browser.close()
        finally:
            for agent in agents.values():
                if agent.returncode is None:
                    await agent.terminate()


async def _rows(page: Any) -> dict[str, list[str]]:
    return dict(
        await page.evaluate(
            "[...document.querySelectorAll('#agent-rows tr')].map(tr =>"
            " [tr.children[0].textContent, [...tr.children].map(td => td.textContent)])"
        )
    )


async def test_signed_out_the_page_shows_nothing_and_actions_are_refused(fleet: Fleet) -> None:
    tokens_before = (await fleet.api("GET", "/v1/admin/tokens"))[1]["data"]  # the agents'
    assert len(tokens_before) == len(PLACES)
    page = await fleet.page()
    await page.wait_for_selector("#view-signin:not([hidden])")
    assert await page.is_hidden("#nav") and await page.is_hidden("#view-fleet")
    assert await page.evaluate("document.querySelectorAll('#agent-rows tr').length") == 0
    assert await page.evaluate("fetch('/v1/agents').then(r => r.status)") == 401
    assert await page.evaluate("fetch('/v1/admin/fleet/series').then(r => r.status)") == 401
    status = await page.evaluate(
        "fetch('/v1/admin/tokens', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: '{}'}).then(r => r.status)"
    )
    assert status == 401
    # A wrong token is refused with a message; nothing is stored in the page.
    await page.fill("#signin-token", "not-a-token")
    await page.click("#signin-form button[type=submit]")
    await poll(page, "document.getElementById('signin-error').textContent.length > 0")
    assert await page.evaluate("document.cookie") == ""
    assert await page.evaluate("localStorage.length + sessionStorage.length") == 0
    await page.screenshot(path=str(SHOTS / "signin.png"), full_page=True)
    assert (await fleet.api("GET", "/v1/admin/tokens"))[1]["data"] == tokens_before


async def _marker_place(page: Any, agent_id: str) -> dict[str, Any]:
    """Where the page drew an agent's marker: its screen point inverted through the page's
    projection and view (lon, lat), and the country whose outline holds that point."""
    return dict(
        await page.evaluate(
            r"""(id) => {
              const map = window.edgefleet.map;
              const node = document.querySelector(`#map-markers [data-agent="${id}"]`);
              const [, sx, sy] = node.getAttribute("transform")
                .match(/translate\(([-\d.]+),([-\d.]+)\)/).map(Number);
              const [bx, by] = map.toBase(sx, sy);
              const country = [...document.querySelectorAll("#map-land path.country")]
                .find((p) => p.isPointInFill(new DOMPoint(bx, by)));
              return {lonlat: map.projection.invert([bx, by]), screen: [sx, sy],
                      country: country ? country.dataset.name : null,
                      label: (node.querySelector("text.label") || {}).textContent || null,
                      status: node.getAttribute("class")};
            }""",
            agent_id,
        )
    )


async def test_the_map_draws_countries_and_places_markers_where_the_agents_are(
    fleet: Fleet,
) -> None:
    page = await fleet.page(fleet.coordinator.admin_token, width=1280, height=800)
    await poll(page, "window.edgefleet.map.atlas === 'loaded'")
    await poll(page, "document.querySelectorAll('#map-markers .marker').length === 2")
    # Natural Earth's 1:110m countries, one outline each, and their borders.
    countries = await page.evaluate(
        "[...document.querySelectorAll('#map-land path.country')].map(p => p.dataset.name)"
    )
    assert len(countries) >= 170 and {"France", "Japan", "Brazil"} <= set(countries)
    assert await page.evaluate("document.querySelector('#map-land path.border').getTotalLength()")
    names = await page.evaluate(
        "[...document.querySelectorAll('#map-names text')].map(t => t.textContent)"
    )
    assert "Russia" in names and "Brazil" in names  # the big ones are named
    # Each marker lies where its agent is: inverted through the projection, and inside
    # the outline of the country of its place; labelled with the agent's id.
    paris = await _marker_place(page, "edge-paris")
    assert paris["lonlat"] == [pytest.approx(2.35, abs=0.05), pytest.approx(48.85, abs=0.05)]
    assert paris["country"] == "France" and paris["label"] == "edge-paris"
    assert paris["status"] == "marker live"
    tokyo = await _marker_place(page, "edge-tokyo")
    assert tokyo["lonlat"] == [pytest.approx(139.69, abs=0.05), pytest.approx(35.68, abs=0.05)]
    assert tokyo["country"] == "Japan"
    await page.screenshot(path=str(SHOTS / "map.png"))
    # Zoom (the wheel over Paris, then the button) and pan (a drag): the markers stay on
    # their places, further apart.
    box = await page.evaluate(  # the SVG's content box (inside its border): the viewBox's
        "(() => { const m = document.getElementById('map'), r = m.getBoundingClientRect();"
        " return [r.left + m.clientLeft, r.top + m.clientTop, m.clientWidth, m.clientHeight];"
        " })()"
    )
    scale = box[2] / 960
    x, y = box[0] + paris["screen"][0] * scale, box[1] + paris["screen"][1] * scale
    await page.mouse.move(x, y)
    await page.mouse.wheel(0, -400)  # the wheel over Paris keeps Paris under the pointer
    await poll(page, "window.edgefleet.map.k > 2")
    await asyncio.sleep(0.1)
    at = (await _marker_place(page, "edge-paris"))["screen"]
    assert (box[0] + at[0] * scale, box[1] + at[1] * scale) == (
        pytest.approx(x, abs=2),
        pytest.approx(y, abs=2),
    )
    await page.mouse.down()
    await page.mouse.move(x + 60, y + 30, steps=5)
    await page.mouse.up()
    await asyncio.sleep(0.1)
    zoomed = await _marker_place(page, "edge-paris")
    assert zoomed["lonlat"] == [pytest.approx(2.35, abs=0.05), pytest.approx(48.85, abs=0.05)]
    assert zoomed["country"] == "France"
    assert zoomed["screen"] == [pytest.approx(at[0] + 60 / scale, abs=2),
                                pytest.approx(at[1] + 30 / scale, abs=2)]  # fmt: skip
    k = await page.evaluate("window.edgefleet.map.k")
    await page.click("#map-zoom-in")
    await poll(page, f"window.edgefleet.map.k === Math.min(48, {k} * 2)")
    await page.click("#map-reset")
    await poll(page, "window.edgefleet.map.k === 1")
    # Agents sharing a place merge into one numbered cluster, coloured by the worst.
    await page.evaluate(
        """() => {
          const map = window.edgefleet.map;
          for (let i = 0; i < 5; i++) {
            map.set({agent_id: `near-${i}`, site: "paris", location: {lat: 48.85 + i * 0.01,
                     lon: 2.35}, liveness: i === 4 ? "down" : "live"});
          }
          map.render();
        }"""
    )
    cluster = await page.evaluate(
        "[...document.querySelectorAll('#map-markers .cluster')].map(c =>"
        " [c.dataset.count, c.getAttribute('class'), c.querySelector('text.count').textContent,"
        " c.querySelector('title').textContent])"
    )
    assert len(cluster) == 1 and cluster[0][0] == "6" and cluster[0][2] == "6", cluster
    assert cluster[0][1] == "cluster down" and "edge-paris" in cluster[0][3]
    assert await page.evaluate("document.querySelector('[data-agent=\"near-0\"]')") is None
    await page.screenshot(path=str(SHOTS / "map-cluster.png"))


async def test_the_fleet_table_fits_1280_px_and_breaks_no_word(fleet: Fleet) -> None:
    page = await fleet.page(fleet.coordinator.admin_token, width=1280, height=800)
    await poll(page, "document.querySelectorAll('#agent-rows tr').length >= 2")
    # Beside the real agents, one with the demo's long model versions and providers (the
    # test fleet's own are short): rendered by the page as any agent is.
    await page.evaluate(
        """() => {
          const real = window.edgefleet.agents.get("edge-paris");
          window.edgefleet.agents.set("edge-amsterdam-long", {...real,
            agent_id: "edge-amsterdam-long", site: "amsterdam-science-park",
            hardware: {...real.hardware, execution_providers: ["AzureExecutionProvider",
              "CPUExecutionProvider"]},
            load: {...real.load, inventory: [
              {name: "all-minilm-l6-v2", version: "int8-252f3159a656", state: "loaded"},
              {name: "smollm2-135m-instruct", version: "int4-b9715715a4c2", state: "loaded"}]}});
          renderTable();
        }"""
    )
    await poll(page, "document.querySelectorAll('#agent-rows tr').length >= 3")
    layout = await page.evaluate(
        r"""() => {
          const lines = (node, start, end) => {
            const range = document.createRange();
            range.setStart(node, start); range.setEnd(node, end);
            return new Set([...range.getClientRects()].filter((r) => r.width > 0)
              .map((r) => Math.round(r.top))).size;
          };
          const broken = [];
          const table = document.getElementById("agents");
          for (const cell of table.querySelectorAll("th, td")) {
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
              const header = cell.tagName === "TH";
              // a header on one line; in a cell, no word split but at a hyphen
              const words = header ? [[0, node.length]] : [...node.data.matchAll(/[^\s-]+/g)]
                .map((m) => [m.index, m.index + m[0].length]);
              for (const [start, end] of words) {
                if (end > start && lines(node, start, end) > 1) {
                  broken.push(node.data.slice(start, end));
                }
              }
            }
          }
          return {broken, table: table.getBoundingClientRect().right,
                  page: document.documentElement.scrollWidth, viewport: window.innerWidth,
                  headerHeights: [...table.querySelectorAll("th")]
                    .map((th) => th.getBoundingClientRect().height)};
        }"""
    )
    assert layout["viewport"] == 1280
    assert layout["broken"] == [], layout
    assert layout["table"] <= 1280 and layout["page"] <= 1280, layout
    assert max(layout["headerHeights"]) < 1.6 * min(layout["headerHeights"]), layout
    await page.screenshot(path=str(SHOTS / "fleet-1280.png"))


async def test_agents_on_the_map_and_table_numbers_move_and_a_killed_agent_goes_down(
    fleet: Fleet,
) -> None:
    page = await fleet.page(fleet.coordinator.admin_token)
    await poll(page, "document.querySelectorAll('#agent-rows tr').length === 2")
    await poll(page, "document.querySelectorAll('#map-markers .marker').length === 2")
    rows = await _rows(page)
    assert rows["edge-paris"][1] == "paris" and rows["edge-paris"][2] == "live"
    assert "tiny-llama" in rows["edge-tokyo"][7]
    assert (await _marker_place(page, "edge-paris"))["lonlat"] == [
        pytest.approx(2.35, abs=0.05),
        pytest.approx(48.85, abs=0.05),
    ]
    # The HttpOnly cookie is invisible to the page's script; over HTTPS it is Secure.
    assert await page.evaluate("document.cookie") == ""
    cookies = await page.context.cookies()
    assert cookies and all(
        c["secure"] and c["httpOnly"] and c["sameSite"] == "Strict" for c in cookies
    ), cookies
    await page.screenshot(path=str(SHOTS / "fleet.png"), full_page=True)
    # Live numbers move while load runs, without a reload.
    await page.evaluate("window.__sameDocument = true")
    before = await page.evaluate("window.edgefleet.agents.get('edge-paris').load.requests_total")
    agent = fleet.agents["edge-paris"]
    async with aiohttp.ClientSession(headers=agent.headers(fleet.api_key)) as http:
        for _ in range(3):
            async with http.post(
                agent.url + "/v1/chat/completions",
                json={
                    "model": "tiny-llama",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
                ssl=fleet.coordinator.ca_context(),
            ) as response:
                assert response.status == 200
    await poll(
        page,
        f"window.edgefleet.agents.get('edge-paris').load.requests_total >= {before + 3}",
        timeout_s=10,
    )
    assert (await _rows(page))["edge-paris"][8].endswith(" s")
    # The fleet series moves too: the 10 s point with those requests arrives over SSE.
    await poll(page, "window.edgefleet.points.some(p => p.requests_per_s > 0)", timeout_s=30)
    # SIGKILL: suspect, then down, within the liveness window, on the same page.
    await fleet.agents["edge-tokyo"].kill()
    seen: list[str] = []
    for _ in range(400):
        status = (await _rows(page))["edge-tokyo"][2]
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "down":
            break
        await asyncio.sleep(0.05)
    assert seen[-1] == "down", seen
    assert "suspect" in seen and seen.index("suspect") < seen.index("down"), seen
    # its last report's numbers are not shown as its load now (on hover only)
    assert (await _rows(page))["edge-tokyo"][3:7] == ["-", "-", "-", "-"]
    title = await page.evaluate(
        "[...document.querySelectorAll('#agent-rows tr')]"
        ".find(tr => tr.children[0].textContent === 'edge-tokyo').children[5].title"
    )
    assert title.startswith("last report: "), title
    assert await page.evaluate("window.__sameDocument === true")
    await poll(page, "document.querySelector('#map-markers [data-agent=\"edge-tokyo\"]')"
                     ".classList.contains('down')")  # fmt: skip
    # ... nor on its own page: "-" for its load, the last report on hover
    await page.goto(f"{fleet.url}/dashboard/#agent/edge-tokyo")
    await page.wait_for_selector("#view-agent:not([hidden])")
    await poll(page, "document.getElementById('agent-h').textContent === 'Agent edge-tokyo'")
    detail = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#agent-detail dt')]"
        ".map(dt => [dt.textContent, [dt.nextElementSibling.textContent,"
        " dt.nextElementSibling.title]]))"
    )
    assert detail["Status"][0] == "down"
    assert detail["Goodbye"][0] == "none: lost without one"  # SIGKILL: it said nothing
    for name in ("Queue", "Running", "Tokens/s", "KV cache"):
        assert detail[name][0] == "-", (name, detail[name])
        assert detail[name][1].startswith("last report: "), (name, detail[name])
    await page.goto(f"{fleet.url}/dashboard/#series")
    await page.wait_for_selector("#view-series:not([hidden])")
    await page.screenshot(path=str(SHOTS / "metrics.png"), full_page=True)


_CHART = r"""([group, id]) => {
  const u = window.edgefleet.charts[group].charts.get(id).plot;
  return {time: u.scales.x.time, axes: u.axes.map((a) => a.label),
          series: u.series.map((s) => s.label), data: u.data.map((d) => Array.from(d)),
          canvas: u.ctx.canvas.width > 0, ticks: u.axes[0]._values};
}"""
_HOVER = r"""async ([group, id, index]) => {
  const u = window.edgefleet.charts[group].charts.get(id).plot;
  const box = u.over.getBoundingClientRect();
  return [box.left + u.valToPos(u.data[0][index], "x"), box.top + box.height / 2];
}"""
_LEGEND = r"""([group, id]) => [...window.edgefleet.charts[group].charts.get(id).plotBox
  .querySelectorAll(".u-legend .u-series")].map((tr) =>
  [tr.querySelector(".u-label").textContent, tr.querySelector(".u-value").textContent])"""


async def _hover_legend(page: Any, group: str, chart: str, index: int) -> dict[str, str]:
    """The chart's legend with the mouse over step ``index``: {series: value text}."""
    x, y = await page.evaluate(_HOVER, [group, chart, index])
    await page.mouse.move(x, y)
    await asyncio.sleep(0.1)
    return dict(await page.evaluate(_LEGEND, [group, chart]))


def _figure(text: str, unit: str) -> float:
    number, shown_unit = text.split(" ", 1)
    assert shown_unit == unit, text
    return float(number)


async def test_charts_have_time_axes_units_and_hover_values_that_match_the_series_api(
    fleet: Fleet,
) -> None:
    agent = fleet.agents["edge-paris"]
    async with aiohttp.ClientSession(headers=agent.headers(fleet.api_key)) as http:
        for _ in range(3):  # requests with a first token: TTFT, tokens
            async with http.post(
                agent.url + "/v1/chat/completions", ssl=fleet.coordinator.ca_context(),
                json={"model": "tiny-llama", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hi"}]},
            ) as response:  # fmt: skip
                assert response.status == 200
    page = await fleet.page(fleet.coordinator.admin_token, width=1280, height=800)
    await page.goto(f"{fleet.url}/dashboard/#series")
    # the 10 s step holding them closes and reaches the page (SSE)
    await poll(page, "window.edgefleet.points.some(p => p.ttft_p99_s !== null)", timeout_s=30)
    await poll(page, "window.edgefleet.charts.fleet.charts.size === 4")
    charts = {
        "chart-requests": (["requests/s"], ["requests", "failed"], "req/s", 1),
        "chart-tokens": (["tokens/s"], ["completion", "prompt"], "tok/s", 1),
        "chart-ttft": (["TTFT (ms)"], ["p50", "p99"], "ms", 1000),
        "chart-rejections": (["rejected/s"], ["rejected"], "req/s", 1),
    }
    fields = {
        "chart-requests": ["requests_per_s", "failed_per_s"],
        "chart-tokens": ["tokens_per_s", "prompt_tokens_per_s"],
        "chart-ttft": ["ttft_p50_s", "ttft_p99_s"],
        "chart-rejections": ["rejections_per_s"],
    }
    status, api = await fleet.api("GET", "/v1/admin/fleet/series")
    assert status == 200
    by_time = {p["t"]: p for p in api["points"]}
    for chart, (axis, names, unit, scale) in charts.items():
        shown = await page.evaluate(_CHART, ["fleet", chart])
        # a time axis and a y axis named with its unit; a legend of every series
        assert shown["time"] is True and shown["canvas"]
        assert shown["axes"] == ["Time (local)", *axis]
        assert shown["series"] == ["Time", *names]
        # one short label per time tick (hh:mm, :ss between), never a date under one that
        # runs into its neighbours
        assert shown["ticks"], shown
        assert all(re.fullmatch(r"\d\d:\d\d|:\d\d", tick) for tick in shown["ticks"]), shown[
            "ticks"
        ]
        # the same steps and values as the series API (which may have closed one more)
        xs = shown["data"][0]
        assert xs and all(t in by_time for t in xs)
        for column, field in zip(shown["data"][1:], fields[chart], strict=True):
            expected = [by_time[t][field] for t in xs]
            assert column == [None if v is None else pytest.approx(v * scale) for v in expected]
        legend = dict(await page.evaluate(_LEGEND, ["fleet", chart]))  # the newest step
        # the legend's time on the axis's 24-hour clock ("14:05:30", not "02:05:30 PM")
        assert re.fullmatch(r"\d\d:\d\d:\d\d", legend["Time"]), legend
        assert all(legend[n] == "-" or legend[n].endswith(f" {unit}") for n in names), legend
    # Hovering a step shows its values, with units, as the API gives them.
    xs = (await page.evaluate(_CHART, ["fleet", "chart-requests"]))["data"][0]
    busiest = max(range(len(xs)), key=lambda i: by_time[xs[i]]["requests_per_s"])
    legend = await _hover_legend(page, "fleet", "chart-requests", busiest)
    assert _figure(legend["requests"], "req/s") == pytest.approx(
        by_time[xs[busiest]]["requests_per_s"], rel=1e-3
    )
    assert legend["Time"] != "-"
    with_ttft = [i for i, t in enumerate(xs) if by_time[t]["ttft_p99_s"] is not None]
    assert with_ttft
    legend = await _hover_legend(page, "fleet", "chart-ttft", with_ttft[-1])
    assert _figure(legend["p99"], "ms") == pytest.approx(
        by_time[xs[with_ttft[-1]]]["ttft_p99_s"] * 1000, rel=1e-3
    )
    await page.screenshot(path=str(SHOTS / "metrics-1280.png"))

    # The agent page: its own history, as GET /v1/admin/agents/{id}/series gives it.
    await page.goto(f"{fleet.url}/dashboard/#agent/edge-paris")
    await poll(page, "window.edgefleet.charts.agent.charts.size === 4", timeout_s=20)
    status, api = await fleet.api("GET", "/v1/admin/agents/edge-paris/series")
    assert status == 200 and api["points"]
    by_time = {p["t"]: p for p in api["points"]}
    agent_charts = {
        "chart-agent-tokens": (["tokens/s"], {"completion": "tokens_per_s"}, "tok/s", 1),
        "chart-agent-queue": (["sequences"], {"queue": "queue"}, "seq", 1),
        "chart-agent-ttft": (["TTFT (ms)"], {"p50": "ttft_p50_s", "p99": "ttft_p99_s"}, "ms",
                             1000),
        "chart-agent-errors": (["requests/s"], {"requests": "requests_per_s",
                                                "failed": "failed_per_s"}, "req/s", 1),
    }  # fmt: skip
    for chart, (axis, series, unit, scale) in agent_charts.items():
        shown = await page.evaluate(_CHART, ["agent", chart])
        assert shown["time"] is True and shown["axes"] == ["Time (local)", *axis]
        assert shown["series"] == ["Time", *series]
        xs = shown["data"][0]
        assert xs and all(t in by_time for t in xs)
        for column, field in zip(shown["data"][1:], series.values(), strict=True):
            expected = [by_time[t][field] for t in xs]
            assert column == [None if v is None else pytest.approx(v * scale) for v in expected]
        legend = dict(await page.evaluate(_LEGEND, ["agent", chart]))
        assert all(legend[n] == "-" or legend[n].endswith(f" {unit}") for n in series), legend
    xs = (await page.evaluate(_CHART, ["agent", "chart-agent-tokens"]))["data"][0]
    busiest = max(range(len(xs)), key=lambda i: by_time[xs[i]]["tokens_per_s"] or 0)
    legend = await _hover_legend(page, "agent", "chart-agent-tokens", busiest)
    assert _figure(legend["completion"], "tok/s") == pytest.approx(
        by_time[xs[busiest]]["tokens_per_s"], rel=1e-3
    )
    assert by_time[xs[busiest]]["tokens_per_s"] > 0  # the requests sent above
    await page.screenshot(path=str(SHOTS / "agent-1280.png"), full_page=True)


async def test_a_join_token_made_on_the_page_enrolls_an_agent_whose_hostile_site_stays_text(
    fleet: Fleet,
) -> None:
    page = await fleet.page(fleet.coordinator.admin_token)
    await page.goto(f"{fleet.url}/dashboard/#tokens")
    await page.wait_for_selector("#view-tokens:not([hidden])")
    await page.fill("#token-site", XSS)
    await page.fill("#token-note", XSS)
    await page.fill("#token-lat", "52.52")
    await page.fill("#token-lon", "13.40")
    await page.click("#token-form button[type=submit]")
    await poll(page, "document.getElementById('token-secret-value').textContent.length > 20")
    token = await page.evaluate("document.getElementById('token-secret-value').textContent")
    await page.screenshot(path=str(SHOTS / "tokens.png"), full_page=True)
    coordinator = fleet.coordinator
    agent = AgentProcess(  # set up as an operator would, with the token from the page
        models_dir=str(fleet.artifacts),
        serve=["tiny-llama"],
        site=XSS,
        coordinator=coordinator.grpc_target,
        agent_id="edge-xss",
        join_token=token,
        state_dir=fleet.state / "xss",
        extra_args=[
            "--set", "coordinator.tls=true",
            "--set", f"coordinator.enroll_target={coordinator.enroll_target}",
            "--set", f"coordinator.ca_file={coordinator.ca_file}",
        ],
    )  # fmt: skip
    async with agent:
        await page.goto(f"{fleet.url}/dashboard/#fleet")
        await poll(page, "window.edgefleet.agents.has('edge-xss')", timeout_s=30)
        await poll(page, "document.querySelectorAll('#agent-rows tr').length === 3")
        rows = await _rows(page)
        assert rows["edge-xss"][1] == XSS  # shown as the text it is
        assert await page.evaluate("document.querySelectorAll('img').length") == 0
        await poll(page, "document.querySelector('#map-markers [data-agent=\"edge-xss\"]')")
        title = await page.evaluate(
            "document.querySelector('#map-markers [data-agent=\"edge-xss\"]').textContent"
        )
        assert XSS in title
        await page.goto(f"{fleet.url}/dashboard/#agent/edge-xss")
        await poll(page, "document.getElementById('agent-detail').textContent.includes('img')")
        await page.goto(f"{fleet.url}/dashboard/#tokens")
        await poll(page, "document.querySelectorAll('#token-rows tr').length >= 1")
        await page.goto(f"{fleet.url}/dashboard/#audit")
        await poll(page, "document.querySelectorAll('#audit-rows tr').length >= 2")
        await page.screenshot(path=str(SHOTS / "audit.png"), full_page=True)
        assert await page.evaluate("document.querySelectorAll('img').length") == 0
        assert fleet.dialogs == []  # nothing ran
        status, listed = await fleet.api("GET", "/v1/agents/edge-xss")
        assert status == 200 and listed["enrolled"] is True and listed["site"] == XSS


async def test_drain_from_the_page_stops_new_routes_to_that_agent(fleet: Fleet) -> None:
    async def routed() -> list[str]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{fleet.url}/v1/route?model=tiny-llama", ssl=fleet.coordinator.http_context()
            ) as response,
        ):
            return [a["agent_id"] for a in (await response.json())["agents"]]

    assert "edge-paris" in await routed()
    page = await fleet.page(fleet.coordinator.admin_token)
    await page.goto(f"{fleet.url}/dashboard/#agent/edge-paris")
    await poll(page, "document.getElementById('agent-detail').textContent.includes('paris')")
    await page.click("#agent-drain")
    await poll(page, "document.getElementById('status-line').textContent.startsWith('Drained')")
    await wait_until(lambda: _absent(routed), timeout_s=10, message="edge-paris unrouted")
    await page.screenshot(path=str(SHOTS / "agent.png"), full_page=True)
    await page.click("#agent-resume")
    await poll(page, "document.getElementById('status-line').textContent.startsWith('Resumed')")
    await wait_until(lambda: _present(routed), timeout_s=10, message="edge-paris routed")
    _, audit = await fleet.api("GET", "/v1/admin/audit")
    assert any(e["action"] == "POST /v1/admin/agents/{agent_id}/drain" for e in audit["data"])


async def _absent(routed: Any) -> bool:
    return "edge-paris" not in await routed()


async def _present(routed: Any) -> bool:
    return "edge-paris" in await routed()


async def test_a_viewer_sees_no_actions_and_its_actions_are_refused(fleet: Fleet) -> None:
    status, minted = await fleet.api(
        "POST", "/v1/admin/admin-tokens", {"role": "viewer", "name": "watcher"}
    )
    assert status == 201
    page = await fleet.page(minted["token"])
    await page.goto(f"{fleet.url}/dashboard/#agent/edge-paris")
    await poll(page, "document.getElementById('agent-detail').textContent.includes('paris')")
    assert await page.is_hidden("#agent-drain") and await page.is_hidden("#agent-resume")
    await page.goto(f"{fleet.url}/dashboard/#tokens")
    await page.wait_for_selector("#view-tokens:not([hidden])")
    assert await page.is_hidden("#token-form")
    refused = await page.evaluate(
        "fetch('/v1/admin/agents/edge-paris/drain', {method: 'POST'}).then(r => r.json())"
    )
    assert refused["error"]["code"] == "insufficient_role", refused
    await page.goto(f"{fleet.url}/dashboard/#rollouts")
    await poll(page, "document.getElementById('rollouts-note').textContent.length > 0")
    await page.screenshot(path=str(SHOTS / "viewer-rollouts.png"), full_page=True)
    await page.goto(f"{fleet.url}/dashboard/#models")
    await poll(page, "document.getElementById('models-note').textContent.length > 0")
    await page.screenshot(path=str(SHOTS / "viewer-models.png"), full_page=True)


async def test_accessibility_audit_finds_no_serious_violations(fleet: Fleet) -> None:
    page = await fleet.page(fleet.coordinator.admin_token)
    found: dict[str, Any] = {}
    for view in ("fleet", "series", "tokens", "keys", "audit", "agent/edge-paris"):
        await page.goto(f"{fleet.url}/dashboard/#{view}")
        await poll(page, "window.edgefleet.role !== null && window.edgefleet.agents.size > 0")
        await asyncio.sleep(0.3)
        serious = await serious_accessibility_violations(page)
        if serious:
            found[view] = serious
    (SHOTS / "axe.json").write_text(json.dumps(found, indent=2))
    assert found == {}


async def test_an_agents_page_shows_its_model_memory_and_which_models_are_cold(
    fleet: Fleet,
) -> None:
    """The agents manage their models' memory (issue 26): their page says what the loaded
    models commit of the budget, and, for a model served but not in memory, that it loads
    on demand and how long that takes (an agent's report, hostile names kept as text)."""
    status, agent = await fleet.api("GET", "/v1/agents/edge-paris")
    assert status == 200
    load = agent["load"]
    budget, committed = load["memory_budget_bytes"], load["memory_committed_bytes"]
    assert budget > committed > 0 and load["cold_models"] == []
    page = await fleet.page(fleet.coordinator.admin_token)
    await page.goto(f"{fleet.url}/dashboard/#agent/edge-paris")
    await page.wait_for_selector("#view-agent:not([hidden])")
    await poll(page, "document.getElementById('agent-h').textContent === 'Agent edge-paris'")
    detail = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#agent-detail dt')]"
        ".map(dt => [dt.textContent, dt.nextElementSibling.textContent]))"
    )
    mib = lambda n: f"{round(n / 1048576)} MiB"  # noqa: E731
    assert detail["Model memory"] == f"{mib(committed)} of {mib(budget)} committed"
    # the same agent as one holding a second model out of memory, with an inventory
    await page.evaluate(
        """() => {
          const real = window.edgefleet.agents.get("edge-paris");
          state.detailId = null;  // live updates leave this page as the test drew it
          renderDetail({...real, load: {...real.load,
            cold_models: [["qwen2.5-coder-0.5b-instruct", 0.74], ["<img src=x>", 2]],
            inventory: [
              {name: "tiny-llama", version: "v1", state: "loaded", resident_bytes: 3145728},
              {name: "qwen2.5-coder-0.5b-instruct", version: "v2", state: "loaded",
               resident_bytes: 0}]}});
        }"""
    )
    rows = await page.evaluate(
        "[...document.querySelectorAll('#agent-models tr')]"
        ".map(tr => [...tr.children].map(td => td.textContent))"
    )
    assert rows == [
        ["tiny-llama", "v1", "loaded (3 MiB in memory)"],
        ["qwen2.5-coder-0.5b-instruct", "v2",
         "on demand (not in memory; loads in about 0.7 s)"],
    ], rows  # fmt: skip
    assert await page.evaluate("document.querySelectorAll('#agent-models img').length") == 0
    await page.screenshot(path=str(SHOTS / "agent-models-memory.png"), full_page=True)


async def test_the_header_shows_the_fleet_databases_health(fleet: Fleet) -> None:
    page = await fleet.page(fleet.coordinator.admin_token)
    await poll(page, "document.getElementById('store-health').dataset.status === 'ok'")
    shown = await page.text_content("#store-health")
    assert shown is not None and shown.startswith("Database (SQLite): ok, ")
    assert shown.endswith(" ms")
    # The database away (as /healthz says it then: tests/coordinator/test_store_outage.py
    # shows the coordinator's side): the header says so, in the "down" colour.
    status, health = await fleet.api("GET", "/healthz")
    assert status == 200
    health["status"] = "degraded"
    health["store"] |= {
        "status": "degraded", "last_error": "connection refused", "pending_writes": 42,
        "down_since": "2026-12-02T06:00:00.000Z",
    }  # fmt: skip
    await page.route(
        "**/healthz",
        lambda route: asyncio.ensure_future(route.fulfill(json=health)),
    )
    await poll(page, "document.getElementById('store-health').dataset.status === 'degraded'")
    shown = await page.text_content("#store-health")
    assert shown is not None and shown.startswith("Database (SQLite) unavailable since ")
    assert "42 writes kept" in shown
    assert await page.get_attribute("#store-health", "title") == "connection refused"
    colour = await page.evaluate("getComputedStyle(document.getElementById('store-health')).color")
    assert colour == "rgb(176, 0, 32)"  # --down
    await page.close()


async def test_the_header_shows_the_coordinators_and_the_leader(fleet: Fleet) -> None:
    """One coordinator (SQLite): it leads. Several (as /healthz says it on PostgreSQL):
    how many are alive and which one leads; none while the lease changes hands (in the
    "down" colour)."""
    page = await fleet.page(fleet.coordinator.admin_token)
    await poll(page, "document.getElementById('coordinator-health').dataset.status === 'ok'")
    assert await page.text_content("#coordinator-health") == "Coordinators: 1 alive, this one leads"
    status, health = await fleet.api("GET", "/healthz")
    assert status == 200
    health["coordinator"] |= {"members_alive": 3, "is_leader": False, "leader": "coord-b"}
    await page.route("**/healthz", lambda route: asyncio.ensure_future(route.fulfill(json=health)))
    await poll(
        page,
        "document.getElementById('coordinator-health').textContent"
        " === 'Coordinators: 3 alive, leader coord-b'",
    )
    health["coordinator"] |= {"members_alive": 2, "leader": None}
    await poll(page, "document.getElementById('coordinator-health').dataset.status === 'degraded'")
    assert await page.text_content("#coordinator-health") == "Coordinators: 2 alive, no leader now"
    await page.close()


async def test_the_keys_page_shows_each_keys_keep_alive_cap_and_policy(fleet: Fleet) -> None:
    """Issues 26, 28 and 29 gave API keys a keep-alive cap, a pin right and a policy
    (moderation rules, stream mode, semantic cache): the keys page says them, hostile
    names kept as text."""
    status, _ = await fleet.api("POST", "/v1/admin/keys", {
        "name": "<img src=x> kiosk", "max_keep_alive_s": 600, "may_pin_models": True,
        "policy": {"moderation": {"input": {"harassment": "block"},
                                  "output": {"violence": {"action": "flag", "threshold": 0.6}},
                                  "stream_mode": "unbuffered"},
                   "semantic_cache": True},
    })  # fmt: skip
    assert status in (200, 201)
    page = await fleet.page(fleet.coordinator.admin_token)
    await page.goto(f"{fleet.url}/dashboard/#keys")
    await poll(page, "[...document.querySelectorAll('#key-rows tr')].length >= 2")
    rows = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#key-rows tr')]"
        ".map(tr => [tr.children[1].textContent, [tr.children[3].textContent,"
        " tr.children[4].textContent]]))"
    )
    assert rows["<img src=x> kiosk"] == [
        "up to 10 min; may pin",
        "input harassment: block; output violence: flag at 0.6; streams unbuffered; semantic cache",
    ], rows
    plain = [v for name, v in rows.items() if name != "<img src=x> kiosk"]
    assert plain and all(v == ["the agent's cap", "default"] for v in plain), rows
    assert await page.evaluate("document.querySelectorAll('#key-rows img').length") == 0
    await page.screenshot(path=str(SHOTS / "keys-policy.png"), full_page=True)


async def test_every_view_loads_without_a_failed_request_or_a_console_error(
    fleet: Fleet,
) -> None:
    """From the first load (signed out: only the 401s of the page asking who is signed in)
    through every view signed in, the dashboard loads everything it asks for (no 4xx or
    5xx; no /favicon.ico left to 404) and logs no console error."""
    context = await fleet.browser.new_context(viewport={"width": 1300, "height": 900})
    page = await context.new_page()
    signed_in: list[bool] = []
    failed: list[str] = []
    errors: list[str] = []

    def on_response(response: Any) -> None:
        if response.status >= 400 and (signed_in or response.status != 401):
            failed.append(f"{response.status} {response.url}")

    def on_console(message: Any) -> None:
        if message.type == "error" and (signed_in or "status of 401" not in message.text):
            errors.append(message.text)

    page.on("response", on_response)
    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    await sign_in(page, fleet.url, fleet.coordinator.admin_token)
    signed_in.append(True)
    agent_id = next(iter(fleet.agents))
    for view in ("fleet", f"agent/{agent_id}", "models", "rollouts", "keys", "tokens",
                 "overflow", "audit", "series"):  # fmt: skip
        await page.goto(f"{fleet.url}/dashboard/#{view}")
        await page.wait_for_load_state("networkidle")
    assert failed == [] and errors == [], (failed, errors)
    await context.close()
