"""An agent SIGKILLed under load, on a fleet run as shipped: how many requests fail.

    .venv/bin/python -m benchmarks.failover_kill [--clients 20] [--duration 30] [--kill-at 10]

A coordinator with TLS (HTTPS API, mutual-TLS sessions, enrollment required) and two
agents serving the real SmolLM2, enrolled at two one-agent sites (edge-paris,
edge-berlin) and serving HTTPS on their enrollment certificates, API keys required: the
demo's fleet beyond loopback. Clients are ``edgefleet_client.FleetClient`` openai
clients with a minted key and the fleet CA, ``--clients`` threads each sending requests
in a loop for ``--duration`` s; the agent most of them use is SIGKILLed at ``--kill-at`` s.
Two experiments, each on a fresh fleet:

* ``stream_resume``: clients placed near Paris (latitude/longitude), streamed chats of
  up to 48 tokens; a stream cut mid-way resumes on the other agent.
* ``one_agent_site``: clients that name only their site (``site="edge-paris"``), short
  chats, every other one streamed; Paris's only agent is killed.

Targets: 0 failed requests in both. Writes benchmarks/results/failover_kill.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.results_file import target, write_results
from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
from edgefleet_client import FleetClient

LLM = "smollm2-135m-instruct"
SITES = [("edge-paris", 48.8566, 2.3522), ("edge-berlin", 52.52, 13.405)]


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    replies: int = 0
    failed: int = 0
    resumed: int = 0
    after_kill: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def ok(self, resumed: bool, killed: bool) -> None:
        with self.lock:
            self.replies += 1
            self.resumed += resumed
            self.after_kill += killed

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failed += 1
            name = type(exc).__name__
            self.errors[name] = self.errors.get(name, 0) + 1


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def client_loop(
    fleet: FleetClient, index: int, mode: str, stop: threading.Event,
    killed: threading.Event, tally: Tally,
) -> None:  # fmt: skip
    client = fleet.openai(timeout=120)
    i = 0
    while not stop.is_set():
        i += 1
        streamed = mode == "stream_resume" or i % 2 == 0
        messages = [{"role": "user", "content": f"Write a short story about number {index}."}]
        try:
            if streamed:
                stream = client.chat.completions.create(
                    model=LLM,
                    messages=messages,
                    max_tokens=48,
                    temperature=0,
                    stream=True,
                    extra_body={"cache": False},
                )
                segments = stream.response.extensions.get("edgefleet_segments", [])
                for _ in stream:
                    pass
                tally.ok(len(segments) >= 2, killed.is_set())
            else:
                client.chat.completions.create(
                    model=LLM,
                    messages=messages,
                    max_tokens=8,
                    temperature=0,
                    extra_body={"cache": False},
                )
                tally.ok(False, killed.is_set())
        except Exception as exc:  # every failure is counted: the target is none
            tally.fail(exc)


async def experiment(
    mode: str, artifacts: str, clients: int, duration_s: float, kill_at_s: float
) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="edgefleet-failover-"))
    async with CoordinatorProcess(report_interval_ms=2000, tls=True) as coordinator:
        agents: list[AgentProcess] = [
            enrolled_agent(
                coordinator,
                agent_id=site,
                site=site,
                lat=lat,
                lon=lon,
                state_dir=state / site,
                models_dir=artifacts,
                serve=[LLM],
                extra_args=["--threads", "1"],
            )
            for site, lat, lon in SITES
        ]
        await asyncio.gather(*(a.start() for a in agents))
        try:
            key = await coordinator.api_key_for(agents)
            where: dict[str, Any] = (
                {"site": "edge-paris"} if mode == "one_agent_site" else {"lat": 48.9, "lon": 2.4}
            )
            fleets = [
                FleetClient(
                    LLM,
                    coordinator_url=coordinator.http_url,
                    ca_file=coordinator.ca_file,
                    api_key=key,
                    **where,
                )
                for _ in range(clients)
            ]
            await asyncio.gather(*(asyncio.to_thread(f.discover) for f in fleets))
            firsts = [f.candidates()[0].agent_id for f in fleets]
            victim_id = max(set(firsts), key=firsts.count)
            victim = next(a for a in agents if a.agent_id == victim_id)
            tally, stop, killed = Tally(), threading.Event(), threading.Event()
            threads = [
                threading.Thread(target=client_loop, args=(f, i, mode, stop, killed, tally))
                for i, f in enumerate(fleets)
            ]
            started = time.monotonic()
            for t in threads:
                t.start()
            await asyncio.sleep(kill_at_s)
            killed.set()
            await victim.kill()
            say(f"{mode}: SIGKILLed {victim_id} at {time.monotonic() - started:.1f} s")
            await asyncio.sleep(max(0.0, duration_s - (time.monotonic() - started)))
            stop.set()
            await asyncio.gather(*(asyncio.to_thread(t.join, 180) for t in threads))
        finally:
            for agent in agents:
                await agent.terminate()
    result = {
        "clients": clients, "duration_s": duration_s, "killed": victim_id,
        "killed_at_s": kill_at_s, "chosen_first_by_clients": firsts.count(victim_id),
        "replies": tally.replies, "failed": tally.failed, "resumed_streams": tally.resumed,
        "replies_after_kill": tally.after_kill, "errors": tally.errors,
    }  # fmt: skip
    say(f"{mode}: {result}")
    return result


async def main(args: argparse.Namespace) -> int:
    figures: dict[str, Any] = {}
    for mode in ("stream_resume", "one_agent_site"):
        figures[mode] = await experiment(
            mode, args.models_dir, args.clients, args.duration, args.kill_at
        )
    targets = {
        f"{mode}.failed": target(figures[mode]["failed"], "== 0", figures[mode]["failed"] == 0)
        for mode in figures
    }
    path = write_results("failover_kill", figures, targets)
    say(f"wrote {path}")
    return 0 if all(t["met"] for t in targets.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--kill-at", type=float, default=10.0)
    parser.add_argument("--models-dir", default="models/artifacts")
    sys.exit(asyncio.run(main(parser.parse_args())))
