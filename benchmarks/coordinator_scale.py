"""Coordinator scale: N fake agents over real gRPC, plus route lookups, against a real process.

    .venv/bin/python -m benchmarks.coordinator_scale --agents 5000 --lookups-per-s 500

A simulator (``--workers`` processes) opens one Session per fake agent (Hello, then a
LoadReport every ``--interval-ms`` with random load); a separate lookup process sends
``GET /v1/route`` at a fixed (open-loop) rate from random places over keep-alive
connections with a minimal HTTP/1.1 client, so that the client's own CPU cost stays
small. With ``--pin`` (the default on 2+ cores) the coordinator runs alone on CPU 0
and the load generators share the other CPUs, the simulators at a lower priority than
the lookup client: the coordinator's "one core" is then enforced, not just measured.

Measured over two steady windows, side by side: reports/s the coordinator stored and
its CPU use (cores) with reports only, then with lookups too. Route latency twice:

* coordinator side: the routing decision itself (candidates, scoring), timed inside the
  router for gRPC and HTTP lookups alike (``edgefleet_coordinator_route_seconds``; buckets are
  0.25 ms apart up to 5 ms; p99 is given as its bucket's upper bound and interpolated;
* client side: from writing the request to reading the whole response, in the lookup
  process (loopback, queueing in the coordinator's event loop and the kernel
  included); the lookup process's own lag behind its schedule is reported apart,
  so a starved client shows up as lag and not as coordinator latency.

Garbage-collector pauses of the coordinator during the lookup window come from its
``edgefleet_coordinator_gc_pause_seconds`` histogram.
Writes benchmarks/results/coordinator_scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import grpc
import psutil  # type: ignore[import-untyped, unused-ignore]

from benchmarks.results_file import target, write_results
from devtools.fleet import CoordinatorProcess
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

MODELS = ("smollm2-135m", "qwen2.5-0.5b")
AGENTS_PER_CHANNEL = 250
# Lookups sent before the measured window (connections opening), not counted.
WARMUP_S = 3.0


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
                contract_minor=CONTRACT_MINOR,
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
                        running_sequences=rng.randrange(8),
                        waiting_sequences=rng.randrange(4),
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


class _Connection:
    """One keep-alive HTTP/1.1 connection; just enough client for GET with Content-Length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, host: str, path: str) -> tuple[int, bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)


def _lookups(
    http_url: str, rate: float, warmup_s: float, seconds: float, warm: Any, out: Any
) -> None:
    """Open-loop lookups; puts (latencies s, schedule lags s, failures, CPU s) on ``out``.

    The first ``warmup_s`` (connections opening, caches filling) are not measured;
    ``warm`` is set when measuring starts.
    """
    parts = urlsplit(http_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    async def run() -> tuple[list[float], list[float], int, float]:
        rng = random.Random(7)
        latencies: list[float] = []
        lags: list[float] = []
        failures = 0
        idle: list[_Connection] = []

        measuring = False

        async def one(due: float) -> None:
            nonlocal failures
            lat, lon = _agent_place(rng)
            path = f"/v1/route?model={rng.choice(MODELS)}&lat={lat:.4f}&lon={lon:.4f}"
            connection = (
                idle.pop() if idle else _Connection(*await asyncio.open_connection(host, port))
            )
            t0 = time.perf_counter()
            counted = measuring
            if counted:
                lags.append(max(0.0, time.monotonic() - due))
            try:
                status, _ = await connection.get(host, path)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                failures += 1
                connection.writer.close()
                return
            elapsed = time.perf_counter() - t0
            idle.append(connection)
            if not counted:
                return
            if status == 200:
                latencies.append(elapsed)
            else:
                failures += 1

        pending: set[asyncio.Task[None]] = set()
        due = time.monotonic()
        start, cpu0 = due + warmup_s, 0.0
        stop = start + seconds
        while due < stop:
            if not measuring and due >= start:
                measuring, cpu0 = True, time.process_time()
                warm.set()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            task = asyncio.create_task(one(due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            due += 1.0 / rate
        if pending:
            await asyncio.wait(pending)
        cpu = time.process_time() - cpu0
        for connection in idle:
            connection.writer.close()
        return latencies, lags, failures, cpu

    out.put(asyncio.run(run()))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _metric(
    http_url: str, name: str, headers: dict[str, str] | None = None
) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(http_url + "/metrics") as response,
    ):
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def _histogram_delta(
    before: dict[str, float], after: dict[str, float], name: str, labels: str = ""
) -> tuple[list[tuple[float, float]], float]:
    """Cumulative (upper bound, count) buckets and the count between two scrapes."""
    buckets = []
    for key, value in after.items():
        if not key.startswith(name + "_bucket{") or labels not in key or "+Inf" in key:
            continue
        bound = float(key.split('le="')[1].split('"')[0])
        buckets.append((bound, value - before.get(key, 0.0)))
    count_key = f"{name}_count{{{labels}}}" if labels else f"{name}_count"
    return sorted(buckets), after.get(count_key, 0.0) - before.get(count_key, 0.0)


def _server_quantile(
    buckets: list[tuple[float, float]], total: float, q: float
) -> tuple[float, float]:
    """(upper bucket bound, linear interpolation inside the bucket) of quantile q (s)."""
    if not total:
        return float("nan"), float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            inside = cumulative - below
            fraction = (rank - below) / inside if inside else 1.0
            return bound, lower + (bound - lower) * fraction
        lower, below = bound, cumulative
    return float("inf"), float("inf")


async def _measure_lookups(
    coordinator: CoordinatorProcess, rate: float, seconds: float, cpus: set[int] | None
) -> tuple[
    tuple[list[float], list[float], int, float], dict[str, float], dict[str, float], float, float
]:
    """Runs the lookup process; returns its results, metric scrapes and the window (s)."""
    ctx = mp.get_context("spawn")
    out, warm = ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=_lookups, args=(coordinator.http_url, rate, WARMUP_S, seconds, warm, out)
    )
    proc.start()
    if cpus and proc.pid is not None:
        os.sched_setaffinity(proc.pid, cpus)
    await asyncio.to_thread(warm.wait)
    process = psutil.Process(coordinator.pid)
    before = await _metric(
        coordinator.http_url, "edgefleet_coordinator_", coordinator.admin_headers
    )
    since = (process.cpu_times(), time.monotonic())
    waited = _run_queue_wait_s(coordinator.pid)
    result = await asyncio.to_thread(out.get)
    cores = _cores(process, since)
    window = time.monotonic() - since[1]
    before["run_queue_wait_s"] = (_run_queue_wait_s(coordinator.pid) - waited) / window
    before["load_average_1m"] = os.getloadavg()[0]
    after = await _metric(coordinator.http_url, "edgefleet_coordinator_", coordinator.admin_headers)
    proc.join()
    return result, before, after, window, cores


def _pin(pid: int, cpus: set[int], nice: int | None = None) -> None:
    """Set the CPU affinity (and niceness) of every thread of a process."""
    for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, tid, nice)


def _run_queue_wait_s(pid: int) -> float:
    """Seconds the process's threads were runnable but waiting for a CPU (schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            total += int(fh.read().split()[1])
    return total / 1e9


def _cores(process: Any, since: tuple[Any, float]) -> float:
    cpu0, t0 = since
    cpu1, t1 = process.cpu_times(), time.monotonic()
    return float((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0)


async def main(args: argparse.Namespace) -> int:
    interval_s = args.interval_ms / 1000.0
    all_cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if args.pin is not None else len(all_cpus) >= 2
    coordinator_cpus = {all_cpus[0]} if pin else None
    load_cpus = set(all_cpus[1:]) if pin else None
    async with CoordinatorProcess(report_interval_ms=args.interval_ms) as coordinator:
        if pin and coordinator_cpus and load_cpus:
            _pin(coordinator.pid, coordinator_cpus)
            _pin(os.getpid(), load_cpus)
            print(f"coordinator on CPU {sorted(coordinator_cpus)}, load on {sorted(load_cpus)}")
        print(f"coordinator up at {coordinator.grpc_target}; registering {args.agents} agents")
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
            if load_cpus and sim.pid is not None:
                _pin(sim.pid, load_cpus, nice=args.simulator_nice)

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
        key = "edgefleet_coordinator_load_reports_total"
        reports0 = await _metric(coordinator.http_url, key, coordinator.admin_headers)
        since = (process.cpu_times(), time.monotonic())
        await asyncio.sleep(args.duration)
        cores_reports = _cores(process, since)
        reports1 = await _metric(coordinator.http_url, key, coordinator.admin_headers)
        reports_per_s = (reports1.get(key, 0) - reports0.get(key, 0)) / args.duration
        print(f"  reports/s {reports_per_s:.0f}, coordinator CPU {cores_reports:.2f} cores")

        print(f"lookups at {args.lookups_per_s:g}/s for {args.duration:g} s under that load")
        measured = await _measure_lookups(coordinator, args.lookups_per_s, args.duration, load_cpus)
        (latencies, lags, failures, client_cpu_s), h0, h1, window, cores_both = measured
        reports_during = (h1.get(key, 0) - h0.get(key, 0)) / window
        connected_end = await connected()
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.join(5)

    lookups_per_s = len(latencies) / args.duration
    p50, p99 = _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000
    lag_p99 = _percentile(lags, 0.99) * 1000
    route = "edgefleet_coordinator_route_seconds"
    buckets, total = _histogram_delta(h0, h1, route)
    server_p50 = _server_quantile(buckets, total, 0.5)
    server_p99 = _server_quantile(buckets, total, 0.99)
    server_over_5ms = total - dict(buckets).get(0.005, 0.0)
    server_mean = (h1.get(f"{route}_sum", 0.0) - h0.get(f"{route}_sum", 0.0)) / total * 1000
    gc_name = "edgefleet_coordinator_gc_pause_seconds"
    gc2, gc2_count = _histogram_delta(h0, h1, gc_name, 'generation="2"')
    gc2_ms = (h1.get(f'{gc_name}_sum{{generation="2"}}', 0.0)
              - h0.get(f'{gc_name}_sum{{generation="2"}}', 0.0)) * 1000  # fmt: skip
    gc2_max = _server_quantile(gc2, gc2_count, 1.0)[0] * 1000 if gc2_count else 0.0
    expected_reports = args.agents / interval_s
    print(
        f"route lookups: {lookups_per_s:.0f}/s; coordinator p50 {server_p50[1] * 1000:.3f} ms "
        f"p99 {server_p99[1] * 1000:.3f} ms (bucket <= {server_p99[0] * 1000:g} ms), "
        f"{server_over_5ms:.0f} of {total:.0f} over 5 ms; client p50 {p50:.2f} ms "
        f"p99 {p99:.2f} ms, schedule lag p99 {lag_p99:.2f} ms, client CPU "
        f"{client_cpu_s / args.duration:.2f} cores; coordinator CPU {cores_both:.2f} cores; "
        f"reports/s {reports_during:.0f}; full GCs {gc2_count:.0f} ({gc2_ms:.1f} ms in all); "
        f"coordinator waited for a CPU {h0['run_queue_wait_s'] * 1000:.0f} ms/s; "
        f"load average {h0['load_average_1m']:.2f}"
    )
    figures: dict[str, Any] = {
        "agents_requested": args.agents,
        "agents_connected": count,
        "agents_connected_at_end": connected_end,
        "report_interval_ms": args.interval_ms,
        "simulator_processes": args.workers,
        "cpus_coordinator": sorted(coordinator_cpus) if coordinator_cpus else "any",
        "cpus_simulators_and_lookup_client": sorted(load_cpus) if load_cpus else "any",
        "simulator_nice": args.simulator_nice if pin else 0,
        "reports_per_s_expected": round(expected_reports, 1),
        "reports_per_s_stored": round(reports_per_s, 1),
        "reports_per_s_stored_during_lookups": round(reports_during, 1),
        "reports_ratio_stored_to_expected": round(reports_per_s / expected_reports, 3),
        "coordinator_cores_reports_only": round(cores_reports, 3),
        "coordinator_cores_reports_and_lookups": round(cores_both, 3),
        "coordinator_cores_per_1000_reports_s": round(cores_reports / reports_per_s * 1000, 3)
        if reports_per_s
        else None,
        "lookups_per_s_requested": args.lookups_per_s,
        "lookups_per_s_achieved": round(lookups_per_s, 1),
        "lookup_failures": failures,
        "route_server_lookups_observed": int(total),
        "route_server_mean_ms": round(server_mean, 3),
        "route_server_p50_ms": round(server_p50[1] * 1000, 3),
        "route_server_p99_ms": round(server_p99[1] * 1000, 3),
        "route_server_p99_ms_bucket_bound": server_p99[0] * 1000,
        "route_server_over_5ms": int(server_over_5ms),
        "route_client_p50_ms": round(p50, 3),
        "route_client_p99_ms": round(p99, 3),
        "route_client_schedule_lag_p99_ms": round(lag_p99, 3),
        "lookup_client_cores": round(client_cpu_s / args.duration, 3),
        "route_client_to_server_p99_ratio": round(p99 / (server_p99[1] * 1000), 2)
        if server_p99[1]
        else None,
        "coordinator_run_queue_wait_s_per_s": round(h0["run_queue_wait_s"], 4),
        "machine_load_average_1m": round(h0["load_average_1m"], 2),
        "coordinator_full_gc_count": int(gc2_count),
        "coordinator_full_gc_total_ms": round(gc2_ms, 1),
        "coordinator_full_gc_max_ms_bucket_bound": gc2_max,
        "machine_note": (
            "coordinator alone on one CPU; simulators (niced) and lookup client on the other"
            if pin
            else "simulator, lookup client and coordinator share the same cores"
        ),
        "client_side_measures": (
            "write of the request to the last byte of the response, one process of its own, "
            "keep-alive HTTP/1.1 over loopback; schedule lag (open-loop) reported apart"
        ),
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
        "route_server_p99_ms": target(
            figures["route_server_p99_ms"], "< 5", figures["route_server_p99_ms"] < 5
        ),
        "route_client_p99_ms": target(figures["route_client_p99_ms"], "< 5", p99 < 5),
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
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="coordinator alone on CPU 0, load generators on the rest (default: with 2+ CPUs)",
    )
    parser.add_argument(
        "--simulator-nice", type=int, default=10, help="niceness of the simulators when pinned"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
