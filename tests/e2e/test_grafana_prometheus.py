"""The Grafana board and alert rules in deploy/ against real processes: Debian's
``prometheus`` scrapes a real coordinator (with a viewer token) and a real agent (tiny
model, some requests served), every panel query of the board is evaluated and must
return data, and ``promtool check rules`` accepts the alert rules.

Both run as beyond loopback: the coordinator with TLS (HTTPS API, enrollment required),
the agent enrolled and serving HTTPS on its enrollment certificate, API keys required.
Prometheus is configured as an operator would: ``scheme: https`` with the fleet CA, the
viewer token for the coordinator, and an API key for the agent (its ``/metrics`` needs
one, any valid key)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import CoordinatorProcess, enrolled_agent
from devtools.process import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
BOARD = REPO / "deploy" / "grafana" / "edgefleet-fleet.json"
RULES = REPO / "deploy" / "prometheus" / "alerts.yml"


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: apt-get install -y prometheus"
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_promtool_accepts_the_alert_rules() -> None:
    done = subprocess.run(
        [_tool("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_the_board_is_importable_as_is() -> None:
    board = json.loads(BOARD.read_text())
    assert board["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) >= 12
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])


async def _query(http: aiohttp.ClientSession, base: str, expr: str) -> list[Any]:
    async with http.get(f"{base}/api/v1/query", params={"query": expr}) as response:
        body = await response.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


async def test_every_panel_query_returns_data_from_real_processes(
    tiny_artifacts: Path, tmp_path: Path
) -> None:
    async with CoordinatorProcess(report_interval_ms=500, tls=True) as coordinator:
        status, minted = await _post(
            coordinator, "/v1/admin/admin-tokens", {"role": "viewer", "name": "prometheus"}
        )
        assert status == 201
        token_file = tmp_path / "viewer-token"
        token_file.write_text(minted["token"])
        async with enrolled_agent(
            coordinator,
            agent_id="edge-prom",
            site="lab",
            state_dir=tmp_path / "agent",
            models_dir=str(tiny_artifacts),
            serve=["tiny-llama"],
        ) as agent:
            api_key = await coordinator.api_key_for([agent], name="prometheus")
            key_file = tmp_path / "agent-api-key"
            key_file.write_text(api_key)
            # why the agent's scrape needs the key
            async with (
                aiohttp.ClientSession() as http,
                http.get(agent.url + "/metrics", ssl=coordinator.ca_context()) as response,
            ):
                assert response.status == 401
            port = _free_port()
            config = tmp_path / "prometheus.yml"
            config.write_text(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {RULES}\n"
                "scrape_configs:\n"
                "  - job_name: edgefleet-coordinator\n"
                f"    scheme: https\n    tls_config:\n      ca_file: {coordinator.ca_file}\n"
                f"    authorization:\n      credentials_file: {token_file}\n"
                f"    static_configs:\n      - targets: ['{coordinator.http_url.split('//')[1]}']\n"
                "  - job_name: edgefleet-agent\n"
                f"    scheme: https\n    tls_config:\n      ca_file: {coordinator.ca_file}\n"
                f"    authorization:\n      credentials_file: {key_file}\n"
                f"    static_configs:\n      - targets: ['{agent.url.split('//')[1]}']\n"
            )
            prometheus = subprocess.Popen(
                [
                    _tool("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            base = f"http://127.0.0.1:{port}"
            try:
                async with aiohttp.ClientSession() as http:

                    async def both_up() -> bool:
                        try:
                            up = await _query(http, base, "up == 1")
                        except (aiohttp.ClientError, AssertionError):
                            return False
                        return len(up) == 2

                    await wait_until(
                        both_up, timeout_s=60, interval_s=0.5, message="prometheus scraping both"
                    )
                    # Load between scrapes: requests (TTFT), route lookups.
                    for _ in range(6):
                        async with http.post(
                            agent.url + "/v1/chat/completions",
                            json={
                                "model": "tiny-llama",
                                "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hello"}],
                            },
                            headers=agent.headers(api_key),
                            ssl=coordinator.ca_context(),
                        ) as response:
                            assert response.status == 200
                        async with http.get(
                            f"{coordinator.http_url}/v1/route?model=tiny-llama",
                            ssl=coordinator.http_context(),
                        ) as response:
                            assert response.status == 200
                        await asyncio.sleep(0.5)
                    await asyncio.sleep(2.5)  # two more scrapes after the last request
                    board = json.loads(BOARD.read_text())
                    empty = []
                    for panel in board["panels"]:
                        for target in panel["targets"]:
                            result = await _query(http, base, target["expr"])
                            if not result:
                                empty.append((panel["title"], target["expr"]))
                    assert empty == [], empty
                    ttft = await _query(http, base, board["panels"][7]["targets"][1]["expr"])
                    assert float(ttft[0]["value"][1]) > 0  # a real quantile, not NaN
                    live = await _query(http, base, board["panels"][1]["targets"][0]["expr"])
                    assert {r["metric"]["site"]: r["value"][1] for r in live} == {"lab": "1"}
                    rules = await _rules(http, base)
                    assert len(rules) == 5 and all(r["health"] == "ok" for r in rules), rules
            finally:
                prometheus.terminate()
                prometheus.wait(timeout=30)


async def _rules(http: aiohttp.ClientSession, base: str) -> list[Any]:
    async with http.get(f"{base}/api/v1/rules") as response:
        body = await response.json()
    return [r for g in body["data"]["groups"] for r in g["rules"]]


async def _post(coordinator: CoordinatorProcess, path: str, body: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            coordinator.http_url + path,
            json=body,
            headers=coordinator.admin_headers,
            ssl=coordinator.http_context(),
        ) as response,
    ):
        return response.status, await response.json()
