"""The dashboard in a real browser (Playwright driving Debian's Chromium) against a real
coordinator and real agents (tiny model), as a fleet beyond loopback runs: the coordinator
with TLS (the dashboard over HTTPS, its certificate from the fleet CA, which the browser
trusts; enrollment required), agents enrolled with join tokens serving HTTPS, API keys
required. Screenshots of each view are written to test-artifacts/dashboard/."""

from __future__ import annotations

import asyncio
import json
import tempfile
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

    async def page(self, token: str | None = None) -> Any:
        context = await self.browser.new_context(viewport={"width": 1300, "height": 900})
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
async def fleet(tiny_artifacts: Path) -> AsyncIterator[Fleet]:
    from playwright.async_api import async_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="edgefleet-dashboard-test-"))
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


async def test_agents_on_the_map_and_table_numbers_move_and_a_killed_agent_goes_down(
    fleet: Fleet,
) -> None:
    page = await fleet.page(fleet.coordinator.admin_token)
    await poll(page, "document.querySelectorAll('#agent-rows tr').length === 2")
    await poll(page, "document.querySelectorAll('#map-dots circle').length === 2")
    rows = await _rows(page)
    assert rows["edge-paris"][1] == "paris" and rows["edge-paris"][2] == "live"
    assert "tiny-llama" in rows["edge-tokyo"][7]
    paris = await page.evaluate(
        "[...document.querySelectorAll('#map-dots circle')].find(c =>"
        " c.dataset.agent === 'edge-paris').getAttribute('cx')"
    )
    assert float(paris) == pytest.approx((2.35 + 180) * 2, abs=0.1)
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
    dot = await page.evaluate(
        "document.querySelector('#map-dots circle[data-agent=\"edge-tokyo\"]')"
        ".getAttribute('class')"
    )
    assert dot == "down"
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
    for name in ("Queue", "Running", "Tokens/s", "KV cache"):
        assert detail[name][0] == "-", (name, detail[name])
        assert detail[name][1].startswith("last report: "), (name, detail[name])
    await page.goto(f"{fleet.url}/dashboard/#series")
    await page.wait_for_selector("#view-series:not([hidden])")
    await page.screenshot(path=str(SHOTS / "metrics.png"), full_page=True)


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
        title = await page.evaluate(
            "document.querySelector('#map-dots circle[data-agent=\"edge-xss\"]').textContent"
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
