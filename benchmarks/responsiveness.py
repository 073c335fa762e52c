"""``python -m benchmarks.responsiveness [--rounds 3]``: how long /healthz and the event
loop wait while heavy requests are served, next to the same probes on the idle server, in
one run. The tests assert what a user would notice (/healthz answers meanwhile, limits
hold); how fast is measured here, where a loaded machine makes a figure, not a failure.

* coordinator: /healthz latency while another process pages through 5,000 agents
  (``/v1/agents``, 10 pages of 500, serialized on a worker thread), and on the same
  coordinator idle (tests/coordinator/test_agents_listing.py); the agents are registered
  in-process and never report (a 10 min report interval keeps them live);
* agent, ~1 MB inputs: the longest event-loop stall (a 5 ms sleep that overran) while a
  1 MB text is tokenized for /v1/embeddings (MiniLM), /v1/chat/completions and
  /v1/completions (SmolLM2); each is refused after tokenizing (too long), so the request's
  own time is the tokenization's, given next to the stall
  (tests/agent/test_embedding_limits.py, tests/agent/test_tokenize_off_loop.py);
* agent, engine saturated: /healthz latency while 8 chats (SmolLM2, 64 tokens) hold the
  4 running slots and the 4 queue places, and idle (tests/agent/test_api_under_load.py,
  tests/e2e/test_fleet_e2e.py);
* embeddings, queue full: how long a request waits to be refused while the running call
  holds (tests/agent/test_embedding_limits.py).

Targets are the bounds those tests used to assert. Needs the real models
(``python -m models build``). Writes ``benchmarks/results/responsiveness.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp.test_utils import TestServer

from benchmarks.results_file import percentile, target, write_results
from devtools.process import REPO_ROOT

FLEET = 5000
LLM = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
BIG = "lorem ipsum dolor sit amet " * 38_000  # ~1 MB

# The lister runs in a process of its own: its JSON parsing must not hold this process's
# GIL while the coordinator (in this process) answers /healthz.
LISTER = """
import json, sys, urllib.request
url, token = sys.argv[1], sys.argv[2]
path, pages, ids = '/v1/agents', 0, []
while True:
    req = urllib.request.Request(url + path, headers={'Authorization': token})
    with urllib.request.urlopen(req) as r:
        body = json.load(r)
    pages += 1
    ids += [a['agent_id'] for a in body['data']]
    if not body.get('has_more'):
        break
    path = '/v1/agents?after=' + body['last_id']
print(json.dumps({'pages': pages, 'agents': len(set(ids))}))
"""


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 2),
        "p90_ms": round(percentile(values, 90) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
        "probes": len(values),
    }


async def _timed_get(http: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with http.get(url) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {url}: {response.status}")
    return time.perf_counter() - started


async def _probe_while(
    busy: Awaitable[Any], http: aiohttp.ClientSession, url: str
) -> tuple[list[float], Any]:
    """/healthz every 10 ms until ``busy`` is done: each probe's latency, and its result."""
    task = asyncio.ensure_future(busy)
    latencies: list[float] = []
    while not task.done():
        latencies.append(await _timed_get(http, url))
        await asyncio.sleep(0.01)
    return latencies, await task


# --------------------------------------------------------------------------- coordinator


async def coordinator_listing(rounds: int) -> dict[str, Any]:
    from coordinator.api.app_keys import REGISTRY_KEY
    from coordinator.app import create_app
    from coordinator.config import CoordinatorConfig
    from edgefleet.contract import Hello, LoadedModel, Location

    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="responsiveness-") as data_dir:
        config = CoordinatorConfig(
            grpc_port=0, http_port=0, enroll_port=0, data_dir=data_dir,
            admin_token=token, max_agents=2 * FLEET,
            # these agents never report: no sweep marks them suspect while they are listed
            report_interval_ms=600_000,
        )  # fmt: skip
        app = create_app(config)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            registry = app[REGISTRY_KEY]
            for i in range(FLEET):
                registry.open_session(
                    Hello(
                        agent_id=f"edge-{i:05d}",
                        site=f"site-{i % 50}",
                        http_url=f"http://10.0.{i // 250}.{i % 250}:8000",
                        location=Location(lat=45.0 + i % 10, lon=5.0),
                        models=(LoadedModel(name=LLM, version="v1", task="chat"),),
                    )
                )
            url = str(server.make_url("")).rstrip("/")
            healthz = url + "/healthz"
            idle: list[float] = []
            during: list[float] = []
            listing_s: list[float] = []
            async with aiohttp.ClientSession() as http:
                for _ in range(200):
                    idle.append(await _timed_get(http, healthz))
                    await asyncio.sleep(0.01)
                for _ in range(rounds):
                    started = time.perf_counter()
                    process = await asyncio.create_subprocess_exec(
                        sys.executable, "-c", LISTER, url, f"Bearer {token}",
                        stdout=asyncio.subprocess.PIPE,
                    )  # fmt: skip
                    probes, (out, _) = await _probe_while(process.communicate(), http, healthz)
                    listing_s.append(time.perf_counter() - started)
                    listed = json.loads(out)
                    if process.returncode != 0 or listed != {"pages": 10, "agents": FLEET}:
                        raise RuntimeError(f"lister: {process.returncode} {listed}")
                    during.extend(probes)
        finally:
            await server.close()
    return {
        "agents": FLEET,
        "rounds": rounds,
        "listing_s_median": round(statistics.median(listing_s), 3),
        "healthz_idle": _ms(idle),
        "healthz_while_listing": _ms(during),
    }


# --------------------------------------------------------------------------------- agent


async def _longest_stall(busy: Awaitable[Any]) -> tuple[float, float, Any]:
    """The longest a 5 ms sleep overran while ``busy`` ran, its time, and its result."""
    task = asyncio.ensure_future(busy)
    started = time.perf_counter()
    longest, last = 0.0, time.perf_counter()
    while not task.done():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        longest = max(longest, now - last - 0.005)
        last = now
    took = time.perf_counter() - started
    return longest, took, await task


async def agent_figures(artifacts: Path, rounds: int) -> dict[str, Any]:
    from agent.api.app import create_app
    from agent.config import load_config

    config = load_config(
        environ={},
        overrides={
            "server": {"max_body_bytes": 2 << 20},
            "models": {"dir": str(artifacts), "serve": [LLM, EMBEDDER]},
            "engine": {"max_running": 4, "max_queue": 8},
            "log_level": "WARNING",
        },
    )
    server = TestServer(create_app(config), host="127.0.0.1", port=0)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    bodies = {
        "embeddings": ("/v1/embeddings", {"model": EMBEDDER, "input": BIG}),
        "chat": ("/v1/chat/completions",
                 {"model": LLM, "messages": [{"role": "user", "content": BIG}]}),
        "completions": ("/v1/completions", {"model": LLM, "prompt": BIG}),
    }  # fmt: skip
    stalls: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def post(path: str, body: object) -> int:
                async with http.post(url + path, json=body) as response:
                    await response.read()
                    return response.status

            # warm-up: first-request allocations are not what this measures
            for path, body in bodies.values():
                await post(path, body)
            for name, (path, body) in bodies.items():
                longest, took = [], []
                for _ in range(rounds):
                    gc.collect()
                    stall, seconds, status = await _longest_stall(post(path, body))
                    if status not in (400, 413):
                        raise RuntimeError(f"{path} with 1 MB: {status}, expected a refusal")
                    longest.append(stall)
                    took.append(seconds)
                stalls[name] = {
                    "longest_stall_ms": round(max(longest) * 1000, 1),
                    "longest_stall_ms_median": round(statistics.median(longest) * 1000, 1),
                    "request_ms_median": round(statistics.median(took) * 1000, 1),
                    "stall_over_request": round(max(longest) / statistics.median(took), 3),
                }
            saturated = await _saturated(http, url, post)
    finally:
        await server.close()
    return {"tokenize_1mb": stalls, "healthz_engine_saturated": saturated}


async def _saturated(
    http: aiohttp.ClientSession, url: str, post: Callable[[str, object], Awaitable[int]]
) -> dict[str, Any]:
    healthz = url + "/healthz"
    idle = []
    for _ in range(100):
        idle.append(await _timed_get(http, healthz))
        await asyncio.sleep(0.01)
    chat = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": 64,
        "temperature": 0,
        "cache": False,
    }
    busy = [asyncio.ensure_future(post("/v1/chat/completions", chat)) for _ in range(8)]
    async with asyncio.timeout(60):
        while True:
            async with http.get(healthz) as response:
                health = await response.json()
            if health["running"] == 4 and health["waiting"] >= 3:
                break
            await asyncio.sleep(0.01)
    during: list[float] = []
    while health["running"] == 4 and health["waiting"] >= 1:
        started = time.perf_counter()
        async with http.get(healthz) as response:
            health = await response.json()
        during.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
    statuses = await asyncio.gather(*busy)
    if set(statuses) != {200}:
        raise RuntimeError(f"saturating chats: {statuses}")
    return {"idle": _ms(idle), "while_saturated": _ms(during)}


# ---------------------------------------------------------------------------- embeddings


async def queue_full_refusal(refusals: int) -> dict[str, Any]:
    from agent.engine.embed_batcher import DynamicEmbeddingBatcher, EmbeddingBatchConfig
    from agent.errors import OverloadedError

    release = threading.Event()

    def slow(batch: list[list[int]]) -> Any:
        release.wait(60)
        return np.ones((len(batch), 4), dtype=np.float32)

    times: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        batcher = DynamicEmbeddingBatcher(
            slow, pool, EmbeddingBatchConfig(max_batch_size=2, max_queue_delay_us=0, max_queue=4)
        )
        await batcher.start()
        running = asyncio.ensure_future(batcher.embed([[1], [2]]))
        await asyncio.sleep(0.1)
        queued = asyncio.ensure_future(batcher.embed([[1], [2], [3], [4]]))
        await asyncio.sleep(0.05)
        for _ in range(refusals):
            started = time.perf_counter()
            try:
                await batcher.embed([[5]])
            except OverloadedError:
                times.append(time.perf_counter() - started)
            else:
                raise RuntimeError("a request was queued past max_queue")
        release.set()
        await asyncio.gather(running, queued)
        await batcher.close()
    return {
        "refusals": refusals,
        "refusal_us_p50": round(percentile(times, 50) * 1e6, 1),
        "refusal_us_p99": round(percentile(times, 99) * 1e6, 1),
        "refusal_ms_max": round(max(times) * 1000, 3),
    }


# ---------------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> None:
    artifacts = Path(args.models_dir)
    for name in (LLM, EMBEDDER):
        if not (artifacts / name / "manifest.json").is_file():
            sys.exit(f"{artifacts / name}: not built; run python -m models build")
    load_before = os.getloadavg()[0]
    print("coordinator: /healthz while 5,000 agents are listed ...", flush=True)
    coordinator = await coordinator_listing(args.rounds)
    print(json.dumps(coordinator, indent=2), flush=True)
    print("agent: 1 MB inputs and a saturated engine ...", flush=True)
    agent = await agent_figures(artifacts, args.rounds)
    print(json.dumps(agent, indent=2), flush=True)
    print("embeddings: refusals with the queue full ...", flush=True)
    refusal = await queue_full_refusal(args.refusals)
    print(json.dumps(refusal, indent=2), flush=True)

    listing = coordinator["healthz_while_listing"]
    stall = agent["tokenize_1mb"]
    saturated = agent["healthz_engine_saturated"]["while_saturated"]
    targets = {
        "coordinator.healthz_while_listing.p50_ms": target(
            listing["p50_ms"], "< 50", listing["p50_ms"] < 50
        ),
        "coordinator.healthz_while_listing.p90_ms": target(
            listing["p90_ms"], "< 250", listing["p90_ms"] < 250
        ),
        "coordinator.healthz_while_listing.max_ms": target(
            listing["max_ms"], "< 2000", listing["max_ms"] < 2000
        ),
        "agent.tokenize_1mb.embeddings.longest_stall_ms": target(
            stall["embeddings"]["longest_stall_ms"],
            "< 100",
            stall["embeddings"]["longest_stall_ms"] < 100,
        ),
        "agent.healthz_engine_saturated.max_ms": target(
            saturated["max_ms"], "< 100", saturated["max_ms"] < 100
        ),
        "embeddings.queue_full.refusal_ms_max": target(
            refusal["refusal_ms_max"], "< 100", refusal["refusal_ms_max"] < 100
        ),
    }
    for name in ("chat", "completions"):
        value = stall[name]["longest_stall_ms"]
        targets[f"agent.tokenize_1mb.{name}.longest_stall_ms"] = target(value, "< 150", value < 150)
    figures = {
        "machine_load_average_1m": {
            "before": round(load_before, 2),
            "after": round(os.getloadavg()[0], 2),
        },
        "coordinator": coordinator,
        "agent": agent,
        "embeddings_queue_full": refusal,
    }
    for name, t in targets.items():
        print(f"{name:52s} {t['value']:>9} {t['target']:>7} {'met' if t['met'] else 'NOT MET'}")
    print(f"wrote {write_results('responsiveness', figures, targets)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="listings and 1 MB requests each")
    parser.add_argument("--refusals", type=int, default=1000, help="queue-full refusals timed")
    parser.add_argument("--models-dir", default=str(REPO_ROOT / "models" / "artifacts"))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
