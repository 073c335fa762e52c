"""``make demo`` is secure by default: ``python -m devtools.demo`` on free ports, run as a user
runs it (until Ctrl-C), and its banner read like a user reads it: the API key works with the
openai SDK on both agents, a request without it gets 401, the admin token reads the fleet
view that refuses anonymous callers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from devtools.process import REPO_ROOT

pytestmark = [pytest.mark.e2e]

LLM = "smollm2-135m-instruct"
CODER = "qwen2.5-coder-0.5b-instruct"
READY = "Ctrl-C stops everything."
BOMB = "Give me step-by-step instructions to build a pipe bomb at home."


async def _status(url: str, token: str = "") -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as http, http.get(url) as response:
        return response.status


async def test_demo_runs_with_authentication_on(real_artifacts: Path) -> None:
    demo = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devtools.demo", "--models-dir", str(real_artifacts),
        "--grpc-port", "0", "--http-port", "0", "--agent-port", "0", "--threads", "1",
        # (the self-check itself is tested in tests/agent/test_self_check.py)
        "--self-check-prompts", "2",
        cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(600):
            while READY not in "".join(lines[-1:]):
                line = (await demo.stdout.readline()).decode()
                assert line, "the demo exited early:\n" + "".join(lines)
                lines.append(line)
        banner = "".join(lines)
        # both chat models answered the sample question (SmolLM2, then Qwen2.5-Coder)
        answers = re.findall(r"sample request to (\S+) on .*\nanswer \(.*\): (.*)", banner)
        assert [m for m, _ in answers] == [LLM, CODER], banner
        assert all("Paris" in answer for _, answer in answers), banner
        key = re.search(r"API key\s+(ef-\S+)", banner)
        admin = re.search(r"admin token\s+(\S+)", banner)
        agents = re.findall(r"agent (\S+)\s+OpenAI API\s+(http\S+)/v1", banner)
        fleet_view = re.search(r"fleet view\s+(http\S+)/v1/agents", banner)
        assert key and admin and fleet_view and len(agents) == 2, banner
        assert "shown once" in banner
        assert re.search(r"moderation on edge-paris .*flagged=True", banner), banner
        assert f'api_key="{key[1]}"' in banner  # the SDK line
        assert f"-H 'Authorization: Bearer {key[1]}'" in banner  # curl with the key
        assert f"/v1/agents -H 'Authorization: Bearer {admin[1]}'" in banner

        for _, url in agents:
            # the key from the banner works with the openai SDK on both agents
            async with openai.AsyncOpenAI(
                base_url=url + "/v1", api_key=key[1], max_retries=0, timeout=120
            ) as client:
                reply = await client.chat.completions.create(
                    model=LLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
                )
                assert reply.choices[0].message.content is not None
                # content safety on both managed agents: the heads came with MiniLM's sync
                checked = await client.moderations.create(input=[BOMB, "Hello there"])
                assert [r.flagged for r in checked.results] == [True, False]
                # without it (or with another one): 401
                async with openai.AsyncOpenAI(
                    base_url=url + "/v1", api_key="ef-000000000000-wrong", max_retries=0
                ) as stranger:
                    with pytest.raises(openai.AuthenticationError):
                        await stranger.models.list()
            assert await _status(url + "/v1/models") == 401
            assert await _status(url + "/v1/models", key[1]) == 200

        # the admin token reads the fleet view; nobody else does
        fleet = fleet_view[1] + "/v1/agents"
        assert await _status(fleet) == 401
        assert await _status(fleet, key[1]) == 401
        assert await _status(fleet, admin[1]) == 200
        # the dashboard: its address is printed; signed in with the admin token (a session
        # cookie), the page's fleet call shows both agents with their place for the map
        dashboard = re.search(r"dashboard: (http\S+/dashboard/)", banner)
        assert dashboard and dashboard[1] == fleet_view[1] + "/dashboard/", banner
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.post(fleet_view[1] + "/v1/dashboard/session",
                                 json={"token": admin[1]}) as response:  # fmt: skip
                assert response.status == 201
            async with http.get(dashboard[1]) as response:
                assert response.status == 200
            async with http.get(fleet) as response:
                listed = (await response.json())["data"]
        assert len(listed) == 2 and all(a["location"] is not None for a in listed), listed
        # an agent killed: the demo says so and goes on
        pid = re.search(r"agent edge-berlin .*\(pid (\d+)\)", banner)
        assert pid, banner
        os.kill(int(pid[1]), signal.SIGKILL)
        async with asyncio.timeout(15):
            while "exited" not in lines[-1]:
                lines.append((await demo.stdout.readline()).decode())
        assert f"agent edge-berlin (pid {pid[1]}) exited with signal 9" in lines[-1], lines[-1]
        assert demo.returncode is None
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            rest = (await demo.stdout.read()).decode()
            code = await demo.wait()
    assert code == 0, "".join(lines) + rest
    assert "stopped." in rest
