"""Several coordinators on one PostgreSQL database (issue 24, "Measured"): what a fleet
served by three coordinators keeps when one of them dies, and how fast changes and limits
are fleet-wide.

    .venv/bin/python -m benchmarks.several_coordinators [--scenario kill revocation ...]

Every scenario starts its own throwaway PostgreSQL server (tests/postgres_cluster.py:
fsync and synchronous_commit off) and three coordinators on one database of it, the second
and third provisioned with the first's fleet CA, model-signing key and admin token
(docs/operators/postgresql.md, "Several coordinators"), each with its own ``coordinator_id``
(``coord-1`` .. ``coord-3``). Simulated agents are benchmarks/coordinator_scale.py's (real
gRPC sessions: Hello, a LoadReport every report interval, section generations
acknowledged), each given the three coordinators in an order of its own (its home first,
the second choice alternating, so that a dead coordinator's agents spread over both
survivors), moving to the next on a broken session at once as the real agent does
(agent/control/session.py). Real agents are agent processes serving the tiny test model
(``tiny-llama``), enrolled with join tokens, mutual TLS. Each scenario is its own section of
benchmarks/results/several_coordinators.json (a run of some scenarios keeps the sections
of the others from the last run) and can run alone (``--scenario NAME``):

* ``kill``: 1,500 simulated agents (plaintext gRPC, 250 per connection) spread over the
  three; route lookups at 200/s round robin over the two that will survive
  (coordinator_scale's open-loop client); SIGKILL of coord-3. Per orphaned agent (owned by
  coord-3 in ``agent_owners`` at the kill), the time from the kill to its ``claimed_at``
  by a survivor (the database's clock: the session open on the survivor); p50, p99, max
  and any not moved. Agents shown down (``liveness`` down in ``GET /v1/agents``) on any
  survivor, polled each second after the kill (and before it, for comparison). Failed
  lookups and empty answers (``"agents": []``) over the whole window.
* ``revocation``: 150 simulated agents over the three, one observer agent with its session
  on coord-3 only (C). 2 x 50 API keys minted through coord-1 (A) and seen in C's agent's
  keys section; then one at a time revoked through A (``DELETE /v1/admin/keys/ID``): the
  time from sending the revocation to C's agent receiving a keys section without the key.
  Then the same with the notifications cut: every coordinator's LISTEN backend in
  PostgreSQL (pg_stat_activity: ``LISTEN edgefleet_changes``) stopped with SIGSTOP, so no
  NOTIFY reaches any coordinator and only the periodic catch-up of the change feed (and
  the key refresh every report interval) delivers; SIGCONT after. And a report received by
  coord-2 (B) seen in A's route answers: probe agents with a model of their own, session
  on B only; the time from the probe's first LoadReport sent to A's ``GET /v1/route`` for
  that model listing it (polled every 50 ms, 5 s at most). Needs the shared live view.
* ``budget``: one real agent per coordinator; a key of 600 requests/min minted through
  coord-1; 1,200 requests/min offered (open loop, round robin over the three agents,
  one-token chats) for ``--budget-s``; accepted (HTTP 200) in any 60-s window, sliding,
  at 10 ms steps over the accepted responses' times. The agents' budgets start full
  (each agent's share of the minute's budget is there at the start), so the first minute
  can take more than the budget: the maximum is given with and without the first minute.
* ``records``: one real agent per coordinator, requests at ``--records-rps`` through all
  three; SIGKILL of coord-1 a third into the run. After the run, each agent's last
  acknowledged record (``requests.acked`` in its spool, what the coordinator confirmed
  storing) against the ``request_records`` rows in the database: acknowledged records
  missing (target 0).
* ``scale``: 1,500 simulated agents enrolled through the real Enroll RPC (own key and
  CSR, one join token) and mutual TLS sessions (one connection each, own certificate)
  over the three; a window of reports only, then one with 200 lookups/s round robin over
  the three. Each coordinator's route p99 from its ``edgefleet_coordinator_route_seconds``
  histogram (as coordinator_scale.py), failed lookups, reports/s stored, cores per
  coordinator and of PostgreSQL (its postmaster and children) per 1,000 reports/s.
  CPUs: by default nothing is pinned; every process shares every CPU, the simulators at
  ``--simulator-nice`` (10), so the coordinators come first. ``--pin`` puts the three
  coordinators on CPU 0 and PostgreSQL, the simulators and the lookup client on the
  others: three coordinators then time-share one core, and each lookup's time includes
  waiting for the other two (on 2026-12-02, 2 vCPUs: route p99 5.0 to 5.8 ms pinned,
  2.8 to 3.2 ms not pinned, in runs minutes apart). Deployed, each coordinator has a
  machine of its own, which the default is nearer to.
* ``connections``: the largest number of PostgreSQL connections to the fleet's database
  (pg_stat_activity, sampled every 0.25 s through every scenario run, the benchmark's
  own connections not counted) against coordinators x (``store_max_connections`` + 1:
  the change listener), and every line of every coordinator's log and of PostgreSQL's
  log searched for "deadlock" and "too many clients". Run alone, it runs a small fleet
  (300 simulated agents, lookups, one coordinator killed) for that.

The machine's load average before and after each scenario is in its section; on a shared
2-core machine the absolute figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil  # type: ignore[import-untyped, unused-ignore]

from benchmarks.coordinator_scale import (
    WARMUP_S,
    LookupResult,
    _cores,
    _fake_agent,
    _histogram_delta,
    _lookups,
    _metric,
    _percentile,
    _pin,
    _Postgres,
    _secure_simulator,
    _server_quantile,
    _Setup,
    _simulator,
    _Stats,
)
from benchmarks.results_file import RESULTS_DIR, machine, target
from coordinator.catalog.catalog import SIGNING_KEY_FILE
from devtools.fleet import ADMIN_TOKEN_ENV, AgentProcess, CoordinatorProcess, wait_key_accepted
from tests.coordinator.test_several_coordinators import fleet_agent
from tests.postgres_cluster import DatabaseError, PostgresCluster, async_connect

NAME = "several_coordinators"
SCENARIOS = ("kill", "revocation", "budget", "records", "scale", "connections")
STORE_URL_ENV = "EDGEFLEET_COORDINATOR_STORE_URL"
COORDINATORS = 3
POOL = 10  # store_max_connections, the default
LOG_PROBLEMS = re.compile(r"deadlock|too many clients", re.IGNORECASE)
REPO = Path(__file__).resolve().parent.parent
MODEL = "tiny-llama"
BENCH_APP = "several_coordinators_benchmark"


class _WatchedLog(collections.deque[str]):
    """A process's last log lines (as ServiceProcess keeps them), every line ever appended
    searched for LOG_PROBLEMS."""

    def __init__(self, lines: Sequence[str] = (), maxlen: int | None = 500) -> None:
        super().__init__(lines, maxlen)  # as a deque is built (copies of it too)
        self.problems: list[str] = []
        self.lines = 0

    def append(self, line: str) -> None:
        self.lines += 1
        if LOG_PROBLEMS.search(line):
            self.problems.append(line.strip()[:300])
        super().append(line)


class Watch:
    """What the connections section reports, over every fleet a run starts."""

    def __init__(self) -> None:
        self.max_connections = 0
        self.at_max: dict[str, int] = {}
        self.max_coordinators = 0  # the coordinators' connections together, at most
        self.max_per_coordinator: dict[str, int] = {}
        self.limit = 0
        self.coordinator_lines = 0
        self.problems: list[str] = []
        self.postgres_problems: list[str] = []
        self.scenarios: list[str] = []


class Fleet:
    """A throwaway PostgreSQL server and COORDINATORS coordinators on one database of it.

    ``mode``: "plain" (no TLS, enrollment not required), "mtls" (mutual TLS sessions,
    enrollment required, Enroll on its own port; HTTP plain on loopback) or "full"
    (that and HTTPS: CoordinatorProcess(tls=True), as the real-agent tests run)."""

    def __init__(self, root: Path, mode: str, interval_ms: int, watch: Watch,
                 extra_args: Sequence[str] = ()) -> None:  # fmt: skip
        self.root, self.mode, self.interval_ms, self.watch = root, mode, interval_ms, watch
        self.extra_args = list(extra_args)
        self.cluster: PostgresCluster | None = None
        self.url = ""
        self.coordinators: list[CoordinatorProcess] = []
        self.postgres: _Postgres | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._env_before: str | None = None

    async def start(self) -> None:
        self.cluster = await asyncio.to_thread(PostgresCluster.start)
        self.url = await asyncio.to_thread(self.cluster.create_database)
        self.postgres = _Postgres(self.url, self.cluster)
        # the CLI (join tokens) reads the database too; given back by stop() (a test runs
        # this in a pytest worker, whose later coordinators must not find a dead database)
        self._env_before = os.environ.get(STORE_URL_ENV)
        os.environ[STORE_URL_ENV] = self.url
        args: list[str] = []
        if self.mode == "mtls":
            args = ["--tls", "on", "--enroll-port", "0"]
        if self.mode != "plain":  # every simulated agent enrolls from 127.0.0.1
            args += ["--set", "enroll_rate_per_minute=1000000", "--set", "enroll_burst=100000"]
        for i in range(COORDINATORS):
            data_dir = self.root / f"coord-{i + 1}"
            env = {STORE_URL_ENV: self.url}
            if self.coordinators:  # provisioned like the first, never generated
                first = self.coordinators[0].data_dir
                data_dir.mkdir(parents=True)
                shutil.copytree(first / "ca", data_dir / "ca")
                shutil.copy2(first / SIGNING_KEY_FILE, data_dir / SIGNING_KEY_FILE)
                env[ADMIN_TOKEN_ENV] = self.coordinators[0].admin_token
            coordinator = CoordinatorProcess(
                report_interval_ms=self.interval_ms, data_dir=data_dir, env=env,
                tls=self.mode == "full",
                extra_args=[*args, "--set", f"coordinator_id=coord-{i + 1}",
                            "--set", f"store_max_connections={POOL}", *self.extra_args],
            )  # fmt: skip
            coordinator.log = _WatchedLog()
            await coordinator.start()
            self.coordinators.append(coordinator)
        self.watch.limit = max(self.watch.limit, COORDINATORS * (POOL + 1))
        self._sampler = asyncio.create_task(self._sample_connections())

    async def _sample_connections(self) -> None:
        assert self.cluster is not None
        database = self.url.rsplit("/", 1)[1]
        async with await async_connect(self.cluster.url(), BENCH_APP) as db:
            while True:
                cursor = await db.execute(
                    "SELECT application_name, client_port FROM pg_stat_activity"
                    " WHERE datname = %s AND application_name <> %s",
                    (database, BENCH_APP),
                )
                rows = await cursor.fetchall()
                if len(rows) >= self.watch.max_connections or len(rows) >= self.watch.limit:
                    by = await asyncio.to_thread(self._whose, [int(r[1] or 0) for r in rows])
                    if len(rows) > self.watch.max_connections:
                        self.watch.max_connections, self.watch.at_max = len(rows), by
                    for name, n in by.items():
                        if name.startswith("coord-"):
                            seen = self.watch.max_per_coordinator.get(name, 0)
                            self.watch.max_per_coordinator[name] = max(seen, n)
                    mine = sum(n for name, n in by.items() if name.startswith("coord-"))
                    self.watch.max_coordinators = max(self.watch.max_coordinators, mine)
                await asyncio.sleep(0.25)

    def _whose(self, ports: list[int]) -> dict[str, int]:
        """How many of the connections (their client ports) each process holds: coord-N
        for the coordinators, else the program's name (an admin CLI call, ...)."""
        names = {c.pid: f"coord-{i + 1}" for i, c in enumerate(self.coordinators)
                 if c.returncode is None}  # fmt: skip
        owner: dict[int, str] = {}
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections(kind="tcp"):
                if conn.laddr and conn.laddr.port in ports and conn.pid is not None:
                    if conn.pid in names:
                        owner[conn.laddr.port] = names[conn.pid]
                    else:
                        with contextlib.suppress(psutil.Error):
                            cmd = psutil.Process(conn.pid).cmdline()
                            owner[conn.laddr.port] = " ".join(cmd[1:5])[:80]
        found: dict[str, int] = collections.Counter(owner.get(p, "unknown") for p in ports)
        return dict(found)

    def db(self) -> Any:
        """A connection to the fleet's database (not counted among the fleet's)."""
        return async_connect(self.url, BENCH_APP)

    async def stop(self) -> None:
        if self._env_before is None:
            os.environ.pop(STORE_URL_ENV, None)
        else:
            os.environ[STORE_URL_ENV] = self._env_before
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, DatabaseError):
                await self._sampler
        for coordinator in self.coordinators:
            with contextlib.suppress(Exception):
                if coordinator.returncode is None:
                    await coordinator.terminate()
            log = coordinator.log
            if isinstance(log, _WatchedLog):
                self.watch.coordinator_lines += log.lines
                self.watch.problems += log.problems
        if self.cluster is not None:
            with contextlib.suppress(OSError):
                text = self.cluster.log_file.read_text(errors="replace")
                self.watch.postgres_problems += [
                    ln.strip()[:300] for ln in text.splitlines() if LOG_PROBLEMS.search(ln)
                ]
            await asyncio.to_thread(self.cluster.stop)

    async def connected(self, coordinator: CoordinatorProcess) -> int:
        try:
            return int((await coordinator.get_json("/healthz"))["connected_agents"])
        except (aiohttp.ClientError, OSError, KeyError):
            return -1

    async def wait_connected(self, agents: int, timeout_s: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            counts = [await self.connected(c) for c in self.coordinators]
            if sum(counts) >= agents:
                break
            print(f"  connected {counts}", flush=True)
            await asyncio.sleep(2)
        return time.monotonic() - started


@contextlib.asynccontextmanager
async def fleet(mode: str, interval_ms: int, watch: Watch, name: str,
                extra_args: Sequence[str] = ()) -> AsyncIterator[Fleet]:  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix=f"edgefleet-several-{name}-"))
    running = Fleet(root, mode, interval_ms, watch, extra_args)
    watch.scenarios.append(name)
    try:
        await running.start()
        print(f"{name}: PostgreSQL and {COORDINATORS} coordinators up ({mode})", flush=True)
        yield running
    finally:
        await running.stop()
        shutil.rmtree(root, ignore_errors=True)


def _orders(n: int) -> list[tuple[int, ...]]:
    """Agent i's order of the coordinators: home i % 3, then the other two, alternately
    one and the other first (a dead coordinator's agents spread over both survivors)."""
    orders = []
    for i in range(n):
        home = i % COORDINATORS
        rest = [(home + k) % COORDINATORS for k in range(1, COORDINATORS)]
        if (i // COORDINATORS) % 2:
            rest.reverse()
        orders.append((home, *rest))
    return orders


_KEEP: list[Any] = []


def _start_simulators(
    targets: list[str], ids: list[str], workers: int, interval_s: float,
    cpus: set[int] | None = None, nice: int = 0,
    enroll: tuple[str, bytes, str] | None = None,
) -> tuple[list[Any], _Setup]:  # fmt: skip
    """``workers`` simulator processes sharing ``ids`` (each agent in its _orders order of
    ``targets``), pinned to ``cpus`` at ``nice`` if given. Plaintext sessions, or with
    ``enroll`` (Enroll target, fleet CA PEM, join token) enrolled agents over mutual TLS."""
    ctx = mp.get_context("spawn")
    setup = _Setup(ctx.Queue(), ctx.Event())
    out = ctx.Queue()
    orders = _orders(len(ids))
    stop = time.monotonic() + 3600  # terminated at the end
    sims = []
    for w in range(workers):
        rest = (ids[w::workers], interval_s, stop, setup, ctx.Value("q", 0, lock=False), out,
                orders[w::workers])  # fmt: skip
        if enroll is None:
            sim = ctx.Process(target=_simulator, args=(targets, *rest))
        else:
            enroll_target, ca_pem, token = enroll
            sim = ctx.Process(target=_secure_simulator,
                              args=(enroll_target, targets, ca_pem, token, (), *rest))  # fmt: skip
        sim.start()
        if cpus and sim.pid is not None:
            _pin(sim.pid, cpus, nice)
        sims.append(sim)
    _KEEP.append(out)  # the children unpickle it after this returns
    return sims, setup


def _stop_simulators(sims: list[Any]) -> None:
    for sim in sims:
        sim.terminate()
    for sim in sims:
        sim.join(5)


def _tree() -> dict[str, Any]:
    """Which code ran: the commit, and the files changed in the working tree then (other
    work in progress in a shared tree runs too)."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True)
        return done.stdout.rstrip()

    changed = [ln[3:] for ln in git("status", "--porcelain", "coordinator", "agent").splitlines()]
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_in_coordinator_or_agent": changed,
    }


def _start_lookups(urls: list[str], rate: float, seconds: float) -> tuple[Any, Any, Any]:
    ctx = mp.get_context("spawn")
    out, warm = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_lookups, args=(",".join(urls), rate, WARMUP_S, seconds, warm, out))
    proc.start()
    return proc, out, warm


def _lookup_figures(result: LookupResult, seconds: float) -> dict[str, Any]:
    latencies, lags, failed = result.latencies, result.lags, result.failed
    retried = sum(v for k, v in failed.items() if k.startswith("retried"))
    failed = {k: v for k, v in failed.items() if not k.startswith("retried")}
    empty = failed.pop("empty answer", 0)
    return {
        "lookups_answered": len(latencies),
        "lookups_per_s_achieved": round(len(latencies) / seconds, 1),
        "lookups_failed": sum(failed.values()),
        "lookups_failed_why": failed,
        "lookups_empty_answers": empty,
        "lookups_retried_on_a_closed_idle_connection": retried,
        "route_client_p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "route_client_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "route_client_schedule_lag_p99_ms": round(_percentile(lags, 0.99) * 1000, 2),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------------------ kill


async def scenario_kill(args: argparse.Namespace, watch: Watch) -> dict[str, Any]:
    interval_s = args.interval_ms / 1000
    load_before = _load()
    async with fleet("plain", args.interval_ms, watch, "kill") as running:
        coords = running.coordinators
        victim, survivors = coords[-1], coords[:-1]
        ids = [f"sim-{i:05d}" for i in range(args.agents)]
        sims, _setup = _start_simulators([c.grpc_target for c in coords], ids, args.workers,
                                         interval_s)  # fmt: skip
        try:
            ramp_s = await running.wait_connected(args.agents, 60 + args.agents / 100)
            per = [await running.connected(c) for c in coords]
            print(f"  connected {per} in {ramp_s:.1f} s", flush=True)
            await asyncio.sleep(interval_s * 1.5)
            down_before = await _down_counts(survivors)
            seconds = args.kill_window_s
            proc, out, warm = _start_lookups([c.http_url for c in survivors],
                                             args.lookups_per_s, seconds)  # fmt: skip
            await asyncio.to_thread(warm.wait)
            async with await running.db() as db:
                cursor = await db.execute(
                    "SELECT agent_id FROM agent_owners WHERE coordinator_id = %s", ("coord-3",)
                )
                orphans = {r[0] for r in await cursor.fetchall()}
                opening_before = [await _session_opening(c) for c in survivors]
                await asyncio.sleep(min(3.0, seconds / 5))
                killed_wall = time.time()
                await victim.signal_and_wait(signal.SIGKILL, 10)
                print(f"  SIGKILL coord-3 ({len(orphans)} agents owned)", flush=True)
                moved: dict[str, float] = {}
                down_seen: dict[str, dict[str, Any]] = {}
                down_after = [0] * len(survivors)
                deadline = time.monotonic() + seconds - min(3.0, seconds / 5)
                next_down = time.monotonic()
                while time.monotonic() < deadline:
                    cursor = await db.execute(
                        "SELECT agent_id, coordinator_id, extract(epoch FROM claimed_at)"
                        " FROM agent_owners WHERE coordinator_id <> 'coord-3'"
                    )
                    for agent_id, _owner, claimed in await cursor.fetchall():
                        if agent_id in orphans and agent_id not in moved:
                            moved[agent_id] = float(claimed) - killed_wall
                    if time.monotonic() >= next_down:
                        counts = await _down_counts(survivors, down_seen)
                        down_after = [max(a, b) for a, b in zip(down_after, counts, strict=True)]
                        next_down = time.monotonic() + 1.0
                    await asyncio.sleep(0.25)
            result = await asyncio.to_thread(out.get, True, 120)
            proc.join(10)
            connected_end = [await running.connected(c) for c in survivors]
            opening = [
                _opening_quantiles(before, await _session_opening(c))
                for before, c in zip(opening_before, survivors, strict=True)
            ]
        finally:
            _stop_simulators(sims)
    times = sorted(moved.values())
    not_moved = len(orphans) - len(moved)
    p99 = _percentile(times, 0.99) if not_moved == 0 else float("inf")
    figures = {
        "agents": args.agents,
        "coordinators": COORDINATORS,
        "report_interval_ms": args.interval_ms,
        "session_transport": "plaintext gRPC, 250 simulated agents per connection",
        "agents_per_coordinator_before_kill": per,
        "all_connected_after_s": round(ramp_s, 1),
        "orphaned_agents": len(orphans),
        "orphans_owned_by_a_survivor": len(moved),
        "orphans_not_moved_within_window": not_moved,
        "takeover_p50_s": round(_percentile(times, 0.5), 3) if times else None,
        "takeover_p99_s": round(p99, 3) if times and not_moved == 0 else None,
        "takeover_max_s": round(times[-1], 3) if times else None,
        "takeover_measure": "agent_owners.claimed_at (database clock, the session open on a "
        "survivor) minus the wall time of the SIGKILL (same machine)",
        "agents_down_on_survivors_before_kill": down_before,
        "agents_down_on_survivors_after_kill_max": down_after,
        "agents_connected_on_survivors_at_end": connected_end,
        "agents_shown_down_after_kill": len(down_seen),
        "agents_shown_down_that_were_orphans": sum(1 for a in down_seen if a in orphans),
        "agents_shown_down_first_seen_s_after_kill": sorted(
            round(v["when"] - killed_wall, 1) for v in down_seen.values()
        )[:1],
        "agents_shown_down_sample": dict(list(down_seen.items())[:3]),
        "session_open_on_survivors_after_kill_ms": opening,
        "lookup_window_s": seconds,
        "lookups_sent_to": "the two survivors, round robin (never the killed one)",
        **_lookup_figures(result, seconds),
        "load_average_1m_before": load_before,
        "load_average_1m_after": _load(),
        "note": "Agents are spread at random over Europe; a survivor's answers come from "
        "every coordinator's agents (the shared live view): the killed coordinator's show "
        "unconfirmed until they reconnect to a survivor.",
    }
    failed = figures["lookups_failed"]
    empty = figures["lookups_empty_answers"]
    down = max(down_after, default=0)
    targets = {
        "kill.takeover_p99_s": target(figures["takeover_p99_s"], "<= 10",
                                      not_moved == 0 and p99 <= 10),
        "kill.agents_down_on_survivors": target(down, "== 0", down == 0),
        "kill.lookups_failed": target(failed, "== 0", failed == 0),
        "kill.lookups_empty_answers": target(empty, "== 0", empty == 0),
    }  # fmt: skip
    return {"figures": figures, "targets": targets}


SESSION_OPEN = "edgefleet_coordinator_session_open_seconds"


async def _session_opening(coordinator: CoordinatorProcess) -> dict[str, float]:
    return await _metric(coordinator.http_url, SESSION_OPEN, coordinator.admin_headers)


def _opening_quantiles(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Sessions opened between two scrapes: count, p50 and p99 (ms, interpolated in the
    histogram's buckets) of each step from Hello to Welcome."""
    found: dict[str, Any] = {}
    for step in ("authenticate", "claim", "generations", "total"):
        buckets, total = _histogram_delta(before, after, SESSION_OPEN, f'step="{step}"')
        found[step] = {
            "sessions": int(total),
            **{f"p{round(q * 100)}": round(_server_quantile(buckets, total, q)[1] * 1000, 1)
               for q in (0.5, 0.99)},
        }  # fmt: skip
    return found


async def _down_counts(
    coordinators: list[CoordinatorProcess], seen: dict[str, dict[str, Any]] | None = None
) -> list[int]:
    """Agents each coordinator lists with liveness down; each one's view is put in
    ``seen`` (the first time it is seen down, by agent id)."""
    counts = []
    for i, coordinator in enumerate(coordinators):
        try:
            listed = await coordinator.agents()
        except (aiohttp.ClientError, OSError):
            counts.append(-1)
            continue
        down = [a for a in listed if a.get("liveness") == "down"]
        counts.append(len(down))
        if seen is not None:
            for a in down:
                seen.setdefault(a["agent_id"], {
                    "on": f"coord-{i + 1}", "status": a.get("status"),
                    "last_seen": a.get("last_seen"), "connected_since": a.get("connected_since"),
                    "bye_reason": a.get("bye_reason"), "when": time.time(),
                })  # fmt: skip
    return counts


# ------------------------------------------------------------------------ revocation


class _Observer:
    """The key ids of the last keys section each in-process agent received."""

    def __init__(self) -> None:
        self.keys: dict[str, set[str]] = {}
        self.changed = asyncio.Event()
        self.reports: dict[str, float] = {}

    def on_keys(self, agent_id: str, key_ids: set[str]) -> None:
        self.keys[agent_id] = key_ids
        self.changed.set()

    async def wait(self, agent_id: str, ok: Callable[[set[str]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not ok(self.keys.get(agent_id, set())):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True


async def scenario_revocation(args: argparse.Namespace, watch: Watch) -> dict[str, Any]:
    interval_s = args.interval_ms / 1000
    load_before = _load()
    n = args.revocations
    async with fleet("plain", args.interval_ms, watch, "revocation") as running:
        a, b, c = running.coordinators
        ids = [f"sim-{i:05d}" for i in range(args.revocation_agents)]
        sims, _ = _start_simulators([x.grpc_target for x in running.coordinators], ids, 1,
                                    interval_s)  # fmt: skip
        observer = _Observer()
        stats = _Stats()
        stats.on_keys = observer.on_keys
        stop = time.monotonic() + 3600
        channels: list[Any] = []
        tasks: list[asyncio.Task[int]] = []

        def agent(agent_id: str, where: CoordinatorProcess, models: Sequence[str] = ()) -> None:
            channel = grpc.aio.insecure_channel(where.grpc_target)
            channels.append(channel)
            tasks.append(asyncio.create_task(_fake_agent(
                lambda: channel, agent_id, interval_s, stop, stats, hello_models=models or None,
                on_report=lambda: observer.reports.setdefault(agent_id, time.monotonic()),
            )))  # fmt: skip

        try:
            agent("observer-on-c", c)
            await running.wait_connected(len(ids) + 1, 60)
            async with aiohttp.ClientSession(headers=a.admin_headers) as http:
                key_ids = []
                for i in range(2 * n):
                    async with http.post(a.http_url + "/v1/admin/keys",
                                         json={"name": f"revoke-{i}"}) as response:  # fmt: skip
                        response.raise_for_status()
                        key_ids.append((await response.json())["key_id"])
                every = set(key_ids)
                seen = await observer.wait("observer-on-c", lambda k: every <= k, 30)
                assert seen, "the minted keys never reached the agent on C"
                print(f"  {2 * n} keys minted through A, all in C's agent's keys section")

                async def revoke(key_id: str) -> float | None:
                    started = time.monotonic()
                    async with http.delete(a.http_url + f"/v1/admin/keys/{key_id}") as response:
                        response.raise_for_status()
                    gone = await observer.wait("observer-on-c", lambda k: key_id not in k, 10)
                    return time.monotonic() - started if gone else None

                notified = [await revoke(k) for k in key_ids[:n]]
                print(f"  revocations with NOTIFY: p99 {_percentile(_got(notified), 0.99):.3f} s")
                stopped = await _stop_listeners(running)
                try:
                    cut = [await revoke(k) for k in key_ids[n:]]
                finally:
                    for pid in stopped:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGCONT)
                print(f"  revocations with {len(stopped)} listeners stopped: p99 "
                      f"{_percentile(_got(cut), 0.99):.3f} s")  # fmt: skip

            # a report received by B, in A's route answers
            seen_after: list[float | None] = []
            for j in range(args.route_probes):
                probe, model = f"probe-{j}", f"probe-model-{j}"
                agent(probe, b, models=[model])
                async with aiohttp.ClientSession() as http:
                    deadline = time.monotonic() + 5 + interval_s
                    found = None
                    while time.monotonic() < deadline:
                        async with http.get(a.http_url + f"/v1/route?model={model}") as response:
                            body = await response.json() if response.status == 200 else {}
                        listed = [x["agent_id"] for x in body.get("agents", [])]
                        if probe in listed and probe in observer.reports:
                            found = time.monotonic() - observer.reports[probe]
                            break
                        await asyncio.sleep(0.05)
                seen_after.append(found)
            print(f"  B's reports in A's route answers: {seen_after}")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for channel in channels:
                await channel.close()
            _stop_simulators(sims)
    notified_s, cut_s, route_s = _got(notified), _got(cut), _got(seen_after)
    figures = {
        "coordinators": COORDINATORS,
        "simulated_agents": args.revocation_agents + 1,
        "report_interval_ms": args.interval_ms,
        "revocations": n,
        "revocation_to_c_p50_s": _round(_percentile(notified_s, 0.5)),
        "revocation_to_c_p99_s": _round(_percentile(notified_s, 0.99)),
        "revocation_to_c_max_s": _round(max(notified_s, default=float("nan"))),
        "revocations_not_seen_within_10s": n - len(notified_s),
        "revocation_notify_cut_p50_s": _round(_percentile(cut_s, 0.5)),
        "revocation_notify_cut_p99_s": _round(_percentile(cut_s, 0.99)),
        "revocation_notify_cut_max_s": _round(max(cut_s, default=float("nan"))),
        "revocations_notify_cut_not_seen_within_10s": n - len(cut_s),
        "listener_backends_stopped": len(stopped),
        "notify_cut_how": "every LISTEN backend of the fleet's database (pg_stat_activity) "
        "SIGSTOPped during the revocations, SIGCONTed after: no notice reaches any "
        "coordinator; the change feed's periodic catch-up (1 s) and the key refresh every "
        "report interval remain",
        "revocation_measure": "from sending DELETE /v1/admin/keys/ID to A to the observer "
        "agent (session on C only) receiving a keys section without the key",
        "route_probes": args.route_probes,
        "report_on_b_in_a_route_answers_s": [
            _round(x) if x is not None else None for x in seen_after
        ],
        "report_on_b_in_a_route_answers_seen": len(route_s),
        "route_measure": "a probe agent with a model of its own, session on B only: from its "
        "first LoadReport sent to A's GET /v1/route for that model listing it (50 ms polls, "
        f"{5 + interval_s:g} s at most)",
        "load_average_1m_before": load_before,
        "load_average_1m_after": _load(),
    }
    p99_n, p99_c = _percentile(notified_s, 0.99), _percentile(cut_s, 0.99)
    route_p99 = _percentile(route_s, 0.99) if len(route_s) == len(seen_after) else None
    targets = {
        "revocation.revocation_to_c_p99_s": target(
            figures["revocation_to_c_p99_s"], "<= 1", len(notified_s) == n and p99_n <= 1),
        "revocation.revocation_notify_cut_p99_s": target(
            figures["revocation_notify_cut_p99_s"], "<= 3", len(cut_s) == n and p99_c <= 3),
        "revocation.report_on_b_in_a_route_answers_p99_s": target(
            _round(route_p99) if route_p99 is not None else None, "<= 1.5",
            route_p99 is not None and route_p99 <= 1.5),
    }  # fmt: skip
    return {"figures": figures, "targets": targets}


def _got(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _round(value: float | None) -> float | None:
    return None if value is None or value != value else round(value, 3)


async def _stop_listeners(running: Fleet) -> list[int]:
    """SIGSTOP every backend of the fleet's database that listens for changes."""
    async with await running.db() as db:
        cursor = await db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
        )
        pids = [int(r[0]) for r in await cursor.fetchall()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


# ------------------------------------------------------------------- real agents


def _build_tiny_model() -> Path:
    artifacts = REPO / "models" / "artifacts"
    subprocess.run([sys.executable, "-m", "models", "build", "--out", str(artifacts),
                    "--only", MODEL], cwd=REPO, check=True)  # fmt: skip
    return artifacts


@contextlib.asynccontextmanager
async def real_agents(running: Fleet) -> AsyncIterator[list[AgentProcess]]:
    """One real agent per coordinator (its home first, then the others), TLS, enrolled."""
    models = await asyncio.to_thread(_build_tiny_model)
    coords = running.coordinators
    agents = []
    try:
        for i, order in enumerate(_orders(COORDINATORS)):
            agent = fleet_agent(running.root / f"agent-{i + 1}", running.url, models, coords[0],
                                [coords[t] for t in order], agent_id=f"edge-{i + 1}")  # fmt: skip
            agents.append(agent)
        await asyncio.gather(*(agent.start() for agent in agents))
        yield agents
    finally:
        for agent in agents:
            with contextlib.suppress(Exception):
                await agent.terminate()


async def _offer(
    agents: list[AgentProcess],
    key: str,
    rate_per_s: float,
    seconds: float,
    during: Callable[[float], Any] | None = None,
) -> list[tuple[float, int]]:
    """Open-loop one-token chats round robin over ``agents``: (time since start, status)."""
    done: list[tuple[float, int]] = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=30)
    sessions = [
        aiohttp.ClientSession(headers=a.headers(key), timeout=timeout,
                              connector=aiohttp.TCPConnector(ssl=a.ssl_context or True))
        for a in agents
    ]  # fmt: skip
    started = time.monotonic()

    async def one(i: int) -> None:
        try:
            async with sessions[i % len(agents)].post(
                agents[i % len(agents)].url + "/v1/chat/completions", json=body
            ) as response:
                await response.read()
                done.append((time.monotonic() - started, response.status))
        except (aiohttp.ClientError, TimeoutError, OSError):
            done.append((time.monotonic() - started, 0))

    pending: set[asyncio.Task[None]] = set()
    i = 0
    try:
        while (due := started + i / rate_per_s) < started + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if during is not None:
                during(time.monotonic() - started)
            task = asyncio.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(pending, timeout=60)
    finally:
        for session in sessions:
            await session.close()
    return done


def _max_in_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


async def scenario_budget(args: argparse.Namespace, watch: Watch) -> dict[str, Any]:
    load_before = _load()
    async with fleet("full", args.interval_ms, watch, "budget") as running, \
            real_agents(running) as agents:  # fmt: skip
        first = running.coordinators[0]
        key = await first.mint_api_key("budget", requests_per_minute=600)
        await wait_key_accepted(agents, key, timeout_s=60)
        await asyncio.sleep(3 * args.interval_ms / 1000)  # shares computed from every agent
        print(f"  offering {args.budget_offered_per_min}/min for {args.budget_s:g} s", flush=True)
        done = await _offer(agents, key, args.budget_offered_per_min / 60, args.budget_s)
    accepted = [t for t, status in done if status == 200]
    refused = sum(1 for _, s in done if s == 429)
    other = collections.Counter(s for _, s in done if s not in (200, 429))
    any_minute = _max_in_window(accepted, 60.0)
    after_first = _max_in_window([t for t in accepted if t >= 60.0], 60.0)
    minutes = [sum(1 for t in accepted if m * 60 <= t < (m + 1) * 60)
               for m in range(int(args.budget_s // 60) + 1)]  # fmt: skip
    figures = {
        "coordinators": COORDINATORS,
        "real_agents": COORDINATORS,
        "agents_model": MODEL,
        "key_requests_per_minute": 600,
        "offered_per_minute": args.budget_offered_per_min,
        "run_s": args.budget_s,
        "requests_sent": len(done),
        "accepted": len(accepted),
        "refused_429": refused,
        "other_statuses": {str(k): v for k, v in other.items()},
        "accepted_max_in_any_60s_window": any_minute,
        "accepted_max_in_any_60s_window_after_the_first_minute": after_first,
        "accepted_per_minute_from_start": minutes,
        "first_minute_note": "each agent's limit (agent/auth/keys.py) is a sliding 60 s "
        "window: an idle key may use its whole share at once, and no 60 s window at an agent "
        "holds more than its share, so while shares stay put no minute holds more than the "
        "budget, the first one included; shares moving can add at most the share that moved "
        "(the token bucket used before took a full bucket plus a minute of refill in the "
        "first minute: 1,200)",
        "load_average_1m_before": load_before,
        "load_average_1m_after": _load(),
    }
    targets = {
        "budget.accepted_max_in_any_60s_window": target(any_minute, "<= 660", any_minute <= 660),
        "budget.accepted_max_in_any_60s_window_after_the_first_minute": target(
            after_first, "<= 660", after_first <= 660
        ),
    }
    return {"figures": figures, "targets": targets}


async def scenario_records(args: argparse.Namespace, watch: Watch) -> dict[str, Any]:
    load_before = _load()
    async with fleet("full", args.interval_ms, watch, "records") as running:
        async with real_agents(running) as agents:
            first = running.coordinators[0]
            key = await first.api_key_for(agents, "records", timeout_s=60)
            killed: list[float] = []
            kill_at = args.records_s / 3

            def during(elapsed: float) -> None:
                if not killed and elapsed >= kill_at:
                    killed.append(elapsed)
                    os.kill(first.pid, signal.SIGKILL)
                    print(f"  SIGKILL coord-1 at {elapsed:.1f} s", flush=True)

            done = await _offer(agents, key, args.records_rps, args.records_s, during)
            await first.signal_and_wait(signal.SIGKILL, 10)
            ids = [a.agent_id for a in agents]
            spools = [running.root / f"agent-{i + 1}" / "agent" for i in range(len(agents))]
            # let the agents send what they hold: until every agent's acknowledged record
            # stops moving for two report intervals
            last: list[int] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = [_acked(spool) for spool in spools]
                if now == last:
                    break
                last = now
                await asyncio.sleep(2 * args.interval_ms / 1000)
        acked = [_acked(spool) for spool in spools]  # the agents have stopped
        async with await running.db() as db:
            stored: dict[str, set[int]] = {}
            for agent_id in ids:
                cursor = await db.execute(
                    "SELECT seq FROM request_records WHERE agent_id = %s", (agent_id,)
                )
                stored[agent_id] = {int(r[0]) for r in await cursor.fetchall()}
    lost = {
        agent_id: sorted(set(range(1, through + 1)) - stored[agent_id])[:20]
        for agent_id, through in zip(ids, acked, strict=True)
    }
    lost_count = sum(
        len(set(range(1, through + 1)) - stored[agent_id])
        for agent_id, through in zip(ids, acked, strict=True)
    )
    statuses = collections.Counter(s for _, s in done)
    figures = {
        "coordinators": COORDINATORS,
        "real_agents": len(ids),
        "requests_per_s": args.records_rps,
        "run_s": args.records_s,
        "coordinator_killed_at_s": round(killed[0], 1) if killed else None,
        "responses_by_status": {str(k): v for k, v in statuses.items()},
        "records_acknowledged_per_agent": dict(zip(ids, acked, strict=True)),
        "records_acknowledged": sum(acked),
        "records_stored": sum(len(v) for v in stored.values()),
        "acknowledged_records_lost": lost_count,
        "lost_seqs_first_20_per_agent": {k: v for k, v in lost.items() if v},
        "measure": "each agent's requests.acked (the last record the coordinator said it "
        "stored) after the agents stopped, against request_records in the database",
        "load_average_1m_before": load_before,
        "load_average_1m_after": _load(),
    }
    targets = {
        "records.acknowledged_records_lost": target(lost_count, "== 0", lost_count == 0),
        "records.records_acknowledged": target(sum(acked), "> 0", sum(acked) > 0),
    }
    return {"figures": figures, "targets": targets}


def _acked(spool: Path) -> int:
    for path in spool.rglob("requests.acked"):
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip() or 0)
    return 0


# ----------------------------------------------------------------------------- scale


async def scenario_scale(args: argparse.Namespace, watch: Watch) -> dict[str, Any]:
    interval_s = args.interval_ms / 1000
    load_before = _load()
    all_cpus = sorted(os.sched_getaffinity(0))
    pin = bool(args.pin) and len(all_cpus) >= 2
    coordinator_cpus = {all_cpus[0]} if pin else None
    load_cpus = set(all_cpus[1:]) if pin else None
    async with fleet("mtls", args.interval_ms, watch, "scale") as running:
        coords = running.coordinators
        postgres = running.postgres
        assert postgres is not None
        if coordinator_cpus and load_cpus:
            for c in coords:
                _pin(c.pid, coordinator_cpus)
            _pin(os.getpid(), load_cpus)
            postgres.pin(load_cpus)
        first = coords[0]
        token = await asyncio.to_thread(first.mint_join_token, uses=args.agents)
        ca_pem = (first.data_dir / "ca" / "ca.pem").read_bytes()
        ids = [f"sim-{i:05d}" for i in range(args.agents)]
        sims, setup = _start_simulators(
            [c.grpc_target for c in coords], ids, args.workers, interval_s, load_cpus,
            args.simulator_nice, enroll=(first.enroll_target, ca_pem, token),
        )  # fmt: skip
        try:
            ramp_s = await running.wait_connected(args.agents, 120 + args.agents / 50)
            per = [await running.connected(c) for c in coords]
            print(f"  connected {per} in {ramp_s:.1f} s", flush=True)
            setup.ask.set()
            await asyncio.sleep(interval_s * 1.5)
            processes = [psutil.Process(c.pid) for c in coords]
            key = "edgefleet_coordinator_load_reports_total"
            prefix = "edgefleet_coordinator_"
            m0 = [await _metric(c.http_url, prefix, c.admin_headers) for c in coords]
            since = [(p.cpu_times(), time.monotonic()) for p in processes]
            pg = postgres.sample()
            await asyncio.sleep(args.duration)
            cores_reports = [_cores(p, s) for p, s in zip(processes, since, strict=True)]
            pg_reports = pg()
            m1 = [await _metric(c.http_url, prefix, c.admin_headers) for c in coords]
            reports_s = [(b.get(key, 0) - a.get(key, 0)) / args.duration
                         for a, b in zip(m0, m1, strict=True)]  # fmt: skip
            print(f"  reports/s {[round(r) for r in reports_s]}, cores "
                  f"{[round(x, 3) for x in cores_reports]}, PostgreSQL {pg_reports}")  # fmt: skip
            proc, lout, warm = _start_lookups([c.http_url for c in coords], args.lookups_per_s,
                                              args.duration)  # fmt: skip
            if load_cpus and proc.pid is not None:
                os.sched_setaffinity(proc.pid, load_cpus)
            await asyncio.to_thread(warm.wait)
            h0 = [await _metric(c.http_url, prefix, c.admin_headers) for c in coords]
            since = [(p.cpu_times(), time.monotonic()) for p in processes]
            pg = postgres.sample()
            result = await asyncio.to_thread(lout.get, True, args.duration + 120)
            cores_both = [_cores(p, s) for p, s in zip(processes, since, strict=True)]
            pg_both = pg()
            h1 = [await _metric(c.http_url, prefix, c.admin_headers) for c in coords]
            proc.join(10)
            connected_end = [await running.connected(c) for c in coords]
        finally:
            _stop_simulators(sims)
    route = "edgefleet_coordinator_route_seconds"
    p99s, observed = [], []
    for a, b in zip(h0, h1, strict=True):
        buckets, total = _histogram_delta(a, b, route)
        p99s.append(round(_server_quantile(buckets, total, 0.99)[1] * 1000, 3))
        observed.append(int(total))
    total_reports = sum(reports_s)
    per_1000 = [round(c / r * 1000, 3) if r else None
                for c, r in zip(cores_reports, reports_s, strict=True)]  # fmt: skip
    pg_per_1000 = round(pg_reports / total_reports * 1000, 3) if pg_reports and total_reports \
        else None  # fmt: skip
    lookups = _lookup_figures(result, args.duration)
    coord_per_1000 = sum(cores_reports) / total_reports * 1000 if total_reports else float("nan")
    figures = {
        "agents": args.agents,
        "coordinators": COORDINATORS,
        "session_transport": "mutual TLS, one connection per agent with its own certificate "
        "(enrolled through coord-1's Enroll RPC, a key and CSR of its own)",
        "report_interval_ms": args.interval_ms,
        "all_connected_after_s": round(ramp_s, 1),
        "agents_per_coordinator": per,
        "agents_connected_at_end": connected_end,
        "reports_per_s_expected": round(args.agents / interval_s, 1),
        "reports_per_s_stored_per_coordinator": [round(r, 1) for r in reports_s],
        "coordinator_cores_reports_only": [round(x, 3) for x in cores_reports],
        "coordinator_cores_reports_and_lookups": [round(x, 3) for x in cores_both],
        "coordinator_cores_per_1000_reports_s": per_1000,
        "postgres_cores_reports_only": _round(pg_reports),
        "postgres_cores_reports_and_lookups": _round(pg_both),
        "postgres_cores_per_1000_reports_s": pg_per_1000,
        "lookups_per_s_requested": args.lookups_per_s,
        "lookups_sent_to": "the three coordinators, round robin",
        **lookups,
        "route_server_p99_ms_per_coordinator": p99s,
        "route_server_lookups_observed_per_coordinator": observed,
        "pinning": (
            f"the three coordinators on CPU {sorted(coordinator_cpus)}; PostgreSQL, "
            f"the simulators (nice {args.simulator_nice}) and the lookup client on "
            f"CPU {sorted(load_cpus)}"
        )
        if coordinator_cpus and load_cpus
        else "not pinned: everything shares every CPU",
        "extrapolation": _extrapolate(coord_per_1000, pg_per_1000, interval_s),
        "load_average_1m_before": load_before,
        "load_average_1m_after": _load(),
    }
    worst = max(p99s, default=float("nan"))
    failed = lookups["lookups_failed"] + lookups["lookups_empty_answers"]
    targets = {
        "scale.route_server_p99_ms": target(worst, "< 5 (every coordinator)", worst < 5),
        "scale.lookups_failed": target(failed, "== 0 (empty answers included)", failed == 0),
        "scale.agents_connected": target(sum(per), f">= {args.agents}", sum(per) >= args.agents),
    }
    return {"figures": figures, "targets": targets}


def _extrapolate(coord_per_1000: float, pg_per_1000: float | None, interval_s: float) -> str:
    parts = []
    for agents in (5000, 20000):
        reports = agents / interval_s
        coord = coord_per_1000 * reports / 1000
        pg = pg_per_1000 * reports / 1000 if pg_per_1000 is not None else float("nan")
        parts.append(
            f"{agents:,} agents at one report per {interval_s:g} s: {reports:,.0f} reports/s, "
            f"about {coord:.2f} coordinator cores in all (over the coordinators sharing them; "
            f"lookups extra) and {pg:.2f} PostgreSQL cores"
        )
    return ("Linear in reports/s from this run's reports-only window (the cores of the three "
            "coordinators summed): " + "; ".join(parts) + ". A coordinator's one core holds "
            "about 1000 / (its cores per 1,000 reports/s) reports/s before lookups.")  # fmt: skip


# ----------------------------------------------------------------------- connections


async def scenario_connections_alone(args: argparse.Namespace, watch: Watch) -> None:
    """A small fleet under load with a coordinator killed, for the connection figures."""
    interval_s = args.interval_ms / 1000
    async with fleet("plain", args.interval_ms, watch, "connections") as running:
        coords = running.coordinators
        ids = [f"sim-{i:05d}" for i in range(300)]
        sims, _ = _start_simulators([c.grpc_target for c in coords], ids, 1, interval_s)
        try:
            await running.wait_connected(len(ids), 60)
            proc, out, warm = _start_lookups([c.http_url for c in coords[:-1]], 100, 20)
            await asyncio.to_thread(warm.wait)
            await asyncio.sleep(5)
            await coords[-1].signal_and_wait(signal.SIGKILL, 10)
            await asyncio.to_thread(out.get, True, 120)
            proc.join(10)
        finally:
            _stop_simulators(sims)


def connections_section(watch: Watch) -> dict[str, Any]:
    problems = watch.problems + watch.postgres_problems
    figures = {
        "scenarios_watched": watch.scenarios,
        "postgres_connections_max": watch.max_connections,
        "postgres_connections_at_max_by_process": watch.at_max,
        "coordinators_connections_max": watch.max_coordinators,
        "coordinator_connections_max_each": watch.max_per_coordinator,
        "limit_coordinators_x_pool_plus_1": watch.limit,
        "pool": POOL,
        "sampled": "pg_stat_activity of the fleet's database every 0.25 s, the benchmark's "
        "own connections left out; each connection's client port mapped to the process "
        "holding it (psutil) whenever the count reached its highest yet or the limit: the "
        "coordinators' connections, and others (the admin CLI's join-token calls) apart",
        "coordinator_log_lines_searched": watch.coordinator_lines,
        "log_lines_with_deadlock_or_too_many_clients": problems[:20],
    }
    targets = {
        "connections.coordinators_connections_max": target(
            watch.max_coordinators, f"<= {watch.limit}", watch.max_coordinators <= watch.limit
        ),
        "connections.coordinator_connections_max_each": target(
            max(watch.max_per_coordinator.values(), default=0), f"<= {POOL + 1}",
            max(watch.max_per_coordinator.values(), default=0) <= POOL + 1,
        ),
        "connections.log_problems": target(len(problems), "== 0", not problems),
    }  # fmt: skip
    return {"figures": figures, "targets": targets}


# ------------------------------------------------------------------------------ main


def _write(sections: dict[str, Any], path: Path) -> Path:
    document: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        document = json.loads(path.read_text())
    document.setdefault("benchmark", NAME)
    document["machine"] = machine()
    document.setdefault("sections", {})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    code = _tree()
    for name, section in sections.items():
        # a section's own time: when it finished (the write after the next scenario
        # keeps it)
        section.setdefault("when", now)
        section.setdefault("code", code)
        document["sections"][name] = section
    document["when"] = now
    targets: dict[str, Any] = {}
    for section in document["sections"].values():
        targets |= section.get("targets", {})
    document["targets"] = targets
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


RUNNERS = {
    "kill": scenario_kill,
    "revocation": scenario_revocation,
    "budget": scenario_budget,
    "records": scenario_records,
    "scale": scenario_scale,
}


async def main(args: argparse.Namespace) -> int:
    watch = Watch()
    sections: dict[str, Any] = {}
    path = RESULTS_DIR / f"{args.results}.json" if args.results else RESULTS_DIR / f"{NAME}.json"
    if args.results and os.path.isabs(args.results):
        path = Path(args.results + ".json")
    for name in args.scenario:
        if name == "connections":
            continue
        started = time.monotonic()
        print(f"== {name}", flush=True)
        sections[name] = await RUNNERS[name](args, watch)
        sections[name]["figures"]["scenario_wall_s"] = round(time.monotonic() - started, 1)
        for key, value in sections[name]["targets"].items():
            print(f"  {key}: {value}", flush=True)
        _write(sections, path)
    if "connections" in args.scenario:
        if not watch.scenarios:
            print("== connections (a small fleet of its own)", flush=True)
            await scenario_connections_alone(args, watch)
        sections["connections"] = connections_section(watch)
        for key, value in sections["connections"]["targets"].items():
            print(f"  {key}: {value}", flush=True)
    print(f"wrote {_write(sections, path)}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--agents", type=int, default=1500, help="kill and scale")
    parser.add_argument("--interval-ms", type=int, default=2000, help="report interval")
    parser.add_argument("--workers", type=int, default=2, help="simulator processes")
    parser.add_argument("--lookups-per-s", type=float, default=200.0)
    parser.add_argument(
        "--kill-window-s",
        type=float,
        default=30.0,
        help="lookups window of the kill scenario (the kill 3 s into it)",
    )
    parser.add_argument("--revocations", type=int, default=50)
    parser.add_argument("--revocation-agents", type=int, default=150)
    parser.add_argument("--route-probes", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--budget-offered-per-min", type=int, default=1200)
    parser.add_argument("--records-s", type=float, default=45.0)
    parser.add_argument("--records-rps", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=20.0, help="scale: seconds per window")
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=False,
        help="scale: the coordinators on CPU 0, the load on the others (see the module doc)",
    )  # fmt: skip
    parser.add_argument("--simulator-nice", type=int, default=10)
    parser.add_argument(
        "--results",
        default="",
        metavar="NAME",
        help=f"write benchmarks/results/NAME.json (default {NAME})",
    )
    return parser.parse_args(argv)  # fmt: skip


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
