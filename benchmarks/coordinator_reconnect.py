"""Coordinator restart at scale: N simulated agents, the coordinator killed and restarted.

    .venv/bin/python -m benchmarks.coordinator_reconnect --agents 5000

Simulated agents (the scale benchmark's places, sites and models, ``--workers``
processes) hold real gRPC Sessions with a real coordinator process and report load
every ``--interval-ms``. They reconnect the way the agent does once its backoff is
capped: equal-jitter exponential backoff from 0.5 s, capped at 2 s, reset after a
session opens; their gRPC channels' own reconnect backoff is capped at 2 s as well
(several agents share one channel, as in the scale benchmark).

Once every agent is connected (and past one periodic save of the live state), the
coordinator is killed (``--signal``, SIGKILL by default) and started again on the same
data directory and ports. Measured from the restarted coordinator's ready line:

* route lookups at once: how many of the agents they return, and their liveness
  (the restarted coordinator routes to the agents it had, as "unconfirmed");
* the time until every agent has a session again (``/healthz`` connected_agents,
  polled every 0.25 s), and until 50 % / 90 % / 99 % had one.

Writes benchmarks/results/coordinator_reconnect.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from agent.control.reconnect import ReconnectBackoff
from benchmarks.coordinator_scale import AGENTS_PER_CHANNEL, MODELS, _agent_place
from benchmarks.results_file import target, write_results
from devtools.fleet import CoordinatorProcess
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

# The agent's reconnect backoff once capped (issue 8): from 0.5 s, doubling, capped at
# 2 s, equal jitter, reset after a session opens.
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 2.0
_CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000)),
]


def backoff_s(failures: int, rng: random.Random) -> float:
    """The agent's own reconnect delay (agent.control.reconnect), capped at 2 s. The
    simulated agents do not probe the port as real agents do, so they come back no
    sooner than real ones would."""
    return ReconnectBackoff(INITIAL_BACKOFF_S, rng).delay(failures, MAX_BACKOFF_S)


def _hello(agent_id: str) -> pb.AgentMessage:
    rng = random.Random(agent_id)
    lat, lon = _agent_place(rng)
    return pb.AgentMessage(
        hello=pb.Hello(
            agent_id=agent_id,
            site=f"site-{rng.randrange(500)}",
            http_url=f"http://10.{rng.randrange(256)}.{rng.randrange(256)}.1:8000",
            location=pb.Location(lat=lat, lon=lon),
            models=[pb.LoadedModel(name=m, version="v1") for m in MODELS],
            contract_minor=CONTRACT_MINOR,
        )
    )


async def _session(stub: Any, agent_id: str, interval_s: float, rng: random.Random) -> bool:
    """One Session until the coordinator ends it; True when it got as far as Welcome."""
    queue: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
    queue.put_nowait(_hello(agent_id))

    async def outgoing() -> Any:
        while (message := await queue.get()) is not None:
            yield message

    call = stub.Session(outgoing())

    async def report() -> None:
        await asyncio.sleep(rng.uniform(0, interval_s))
        while True:
            queue.put_nowait(
                pb.AgentMessage(
                    load_report=pb.LoadReport(
                        waiting_sequences=rng.randrange(8),
                        running_sequences=rng.randrange(8),
                        tokens_per_second=rng.uniform(5, 60),
                        kv_cache_used_fraction=rng.uniform(0, 0.9),
                    )
                )
            )
            await asyncio.sleep(interval_s)

    reporter: asyncio.Task[None] | None = None
    welcomed = False
    try:
        first = await call.read()
        if first is grpc.aio.EOF:
            return False
        welcomed = True
        reporter = asyncio.create_task(report())
        while await call.read() is not grpc.aio.EOF:  # desired state, commands
            pass
    except grpc.aio.AioRpcError:
        pass
    finally:
        if reporter is not None:
            reporter.cancel()
        queue.put_nowait(None)
        call.cancel()
    return welcomed


async def _agent(stub: Any, agent_id: str, interval_s: float) -> None:
    rng = random.Random(agent_id)
    failures = 0
    while True:
        opened = await _session(stub, agent_id, interval_s, rng)
        failures = 0 if opened else failures + 1
        await asyncio.sleep(backoff_s(failures, rng))


def _simulator(target_addr: str, ids: list[str], interval_s: float) -> None:
    async def run() -> None:
        channels = [
            grpc.aio.insecure_channel(target_addr, options=_CHANNEL_OPTIONS)
            for _ in range(max(1, len(ids) // AGENTS_PER_CHANNEL))
        ]
        tasks = []
        for i, agent_id in enumerate(ids):
            stub = pb_grpc.CoordinatorStub(channels[i % len(channels)])
            tasks.append(asyncio.create_task(_agent(stub, agent_id, interval_s)))
            if i % 200 == 199:
                await asyncio.sleep(0.05)  # ramp, do not stampede
        await asyncio.gather(*tasks)

    asyncio.run(run())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def connected(coordinator: CoordinatorProcess) -> int:
    health = await coordinator.get_json("/healthz")
    return int(health["connected_agents"])


async def route_liveness(coordinator: CoordinatorProcess, limit: int) -> dict[str, Any]:
    """One route lookup: how many agents came back, by liveness, and what was excluded."""
    body = await coordinator.get_json(f"/v1/route?model={MODELS[0]}&limit={limit}")
    counts: dict[str, int] = {}
    for agent in body["agents"]:
        counts[agent["liveness"]] = counts.get(agent["liveness"], 0) + 1
    return {"returned": len(body["agents"]), "by_liveness": counts, "excluded": body["excluded"]}


async def main(args: argparse.Namespace) -> int:
    interval_s = args.interval_ms / 1000.0
    data_dir = Path(tempfile.mkdtemp(prefix="edgefleet-reconnect-"))
    grpc_port, http_port = free_port(), free_port()

    def coordinator() -> CoordinatorProcess:
        return CoordinatorProcess(
            grpc_port=grpc_port, http_port=http_port, data_dir=data_dir,
            report_interval_ms=args.interval_ms, startup_timeout_s=60,
        )  # fmt: skip

    first = coordinator()
    await first.start()
    ctx = mp.get_context("spawn")
    ids = [f"sim-{i:05d}" for i in range(args.agents)]
    sims = [
        ctx.Process(target=_simulator, args=(first.grpc_target, ids[w :: args.workers], interval_s))
        for w in range(args.workers)
    ]
    for sim in sims:
        sim.start()
    try:
        ramp_deadline = time.monotonic() + max(30.0, args.agents / 100)
        while (count := await connected(first)) < args.agents:
            if time.monotonic() > ramp_deadline:
                raise SystemExit(f"only {count}/{args.agents} agents connected before the restart")
            print(f"  connected {count}/{args.agents}", flush=True)
            await asyncio.sleep(2)
        # Past a periodic save of the live state (every 5 report intervals).
        await asyncio.sleep(interval_s * 6)
        print(f"all {args.agents} connected; killing the coordinator ({args.signal})", flush=True)
        await first.signal_and_wait(getattr(signal, args.signal), 30)

        second = coordinator()
        killed_to_ready = time.monotonic()
        await second.start()
        ready = time.monotonic()
        print(f"restarted in {ready - killed_to_ready:.2f} s; waiting for reconnects", flush=True)
        try:
            at_ready = await route_liveness(second, limit=min(args.agents, 1000))
            milestones: dict[str, float | None] = {"p50": None, "p90": None, "p99": None}
            deadline = ready + args.timeout_s
            count = 0
            while time.monotonic() < deadline:
                count = await connected(second)
                elapsed = time.monotonic() - ready
                for name, share in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                    if milestones[name] is None and count >= share * args.agents:
                        milestones[name] = elapsed
                if count >= args.agents:
                    break
                await asyncio.sleep(0.25)
            all_back_s = time.monotonic() - ready if count >= args.agents else None
            after = await route_liveness(second, limit=min(args.agents, 1000))
        finally:
            await second.terminate()
    finally:
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.join(5)
        if first.returncode is None:
            await first.kill()
        shutil.rmtree(data_dir, ignore_errors=True)

    print(
        f"at ready: lookups returned {at_ready['returned']} agents {at_ready['by_liveness']}; "
        f"all {args.agents} reconnected in "
        f"{'-' if all_back_s is None else f'{all_back_s:.2f}'} s "
        f"(50% {milestones['p50']}, 90% {milestones['p90']}, 99% {milestones['p99']})"
    )
    figures: dict[str, Any] = {
        "agents": args.agents,
        "report_interval_ms": args.interval_ms,
        "signal": args.signal,
        "simulator_processes": args.workers,
        "agent_backoff": f"equal jitter from {INITIAL_BACKOFF_S:g} s, capped at "
        f"{MAX_BACKOFF_S:g} s, reset after a session opens",
        "restart_to_ready_s": round(ready - killed_to_ready, 3),
        "reconnected_all_s": None if all_back_s is None else round(all_back_s, 3),
        "reconnected_at_end": count,
        "reconnected_50pct_s": milestones["p50"] and round(milestones["p50"], 3),
        "reconnected_90pct_s": milestones["p90"] and round(milestones["p90"], 3),
        "reconnected_99pct_s": milestones["p99"] and round(milestones["p99"], 3),
        "route_at_ready": at_ready,
        "route_after_reconnect": after,
        "command": "python -m benchmarks.coordinator_reconnect " + " ".join(sys.argv[1:]),
        "measured_from": "the restarted coordinator's ready line",
    }
    targets = {
        "reconnected_all_s": target(
            figures["reconnected_all_s"] or float("inf"), "<= 30",
            all_back_s is not None and all_back_s <= 30,
        ),
        "route_at_ready_down": target(
            at_ready["excluded"].get("down", 0), "== 0", at_ready["excluded"].get("down", 0) == 0
        ),
    }  # fmt: skip
    path = write_results("coordinator_reconnect", figures, targets)
    print(f"wrote {path}")
    return 0 if all(t["met"] for t in targets.values()) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2, help="simulator processes")
    parser.add_argument("--signal", choices=("SIGKILL", "SIGTERM"), default="SIGKILL")
    parser.add_argument(
        "--timeout-s", type=float, default=90.0, help="longest wait for the reconnects"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(parse_args())))
