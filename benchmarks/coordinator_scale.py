"""Coordinator scale: N fake agents over real gRPC, plus route lookups, against a real process.

    .venv/bin/python -m benchmarks.coordinator_scale --agents 5000 --lookups-per-s 500

A simulator (``--workers`` processes) opens one Session per fake agent (Hello, then a
LoadReport every ``--interval-ms`` with random load), while a lookup process sends
``GET /v1/route`` at a fixed rate from random places. Measured over a steady window:
reports/s the coordinator stored, its CPU use (cores), route latency as the client sees
it and as the coordinator measures it, side by side with an idle-fleet baseline.
Writes benchmarks/results/coordinator_scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import sys
import time
from typing import Any

import aiohttp
import grpc
import psutil  # type: ignore[import-untyped, unused-ignore]

from benchmarks.results_file import target, write_results
from devtools.fleet import CoordinatorProcess
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

MODELS = ("smollm2-135m", "qwen2.5-0.5b")
AGENTS_PER_CHANNEL = 250


def _agent_place(rng: random.Random) -> tuple[float, float]:
    # Europe-ish box: dense enough that the nearest-cell search has real work.
    return rng.uniform(36.0, 60.0), rng.uniform(-9.0, 30.0)


async def _fake_agent(stub: Any, agent_id: str, interval_s: float, stop: float) -> int:
    """One agent: a session like a real one, reconnecting with backoff when it fails."""
    sent = 0
    rng = random.Random(agent_id)
    while time.monotonic() < stop:
        try:
            sent += await _fake_session(stub, agent_id, interval_s, stop)
        except grpc.aio.AioRpcError:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
    return sent


async def _fake_session(stub: Any, agent_id: str, interval_s: float, stop: float) -> int:
    rng = random.Random(agent_id)
    lat, lon = _agent_place(rng)
    queue: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
    queue.put_nowait(
        pb.AgentMessage(
            hello=pb.Hello(
                agent_id=agent_id,
                site=f"site-{rng.randrange(500)}",
                http_url=f"http://10.{rng.randrange(256)}.{rng.randrange(256)}.1:8000",
                location=pb.Location(lat=lat, lon=lon),
                models=[pb.LoadedModel(name=m, version="v1") for m in MODELS],
            )
        )
    )

    async def outgoing() -> Any:
        while (message := await queue.get()) is not None:
            yield message

    call = stub.Session(outgoing())
    sent = 0
    try:
        await call.read()  # Welcome
        await asyncio.sleep(rng.uniform(0, interval_s))  # spread reports over the interval
        while time.monotonic() < stop:
            queue.put_nowait(
                pb.AgentMessage(
                    load_report=pb.LoadReport(
                        queue_depth=rng.randrange(8),
                        tokens_per_second=rng.uniform(5, 60),
                        kv_cache_used_fraction=rng.uniform(0, 0.9),
                    )
                )
            )
            sent += 1
            await asyncio.sleep(interval_s)
    finally:
        queue.put_nowait(None)
        call.cancel()
    return sent


def _simulator(target_addr: str, ids: list[str], interval_s: float, stop: float, out: Any) -> None:
    async def run() -> int:
        channels = [
            grpc.aio.insecure_channel(target_addr, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(max(1, len(ids) // AGENTS_PER_CHANNEL))
        ]
        tasks = []
        for i, agent_id in enumerate(ids):
            stub = pb_grpc.CoordinatorStub(channels[i % len(channels)])
            tasks.append(asyncio.create_task(_fake_agent(stub, agent_id, interval_s, stop)))
            if i % 200 == 199:
                await asyncio.sleep(0.05)  # ramp, do not stampede
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()
        return sum(r for r in results if isinstance(r, int))

    out.put(asyncio.run(run()))


def _lookups(http_url: str, rate: float, start: float, stop: float, out: Any) -> None:
    async def run() -> list[float]:
        rng = random.Random(7)
        latencies: list[float] = []
        connector = aiohttp.TCPConnector(limit=32)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one() -> None:
                lat, lon = _agent_place(rng)
                params = {"model": rng.choice(MODELS), "lat": f"{lat:.4f}", "lon": f"{lon:.4f}"}
                t0 = time.perf_counter()
                async with http.get(http_url + "/v1/route", params=params) as response:
                    await response.read()
                if response.status == 200:
                    latencies.append(time.perf_counter() - t0)

            while time.monotonic() < start:
                await asyncio.sleep(0.05)
            pending: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            while next_at < stop:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                next_at += 1.0 / rate
            if pending:
                await asyncio.wait(pending)
        return latencies

    out.put(asyncio.run(run()))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _metric(http_url: str, name: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(http_url + "/metrics") as response:
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


async def _route_histogram(http_url: str) -> dict[str, float]:
    return await _metric(http_url, "edgefleet_coordinator_route_seconds")


def _server_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float:
    """Upper bucket bound holding quantile q of the lookups between two scrapes (s)."""
    buckets = sorted(
        (float(k.split('le="')[1].rstrip('"}')), after[k] - before.get(k, 0.0))
        for k in after
        if "_bucket" in k and "+Inf" not in k
    )
    total = after.get("edgefleet_coordinator_route_seconds_count", 0.0) - before.get(
        "edgefleet_coordinator_route_seconds_count", 0.0
    )
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("inf")


async def _measure_lookups(
    coordinator: CoordinatorProcess, rate: float, seconds: float
) -> tuple[list[float], dict[str, float], dict[str, float]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    now = time.monotonic()
    before = await _route_histogram(coordinator.http_url)
    proc = ctx.Process(target=_lookups, args=(coordinator.http_url, rate, now, now + seconds, out))
    proc.start()
    latencies: list[float] = await asyncio.to_thread(out.get)
    proc.join()
    after = await _route_histogram(coordinator.http_url)
    return latencies, before, after


async def main(args: argparse.Namespace) -> int:
    interval_s = args.interval_ms / 1000.0
    async with CoordinatorProcess(report_interval_ms=args.interval_ms) as coordinator:
        print(f"coordinator up at {coordinator.grpc_target}; registering {args.agents} agents")
        # Seed a small fleet so the idle baseline has something to rank.
        ctx = mp.get_context("spawn")
        sim_out = ctx.Queue()
        ramp_s = max(10.0, args.agents / 400)
        stop = time.monotonic() + 3600  # the simulators are terminated at the end
        ids = [f"sim-{i:05d}" for i in range(args.agents)]
        shares = [ids[w :: args.workers] for w in range(args.workers)]
        sims = [
            ctx.Process(
                target=_simulator, args=(coordinator.grpc_target, share, interval_s, stop, sim_out)
            )
            for share in shares
        ]
        for sim in sims:
            sim.start()

        async def connected() -> int:
            health = await coordinator.get_json("/healthz")
            return int(health["connected_agents"])

        deadline = time.monotonic() + ramp_s + 60
        while (count := await connected()) < args.agents and time.monotonic() < deadline:
            print(f"  connected {count}/{args.agents}", flush=True)
            await asyncio.sleep(2)
        count = await connected()
        print(f"connected {count}; steady window {args.duration:g} s with reports only")
        await asyncio.sleep(interval_s * 1.5)  # every agent past its first report

        process = psutil.Process(coordinator.pid)
        reports0 = await _metric(coordinator.http_url, "edgefleet_coordinator_load_reports")
        cpu0, t0 = process.cpu_times(), time.monotonic()
        await asyncio.sleep(args.duration)
        cpu1, t1 = process.cpu_times(), time.monotonic()
        reports1 = await _metric(coordinator.http_url, "edgefleet_coordinator_load_reports")
        key = "edgefleet_coordinator_load_reports_total"
        reports_per_s = (reports1.get(key, 0) - reports0.get(key, 0)) / (t1 - t0)
        cores_reports = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0)
        print(f"  reports/s {reports_per_s:.0f}, coordinator CPU {cores_reports:.2f} cores")

        print(f"lookups at {args.lookups_per_s}/s for {args.duration:g} s under that load")
        cpu2, t2 = process.cpu_times(), time.monotonic()
        latencies, h0, h1 = await _measure_lookups(coordinator, args.lookups_per_s, args.duration)
        cpu3, t3 = process.cpu_times(), time.monotonic()
        cores_both = ((cpu3.user + cpu3.system) - (cpu2.user + cpu2.system)) / (t3 - t2)
        connected_end = await connected()
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.join(5)

    lookups_per_s = len(latencies) / args.duration
    p50, p99 = _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000
    server_p50 = _server_quantile(h0, h1, 0.5) * 1000
    server_p99 = _server_quantile(h0, h1, 0.99) * 1000
    expected_reports = args.agents / interval_s
    print(
        f"route lookups: {lookups_per_s:.0f}/s, client p50 {p50:.2f} ms p99 {p99:.2f} ms; "
        f"server p50 <= {server_p50:g} ms, p99 <= {server_p99:g} ms; "
        f"coordinator CPU {cores_both:.2f} cores"
    )
    figures: dict[str, Any] = {
        "agents_requested": args.agents,
        "agents_connected": count,
        "agents_connected_at_end": connected_end,
        "report_interval_ms": args.interval_ms,
        "simulator_processes": args.workers,
        "reports_per_s_expected": round(expected_reports, 1),
        "reports_per_s_stored": round(reports_per_s, 1),
        "reports_ratio_stored_to_expected": round(reports_per_s / expected_reports, 3),
        "coordinator_cores_reports_only": round(cores_reports, 3),
        "coordinator_cores_reports_and_lookups": round(cores_both, 3),
        "coordinator_cores_per_1000_reports_s": round(cores_reports / reports_per_s * 1000, 3)
        if reports_per_s
        else None,
        "lookups_per_s_requested": args.lookups_per_s,
        "lookups_per_s_achieved": round(lookups_per_s, 1),
        "route_client_p50_ms": round(p50, 3),
        "route_client_p99_ms": round(p99, 3),
        "route_server_p50_ms_bucket_bound": server_p50,
        "route_server_p99_ms_bucket_bound": server_p99,
        "route_client_to_server_p99_ratio": round(p99 / server_p99, 2) if server_p99 else None,
        "machine_note": "simulator, lookup client and coordinator share the same cores",
    }
    targets = {
        "agents_connected": target(count, f">= {args.agents}", count >= args.agents),
        "reports_ratio_stored_to_expected": target(
            figures["reports_ratio_stored_to_expected"], ">= 0.95",
            figures["reports_ratio_stored_to_expected"] >= 0.95,
        ),
        "coordinator_cores_reports_and_lookups": target(
            figures["coordinator_cores_reports_and_lookups"], "<= 1.0", cores_both <= 1.0
        ),
        "lookups_per_s_achieved": target(
            figures["lookups_per_s_achieved"], f">= {0.95 * args.lookups_per_s:g}",
            lookups_per_s >= 0.95 * args.lookups_per_s,
        ),
        "route_client_p99_ms": target(figures["route_client_p99_ms"], "< 5", p99 < 5),
        "route_server_p99_ms_bucket_bound": target(server_p99, "< 5", server_p99 < 5),
    }  # fmt: skip
    path = write_results("coordinator_scale", figures, targets)
    print(f"wrote {path}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2, help="simulator processes")
    parser.add_argument("--lookups-per-s", type=float, default=500.0)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per window")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
