"""Store outage: the coordinator's PostgreSQL killed for 30 s under simulated agents and lookups.

    .venv/bin/python -m benchmarks.store_outage [--agents 1000 --lookups-per-s 100 --down-s 30]

A throwaway PostgreSQL cluster (tests/postgres_cluster.py; ``synchronous_commit = on``
for the coordinator's database, so that a commit the server acknowledged survives an
immediate stop, as on a production server), a coordinator process on it, and
``--agents`` simulated agents over real gRPC (the scale benchmark's plaintext sessions,
``--workers`` processes): each says Hello, sends a LoadReport every interval and, like a
real agent, one new per-request record every interval in a ``RequestRecords`` batch with
every record not sent on this session yet; a record leaves its spool only when the
coordinator acknowledges it (``RecordsAck``), and a new session sends again everything
not acknowledged. Route lookups at ``--lookups-per-s`` (the scale benchmark's open-loop
client) run throughout.

After ``--steady-s``, PostgreSQL is killed (``pg_ctl stop -m immediate``: no shutdown
checkpoint, every connection cut) and started again ``--down-s`` later. Reported:

* failed lookups (target 0), over the whole run;
* agents shown down (target 0): the most the coordinator's metrics ever counted down,
  sampled every 0.25 s; and the fewest connected;
* acknowledged request records lost (target 0): once the agents stop, every record each
  agent had acknowledged is looked for in the database;
* catch-up time: from PostgreSQL accepting connections again to the coordinator's
  ``/healthz`` saying ``ok`` with no kept write left; and the most writes kept.

Bounded: about steady + down + 60 s of catch-up at most, plus the ramp. Writes
benchmarks/results/store_outage.json.
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

import aiohttp
import grpc
import msgpack

from benchmarks.coordinator_scale import (
    AGENTS_PER_CHANNEL,
    MODELS,
    WARMUP_S,
    _agent_place,
    _lookups,
)
from benchmarks.results_file import target, write_results
from devtools.fleet import CoordinatorProcess
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.postgres_cluster import PostgresCluster

CATCH_UP_LIMIT_S = 60.0
# Lookups go on this long after PostgreSQL is started again (through the catch-up).
LOOKUPS_AFTER_S = 30.0


async def _recording_agent(
    channel: Any, agent_id: str, interval_s: float, stop: Any, acked: dict[str, int]
) -> None:
    """One agent: sessions as the scale benchmark's, plus a record per interval, kept
    until acknowledged (``acked[agent_id]``: the last sequence number acknowledged)."""
    rng = random.Random(agent_id)
    lat, lon = _agent_place(rng)
    next_seq = 1
    acked[agent_id] = 0
    while not stop.is_set():
        queue: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
        queue.put_nowait(pb.AgentMessage(hello=pb.Hello(
            agent_id=agent_id, site=f"site-{rng.randrange(100)}",
            http_url=f"http://10.{rng.randrange(256)}.{rng.randrange(256)}.1:8000",
            location=pb.Location(lat=lat, lon=lon),
            models=[pb.LoadedModel(name=m, version="v1") for m in MODELS],
            contract_minor=CONTRACT_MINOR,
        )))  # fmt: skip

        async def outgoing(queue: asyncio.Queue[pb.AgentMessage | None] = queue) -> Any:
            while (message := await queue.get()) is not None:
                yield message

        call = pb_grpc.CoordinatorStub(channel).Session(outgoing())

        async def incoming(call: Any = call) -> None:
            while (message := await call.read()) is not grpc.aio.EOF:
                if message.WhichOneof("body") == "records_ack":
                    through = message.records_ack.through_seq
                    acked[agent_id] = max(acked[agent_id], through)

        reader: asyncio.Task[None] | None = None
        try:
            await call.read()  # Welcome
            sent_through = acked[agent_id]
            reader = asyncio.create_task(incoming())
            await asyncio.sleep(rng.uniform(0, interval_s))
            while not stop.is_set() and not reader.done():
                queue.put_nowait(pb.AgentMessage(load_report=pb.LoadReport(
                    running_sequences=rng.randrange(8), waiting_sequences=rng.randrange(4),
                    tokens_per_second=rng.uniform(5, 60),
                    kv_cache_used_fraction=rng.uniform(0, 0.9),
                )))  # fmt: skip
                next_seq += 1  # a request served since the last interval
                first = max(sent_through, acked[agent_id]) + 1
                records = [
                    {"at": time.time(), "model": MODELS[0], "version": "v1",
                     "prompt_tokens": 40, "completion_tokens": 60, "latency_ms": 80.0,
                     "served_by": agent_id, "endpoint": "/v1/chat/completions", "status": 200}
                    for _ in range(first, next_seq)
                ][:500]  # fmt: skip
                if records:
                    queue.put_nowait(pb.AgentMessage(request_records=pb.RequestRecords(
                        first_seq=first, records_msgpack=msgpack.packb(records),
                    )))  # fmt: skip
                    sent_through = first + len(records) - 1
                await asyncio.sleep(interval_s)
        except grpc.aio.AioRpcError:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
        finally:
            queue.put_nowait(None)
            call.cancel()
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await reader


def _simulator(target_addr: str, ids: list[str], interval_s: float, stop: Any, out: Any) -> None:
    async def run() -> dict[str, int]:
        channels = [
            grpc.aio.insecure_channel(target_addr, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(max(1, len(ids) // AGENTS_PER_CHANNEL))
        ]
        acked: dict[str, int] = {}
        loop_stop = asyncio.Event()
        tasks = []
        for i, agent_id in enumerate(ids):
            agent = _recording_agent(channels[i % len(channels)], agent_id, interval_s,
                                     loop_stop, acked)  # fmt: skip
            tasks.append(asyncio.create_task(agent))
            if i % 200 == 199:
                await asyncio.sleep(0.05)
        while not stop.is_set():
            await asyncio.sleep(0.2)
        loop_stop.set()
        await asyncio.sleep(interval_s * 2)  # the last acks arrive
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()
        return acked

    out.put(asyncio.run(run()))


async def _scrape(coordinator: CoordinatorProcess) -> tuple[float, int]:
    """(agents counted down, agents connected) from /metrics."""
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.get(coordinator.http_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5))
        as response,
    ):  # fmt: skip
        text = await response.text()
    down = connected = 0.0
    for line in text.splitlines():
        if line.startswith("edgefleet_coordinator_agents{") and 'status="down"' in line:
            down += float(line.rsplit(" ", 1)[1])
        elif line.startswith("edgefleet_coordinator_connected_agents "):
            connected = float(line.rsplit(" ", 1)[1])
    return down, int(connected)


async def _store(coordinator: CoordinatorProcess) -> dict[str, Any]:
    health = await coordinator.get_json("/healthz")
    return dict(health["store"])


async def _stored_seqs(coordinator: CoordinatorProcess, ids: list[str]) -> dict[str, set[int]]:
    """Each agent's request records in the database, read back through the admin API."""
    seqs: dict[str, set[int]] = {}
    gate = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(headers=coordinator.admin_headers) as http:

        async def one(agent_id: str) -> None:
            after = 0
            while True:
                path = (
                    f"/v1/admin/request-records?agent_id={agent_id}&after_seq={after}&limit=10000"
                )
                async with gate, http.get(coordinator.http_url + path) as response:
                    response.raise_for_status()
                    rows = (await response.json())["data"]
                seqs.setdefault(agent_id, set()).update(int(r["seq"]) for r in rows)
                if len(rows) < 10000:
                    return
                after = max(int(r["seq"]) for r in rows)

        await asyncio.gather(*(one(agent_id) for agent_id in ids))
    return seqs


async def main(args: argparse.Namespace) -> int:
    interval_s = args.interval_ms / 1000.0
    cluster = await asyncio.to_thread(PostgresCluster.start)
    try:
        url = await asyncio.to_thread(cluster.create_database, synchronous_commit=True)
        database = url.rsplit("/", 1)[1]
        async with CoordinatorProcess(
            report_interval_ms=args.interval_ms, extra_args=["--set", f"store_url={url}"]
        ) as coordinator:
            print(f"coordinator on {cluster.url(database)}; {args.agents} agents connecting")
            ctx = mp.get_context("spawn")
            stop, sim_out = ctx.Event(), ctx.Queue()
            ids = [f"sim-{i:05d}" for i in range(args.agents)]
            sims = [
                ctx.Process(target=_simulator, args=(
                    coordinator.grpc_target, ids[w :: args.workers], interval_s, stop, sim_out))
                for w in range(args.workers)
            ]  # fmt: skip
            for sim in sims:
                sim.start()
            deadline = time.monotonic() + 120
            while (await _scrape(coordinator))[1] < args.agents and time.monotonic() < deadline:
                await asyncio.sleep(1)
            ramp_connected = (await _scrape(coordinator))[1]
            print(f"{ramp_connected} connected; lookups at {args.lookups_per_s:g}/s")
            window = args.steady_s + args.down_s + LOOKUPS_AFTER_S
            lookups_out, warm = ctx.Queue(), ctx.Event()
            lookup_proc = ctx.Process(
                target=_lookups,
                args=(
                    coordinator.http_url,
                    args.lookups_per_s,
                    WARMUP_S,
                    window,
                    warm,
                    lookups_out,
                ),
            )
            lookup_proc.start()  # fmt: skip
            await asyncio.to_thread(warm.wait)
            most_down, fewest_connected, most_kept = 0.0, ramp_connected, 0

            async def sample(seconds: float) -> None:
                nonlocal most_down, fewest_connected, most_kept
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    down, connected = await _scrape(coordinator)
                    most_down = max(most_down, down)
                    fewest_connected = min(fewest_connected, connected)
                    most_kept = max(most_kept, (await _store(coordinator))["pending_writes"])
                    await asyncio.sleep(0.25)

            await sample(args.steady_s)
            load_before = os.getloadavg()
            print("killing PostgreSQL (pg_ctl stop -m immediate)")
            await asyncio.to_thread(cluster.stop_server, "immediate")
            killed = time.monotonic()
            await sample(args.down_s)
            during = await _store(coordinator)
            print(f"restarting PostgreSQL; store {during['status']}, "
                  f"{during['pending_writes']} writes kept")  # fmt: skip
            await asyncio.to_thread(cluster.restart)
            back = time.monotonic()
            away_s = back - killed
            caught_up_s: float | None = None
            while time.monotonic() - back < CATCH_UP_LIMIT_S:
                store = await _store(coordinator)
                if store["status"] == "ok" and store["pending_writes"] == 0:
                    caught_up_s = time.monotonic() - back
                    break
                await sample(0.25)
            print(f"caught up in {caught_up_s} s; waiting for the lookups to finish")
            while lookup_proc.is_alive() and lookups_out.empty():
                await sample(0.5)
            latencies, _, failed, _ = await asyncio.to_thread(lookups_out.get)
            lookup_proc.join()
            load_after = os.getloadavg()
            stop.set()
            acked: dict[str, int] = {}
            for _ in sims:
                acked |= await asyncio.to_thread(sim_out.get, True, 120)
            for sim in sims:
                sim.join(10)
            health = await coordinator.get_json("/healthz")
            stored = await _stored_seqs(coordinator, ids)
    finally:
        await asyncio.to_thread(cluster.stop)
    acknowledged = sum(acked.values())
    lost = sum(
        len(set(range(1, through + 1)) - stored.get(agent_id, set()))
        for agent_id, through in acked.items()
    )
    failed_lookups = sum(n for why, n in failed.items() if not why.startswith("retried"))
    figures = {
        "agents": args.agents,
        "agents_connected_before": ramp_connected,
        "lookups_per_s_requested": args.lookups_per_s,
        "lookups_answered": len(latencies),
        "lookups_failed": failed_lookups,
        "lookups_failed_why": failed,
        "lookup_p99_ms": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))] * 1000, 2)
        if latencies
        else None,
        "postgres_away_s": round(away_s, 1),
        "agents_shown_down_most": int(most_down),
        "agents_connected_fewest": fewest_connected,
        "request_records_acknowledged": acknowledged,
        "request_records_acknowledged_lost": lost,
        "writes_kept_most": most_kept,
        "catch_up_s": None if caught_up_s is None else round(caught_up_s, 2),
        "store_outages_seen": health["store"]["outages"],
        "store_writes_dropped": health["store"]["dropped_writes"],
        "load_average_1m_before_kill": round(load_before[0], 2),
        "load_average_1m_after": round(load_after[0], 2),
    }
    targets = {
        "lookups_failed": target(failed_lookups, "== 0", failed_lookups == 0),
        "agents_shown_down_most": target(int(most_down), "== 0", most_down == 0),
        "request_records_acknowledged_lost": target(lost, "== 0", lost == 0),
        "catch_up_s": target(
            figures["catch_up_s"] or -1,
            f"< {CATCH_UP_LIMIT_S:g} (reported)",
            caught_up_s is not None,
        ),
    }
    path = write_results("store_outage", figures, targets)
    for name, value in figures.items():
        print(f"  {name}: {value}")
    print(f"wrote {path}")
    return 0 if all(t["met"] for t in targets.values()) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--lookups-per-s", type=float, default=100.0)
    parser.add_argument("--down-s", type=float, default=30.0)
    parser.add_argument("--steady-s", type=float, default=15.0)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
