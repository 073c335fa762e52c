"""A request's keep_alive at the residency (issue 26): never a way for one key to push
other keys' models out. A long keep_alive only keeps an idle model loaded longer: a
newcomer still takes the least recently used idle model's room, however long that one's
keep_alive. Only a pin (a key allowed to pin models) protects a model, and an operator's
unload ends it; a negative keep_alive without the pin flag never means forever."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.__main__ import main as agent_main
from agent.engine.residency import ModelState
from devtools.fleet import AgentProcess
from tests.agent.test_residency import MiB, add, residency

TINY = "tiny-llama"


async def test_a_long_keep_alive_does_not_protect_a_model_from_eviction_for_room() -> None:
    r = residency(budget_bytes=100 * MiB, keep_alive_s=60.0, max_request_keep_alive_s=3600.0)
    greedy, other, newcomer = add(r, "greedy", 40), add(r, "other", 40), add(r, "new", 40)
    await r.acquire("greedy", keep_alive_s=3600.0)  # the longest a request may ask
    r.release("greedy")
    await r.acquire("other")  # used after it: greedy is the least recently used
    r.release("other")
    await r.acquire("new")  # needs one of them to go
    r.release("new")
    assert (greedy.detached, other.detached, newcomer.builds) == (1, 0, 1)
    assert r.state("greedy") is ModelState.AVAILABLE
    await r.close()


async def test_a_requests_pin_protects_its_model_until_an_operator_unloads_it() -> None:
    r = residency(budget_bytes=100 * MiB, keep_alive_s=0.1, room_wait_s=0.2)
    pinned, other, newcomer = add(r, "pinned", 40), add(r, "other", 40), add(r, "new", 40)
    await r.acquire("pinned", pin=True)
    r.release("pinned")
    await r.acquire("other")  # used after it: pinned is the least recently used
    r.release("other")
    await r.acquire("new")  # room is made from the other one: the pinned one is no victim
    r.release("new")
    assert (pinned.detached, other.detached, newcomer.builds) == (0, 1, 1)
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["new"]  # idle past its keep-alive; the pin stays
    assert {s["model"]: s["pinned"] for s in r.snapshot()}["pinned"] is True
    assert await r.unload("pinned")  # the operator's unload ends the request's pin
    await r.acquire("pinned")  # loaded again by a request without the pin: on demand
    r.release("pinned")
    assert {s["model"]: s["pinned"] for s in r.snapshot()}["pinned"] is False
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["pinned"]
    await r.close()


async def test_a_negative_keep_alive_without_the_pin_flag_is_not_forever() -> None:
    r = residency(keep_alive_s=0.1)
    add(r, "a", 10)
    await r.acquire("a", keep_alive_s=-1.0)  # a caller that skipped the key's check
    r.release("a")
    assert [s["pinned"] for s in r.snapshot()] == [False]
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["a"]
    await r.close()


# --- a real agent process with API keys on (a standalone site's keys file) -----------------


async def _chat(agent: AgentProcess, key: str, keep_alive: object) -> tuple[int, dict[str, Any]]:
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "keep_alive": keep_alive}  # fmt: skip
    async with (
        aiohttp.ClientSession(headers=agent.headers(key)) as http,
        http.post(agent.url + "/v1/chat/completions", json=body) as response,
    ):
        return response.status, await response.json()


async def _tiny(agent: AgentProcess, key: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(headers=agent.headers(key)) as http,
        http.get(agent.url + "/v1/models") as response,
    ):
        assert response.status == 200
        (model,) = [m for m in (await response.json())["data"] if m["id"] == TINY]
        return dict(model)


async def test_an_agent_process_caps_keep_alive_per_key_and_pins_for_the_key_allowed(
    tiny_artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two keys, made as a site's operator makes them: one capped at 60 s without the pin
    right, one allowed to pin. "10m" from the first keeps the model 60 s (``/v1/models``
    ``expires_at``); -1 from it is a 400 (OpenAI error body, param keep_alive), from the
    second it pins the model (``pinned: true``, no expiry)."""
    keys_file = tmp_path / "keys.json"
    secrets = []
    for extra in (["--max-keep-alive", "60s"], ["--may-pin-models"]):
        assert agent_main(["keys", "add", "--file", str(keys_file), *extra]) == 0
        secrets.append(capsys.readouterr().out.strip())
    capped, pinner = secrets
    settings = {"auth.keys_file": str(keys_file), "residency.keep_alive_s": "5",
                "cache.enabled": "false"}  # fmt: skip
    extra_args = ["--threads", "1"]
    extra_args += [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    async with AgentProcess(
        models_dir=str(tiny_artifacts), serve=[TINY], extra_args=extra_args
    ) as agent:
        status, _ = await _chat(agent, capped, "10m")
        assert status == 200
        model = await _tiny(agent, capped)
        assert model["pinned"] is False
        assert time.time() + 45 < model["expires_at"] <= time.time() + 61  # 60 s, not 10 min

        status, body = await _chat(agent, capped, -1)
        assert status == 400
        assert set(body) == {"error"}
        error = body["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "keep_alive")
        assert capped.split("-")[1] in error["message"]  # names the key (its public id)
        assert (await _tiny(agent, capped))["pinned"] is False

        for hostile in (True, [5], "5x", "nan", "inf", "1e999", 1e300, 10**30):
            status, body = await _chat(agent, pinner, hostile)
            assert status == 400 and body["error"]["param"] == "keep_alive", (hostile, body)

        status, _ = await _chat(agent, pinner, -1)
        assert status == 200
        model = await _tiny(agent, pinner)
        assert model["pinned"] is True and model["expires_at"] is None
        assert model["state"] == "loaded"
