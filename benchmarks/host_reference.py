"""This machine's speed at the coordinator's own work: a yardstick for scale runs on other days.

    .venv/bin/python -m benchmarks.host_reference [--cpu 0] [--agents 5000]

``timeit sum(range(100))`` did not tell a slow host from a fast one: on 2026-12-04 it read
568 ns against 543 ns on 2026-12-03, while the same coordinator code (b7022ba) ran its
event loop thread at 0.65 cores instead of 0.37 under the same scale benchmark. This times
the coordinator's own work over a fleet shaped as ``benchmarks.coordinator_scale`` shapes
it (agents in the same places, the same two models): route decisions (``Router.route``, as
``GET /v1/route`` makes them) and load reports applied (``LiveFleetRegistry.record_report``),
in one process pinned to ``--cpu``, the fastest of several rounds. It prints one JSON
object: microseconds per route and per report, and the timeit figure beside them.
``coordinator_scale`` runs it (a subprocess) on the coordinator's CPU before the
coordinator starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

ROUNDS = 5
ROUTES_PER_ROUND = 1000


async def measure(agents: int) -> dict[str, Any]:
    from benchmarks.coordinator_scale import MODELS, _agent_place
    from coordinator.config import CoordinatorConfig
    from coordinator.fleet.metrics import CoordinatorMetrics
    from coordinator.fleet.registry import LiveFleetRegistry
    from coordinator.routing.scorer import RouteQuery
    from coordinator.routing.service import Router
    from coordinator.store.sqlite import SQLiteFleetStore
    from edgefleet.contract import Hello, LoadedModel, LoadReport, Location

    with tempfile.TemporaryDirectory(prefix="edgefleet-host-reference-") as data_dir:
        store = SQLiteFleetStore.in_directory(Path(data_dir))
        await store.open()
        try:
            registry = await LiveFleetRegistry.open(store)
            router = Router.from_config(registry, CoordinatorConfig(), CoordinatorMetrics(registry))
            sessions: list[tuple[str, str]] = []
            for i in range(agents):
                rng = random.Random(f"agent-{i}")
                lat, lon = _agent_place(rng)
                hello = Hello(
                    agent_id=f"agent-{i}",
                    site=f"site-{rng.randrange(500)}",
                    http_url=f"http://10.{rng.randrange(256)}.{rng.randrange(256)}.1:8000",
                    location=Location(lat, lon),
                    models=tuple(LoadedModel(m, "v1") for m in MODELS),
                )
                sessions.append((hello.agent_id, registry.open_session(hello)))
            rng = random.Random(1)

            def report() -> LoadReport:
                return LoadReport(
                    running_sequences=rng.randrange(8),
                    waiting_sequences=rng.randrange(4),
                    tokens_per_second=rng.uniform(5, 60),
                    kv_cache_used_fraction=rng.uniform(0, 0.9),
                )

            reports = [report() for _ in sessions]
            queries = [
                RouteQuery(model=rng.choice(MODELS), location=Location(*_agent_place(rng)))
                for _ in range(ROUTES_PER_ROUND)
            ]
            route_us, report_us = [], []
            for _ in range(ROUNDS):
                started = time.perf_counter()
                for (agent_id, session_id), one in zip(sessions, reports, strict=True):
                    registry.record_report(agent_id, session_id, one)
                report_us.append((time.perf_counter() - started) / len(sessions) * 1e6)
                started = time.perf_counter()
                for query in queries:
                    router.route(query)
                route_us.append((time.perf_counter() - started) / len(queries) * 1e6)
        finally:
            await store.close()
    return {
        "agents": agents,
        "route_us": round(min(route_us), 1),
        "record_report_us": round(min(report_us), 2),
        "timeit_sum_range_100_ns": round(
            min(timeit.repeat("sum(range(100))", number=100_000, repeat=3)) / 100_000 * 1e9
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    parser.add_argument("--agents", type=int, default=5000)
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    print(json.dumps(asyncio.run(measure(args.agents))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
