"""Several models on one agent under a memory budget, in a real agent process with API keys
on (a standalone site's keys file): SmolLM2 and Qwen2.5-Coder with room for one at a time
(``residency.max_loaded = 1``; the byte budget is covered by tests/agent/test_residency.py).
The first loads at start, the second is listed ``available``; a request for it loads it
and unloads the idle first (least recently used), both answer right, ``/v1/models`` and
``/metrics`` say so, an idle model goes after its keep-alive and the resident set drops by
most of its footprint; a request's ``keep_alive`` is checked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from agent.engine.residency import LOADER_NICE
from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until
from tests.e2e.test_qwen_e2e import _keys_file  # the site's keys file, as its operator makes it

pytestmark = [pytest.mark.e2e]

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"
TINY = "tiny-llama"


async def _models(agent: AgentProcess, key: str) -> dict[str, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(headers=agent.headers(key)) as http,
        http.get(agent.url + "/v1/models") as resp,
    ):
        assert resp.status == 200
        return {m["id"]: m for m in (await resp.json())["data"]}


async def _metric(agent: AgentProcess, key: str, sample: str) -> float:
    async with (
        aiohttp.ClientSession(headers=agent.headers(key)) as http,
        http.get(agent.url + "/metrics") as resp,
    ):
        for line in (await resp.text()).splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _ask(client: openai.AsyncOpenAI, model: str, question: str, **extra: Any) -> str:
    reply = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=24,
        temperature=0,
        **extra,
    )
    return reply.choices[0].message.content or ""


async def test_two_models_take_turns_where_one_fits(real_artifacts: Path, tmp_path: Path) -> None:
    keys_file, key = _keys_file(tmp_path)
    settings = {
        "auth.keys_file": str(keys_file),
        "engine.kv_cache_bytes": str(64 << 20),
        "engine.prefix_cache_bytes": str(8 << 20),
        # Qwen's 548 MiB of files and 72 of caches fit, and one model at a time
        "residency.budget_bytes": str(700 << 20),
        "residency.max_loaded": "1",
        "residency.min_residency_s": "0",
        "residency.keep_alive_s": "4",
        "cache.enabled": "false",
    }
    extra = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    async with AgentProcess(
        models_dir=str(real_artifacts), serve=[SMOL, QWEN], extra_args=extra
    ) as agent:
        models = await _models(agent, key)
        assert models[SMOL]["state"] == "loaded" and models[QWEN]["state"] == "available"
        assert models[SMOL]["resident_bytes"] > 20 << 20 and models[QWEN]["resident_bytes"] == 0
        process = psutil.Process(agent.pid)
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=key, max_retries=0
        ) as client:
            assert "Paris" in await _ask(client, SMOL, "Name the capital of France.")
            started = time.monotonic()
            answer = await _ask(client, QWEN, "Name the capital of France.")
            cold = time.monotonic() - started
            assert "Paris" in answer
            models = await _models(agent, key)
            assert models[QWEN]["state"] == "loaded" and models[SMOL]["state"] == "available"
            assert models[QWEN]["expires_at"] > time.time()
            loads = 'edgefleet_agent_model_loads_total{model="qwen2.5-coder-0.5b-instruct",'
            assert await _metric(agent, key, loads + 'reason="request",result="loaded"}') == 1
            evicted = 'edgefleet_agent_model_evictions_total{model="smollm2-135m-instruct",'
            assert await _metric(agent, key, evicted + 'reason="room"}') == 1
            committed = await _metric(
                agent, key, 'edgefleet_agent_memory_budget_bytes{part="committed"}'
            )
            assert 0 < committed <= 700 << 20
            # back to SmolLM2: Qwen goes, SmolLM2 answers the same as before
            assert "Paris" in await _ask(client, SMOL, "Name the capital of France.")
            assert (await _models(agent, key))[QWEN]["state"] == "available"

            # a request's keep_alive: checked, never "forever" from a request
            with pytest.raises(openai.BadRequestError, match="keep_alive"):
                await _ask(client, SMOL, "Hi", extra_body={"keep_alive": "-1"})
            with pytest.raises(openai.BadRequestError, match="keep_alive"):
                await _ask(client, SMOL, "Hi", extra_body={"keep_alive": "5 parsecs"})

            # idle past its keep-alive (4 s), SmolLM2 is unloaded and its memory given back
            busy_rss = process.memory_info().rss
            footprint = (await _models(agent, key))[SMOL]["resident_bytes"]
            deadline = time.monotonic() + 15
            while (await _models(agent, key))[SMOL]["state"] != "available":
                assert time.monotonic() < deadline, "SmolLM2 was not unloaded when idle"
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)
            freed = busy_rss - process.memory_info().rss
            # most of it: an unload that kept the session would free next to nothing; the
            # agent's own allocations meanwhile (requests, logs, Python's heap) are a few MiB
            # either way (CI saw 110 of 124 MiB freed under load)
            assert freed >= 0.75 * footprint, (freed >> 20, footprint >> 20)
            kept = 'edgefleet_agent_model_evictions_total{model="smollm2-135m-instruct",'
            assert await _metric(agent, key, kept + 'reason="keep_alive"}') == 1
            # and it comes back on the next request
            assert "Paris" in await _ask(client, SMOL, "Name the capital of France.")
    assert cold < 30


def _threads(pid: int) -> dict[str, int]:
    """The process's threads by name (comm), each with its nice value."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            nice = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
            found[f"{name}#{task.name}"] = nice
    return found


async def test_models_share_one_thread_pool_and_loads_yield_the_cores(
    real_artifacts: Path, tiny_artifacts: Path
) -> None:
    """One ONNX Runtime pool for every session: an agent holding three models has no more
    threads than one holding the tiny one. A load's thread lasts as long as the load (it
    runs at LOADER_NICE only beside serving models: test_residency), so none is left."""
    args = ["--threads", "2", "--set", "cache.enabled=false"]
    async with AgentProcess(
        models_dir=str(real_artifacts), serve=["tiny-llama"], extra_args=args
    ) as agent:
        one = _threads(agent.pid)
    async with AgentProcess(
        models_dir=str(real_artifacts), serve=["tiny-llama", SMOL, QWEN], extra_args=args
    ) as agent:
        models = await _models(agent, "")
        assert {m["state"] for m in models.values() if m.get("state")} == {"loaded"}
        three = _threads(agent.pid)
        for _ in range(20):  # a heap trim after a load has a thread while it runs (ms)
            if len(three) <= len(one):
                break
            await asyncio.sleep(0.1)
            three = _threads(agent.pid)
    assert len(three) <= len(one), (sorted(one), sorted(three))
    # no load's thread left, at whatever priority (Python does not name its threads for
    # the OS: a thread at the loader's nice would be a loader's)
    assert list(three.values()).count(LOADER_NICE) == 0, three
    assert list(one.values()).count(LOADER_NICE) == 0


def _cli(*args: str, admin_token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEFLEET_ADMIN_TOKEN": admin_token}
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip


def _affinities(pid: int) -> dict[str, str]:
    """The process's threads (native ids) and the cores each may run on (a list: "0-1")."""
    found: dict[str, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    found[task.name] = line.split(":", 1)[1].strip()
    return found


async def test_a_load_beside_a_serving_model_keeps_the_steps_threads_apart(
    real_artifacts: Path, tmp_path: Path
) -> None:
    """SmolLM2 loads while the tiny model serves: meanwhile the step thread and ONNX
    Runtime's pool worker (found by the agent itself when it made the pool) are each pinned
    to a core of their own, the rest of the agent's threads (the loader's among them) are
    not, and when the load is done every thread may run anywhere again (step_cores)."""
    keys_file, key = _keys_file(tmp_path)
    state = tmp_path / "state"
    args = ["--threads", "2", "--set", f"auth.keys_file={keys_file}",
            "--set", "residency.min_residency_s=0", "--set", "cache.enabled=false"]  # fmt: skip
    async with AgentProcess(
        models_dir=str(real_artifacts), serve=[TINY, SMOL], state_dir=state, extra_args=args
    ) as agent:
        everywhere = _affinities(agent.pid)[str(agent.pid)]
        env = {**os.environ, "EDGEFLEET_AGENT_COORDINATOR__STATE_DIR": str(state)}
        port = agent.url.rsplit(":", 1)[1]
        done = subprocess.run(
            [sys.executable, "-m", "agent", "models", "--port", port, "unload", SMOL],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        samples: list[dict[str, str]] = []

        async def sample() -> None:
            while True:
                samples.append(_affinities(agent.pid))
                await asyncio.sleep(0.02)

        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=key, max_retries=0
        ) as client:
            loaded = asyncio.Event()

            async def serve_tiny() -> None:  # the tiny model serves before and during the load
                while not loaded.is_set():
                    await _ask(client, TINY, "Count from one to twenty.")

            serving = asyncio.create_task(serve_tiny())
            await asyncio.sleep(0.3)
            sampler = asyncio.create_task(sample())
            try:
                answer = await _ask(client, SMOL, "Name the capital of France.")
            finally:
                loaded.set()
                sampler.cancel()
            await serving
        assert "Paris" in answer
        after = _affinities(agent.pid)
    cores = sorted(os.sched_getaffinity(0))  # the agent's: it inherits this process's
    pinned = [sorted(v for v in s.values() if v != everywhere) for s in samples]
    if len(cores) >= 2:
        assert [str(cores[0]), str(cores[1])] in pinned, pinned
    # nothing else is ever pinned (a sample may fall between the two threads' calls)
    assert all(set(p) <= {str(cores[0]), str(cores[1])} and len(set(p)) == len(p)
               for p in pinned), pinned  # fmt: skip
    assert set(after.values()) == {everywhere}, after


async def test_an_operator_unloads_and_loads_a_model_through_the_coordinator(
    real_artifacts: Path,
) -> None:
    """agents unload-model / load-model: a command over the agent's session; the agent's
    /v1/models and its report (the route's predicted wait) follow, and bad input is
    refused with a clear error."""
    async with (
        CoordinatorProcess(report_interval_ms=200) as coordinator,
        AgentProcess(
            models_dir=str(real_artifacts),
            serve=["tiny-llama", SMOL],
            coordinator=coordinator.grpc_target,
            agent_id="edge-budget",
            extra_args=["--threads", "2"],
        ) as agent,
    ):
        key = await coordinator.api_key_for([agent])
        assert (await _models(agent, key))[SMOL]["state"] == "loaded"
        url, token = coordinator.http_url, coordinator.admin_token

        async def state() -> str:
            return str((await _models(agent, key))[SMOL]["state"])

        async def predicted_wait() -> float:
            route = await coordinator.get_json(f"/v1/route?model={SMOL}")
            return float(route["agents"][0]["predicted_wait_ms"])

        done = _cli("agents", "unload-model", "edge-budget", SMOL, "--url", url,
                    admin_token=token)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"unload_model {SMOL} sent" in done.stdout
        await wait_until(lambda: _is(state, "available"), timeout_s=10, message="unloaded")
        # the next report says it is cold: the route counts its load
        await wait_until(lambda: _positive(predicted_wait), timeout_s=5, message="cold")
        done = _cli("agents", "load-model", "edge-budget", SMOL, "--url", url,
                    admin_token=token)  # fmt: skip
        assert done.returncode == 0, done.stderr
        await wait_until(lambda: _is(state, "loaded"), timeout_s=20, message="loaded")
        await wait_until(lambda: _is(predicted_wait, 0.0), timeout_s=5, message="warm")
        # refused: a model it does not serve, a hostile name, an unknown agent
        for args, code in (
            (("edge-budget", QWEN), "404 agent edge-budget does not serve model"),
            (("edge-budget", "../../admin"), "400 model must be a model name"),
            (("edge-budget", "a" * 300), "400 model must be a model name"),
            (("no-such-agent", SMOL), "no-such-agent"),
        ):
            done = _cli("agents", "load-model", *args, "--url", url, admin_token=token)
            assert done.returncode != 0 and code in done.stderr, (args, done.stderr)
        assert (await _models(agent, key))[SMOL]["state"] == "loaded"


async def _is(probe: Any, wanted: Any) -> bool:
    return bool(await probe() == wanted)


async def _positive(probe: Any) -> bool:
    return bool(await probe() > 0)


async def test_a_standalone_agents_operator_loads_and_unloads_from_the_box(
    real_artifacts: Path, tmp_path: Path
) -> None:
    """A standalone agent (API keys on, no coordinator) makes its admin token at start
    (0600, in its state directory); ``python -m agent models unload|load|list`` on the box
    uses it, and /v1/models follows. An API key does not open the admin API."""
    keys_file, key = _keys_file(tmp_path)
    state = tmp_path / "state"
    async with AgentProcess(
        models_dir=str(real_artifacts), serve=[SMOL], state_dir=state,
        extra_args=["--set", f"auth.keys_file={keys_file}", "--set", "residency.min_residency_s=0"],
    ) as agent:  # fmt: skip
        token_file = state / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        port = agent.url.rsplit(":", 1)[1]
        env = {**os.environ, "EDGEFLEET_AGENT_COORDINATOR__STATE_DIR": str(state)}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "agent", "models", "--port", port, *args],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip

        assert (await _models(agent, key))[SMOL]["state"] == "loaded"
        done = cli("unload", SMOL)
        assert done.returncode == 0, done.stderr
        assert '"unloaded": true' in done.stdout
        assert (await _models(agent, key))[SMOL]["state"] == "available"
        done = cli("load", SMOL)
        assert done.returncode == 0 and '"state": "loaded"' in done.stdout, done.stderr
        assert (await _models(agent, key))[SMOL]["resident_bytes"] > 20 << 20
        done = cli("load", "no-such-model")
        assert done.returncode == 1 and "error 404" in done.stderr
        wrong = tmp_path / "wrong-token"
        wrong.write_text(key)  # an API key is not the admin token
        done = cli("--admin-token-file", str(wrong), "unload", SMOL)
        assert done.returncode == 1 and "error 401" in done.stderr
        assert (await _models(agent, key))[SMOL]["state"] == "loaded"
