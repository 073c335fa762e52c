"""Dashboard with a simulated fleet: first render and live-update latency in a real browser.

A coordinator process, ``--agents`` simulated agents (the scale benchmark's simulator:
real gRPC sessions, a LoadReport every ``--interval-ms``), and Debian's Chromium driven by
Playwright, signed in through the page's form. Figures:

- first render: navigation start to the page's ``edgefleet-first-render`` mark, set
  after every agent is in the table and on the map and the frame is painted (the page
  loads the whole fleet: GET /v1/agents pages of 1,000, plus the last hour of series);
  the map's country outlines are drawn right after it (``map_land_drawn_ms``: navigation
  start to the ``edgefleet-atlas-drawn`` mark);
- live update: for each row repainted from the SSE stream, the browser's clock after the
  paint minus the time the coordinator received that report (same machine, same clock).

Writes benchmarks/results/dashboard.json. Run: python -m benchmarks.dashboard
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from typing import Any

from benchmarks.coordinator_scale import _Setup, _simulator
from benchmarks.results_file import percentile, target, write_results
from devtools.browser import chromium_path, first_render_ms, mark_ms, sign_in
from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until

_KEEP: list[Any] = []
FIRST_RENDER_TARGET_MS = 1000.0
LIVE_UPDATE_TARGET_MS = 100.0


def start_simulators(
    coordinator: CoordinatorProcess, n: int, interval_s: float, workers: int = 1
) -> list[Any]:
    """The scale benchmark's simulator processes for ``n`` agents (terminate them after)."""
    ctx = mp.get_context("spawn")
    ids = [f"sim-{i:05d}" for i in range(n)]
    setup = _Setup(ctx.Queue(), ctx.Event())
    setup.ask.set()  # nobody waits for their setup figures
    # The queues and counters live as long as the processes (a child unpickles them late).
    shared = [(ctx.Value("q", 0, lock=False), ctx.Queue()) for _ in range(workers)]
    sims = [
        ctx.Process(
            target=_simulator,
            args=(
                coordinator.grpc_target,
                ids[w::workers],
                interval_s,
                time.monotonic() + 3600,
                setup,
                *shared[w],
            ),
            daemon=True,
        )
        for w in range(workers)
    ]
    for sim in sims:
        sim.start()
    _KEEP.append((setup, shared))
    return sims


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    async with CoordinatorProcess(report_interval_ms=args.interval_ms) as coordinator:
        sims = start_simulators(coordinator, args.agents, args.interval_ms / 1000.0)
        try:

            async def all_connected() -> bool:
                health = await coordinator.get_json("/healthz")
                return bool(int(health["connected_agents"]) >= args.agents)

            await wait_until(all_connected, timeout_s=120, interval_s=0.5)
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=chromium_path(), headless=True)
                page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                await sign_in(page, coordinator.http_url, coordinator.admin_token)
                renders, land = [], []
                for _ in range(args.renders):  # signed in: each load is the page alone
                    await page.goto("about:blank")  # a real load, not a hash change
                    await page.goto(f"{coordinator.http_url}/dashboard/#fleet")
                    renders.append(await first_render_ms(page))
                    land.append(await mark_ms(page, "edgefleet-atlas-drawn"))
                shown = await page.evaluate("window.edgefleet.agents.size")
                await page.evaluate(
                    "window.edgefleet.latencies.length = 0;"
                    " window.edgefleet.serverDelays.length = 0"
                )
                await asyncio.sleep(args.duration)
                latencies = await page.evaluate("window.edgefleet.latencies.slice()")
                server = await page.evaluate("window.edgefleet.serverDelays.slice()")
                await browser.close()
        finally:
            for sim in sims:
                sim.terminate()
    if not latencies:
        raise RuntimeError("no live update was painted")
    return {
        "agents": args.agents,
        "agents_shown": shown,
        "report_interval_ms": args.interval_ms,
        "first_render_ms": renders,
        "first_render_ms_max": max(renders),
        # The country outlines, drawn just after the first render (the agents first).
        "map_land_drawn_ms": land,
        "live_updates": len(latencies),
        "live_update_ms_p50": percentile(latencies, 50),
        "live_update_ms_p99": percentile(latencies, 99),
        "live_update_ms_max": max(latencies),
        # Of which: report received -> event sent by the coordinator (its flush period and
        # event loop); the rest is transfer, parsing and painting in the browser.
        "coordinator_ms_p50": percentile(server, 50),
        "coordinator_ms_p99": percentile(server, 99),
        "duration_s": args.duration,
    }


def main(args: argparse.Namespace) -> int:
    figures = asyncio.run(measure(args))
    targets = {
        "first_render": target(
            figures["first_render_ms_max"],
            f"< {FIRST_RENDER_TARGET_MS:g} ms",
            figures["first_render_ms_max"] < FIRST_RENDER_TARGET_MS,
        ),
        "live_update_p99": target(
            figures["live_update_ms_p99"],
            f"< {LIVE_UPDATE_TARGET_MS:g} ms",
            figures["live_update_ms_p99"] < LIVE_UPDATE_TARGET_MS,
        ),
    }
    path = write_results(args.name, figures, targets)
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(f"wrote {path}")
    return 0 if all(t["met"] for t in targets.values()) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--renders", type=int, default=3, help="page loads timed")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of live updates")
    parser.add_argument("--name", default="dashboard", help="results file name")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
