"""The dashboard's catalog, rollouts and redaction views in a real browser (Playwright
driving Debian's Chromium) against a real coordinator and two real tiny-model agents that
sync their models from its catalog.

- the catalog view shows the versions ``python -m coordinator models publish`` put there,
  with the agents desiring and loading each, as ``GET /v1/admin/models`` says;
- the rollouts view shows a real rollout's state, step, waves and gate figures as
  ``GET /v1/admin/rollouts/{id}`` says; pause, resume and abort clicked on the page change
  the coordinator's state each time (read back through the admin API);
- a request that overflows from one agent to a pool (the other agent) with an e-mail
  address in it is redacted before it leaves; the agent's LoadReport.redactions reaches
  the fleet series and the page charts EMAIL under "Redactions by type", beside the
  pool's overflow cost;
- axe-core finds nothing serious in those three views;
- sessions are kept in the coordinator's database: a coordinator with the page open stops
  cleanly on SIGTERM, and after its restart the open page's live stream reconnects,
  still signed in; restarted with another bootstrap admin token (the page signed in with
  the old one), the open page goes back to its sign-in form by itself; signing in again
  works.

The fleet runs as beyond loopback: the coordinator with TLS (the dashboard, admin API and
model files over HTTPS, enrollment required), agents enrolled with join tokens, API keys
required (the tests' requests send a minted key; the pool's credential file holds one).
The sending agent serves HTTPS on its enrollment certificate; the agent standing in for
the GPU pool serves plain HTTP on loopback (``server.tls = auto``), as a pool behind the
site's own network would be reached: a pool is called with the system's trust store, not
the fleet CA. Chromium trusts the dashboard's certificate; the restarted coordinator
serves the same certificate (given as the operator's files).

Screenshots go to test-artifacts/dashboard/.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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
from devtools.fleet import ADMIN_TOKEN_ENV, AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.process import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts" / "dashboard"
TINY = "tiny-llama"
BIG = "big-model"  # loaded nowhere: the pool's model_names send it to the tiny model
POOL = "gpu-pool"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _other_version(version: str) -> str:
    """Another catalog version name for the same files (``<variant>-<12 hex>``)."""
    variant, _, digest = version.rpartition("-")
    return f"{variant}-{int(digest, 16) ^ 1:012x}"


@dataclass
class Fleet:
    coordinator: CoordinatorProcess
    agents: list[AgentProcess]
    browser: Any
    v1: str
    v2: str
    api_key: str
    coordinator_args: list[str]  # its extra_args (for the restart)
    pages: list[Any] = field(default_factory=list)

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method,
                self.coordinator.http_url + path,
                json=body,
                headers=self.coordinator.admin_headers,
                ssl=self.coordinator.http_context(),
            ) as response,
        ):
            data = await response.json()
            assert response.status in (200, 201), (method, path, response.status, data)
            return data

    async def page(self) -> Any:
        context = await self.browser.new_context(viewport={"width": 1300, "height": 900})
        page = await context.new_page()
        await sign_in(page, self.coordinator.http_url, self.coordinator.admin_token)
        return page


async def _cli(coordinator: CoordinatorProcess, *args: str) -> None:
    """``python -m coordinator ARGS`` as an operator runs it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", *args, "--url", coordinator.http_url,
        "--ca-file", str(coordinator.ca_file), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": coordinator.admin_token},
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, f"coordinator {' '.join(args)}: {err.decode()}"


async def _serves(agent: AgentProcess, api_key: str, version: str) -> bool:
    async with (
        aiohttp.ClientSession(headers=agent.headers(api_key)) as http,
        http.post(
            agent.url + "/v1/completions", json={"model": TINY, "prompt": "Hi", "max_tokens": 1},
            ssl=agent.ssl_context or True,
        ) as response,
    ):  # fmt: skip
        return response.status == 200 and (await response.json())["model"] == f"{TINY}@{version}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> AsyncIterator[Fleet]:  # fmt: skip
    from playwright.async_api import async_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_factory.mktemp("dashboard-rollouts")
    pool_port = _free_port()
    targets = tmp / "overflow-targets.json"
    # the pool's API key, written once minted (the agent reads it when a request goes out)
    pool_key = tmp / "pool-api-key"
    targets.write_text(json.dumps({"pools": [{
        "name": POOL, "endpoints": [{"url": f"http://127.0.0.1:{pool_port}/v1"}],
        "model_names": {BIG: TINY}, "prompt_price_per_1k": 1.0, "completion_price_per_1k": 2.0,
        "credential_file": str(pool_key),
    }]}))  # fmt: skip
    coordinator_args = ["--set", f"overflow_targets_file={targets}"]
    coordinator = CoordinatorProcess(
        report_interval_ms=400, data_dir=tmp / "coordinator", extra_args=coordinator_args,
        tls=True,
    )  # fmt: skip
    agents: list[AgentProcess] = []
    await coordinator.start()
    holder = [coordinator]  # the last test restarts it
    try:
        v1 = json.loads((tiny_artifacts / TINY / "manifest.json").read_text())["version"]
        v2 = _other_version(v1)

        async def publish(version: str) -> None:
            await _cli(coordinator, "models", "publish", str(tiny_artifacts / TINY),
                       "--name", TINY, "--version", version)  # fmt: skip

        async def catalog() -> None:
            """Publish v1 and deploy it everywhere, then publish v2 while agents sync."""
            await publish(v1)
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{coordinator.http_url}/v1/admin/models/{TINY}/{v1}/deploy",
                          json={}, headers=coordinator.admin_headers,
                          ssl=coordinator.http_context()) as response,
            ):  # fmt: skip
                assert response.status == 200, await response.text()
            await publish(v2)

        # The sender: enrolled, HTTPS on its enrollment certificate.
        agents.append(enrolled_agent(
            coordinator, agent_id="dash-agent-0", site="east", state_dir=tmp / "agent-0",
            extra_args=["--set", "models.source=store", "--set", "overflow.allow_cloud=true"],
        ))  # fmt: skip
        # The pool: enrolled too, plain HTTP on loopback at the pool's URL.
        agents.append(AgentProcess(
            coordinator=coordinator.grpc_target, agent_id="dash-agent-1", site="west",
            port=pool_port, state_dir=tmp / "agent-1",
            join_token=coordinator.mint_join_token("west"),
            extra_args=[
                "--set", "models.source=store",
                "--set", "coordinator.tls=true",
                "--set", f"coordinator.enroll_target={coordinator.enroll_target}",
                "--set", f"coordinator.ca_file={coordinator.ca_file}",
            ],
        ))  # fmt: skip
        # The agents start (empty stores) while the catalog is filled; they sync v1.
        await asyncio.gather(catalog(), *(agent.start() for agent in agents))
        api_key = await coordinator.api_key_for(agents)
        pool_key.write_text(await coordinator.api_key_for(agents[1:], name="gpu-pool"))
        for agent in agents:
            await wait_until(lambda a=agent: _serves(a, api_key, v1), timeout_s=120,  # type: ignore[misc]
                             message=f"{agent.agent_id} serves {TINY}@{v1}")  # fmt: skip
        # the dashboard's HTTPS certificate (the restarted coordinator serves it again)
        trust = trusting_certificate((coordinator.data_dir / "tls" / "http.crt").read_bytes())
        async with async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=chromium_path(), headless=True, args=trust
            )
            fleet = Fleet(coordinator, agents, browser, v1, v2, api_key, coordinator_args)
            yield fleet
            holder.append(fleet.coordinator)
            await browser.close()
    finally:
        for agent in agents:
            await agent.terminate()
        await holder[-1].terminate()


async def _text(page: Any, selector: str) -> str:
    return str(
        await page.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? ''")
    )


async def test_the_catalog_view_shows_the_published_versions(fleet: Fleet) -> None:
    page = await fleet.page()
    await page.click("nav a[href='#models']")
    await poll(page, "document.querySelectorAll('#model-rows tr').length === 2")
    catalog = await fleet.api("GET", "/v1/admin/models")
    shown = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#model-rows tr')].map(tr =>"
        " [tr.dataset.model, [...tr.children].map(td => td.textContent)]))"
    )
    for item in catalog["data"]:
        row = shown[f"{item['name']}@{item['version']}"]
        assert row[:3] == [item["name"], item["version"], item["task"]]
        assert row[3] == f"{item['size_bytes'] / 1e6:.1f} MB"
        assert row[4] == ("passed" if item["gate_passed"] else "failed")
        assert row[5] == "no"
        assert row[6:9] == [str(item["desired_by"]), str(item["loaded_on"]), item["published_at"]]
        assert row[9] == str(item["held_by"]) == "1"  # one coordinator: it holds every file
    assert {v["version"] for v in catalog["data"]} == {fleet.v1, fleet.v2}
    assert shown[f"{TINY}@{fleet.v1}"][6] == "2"  # both agents desire v1 (the deploy rule)
    rules = await page.evaluate(
        "[...document.querySelectorAll('#model-rules tr')]"
        ".map(tr => [tr.children[1].textContent, tr.children[3].textContent])"
    )
    assert rules == [[fleet.v1, "on demand"]]  # the deploy named no residency
    assert catalog["signing_public_key"] in await _text(page, "#models-note")
    await page.screenshot(path=str(SHOTS / "models.png"), full_page=True)


async def _wait_state(fleet: Fleet, rollout_id: str, want: str) -> dict[str, Any]:
    async def reached() -> bool:
        found = await fleet.api("GET", f"/v1/admin/rollouts/{rollout_id}")
        return bool(found["state"] == want)

    await wait_until(reached, timeout_s=10, message=f"rollout {rollout_id} is {want}")
    return dict(await fleet.api("GET", f"/v1/admin/rollouts/{rollout_id}"))


async def test_the_rollouts_view_shows_a_real_rollout_and_pauses_resumes_aborts_it(
    fleet: Fleet,
) -> None:
    started = await fleet.api("POST", "/v1/admin/rollouts", {
        "model": TINY, "version": fleet.v2, "canary_count": 1, "waves": [100], "soak_s": 600,
        "min_requests": 3, "require_self_check": False,
    })  # fmt: skip
    rid = started["rollout_id"]
    canary = started["plan"][0][0]
    agent = next(a for a in fleet.agents if a.agent_id == canary)
    await wait_until(lambda: _serves(agent, fleet.api_key, fleet.v2), timeout_s=60,
                     message=f"the canary {canary} serves {fleet.v2}")  # fmt: skip
    for _ in range(3):  # traffic on the canary: the gate's figures move
        assert await _serves(agent, fleet.api_key, fleet.v2)
    await wait_until(
        lambda: _gate_requests(fleet, rid, 4), timeout_s=15, message="the gate counts requests"
    )
    page = await fleet.page()
    await page.click("nav a[href='#rollouts']")
    await poll(page, f"document.querySelector('#rollout-rows tr[data-rollout=\"{rid}\"]')")
    row = await page.evaluate(
        f"[...document.querySelector('#rollout-rows tr[data-rollout=\"{rid}\"]').children]"
        ".map(td => td.textContent)"
    )
    assert row[:6] == [rid, f"{TINY}@{fleet.v2}", fleet.v1, "running", "canary (step 1 of 2)",
                       "1 / 2"]  # fmt: skip
    # The detail: waves and the gate's figures as the admin API has them now.
    await poll(page, f"document.getElementById('rollout-detail').dataset.rollout === '{rid}'")
    waves = await page.evaluate(
        "[...document.querySelectorAll('#rollout-detail ol.waves li')].map(li => li.textContent)"
    )
    assert waves == ["canary: 1 agents, running, moved", "wave 1: 1 agents, waiting"]
    detail = await fleet.api("GET", f"/v1/admin/rollouts/{rid}")
    gate = detail["gate"]
    assert gate["requests"] >= 4 and gate["loaded"] == 1 and gate["agents"] == 1
    figures = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#rollout-detail dd[data-gate]')]"
        ".map(dd => [dd.dataset.gate, dd.textContent]))"
    )
    assert figures["verdict"] == gate["verdict"] == "wait"
    assert figures["requests"] == f"{gate['requests']} (at least 3)"
    assert figures["loaded"] == "1 of 1"
    assert figures["ttft_p99_s"].startswith(f"{gate['ttft_p99_s'] * 1000:.1f} ms (previous")
    assert f"{gate['failed']} failed; at most 2.00 %" in figures["error_rate"]
    assert figures["soak"].endswith("of 600 s")
    assert gate["reasons"] and "soak" in figures["reasons"].lower(), (figures, gate)
    await page.screenshot(path=str(SHOTS / "rollouts.png"), full_page=True)

    # Pause, resume, abort: each click changes the coordinator's state.
    for verb, want in (("pause", "paused"), ("resume", "running"), ("abort", "aborted")):
        await page.click(f"#rollout-detail button[data-action={verb}]")
        found = await _wait_state(fleet, rid, want)
        await poll(
            page,
            f"document.querySelector('#rollout-rows tr[data-rollout=\"{rid}\"]')"
            f"?.children[3].textContent === '{want}'",
            timeout_s=10,
        )
        if verb == "pause":
            assert found["paused_at"] is not None
            await page.screenshot(path=str(SHOTS / "rollout-paused.png"), full_page=True)
    assert "aborted by" in found["detail"]
    await poll(page, "!document.querySelector('#rollout-detail button[data-action]')")
    assert await _text(page, "#rollout-detail dd.rollout-state") == "aborted"
    audit = await fleet.api("GET", "/v1/admin/audit?limit=100")
    actions = [e["action"] for e in audit["data"] if rid in e.get("target", "") or rid in
               e.get("action", "")]  # fmt: skip
    for verb in ("pause", "resume", "abort"):
        assert any(a.endswith(f"/{verb}") for a in actions), actions
    await page.screenshot(path=str(SHOTS / "rollout-aborted.png"), full_page=True)
    # Rolled back: the canary serves v1 again.
    await wait_until(lambda: _serves(agent, fleet.api_key, fleet.v1), timeout_s=60,
                     message=f"the canary {canary} is back on {fleet.v1}")  # fmt: skip


async def _gate_requests(fleet: Fleet, rollout_id: str, at_least: int) -> bool:
    found = await fleet.api("GET", f"/v1/admin/rollouts/{rollout_id}")
    return bool(found["gate"] and found["gate"]["requests"] >= at_least)


async def test_redactions_by_type_are_charted_after_a_redacting_overflow(fleet: Fleet) -> None:
    page = await fleet.page()
    await page.click("nav a[href='#overflow']")
    await page.wait_for_selector("#view-overflow:not([hidden])")
    sender = fleet.agents[0]
    # A key without allow_cloud keeps its requests at the site: no pool for it.
    async with (
        aiohttp.ClientSession(headers=sender.headers(fleet.api_key)) as http,
        http.post(
            sender.url + "/v1/chat/completions", ssl=sender.ssl_context or True,
            json={"model": BIG, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        ) as response,
    ):  # fmt: skip
        assert response.status == 404, await response.text()
        assert (await response.json())["error"]["code"] == "model_not_found"
    # Leaving the site needs the agent's overflow.allow_cloud and the key's.
    cloud_key = await fleet.coordinator.api_key_for([sender], name="cloud", allow_cloud=True)
    async with aiohttp.ClientSession(headers=sender.headers(cloud_key)) as http:
        for _ in range(2):
            body = {
                "model": BIG, "max_tokens": 4,
                "messages": [{"role": "user",
                              "content": "Mail jane.doe@example.com and bob@example.org now"}],
            }  # fmt: skip
            async with http.post(
                sender.url + "/v1/chat/completions", json=body, ssl=sender.ssl_context or True
            ) as response:
                assert response.status == 200, await response.text()
                assert response.headers["X-Edgefleet-Served-By"] == POOL
        # The agent's totals: 4 e-mail addresses redacted before the requests left.
        async with http.get(sender.url + "/metrics", ssl=sender.ssl_context or True) as response:
            metrics = await response.text()
    assert 'edgefleet_agent_redactions_total{type="EMAIL"} 4.0' in metrics

    # The 10 s point holding them reaches the page over SSE (no reload) and is charted.
    await poll(
        page,
        "[...document.querySelectorAll('#chart-redactions .series-name')]"
        ".some(s => s.textContent === 'EMAIL')",
        timeout_s=40,
    )
    names = await page.evaluate(
        "[...document.querySelectorAll('#chart-redactions .series-name')].map(s => s.textContent)"
    )
    assert "EMAIL" in names
    points = await page.evaluate("window.edgefleet.points")
    assert sum(p["redactions"].get("EMAIL", 0) for p in points) == 4
    assert sum(p["redactions_per_s"].get("EMAIL", 0) for p in points) == pytest.approx(0.4)
    # Beside it: the pool's overflow cost, from its prices.
    cost_names = await page.evaluate(
        "[...document.querySelectorAll('#chart-overflow-cost .series-name')]"
        ".map(s => s.textContent)"
    )
    assert cost_names == [POOL]
    assert sum(p["overflow_cost"].get(POOL, 0) for p in points) > 0
    assert await page.evaluate("document.querySelectorAll('#chart-redactions img').length") == 0
    await page.screenshot(path=str(SHOTS / "overflow-redactions.png"), full_page=True)
    # The sending agent's detail: its totals since start, and its inventory.
    await page.goto(f"{fleet.coordinator.http_url}/dashboard/#agent/{sender.agent_id}")
    await poll(page, "document.querySelectorAll('#agent-models tr').length > 0")
    facts = await page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#agent-detail dt')]"
        ".map(dt => [dt.textContent, dt.nextElementSibling.textContent]))"
    )
    assert facts["Redactions since start"] == "EMAIL: 4"
    models = await page.evaluate(
        "[...document.querySelectorAll('#agent-models tr')]"
        ".map(tr => [...tr.children].map(td => td.textContent))"
    )
    # served and in memory, with what it holds (its agent manages its models' memory)
    served = [m for m in models if m[:2] == [TINY, fleet.v1]]
    assert len(served) == 1 and re.fullmatch(r"loaded \(\d+ MiB in memory\)", served[0][2]), models


async def test_the_catalog_rollouts_and_overflow_views_pass_an_accessibility_audit(
    fleet: Fleet,
) -> None:
    """axe-core (npm, run offline) over the three views with real data in them."""
    page = await fleet.page()
    found: dict[str, Any] = {}
    for view, ready in (
        ("models", "#model-rows tr"),
        ("rollouts", "#rollout-detail dl"),
        ("overflow", "#chart-redactions .series-name"),
    ):
        await page.click(f"nav a[href='#{view}']")
        await poll(page, f"document.querySelector({json.dumps(ready)})")
        serious = await serious_accessibility_violations(page)
        if serious:
            found[view] = serious
    (SHOTS / "axe-rollouts-models-overflow.json").write_text(json.dumps(found, indent=2))
    assert found == {}


async def test_a_restart_keeps_the_session_and_a_new_bootstrap_token_ends_it(
    fleet: Fleet,
) -> None:
    page = await fleet.page()
    await poll(page, "document.querySelectorAll('#agent-rows tr').length === 2")

    async def restart(env: dict[str, str]) -> None:
        old = fleet.coordinator
        # SIGTERM: the open page's event stream does not hold the shutdown (a clean exit,
        # not the SIGKILL that terminate() sends after its timeout: 30 s, not 10, since on a
        # loaded 2-core CI machine a clean stop, with its 5 s gRPC grace, once took longer)
        assert await old.terminate(timeout_s=30) == 0
        # The same HTTPS certificate, as the operator's files (a start without them issues
        # a new one from the fleet CA, which a browser trusting the CA would take as well).
        cert = old.data_dir / "tls"
        fleet.coordinator = CoordinatorProcess(
            grpc_port=old.grpc_port, http_port=int(old.http_url.rsplit(":", 1)[1]),
            report_interval_ms=400, data_dir=old.data_dir, tls=True,
            enroll_port=old.enroll_port,
            extra_args=[*fleet.coordinator_args,
                        "--set", f"http_tls_cert_file={cert / 'http.crt'}",
                        "--set", f"http_tls_key_file={cert / 'http.key'}"],
            env=env,
        )  # fmt: skip
        await fleet.coordinator.start()

    # The same bootstrap token: the sign-in is in the database; no reload, the live stream
    # breaks and reconnects (a new "ready" event), still signed in.
    await page.evaluate("document.getElementById('status-line').textContent = ''")
    await restart({ADMIN_TOKEN_ENV: fleet.coordinator.admin_token})
    await poll(page, "document.getElementById('status-line').textContent"
                     " === 'Live updates connected.'", timeout_s=20)  # fmt: skip
    assert await page.is_hidden("#view-signin") and not await page.is_hidden("#nav")
    assert await page.evaluate("fetch('/v1/admin/whoami').then((r) => r.status)") == 200
    assert (await _text(page, "#who")).endswith("(admin)")

    # Another bootstrap token: the page signed in with the old one is refused and signs out.
    await restart({})
    await poll(page, "!document.getElementById('view-signin').hidden", timeout_s=20)
    assert await page.is_hidden("#nav") and await page.is_hidden("#view-fleet")
    assert await page.evaluate("document.querySelectorAll('#agent-rows tr').length") == 0
    assert "session has ended" in await _text(page, "#status-line")
    await page.screenshot(path=str(SHOTS / "session-ended.png"), full_page=True)
    await page.fill("#signin-token", fleet.coordinator.admin_token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector("#view-fleet:not([hidden])")
    assert (await _text(page, "#who")).endswith("(admin)")
