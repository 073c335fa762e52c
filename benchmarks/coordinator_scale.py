"""Coordinator scale: N fake agents over real gRPC, plus route lookups, against a real process.

    .venv/bin/python -m benchmarks.coordinator_scale --agents 5000 --lookups-per-s 500

A simulator (``--workers`` processes) opens one Session per fake agent (Hello, then a
LoadReport every ``--interval-ms`` with random load); a separate lookup process sends
``GET /v1/route`` at a fixed (open-loop) rate from random places over keep-alive
connections with a minimal HTTP/1.1 client, so that the client's own CPU cost stays
small. With ``--pin`` (the default on 2+ cores) the coordinator runs alone on CPU 0
and the load generators share the other CPUs at a lower priority (the simulators and the
lookup client alike: a client above them kept them from running for up to 0.26 s, and
their agents then reported in one burst): the coordinator's "one core" is then enforced,
not just measured.

Measured over two steady windows, side by side: reports/s the coordinator stored and
its CPU use (cores) with reports only, then with lookups too. Route latency twice:

* coordinator side: the routing decision itself (candidates, scoring), timed inside the
  router for gRPC and HTTP lookups alike (``edgefleet_coordinator_route_seconds``; buckets are
  0.25 ms apart up to 5 ms; p99 is given as its bucket's upper bound and interpolated;
* client side: from writing the request to reading the whole response, in the lookup
  process (loopback, queueing in the coordinator's event loop and the kernel
  included); the lookup process's own lag behind its schedule is reported apart,
  so a starved client shows up as lag and not as coordinator latency. Beside it, "on the
  wire": from the kernel's send time of the request's last byte (SO_TIMESTAMPING) to its
  receive time of the answer's last byte (SO_TIMESTAMPNS), which leaves out the client's
  own waits to be scheduled, before its write and after the answer came (the first is
  reported too: ``route_client_send_delay_p99_ms``).

Garbage-collector pauses of the coordinator during the lookup window come from its
``edgefleet_coordinator_gc_pause_seconds`` histogram; the event loop's longest stall in
each window from ``edgefleet_coordinator_event_loop_lag_seconds`` (how late a probe timer
due every 10 ms ran: the upper bound of the highest bucket reached, and how many wake-ups
were more than 20 ms late), measured inside the coordinator. Pauses of the machine itself
(a virtual machine's CPU taken away by its host: nothing in it is then running) come from
a real-time probe on each CPU (``benchmarks.host_pauses``, with ``--host-probe``): the
longest in each window and how many were over 10 ms, so that a latency spike the host
caused is told apart from one the coordinator did. It is off by default because it
perturbs what it watches: waking a thousand times a second ahead of the coordinator on its
CPU, it cost about 0.07 cores and tripled the client route p99. Every fake agent reads what the
coordinator pushes and acknowledges the section generations in its reports, as a real
one does. Session setup time: from opening the Session to its Welcome, per agent, while
all of them ramp up together. Writes benchmarks/results/coordinator_scale.json.

A simulator process carries thousands of agents, so anything that stops it (its garbage
collector above all) stops them all at once, and they then report in one burst: a
correlated burst that separate boxes do not make. Once its agents are set up, each
simulator freezes what it holds out of its collector's sight (``--simulator-gc frozen``,
the default; ``python`` keeps the bursts as a stress case), and every simulator's own
event-loop stalls are measured in both windows and written next to the coordinator's.

    .venv/bin/python -m benchmarks.coordinator_scale --secure --agents 5000

``--secure`` is the fleet as issue 9 runs it: the coordinator with ``tls = on`` (mutual
TLS on the Session port, enrollment required, Enroll on its own server-authenticated
port). Before its session each simulated agent makes its own EC key and CSR and enrolls
through the real Enroll RPC (one multi-use join token; Enroll's per-peer rate limit
raised, since every simulated agent enrolls from 127.0.0.1), then opens a channel of its
own (one TCP + TLS connection per agent) presenting its own client certificate, and
says Hello with its credential: the coordinator checks that the certificate's agent id
is Hello.agent_id, so agents cannot share a connection. Nothing is shared between agents
but the simulator processes (and, for the one-off Enroll calls, ENROLL_CHANNELS
server-authenticated channels per process). KEYS API keys are minted through the admin
API before the agents come; every agent gets all of them in its keys section, and
reports usage on two of them (skewed), so that the distributor's per-interval rebalance
of the KEYS_WITH_BUDGETS keys with fleet-wide budgets runs at scale; keys sections
received per second are counted at the agents. Route lookups stay plain HTTP on
loopback (the coordinator's ``http_tls = auto``: off on loopback). Writes
benchmarks/results/coordinator_scale_secure.json.

    .venv/bin/python -m benchmarks.coordinator_scale --store postgresql --agents 5000

``--store postgresql`` runs the coordinator on PostgreSQL (``store_url``): on a throwaway
cluster started on this machine for the run (tests/postgres_cluster.py: Debian's server,
fsync and synchronous_commit off, so its disk costs little), or on ``--store-url`` (its
password, if any, from ``EDGEFLEET_COORDINATOR_STORE_PASSWORD``). PostgreSQL's cores are
reported next to the coordinator's for both windows: the CPU time of the server's
processes (the postmaster listening on the URL's port and its children: backends,
writers) over the window, when the server runs on this machine; with ``--pin`` they share
the load generators' CPUs, not the coordinator's. Results go to ``..._postgres.json``
(``--results NAME`` to choose).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import multiprocessing as mp
import os
import random
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import grpc
import psutil  # type: ignore[import-untyped, unused-ignore]
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.control.reconnect import ReconnectBackoff
from benchmarks.host_pauses import HostPauses
from benchmarks.results_file import target, write_results
from devtools.fleet import CoordinatorProcess
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.postgres_cluster import PostgresCluster

MODELS = ("smollm2-135m", "qwen2.5-0.5b")
AGENTS_PER_CHANNEL = 250
# --secure: Enroll calls in flight per simulator, over this many channels.
ENROLL_IN_FLIGHT = 64
ENROLL_CHANNELS = 4
# --secure: API keys minted (every agent gets all of them in its keys section); the
# first KEYS_WITH_BUDGETS have fleet-wide rate limits, so their shares are rebalanced
# from reported usage every report interval.
KEYS = 10
KEYS_WITH_BUDGETS = 5
# Each channel its own subchannel (connection): channels are never merged.
_LOCAL_POOL = ("grpc.use_local_subchannel_pool", 1)
# Lookups sent before the measured window (connections opening), not counted.
WARMUP_S = 3.0


class ReportSchedule:
    """When a simulated agent's next report is due: on its own grid (``start + phase + k *
    interval``), whenever its simulator got round to the last one. Waiting an interval
    after each report instead, every stall of a simulator process (its event loop, its
    CPU taken by the others) moved all the agents it delayed onto the same moment for
    good: over a minute their phases bunched until 0.4-0.6 s of every 2 s carried no
    report at all and the rest came in a flood (seen at the coordinator and in the
    simulators' own send times), a correlation that a fleet of separate boxes does not
    have. A report more than an interval late skips the slots it missed."""

    def __init__(self, start: float, interval_s: float, phase_s: float) -> None:
        self.interval_s = interval_s
        self.due = start + phase_s

    def sent(self, now: float) -> None:
        """The report due was sent at ``now``: the next is due one interval later on the
        grid (the first slot after ``now``)."""
        self.due += self.interval_s
        if self.due <= now:
            self.due += (now - self.due) // self.interval_s * self.interval_s + self.interval_s


def _agent_place(rng: random.Random) -> tuple[float, float]:
    # Europe-ish box: dense enough that the nearest-cell search has real work.
    return rng.uniform(36.0, 60.0), rng.uniform(-9.0, 30.0)


class _Identity(NamedTuple):
    """What a simulated agent got from Enroll (--secure): its id and credentials."""

    agent_id: str
    token: str
    credentials: Any  # grpc.ChannelCredentials: its own client certificate and key


# Simulator processes' garbage collector once their agents are set up (--simulator-gc):
# "frozen" moves everything set up so far out of the collector's sight (gc.freeze) and
# collects the young generation less often; "python" leaves Python's defaults. A simulator
# carries 2,500 agents: with the defaults its collections (generation 1: 80-160 ms,
# generation 2: up to 700 ms, seen 2026-12-03) stop all of them at once, and they then send
# their reports in one burst, a correlated burst that a fleet of separate boxes does not
# make. "python" keeps that burst as a stress case.
SIMULATOR_GC_MODES = ("frozen", "python")
SIMULATOR_GC_THRESHOLDS = (10_000, 50, 1_000)
# A simulator's event loop counts as stalled when a 10 ms probe timer runs this late.
SIMULATOR_STALL_S = 0.05


class _Setup(NamedTuple):
    """Where simulators put their setup figures, and the main process's "report now".
    ``gc``: one of SIMULATOR_GC_MODES; ``stalls``: a multiprocessing Array('d', 2) where
    every simulator keeps [longest stall of its event loop in ms, stalls over
    SIMULATOR_STALL_S] from its setup on (the main process zeroes it per window)."""

    out: Any  # multiprocessing Queue
    ask: Any  # multiprocessing Event
    gc: str = "frozen"
    stalls: Any = None


class _Stats:
    """Per simulator process: session setup times and what the coordinator pushed."""

    def __init__(self, pushed: Any = None) -> None:
        self.setup_s: list[float] = []
        self.keys_sections = 0
        self.keys_in_last_section = 0
        self.failed_attempts = 0
        self.failures: dict[str, int] = {}
        # multiprocessing Value: keys sections received, read by the main process.
        self.pushed = pushed
        # sessions opened on another coordinator than the agent's previous one, and
        # sessions that broke after their Welcome (not failed attempts)
        self.moves = 0
        self.sessions_broken = 0
        # called with (agent id, the key ids of a keys section) as each one arrives
        self.on_keys: Callable[[str, set[str]], None] | None = None
        self.stall_watch: asyncio.Task[None] | None = None


async def _watch_stalls(stalls: Any) -> None:
    """Records how late a 10 ms timer runs in this simulator's loop (see _Setup.stalls)."""
    while True:
        due = time.monotonic() + 0.01
        await asyncio.sleep(0.01)
        late_ms = (time.monotonic() - due) * 1000
        if late_ms > 5:
            with stalls.get_lock():
                stalls[0] = max(stalls[0], late_ms)
                stalls[1] += late_ms >= SIMULATOR_STALL_S * 1000


async def _fake_agent(
    channel_of: Callable[[], Any] | Sequence[Callable[[], Any]],
    agent_id: str,
    interval_s: float,
    stop: float,
    stats: _Stats,
    token: str = "",
    key_ids: tuple[str, ...] = (),
    own_channel: bool = False,
    hello_models: Sequence[str] | None = None,
    on_report: Callable[[], object] | None = None,
) -> int:
    """One agent: a session like a real one, reconnecting as the real one does when it fails.
    ``hello_models``: the models it says it serves (default MODELS); ``on_report`` is
    called as each LoadReport goes out.

    ``channel_of`` gives the channel for each attempt; with ``own_channel`` it is a new
    one per attempt, closed after it, as the real agent does (a failed TLS handshake then
    leaves no gRPC reconnect backoff behind for the next attempt). Several of them (one per
    coordinator, in this agent's order, as ``coordinator.target`` lists them): like
    agent/control/session.py, a broken session or a failed attempt moves on to the next
    coordinator at once; only once each was tried in a round without a session opening
    does the agent wait (agent.control.reconnect's backoff: 0.5 s doubling with jitter,
    capped at one report interval), and the next round starts with the one that worked
    last. One target: the same rounds of one."""
    sent = 0
    rng = random.Random(agent_id)
    targets = [channel_of] if callable(channel_of) else list(channel_of)
    backoff = ReconnectBackoff(0.5, rng)
    failures, preferred, last_opened = 0, 0, -1
    while time.monotonic() < stop:
        opened_in_round = False
        for step in range(len(targets)):
            index = (preferred + step) % len(targets)
            channel = targets[index]()
            opened: list[bool] = []
            try:
                stub = pb_grpc.CoordinatorStub(channel)
                sent += await _fake_session(
                    stub, agent_id, interval_s, stop, stats, token, key_ids, opened,
                    hello_models, on_report,
                )  # fmt: skip
            except Exception as exc:  # the session failed; the agent goes on
                if opened:
                    stats.sessions_broken += 1
                else:
                    stats.failed_attempts += 1
                    why = (
                        f"{exc.code().name}: {(exc.details() or '')[:60]}"
                        if isinstance(exc, grpc.aio.AioRpcError)
                        else f"{type(exc).__name__}: {str(exc)[:60]}"
                    )
                    stats.failures[why] = stats.failures.get(why, 0) + 1
            finally:
                if own_channel:
                    await channel.close()
            if opened:
                opened_in_round, preferred = True, index
                if last_opened not in (-1, index):
                    stats.moves += 1
                last_opened = index
            if time.monotonic() >= stop:
                return sent
        failures = 0 if opened_in_round else failures + 1
        await asyncio.sleep(backoff.delay(failures, interval_s))
    return sent


async def _fake_session(
    stub: Any,
    agent_id: str,
    interval_s: float,
    stop: float,
    stats: _Stats,
    token: str,
    key_ids: tuple[str, ...],
    opened: list[bool] | None = None,
    hello_models: Sequence[str] | None = None,
    on_report: Callable[[], object] | None = None,
) -> int:
    """Hello, then a LoadReport every interval (``opened`` gets True at the Welcome). Like
    a real agent it reads what the coordinator pushes and acknowledges the section
    generations it applied; with ``key_ids`` it reports per-key usage (a few keys, skewed,
    so shares move)."""
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
                models=[pb.LoadedModel(name=m, version="v1") for m in hello_models or MODELS],
                contract_minor=CONTRACT_MINOR,
                token=token,
            )
        )
    )
    applied = pb.SectionGenerations()

    async def outgoing() -> Any:
        while (message := await queue.get()) is not None:
            yield message

    async def incoming() -> None:
        while (message := await call.read()) is not grpc.aio.EOF:
            if message.WhichOneof("body") != "desired_state":
                continue
            desired = message.desired_state
            for name in ("models", "overflow_targets", "keys", "config"):
                if desired.HasField(name):
                    setattr(applied, name, getattr(desired, name).generation)
            if desired.HasField("keys"):
                stats.keys_sections += 1
                stats.keys_in_last_section = len(desired.keys.keys)
                if stats.pushed is not None:
                    stats.pushed.value += 1
                if stats.on_keys is not None:
                    stats.on_keys(agent_id, {k.key_id for k in desired.keys.keys})

    started = time.perf_counter()
    call = stub.Session(outgoing())
    sent = 0
    reader: asyncio.Task[None] | None = None
    # Each agent favours a couple of keys: demand differs between agents.
    mine = rng.sample(key_ids, min(2, len(key_ids))) if key_ids else []
    try:
        await call.read()  # Welcome
        stats.setup_s.append(time.perf_counter() - started)
        if opened is not None:
            opened.append(True)
        reader = asyncio.create_task(incoming())
        # reports spread over the interval, each agent keeping its own phase
        schedule = ReportSchedule(time.monotonic(), interval_s, rng.uniform(0, interval_s))
        while time.monotonic() < stop:
            # the stream ending (a broken connection, the coordinator gone or closing it)
            # ends the session at once, as the real agent's reader does
            wait_s = max(0.0, schedule.due - time.monotonic())
            ended, _ = await asyncio.wait({reader}, timeout=wait_s)
            if ended:
                reader.result()  # raises the stream's error
                return sent
            schedule.sent(time.monotonic())
            usage = [
                pb.KeyUsage(
                    key_id=key_id,
                    requests=(n := rng.randrange(1 + 6 * (i == 0))),
                    prompt_tokens=n * 40,
                    completion_tokens=n * 60,
                )
                for i, key_id in enumerate(mine)
            ]
            queue.put_nowait(
                pb.AgentMessage(
                    load_report=pb.LoadReport(
                        running_sequences=rng.randrange(8),
                        waiting_sequences=rng.randrange(4),
                        tokens_per_second=rng.uniform(5, 60),
                        kv_cache_used_fraction=rng.uniform(0, 0.9),
                        applied=applied,
                        key_usage=usage,
                    )
                )
            )
            sent += 1
            if on_report is not None:
                on_report()
    finally:
        queue.put_nowait(None)
        call.cancel()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
    return sent


def _merged(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for why, n in one.items():
            total[why] = total.get(why, 0) + n
    return dict(sorted(total.items(), key=lambda item: -item[1])[:5])


def _same(channel: Any) -> Any:
    return channel


def _simulator(
    target_addr: str | Sequence[str],
    ids: list[str],
    interval_s: float,
    stop: float,
    setup: Any,
    pushed: Any,
    out: Any,
    orders: Sequence[Sequence[int]] | None = None,
) -> None:
    """Plain sessions: AGENTS_PER_CHANNEL agents share each (plaintext) channel to a
    coordinator. Several coordinators (``target_addr`` a list): ``orders[i]`` is agent i's
    order of them (its ``coordinator.target`` list), default the list as given."""
    targets = [target_addr] if isinstance(target_addr, str) else list(target_addr)

    async def run() -> int:
        channels = [
            [
                grpc.aio.insecure_channel(where, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(max(1, len(ids) // AGENTS_PER_CHANNEL))
            ]
            for where in targets
        ]
        stats = _Stats(pushed)
        tasks = []
        for i, agent_id in enumerate(ids):
            order = orders[i] if orders is not None else range(len(targets))
            mine = [functools.partial(_same, channels[t][i % len(channels[t])]) for t in order]
            tasks.append(asyncio.create_task(_fake_agent(mine, agent_id, interval_s, stop, stats)))
            if i % 200 == 199:
                await asyncio.sleep(0.05)  # ramp, do not stampede
        await _report_setup(stats, len(ids), setup, {})
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for one in channels:
            for channel in one:
                await channel.close()
        return sum(r for r in results if isinstance(r, int))

    out.put(asyncio.run(run()))


async def _report_setup(stats: _Stats, n: int, setup: Any, extra: dict[str, Any]) -> None:
    """Once every agent of this process got its first Welcome, or the main process gave
    up waiting (``setup.ask`` set)."""
    while len(stats.setup_s) < n and not setup.ask.is_set():
        await asyncio.sleep(0.5)
    if not setup.ask.is_set():
        await asyncio.sleep(5)  # let the coordinator's first pushes arrive
    setup.out.put({"setup_s": list(stats.setup_s), "keys_sections": stats.keys_sections,
               "failed_attempts": stats.failed_attempts, "failures": dict(stats.failures),
               "keys_in_last_section": stats.keys_in_last_section, **extra})  # fmt: skip
    if setup.gc == "frozen":
        gc.collect()
        gc.freeze()
        gc.set_threshold(*SIMULATOR_GC_THRESHOLDS)
    if setup.stalls is not None:
        stats.stall_watch = asyncio.create_task(_watch_stalls(setup.stalls))


def _new_key_and_csr(name: str) -> tuple[bytes, str]:
    """What a real agent makes before Enroll: its own EC key and a CSR for it."""
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


async def _enroll_all(
    enroll_target: str, ca_pem: bytes, join_token: str, ids: list[str]
) -> tuple[list[_Identity], float]:
    """Enroll every agent through the real Enroll RPC (server-authenticated TLS), each with
    a key and CSR of its own; ENROLL_IN_FLIGHT calls at a time over ENROLL_CHANNELS
    channels (enrollment is a one-off call, not the agent's identity)."""
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    channels = [
        grpc.aio.secure_channel(
            enroll_target, creds, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(ENROLL_CHANNELS)
    ]
    gate = asyncio.Semaphore(ENROLL_IN_FLIGHT)
    started = time.perf_counter()

    async def one(i: int, name: str) -> _Identity:
        key_pem, csr_pem = _new_key_and_csr(name)
        stub = pb_grpc.CoordinatorStub(channels[i % len(channels)])
        async with gate:
            reply = await stub.Enroll(
                pb.EnrollRequest(join_token=join_token, requested_name=name, csr_pem=csr_pem),
                timeout=120,
            )
        own = grpc.ssl_channel_credentials(
            root_certificates=ca_pem,
            private_key=key_pem,
            certificate_chain=reply.client_cert_pem.encode("ascii"),
        )
        return _Identity(reply.agent_id, reply.credentials, own)

    identities = await asyncio.gather(*(one(i, name) for i, name in enumerate(ids)))
    elapsed = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return list(identities), elapsed


def _secure_simulator(
    enroll_target: str,
    session_target: str | Sequence[str],
    ca_pem: bytes,
    join_token: str,
    key_ids: tuple[str, ...],
    ids: list[str],
    interval_s: float,
    stop: float,
    setup: Any,
    pushed: Any,
    out: Any,
    orders: Sequence[Sequence[int]] | None = None,
) -> None:
    """Enrolled agents over mutual TLS: one channel (TCP + TLS connection) per agent,
    presenting that agent's own client certificate, as the coordinator requires (the
    certificate's agent id must be Hello.agent_id). Several coordinators (sharing the
    fleet CA): ``orders[i]`` is agent i's order of ``session_target``."""
    targets = [session_target] if isinstance(session_target, str) else list(session_target)

    async def run() -> int:
        identities, enroll_s = await _enroll_all(enroll_target, ca_pem, join_token, ids)
        stats = _Stats(pushed)
        tasks = []
        for i, identity in enumerate(identities):

            def channel_of(where: str, credentials: Any = identity.credentials) -> Any:
                return grpc.aio.secure_channel(where, credentials, options=[_LOCAL_POOL])

            order = orders[i] if orders is not None else range(len(targets))
            mine = [functools.partial(channel_of, targets[t]) for t in order]
            tasks.append(
                asyncio.create_task(
                    _fake_agent(
                        mine, identity.agent_id, interval_s, stop, stats,
                        identity.token, key_ids, own_channel=True,
                    )
                )
            )  # fmt: skip
            if i % 200 == 199:
                await asyncio.sleep(0.05)  # ramp, do not stampede
        await _report_setup(stats, len(ids), setup, {"enroll_s": enroll_s, "enrolled": len(ids)})
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return sum(r for r in results if isinstance(r, int))

    out.put(asyncio.run(run()))


# Linux's SO_TIMESTAMPNS (asm-generic, x86 and arm alike; the socket module does not name
# it): every read then carries the kernel's receive time of its data (CLOCK_REALTIME).
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
# SO_TIMESTAMPING with a software timestamp of each send (linux/net_tstamp.h): the kernel
# queues the time it passed the request's last byte on (CLOCK_REALTIME) on the socket's
# error queue, so the time on the wire starts when the request left, not when this process
# (sharing its CPU with the simulators) meant to send it.
SO_TIMESTAMPING = 37
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
_TX_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY


class _Connection:
    """One keep-alive HTTP/1.1 connection; just enough client for GET with Content-Length.

    Besides the answer, ``get`` says when the kernel received its last byte
    (SO_TIMESTAMPNS) and when it sent the request's last byte (SO_TIMESTAMPING), so the
    time on the wire can be told apart from the time this process took to be scheduled
    to send the request and to read the answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.sent_at: float | None = None  # the kernel's send time of the last request
        # the kernel's receive time of the latest read that carried one
        self.received_at: float | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        with contextlib.suppress(OSError):  # without it, the wire time starts at the write
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TX_FLAGS)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def close(self) -> None:
        self.sock.close()

    def _take_send_times(self) -> None:
        """Empty the error queue of send timestamps (the latest is the request's); it must
        not stay full, or the socket polls as readable (POLLERR) while no answer came."""
        while True:
            try:
                _data, ancillary, _flags, _addr = self.sock.recvmsg(1, 256, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                    seconds, nanoseconds = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    if seconds or nanoseconds:  # the first of three: the software one
                        self.sent_at = seconds + nanoseconds / 1e9

    async def _recv(self) -> bytes:
        """One read; its kernel receive time (seconds since the epoch) into
        ``received_at`` when the kernel gave one (seen once without, in CI on a busy
        machine; why, not found: the earlier read's time then stands)."""
        while True:
            self._take_send_times()
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(65536, 256)
            except BlockingIOError:
                readable = self.loop.create_future()
                self.loop.add_reader(self.sock.fileno(), readable.set_result, None)
                try:
                    await readable
                finally:
                    self.loop.remove_reader(self.sock.fileno())
                continue
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    self.received_at = seconds + nanoseconds / 1e9
            return data

    async def get(self, host: str, path: str) -> tuple[int, bytes, float | None]:
        """(status, body, kernel receive time of the answer's last byte); ``sent_at``
        then holds the kernel's send time of the request (None where not given)."""
        self.sent_at = self.received_at = None
        await self.loop.sock_sendall(
            self.sock, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        )
        buffer = b""
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            data = await self._recv()
            if not data:
                raise asyncio.IncompleteReadError(buffer, None)
            buffer += data
        head, body = buffer[: end + 4], buffer[end + 4 :]
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        while len(body) < length:
            data = await self._recv()
            if not data:
                raise asyncio.IncompleteReadError(head + body, length + len(head))
            body += data
        if len(body) > length:
            raise ValueError("more bytes than Content-Length")
        return status, body, self.received_at


class LookupResult(NamedTuple):
    """What the lookup process measured (read by name: its users are in other modules)."""

    latencies: list[float]  # s, writing the request to reading the whole answer
    lags: list[float]  # s, how late each lookup left against its schedule
    failed: dict[str, int]  # why -> how many
    cpu_s: float  # the lookup process's CPU while measuring
    wire: list[float]  # s, the kernel's send time to its receive time
    sends: list[float]  # s, this process's delay before the kernel sent


def _lookups(
    http_url: str, rate: float, warmup_s: float, seconds: float, warm: Any, out: Any
) -> None:
    """Open-loop lookups; puts a :class:`LookupResult` on ``out``: a latency runs from
    writing the request to reading the whole answer; its wire latency to the kernel's
    receive time of the answer's last byte, so it leaves out how long this process,
    sharing its CPU with the simulators, took to be scheduled after the answer came. An
    answer without any agent (``"agents": []``) counts as a failure ("empty answer").
    ``http_url``: one coordinator, or several comma-separated, asked in turn (one lookup
    each, round robin).

    The first ``warmup_s`` (connections opening, caches filling) are not measured;
    ``warm`` is set when measuring starts.
    """
    servers = [urlsplit(url.strip()) for url in http_url.split(",") if url.strip()]
    addresses = [(p.hostname or "127.0.0.1", p.port or 80) for p in servers]

    async def run() -> LookupResult:
        rng = random.Random(7)
        latencies: list[float] = []
        wire: list[float] = []
        sends: list[float] = []  # how long after this process meant to send the kernel did
        lags: list[float] = []
        failed: dict[str, int] = {}  # why -> how many lookups failed so
        idles: list[list[_Connection]] = [[] for _ in addresses]
        turn = 0

        measuring = False

        def fail(why: str) -> None:
            failed[why] = failed.get(why, 0) + 1

        async def one(due: float, host: str, port: int, idle: list[_Connection]) -> None:
            lat, lon = _agent_place(rng)
            path = f"/v1/route?model={rng.choice(MODELS)}&lat={lat:.4f}&lon={lon:.4f}"
            reused = bool(idle)
            connection = idle.pop() if idle else await _Connection.open(host, port)
            t0, sent_at = time.perf_counter(), time.time()
            counted = measuring
            if counted:
                lags.append(max(0.0, time.monotonic() - due))
            try:
                try:
                    status, body, received_at = await connection.get(host, path)
                except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
                    # a kept-alive connection the server closed while idle (its header
                    # timeout), before any byte of an answer: retried once on a new
                    # connection, as HTTP clients do for an idempotent request
                    partial = getattr(exc, "partial", b"")
                    if not reused or partial:
                        raise
                    connection.close()
                    failed["retried: kept-alive connection closed by the server"] = (
                        failed.get("retried: kept-alive connection closed by the server", 0) + 1
                    )
                    connection = await _Connection.open(host, port)
                    sent_at = time.time()
                    status, body, received_at = await connection.get(host, path)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                fail(f"{type(exc).__name__}: {str(exc)[:60]}")
                connection.close()
                return
            elapsed = time.perf_counter() - t0
            idle.append(connection)
            if not counted:
                return
            if status != 200:
                fail(f"HTTP {status}")
            elif b'"agents": []' in body or b'"agents":[]' in body:
                fail("empty answer")
            else:
                latencies.append(elapsed)
                if received_at is not None:
                    left_at = connection.sent_at
                    if left_at is not None:
                        sends.append(max(0.0, left_at - sent_at))
                    wire.append(max(0.0, received_at - (left_at or sent_at)))

        pending: set[asyncio.Task[None]] = set()
        due = time.monotonic()
        start, cpu0 = due + warmup_s, 0.0
        stop = start + seconds
        while due < stop:
            if not measuring and due >= start:
                measuring, cpu0 = True, time.process_time()
                warm.set()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            turn = (turn + 1) % len(addresses)
            task = asyncio.create_task(one(due, *addresses[turn], idles[turn]))
            pending.add(task)
            task.add_done_callback(pending.discard)
            due += 1.0 / rate
        if pending:
            await asyncio.wait(pending)
        cpu = time.process_time() - cpu0
        for connection in (c for idle in idles for c in idle):
            connection.close()
        return LookupResult(latencies, lags, failed, cpu, wire, sends)

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


def _longest_stall_ms(
    before: dict[str, float], after: dict[str, float], name: str
) -> tuple[float, int]:
    """(upper bound in ms of the highest lag bucket reached between two scrapes, wake-ups
    more than 20 ms late then); (0, 0) when the coordinator exports no such histogram."""
    buckets, total = _histogram_delta(before, after, name)
    if not total:
        return 0.0, 0
    bound = _server_quantile(buckets, total, 1.0)[0]
    over = total - dict(buckets).get(0.02, total)
    return bound * 1000, int(over)


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


#: ``sample()`` at a window's start returns ``cores()`` for its end (another process's CPU).
Sampler = Callable[[], Callable[[], float | None]]


async def _measure_lookups(
    coordinator: CoordinatorProcess,
    rate: float,
    seconds: float,
    cpus: set[int] | None,
    also: Sampler | None = None,
    nice: int | None = None,
) -> tuple[
    LookupResult,
    dict[str, float],
    dict[str, float],
    float,
    float,
]:
    """Runs the lookup process; returns its results, metric scrapes and the window (s).
    ``also``: another process's cores over the same window, put in ``before["also_cores"]``."""
    ctx = mp.get_context("spawn")
    out, warm = ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=_lookups, args=(coordinator.http_url, rate, WARMUP_S, seconds, warm, out)
    )
    proc.start()
    if cpus and proc.pid is not None:
        _pin(proc.pid, cpus, nice=nice)
    await asyncio.to_thread(warm.wait)
    process = psutil.Process(coordinator.pid)
    before = await _metric(
        coordinator.http_url, "edgefleet_coordinator_", coordinator.admin_headers
    )
    since = (process.cpu_times(), time.monotonic())
    also_cores = also() if also is not None else None
    waited = _run_queue_wait_s(coordinator.pid)
    threads = _thread_cpu_s(coordinator.pid)
    result = await asyncio.to_thread(out.get)
    cores = _cores(process, since)
    also_used = also_cores() if also_cores is not None else None
    before["also_cores"] = float("nan") if also_used is None else also_used
    window = time.monotonic() - since[1]
    before["run_queue_wait_s"] = (_run_queue_wait_s(coordinator.pid) - waited) / window
    for name, cpu_s in _thread_cpu_s(coordinator.pid).items():  # who used the core
        before["thread_cores:" + name] = (cpu_s - threads.get(name, 0.0)) / window
    before["load_average_1m"] = os.getloadavg()[0]
    after = await _metric(coordinator.http_url, "edgefleet_coordinator_", coordinator.admin_headers)
    proc.join()
    return result, before, after, window, cores


def _client_nice(args: argparse.Namespace) -> int:
    """The lookup client's niceness when pinned: --lookup-client-nice, else the simulators'."""
    nice = args.lookup_client_nice
    return int(args.simulator_nice if nice is None else nice)


def _take_stalls(stalls: Any) -> tuple[float, int]:
    """The simulators' [longest stall ms, stalls over SIMULATOR_STALL_S] so far, zeroed."""
    with stalls.get_lock():
        taken = (stalls[0], int(stalls[1]))
        stalls[0] = stalls[1] = 0.0
    return taken


def _pin(pid: int, cpus: set[int], nice: int | None = None) -> None:
    """Set the CPU affinity (and niceness) of every thread of a process."""
    for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, tid, nice)


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each of the process's threads, summed by name; the
    main thread (the event loop) is ``main``, Python's other threads ``python``. Also
    ``main waited``: the seconds the main thread was runnable but had no CPU."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                text = fh.read()
        except OSError:  # the thread ended
            continue
        name = "main" if tid == str(pid) else text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/schedstat") as fh:
        found["main waited"] = int(fh.read().split()[1]) / 1e9
    return found


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


class _Postgres:
    """The PostgreSQL server a run uses: a throwaway cluster (``cluster``) or ``--store-url``;
    ``server`` is its postmaster when it runs on this machine (None: not measured)."""

    def __init__(self, url: str, cluster: PostgresCluster | None) -> None:
        self.url, self.cluster = url, cluster
        self.server = _postmaster(url, cluster)

    def processes(self) -> list[Any]:
        if self.server is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [self.server, *self.server.children(recursive=True)]
        return []

    def cpu_s(self) -> tuple[dict[int, float], float]:
        """(CPU seconds of each live server process, those of the postmaster's children
        that ended: it reaps them, the kernel adds their time to its children's)."""
        live: dict[int, float] = {}
        ended = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                live[proc.pid] = times.user + times.system
                if proc is self.server:
                    ended = times.children_user + times.children_system
        return live, ended

    def sample(self) -> Callable[[], float | None]:
        """CPU of the server's processes from now; the returned call gives cores until then:
        live processes' time since (whole for those started since), plus that of children
        that ended since (their time before the window taken off)."""
        (before, ended_before), started = self.cpu_s(), time.monotonic()

        def cores() -> float | None:
            if self.server is None:
                return None
            after, ended_after = self.cpu_s()
            used = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
            used += ended_after - ended_before
            used -= sum(cpu for pid, cpu in before.items() if pid not in after)
            return used / (time.monotonic() - started)

        return cores

    def pin(self, cpus: set[int]) -> None:
        """The server's processes on ``cpus`` (backends it forks later inherit it)."""
        for proc in self.processes():
            with contextlib.suppress(psutil.Error, OSError):
                _pin(proc.pid, cpus)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def _postmaster(url: str, cluster: PostgresCluster | None) -> Any:
    """The postmaster of the server at ``url`` when it runs here: the cluster's
    (postmaster.pid), else the process listening on the URL's port on this machine."""
    if cluster is not None:
        with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
            pid = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
            return psutil.Process(pid)
    port = urlsplit(url).port or 5432
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            listening = conn.status == psutil.CONN_LISTEN and conn.laddr
            if listening and conn.laddr.port == port and conn.pid is not None:
                return psutil.Process(conn.pid)
    return None


async def _mint_keys(coordinator: CoordinatorProcess) -> list[str]:
    """KEYS API keys through the admin API (as an operator would); returns their ids."""
    ids = []
    async with aiohttp.ClientSession(headers=coordinator.admin_headers) as http:
        for i in range(KEYS):
            body: dict[str, Any] = {"name": f"bench-{i}"}
            if i < KEYS_WITH_BUDGETS:
                body |= {"requests_per_minute": 600_000, "tokens_per_minute": 60_000_000}
            async with http.post(coordinator.http_url + "/v1/admin/keys", json=body) as response:
                response.raise_for_status()
                ids.append((await response.json())["key_id"])
    return ids


async def main(args: argparse.Namespace) -> int:
    all_cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if args.pin is not None else len(all_cpus) >= 2
    coordinator_cpus = {all_cpus[0]} if pin else None
    load_cpus = set(all_cpus[1:]) if pin else None
    extra_args: list[str] = []
    if args.secure:
        # Mutual TLS on the Session port (enrollment required), Enroll on its own
        # server-authenticated port; Enroll's per-peer rate limit raised: every simulated
        # agent enrolls from the same loopback address.
        extra_args = ["--tls", "on", "--enroll-port", "0",
                      "--set", "enroll_rate_per_minute=1000000",
                      "--set", "enroll_burst=100000"]  # fmt: skip
    setup_figures: dict[str, Any] = {}
    postgres: _Postgres | None = None
    if args.store == "postgresql":
        if args.store_url:
            postgres = _Postgres(args.store_url, None)
        else:
            cluster = await asyncio.to_thread(PostgresCluster.start)
            postgres = _Postgres(await asyncio.to_thread(cluster.create_database), cluster)
        extra_args += ["--set", f"store_url={postgres.url}"]  # no password in it
        where = "this machine" if postgres.server is not None else "elsewhere: not measured"
        print(f"store: PostgreSQL at {postgres.url} ({where})")
    try:
        return await _run(args, extra_args, setup_figures, postgres, pin, coordinator_cpus,
                          load_cpus)  # fmt: skip
    finally:
        if postgres is not None:
            postgres.stop()


async def _run(
    args: argparse.Namespace,
    extra_args: list[str],
    setup_figures: dict[str, Any],
    postgres: _Postgres | None,
    pin: bool,
    coordinator_cpus: set[int] | None,
    load_cpus: set[int] | None,
) -> int:
    interval_s = args.interval_ms / 1000.0
    # a probe per CPU: pauses of the machine itself (stopped after the windows; a probe
    # whose benchmark died ends itself)
    host = HostPauses(os.sched_getaffinity(0)) if args.host_probe else None
    # this machine's speed at the coordinator's own work, on its CPU before it starts: a
    # yardstick for runs of other days (timeit told a slow host from a fast one poorly)
    reference = await asyncio.to_thread(
        _host_reference, min(coordinator_cpus) if coordinator_cpus else None, args.agents
    )
    print(
        "host reference (benchmarks.host_reference): "
        + (
            f"route {reference['route_us']} us, report applied {reference['record_report_us']} "
            f"us, timeit sum(range(100)) {reference['timeit_sum_range_100_ns']} ns"
            if "error" not in reference
            else f"failed: {reference['error']}"
        )
    )
    async with CoordinatorProcess(
        report_interval_ms=args.interval_ms, extra_args=extra_args
    ) as coordinator:
        if pin and coordinator_cpus and load_cpus:
            _pin(coordinator.pid, coordinator_cpus)
            _pin(os.getpid(), load_cpus)
            if postgres is not None:
                postgres.pin(load_cpus)
            print(f"coordinator on CPU {sorted(coordinator_cpus)}, load on {sorted(load_cpus)}"
                  + (" with PostgreSQL" if postgres is not None else ""))  # fmt: skip
        print(f"coordinator up at {coordinator.grpc_target}; registering {args.agents} agents")
        ctx = mp.get_context("spawn")
        sim_out = ctx.Queue()
        sim_stalls = ctx.Array("d", 2)
        setup_out = _Setup(ctx.Queue(), ctx.Event(), args.simulator_gc, sim_stalls)
        ramp_s = max(10.0, args.agents / 400)
        stop = time.monotonic() + 3600  # the simulators are terminated at the end
        ids = [f"sim-{i:05d}" for i in range(args.agents)]
        shares = [ids[w :: args.workers] for w in range(args.workers)]
        pushed = [ctx.Value("q", 0, lock=False) for _ in shares]
        key_ids: list[str] = []
        if args.secure:
            join_token = await asyncio.to_thread(coordinator.mint_join_token, uses=args.agents)
            key_ids = await _mint_keys(coordinator)
            ca_pem = (Path(coordinator.data_dir) / "ca" / "ca.pem").read_bytes()
            print(f"minted {len(key_ids)} API keys and a join token for {args.agents} agents")
            sims = [
                ctx.Process(
                    target=_secure_simulator,
                    args=(
                        coordinator.enroll_target,
                        coordinator.grpc_target,
                        ca_pem,
                        join_token,
                        tuple(key_ids),
                        share,
                        interval_s,
                        stop,
                        setup_out,
                        counter,
                        sim_out,
                    ),
                )
                for share, counter in zip(shares, pushed, strict=True)
            ]
            ramp_s += 60  # enrollment first
        else:
            sims = [
                ctx.Process(
                    target=_simulator,
                    args=(
                        coordinator.grpc_target,
                        share,
                        interval_s,
                        stop,
                        setup_out,
                        counter,
                        sim_out,
                    ),
                )
                for share, counter in zip(shares, pushed, strict=True)
            ]
        ramp_started = time.monotonic()
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
        ramp_wall_s = time.monotonic() - ramp_started
        print(f"connected {count} in {ramp_wall_s:.1f} s")
        setup_out.ask.set()
        setups = [await asyncio.to_thread(setup_out.out.get, True, 60) for _ in sims]
        setup_s = [t for one in setups for t in one["setup_s"]]
        setup_figures = {
            "all_agents_connected_after_s": round(ramp_wall_s, 1),
            "session_setup_p50_ms": round(_percentile(setup_s, 0.5) * 1000, 1),
            "session_setup_p99_ms": round(_percentile(setup_s, 0.99) * 1000, 1),
            "session_setup_max_ms": round(max(setup_s, default=float("nan")) * 1000, 1),
            "session_attempts_failed_during_ramp": sum(one["failed_attempts"] for one in setups),
            "session_attempts_failed_why": _merged(one["failures"] for one in setups),
        }
        if args.secure:
            enroll_s = max(one["enroll_s"] for one in setups)
            setup_figures |= {
                "agents_enrolled": sum(one["enrolled"] for one in setups),
                "enrollment_s": round(enroll_s, 1),
                "enrollments_per_s": round(args.agents / enroll_s, 1),
                "api_keys": len(key_ids),
                "api_keys_with_budgets": KEYS_WITH_BUDGETS,
                "keys_in_an_agents_section": max(one["keys_in_last_section"] for one in setups),
            }
        print(f"  setup: {setup_figures}")
        print(f"steady window {args.duration:g} s with reports only")
        if host is not None:
            host.start()
        await asyncio.sleep(interval_s * 1.5)  # every agent past its first report

        process = psutil.Process(coordinator.pid)
        key = "edgefleet_coordinator_load_reports_total"
        prefix = "edgefleet_coordinator_"
        reports0 = await _metric(coordinator.http_url, prefix, coordinator.admin_headers)
        pushed0 = sum(v.value for v in pushed)
        _take_stalls(sim_stalls)
        since = (process.cpu_times(), time.monotonic())
        postgres_cores = postgres.sample() if postgres is not None else None
        reports_window = time.time()
        await asyncio.sleep(args.duration)
        reports_window_end = time.time()
        sim_stalls_reports = _take_stalls(sim_stalls)
        cores_reports = _cores(process, since)
        pg_cores_reports = postgres_cores() if postgres_cores is not None else None
        reports1 = await _metric(coordinator.http_url, prefix, coordinator.admin_headers)
        reports_per_s = (reports1.get(key, 0) - reports0.get(key, 0)) / args.duration
        keys_pushed_per_s = (sum(v.value for v in pushed) - pushed0) / args.duration
        print(
            f"  reports/s {reports_per_s:.0f}, coordinator CPU {cores_reports:.2f} cores, "
            f"keys sections pushed/s {keys_pushed_per_s:.0f}"
            + (f", PostgreSQL CPU {pg_cores_reports:.2f} cores" if pg_cores_reports is not None
               else "")
        )  # fmt: skip

        print(f"lookups at {args.lookups_per_s:g}/s for {args.duration:g} s under that load")
        lookups_window = time.time()
        measured = await _measure_lookups(
            coordinator, args.lookups_per_s, args.duration, load_cpus,
            nice=_client_nice(args) if load_cpus else None,
            also=postgres.sample if postgres is not None else None,
        )  # fmt: skip
        lookups_window_end = time.time()
        if host is not None:
            host.stop()
        sim_stalls_lookups = _take_stalls(sim_stalls)  # the lookups' warm-up included
        lookups, h0, h1, window, cores_both = measured
        latencies, lags, failed = lookups.latencies, lookups.lags, lookups.failed
        client_cpu_s, wire, sends = lookups.cpu_s, lookups.wire, lookups.sends
        retried = {k: v for k, v in failed.items() if k.startswith("retried")}
        failed = {k: v for k, v in failed.items() if not k.startswith("retried")}
        failures = sum(failed.values())
        reports_during = (h1.get(key, 0) - h0.get(key, 0)) / window
        connected_end = await connected()
        rss_mb = process.memory_info().rss / 2**20
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.join(5)

    pg_cores_both = h0.pop("also_cores", float("nan"))
    lookups_per_s = len(latencies) / args.duration
    p50, p99 = _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000
    lag_p99 = _percentile(lags, 0.99) * 1000
    wire_p50, wire_p99 = _percentile(wire, 0.5) * 1000, _percentile(wire, 0.99) * 1000
    send_p99 = _percentile(sends, 0.99) * 1000 if sends else float("nan")
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
    lag = "edgefleet_coordinator_event_loop_lag_seconds"
    stall_reports = _longest_stall_ms(reports0, reports1, lag)
    stall_lookups = _longest_stall_ms(h0, h1, lag)
    print(
        f"route lookups: {lookups_per_s:.0f}/s; coordinator p50 {server_p50[1] * 1000:.3f} ms "
        f"p99 {server_p99[1] * 1000:.3f} ms (bucket <= {server_p99[0] * 1000:g} ms), "
        f"{server_over_5ms:.0f} of {total:.0f} over 5 ms; client p50 {p50:.2f} ms "
        f"p99 {p99:.2f} ms (on the wire: p50 {wire_p50:.2f} ms p99 {wire_p99:.2f} ms; the "
        f"kernel sent the request p99 {send_p99:.2f} ms after the client's write began), "
        f"schedule lag p99 {lag_p99:.2f} ms, client CPU "
        f"{client_cpu_s / args.duration:.2f} cores; coordinator CPU {cores_both:.2f} cores; "
        f"reports/s {reports_during:.0f}; full GCs {gc2_count:.0f} ({gc2_ms:.1f} ms in all); "
        f"coordinator waited for a CPU {h0['run_queue_wait_s'] * 1000:.0f} ms/s; "
        f"load average {h0['load_average_1m']:.2f}"
    )
    print(
        f"event loop's longest stall: <= {stall_reports[0]:g} ms with reports only "
        f"({stall_reports[1]} wake-ups over 20 ms late), <= {stall_lookups[0]:g} ms with "
        f"lookups ({stall_lookups[1]} over 20 ms)"
    )
    if host is not None:
        paused = host.between(lookups_window, lookups_window_end, "with_lookups")
        rights = "" if host.realtime else ", NOT real-time: no rights"
        print(
            f"the machine itself (a real-time probe on each CPU{rights}) paused up to "
            f"{paused['host_longest_pause_ms_with_lookups']} ms during the lookups "
            f"({paused['host_pauses_over_10ms_with_lookups']} pauses over 10 ms)"
        )
    print(
        f"simulators' own event loops (garbage collector {args.simulator_gc}): longest stall "
        f"{sim_stalls_reports[0]:.0f} ms with reports only ({sim_stalls_reports[1]} over "
        f"{SIMULATOR_STALL_S * 1000:g} ms), {sim_stalls_lookups[0]:.0f} ms with lookups "
        f"({sim_stalls_lookups[1]} over {SIMULATOR_STALL_S * 1000:g} ms)"
    )
    figures: dict[str, Any] = {
        "mode": "secure" if args.secure else "plain",
        "store": args.store,
        "session_transport": (
            "mutual TLS, one connection per agent with its own client certificate"
            if args.secure
            else f"plaintext gRPC, {AGENTS_PER_CHANNEL} agents per connection"
        ),
        "agents_requested": args.agents,
        "agents_connected": count,
        "agents_connected_at_end": connected_end,
        "report_interval_ms": args.interval_ms,
        "simulator_processes": args.workers,
        "cpus_coordinator": sorted(coordinator_cpus) if coordinator_cpus else "any",
        "cpus_simulators_and_lookup_client": sorted(load_cpus) if load_cpus else "any",
        "simulator_nice": args.simulator_nice if pin else 0,
        "lookup_client_nice": _client_nice(args) if pin else 0,
        "simulator_gc": args.simulator_gc,
        "simulator_loop_longest_stall_ms_reports_only": round(sim_stalls_reports[0], 1),
        "simulator_loop_stalls_over_50ms_reports_only": sim_stalls_reports[1],
        "simulator_loop_longest_stall_ms_with_lookups": round(sim_stalls_lookups[0], 1),
        "simulator_loop_stalls_over_50ms_with_lookups": sim_stalls_lookups[1],
        "reports_per_s_expected": round(expected_reports, 1),
        "reports_per_s_stored": round(reports_per_s, 1),
        "reports_per_s_stored_during_lookups": round(reports_during, 1),
        "reports_ratio_stored_to_expected": round(reports_per_s / expected_reports, 3),
        "reports_ratio_stored_to_expected_during_lookups": round(
            reports_during / expected_reports, 3
        ),
        "coordinator_cores_reports_only": round(cores_reports, 3),
        "coordinator_cores_reports_and_lookups": round(cores_both, 3),
        "coordinator_cores_per_1000_reports_s": round(cores_reports / reports_per_s * 1000, 3)
        if reports_per_s
        else None,
        "coordinator_rss_mb": round(rss_mb, 1),
        **_postgres_figures(postgres, pg_cores_reports, pg_cores_both),
        "keys_sections_pushed_per_s": round(keys_pushed_per_s, 1),
        **setup_figures,
        "lookups_per_s_requested": args.lookups_per_s,
        "lookups_per_s_achieved": round(lookups_per_s, 1),
        "lookup_failures": failures,
        "lookup_failures_why": failed,
        "lookups_retried_on_a_closed_idle_connection": sum(retried.values()),
        "route_server_lookups_observed": int(total),
        "route_server_mean_ms": round(server_mean, 3),
        "route_server_p50_ms": round(server_p50[1] * 1000, 3),
        "route_server_p99_ms": round(server_p99[1] * 1000, 3),
        "route_server_p99_ms_bucket_bound": server_p99[0] * 1000,
        "route_server_over_5ms": int(server_over_5ms),
        "route_client_p50_ms": round(p50, 3),
        "route_client_p99_ms": round(p99, 3),
        "route_client_wire_p50_ms": round(wire_p50, 3),
        "route_client_wire_p99_ms": round(wire_p99, 3),
        "route_client_wire_timestamped": len(wire),
        "route_client_wire_from_kernel_send": len(sends),
        "route_client_send_delay_p99_ms": round(send_p99, 3),
        "route_client_schedule_lag_p99_ms": round(lag_p99, 3),
        "lookup_client_cores": round(client_cpu_s / args.duration, 3),
        "route_client_to_server_p99_ratio": round(p99 / (server_p99[1] * 1000), 2)
        if server_p99[1]
        else None,
        "coordinator_run_queue_wait_s_per_s": round(h0["run_queue_wait_s"], 4),
        "host_reference": reference,
        "host_pause_probe": host is not None,
        **(
            {
                "host_pause_probe_realtime": host.realtime,
                **host.between(reports_window, reports_window_end, "reports_only"),
                **host.between(lookups_window, lookups_window_end, "with_lookups"),
            }
            if host is not None
            else {}
        ),
        "coordinator_thread_cores_with_lookups": {
            k.split(":", 1)[1]: round(v, 3)
            for k, v in sorted(h0.items(), key=lambda kv: -kv[1])
            if k.startswith("thread_cores:") and v >= 0.005
        },
        "machine_load_average_1m": round(h0["load_average_1m"], 2),
        "coordinator_full_gc_count": int(gc2_count),
        "coordinator_full_gc_total_ms": round(gc2_ms, 1),
        "coordinator_full_gc_max_ms_bucket_bound": gc2_max,
        "event_loop_longest_stall_ms_bucket_bound_reports_only": stall_reports[0],
        "event_loop_stalls_over_20ms_reports_only": stall_reports[1],
        "event_loop_longest_stall_ms_bucket_bound_with_lookups": stall_lookups[0],
        "event_loop_stalls_over_20ms_with_lookups": stall_lookups[1],
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
        "reports_ratio_stored_to_expected_during_lookups": target(
            figures["reports_ratio_stored_to_expected_during_lookups"], ">= 0.95",
            figures["reports_ratio_stored_to_expected_during_lookups"] >= 0.95,
        ),
        "session_attempts_failed_during_ramp": target(
            setup_figures["session_attempts_failed_during_ramp"], "== 0",
            setup_figures["session_attempts_failed_during_ramp"] == 0,
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
        "route_client_p99_ms": target(figures["route_client_p99_ms"], "< 10", p99 < 10),
    }  # fmt: skip
    name = "coordinator_scale_secure" if args.secure else "coordinator_scale"
    name = args.results or (name + ("_postgres" if postgres is not None else ""))
    path = write_results(name, figures, targets)
    print(f"wrote {path}")
    return 0


def _host_reference(cpu: int | None, agents: int, timeout_s: float = 300.0) -> dict[str, Any]:
    """``benchmarks.host_reference`` in a subprocess pinned to ``cpu``; {"error": ...} when
    it fails (the run goes on without it)."""
    command = [sys.executable, "-m", "benchmarks.host_reference", "--agents", str(agents)]
    if cpu is not None:
        command += ["--cpu", str(cpu)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout_s:g} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _postgres_figures(
    postgres: _Postgres | None, reports_only: float | None, with_lookups: float
) -> dict[str, Any]:
    if postgres is None:
        return {}
    measured = postgres.server is not None
    return {
        "postgres_server": (
            "throwaway cluster on this machine (tests/postgres_cluster.py: fsync and "
            "synchronous_commit off)"
            if postgres.cluster is not None
            else "--store-url" + (" (on this machine)" if measured else " (not on this machine)")
        ),
        "postgres_cores_reports_only": None if reports_only is None else round(reports_only, 3),
        "postgres_cores_reports_and_lookups": (
            round(with_lookups, 3) if measured and with_lookups == with_lookups else None
        ),
        "postgres_cores_measure": (
            "CPU time of the postmaster and its child processes (backends, writers) over the "
            "window, those that ended within it included"
        ),
    }


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
        "--secure",
        action="store_true",
        help="mutual TLS on the Session port, every agent enrolled (Enroll RPC, own key and "
        f"CSR), {KEYS} API keys pushed to every agent; writes coordinator_scale_secure.json",
    )
    parser.add_argument(
        "--simulator-nice", type=int, default=10, help="niceness of the simulators when pinned"
    )
    parser.add_argument(
        "--lookup-client-nice",
        type=int,
        default=None,
        help="niceness of the lookup client when pinned (default: the simulators'). Above "
        "theirs, its wake-ups 500 times a second kept the simulators from running for up to "
        "0.26 s, and their agents then reported in one burst; its wire figures do not count "
        "its own wait for the CPU, its client figures do",
    )
    parser.add_argument(
        "--simulator-gc",
        choices=SIMULATOR_GC_MODES,
        default="frozen",
        help="the simulators' garbage collector once their agents are set up: frozen "
        "(gc.freeze, fewer young collections) or python (the defaults: each collection stops "
        "a whole simulator's agents at once, then they report in one burst)",
    )
    parser.add_argument(
        "--host-probe",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run a real-time probe on each CPU (benchmarks.host_pauses) to tell pauses of the "
        "machine itself from the coordinator's. Off by default: its thousand wake-ups a second "
        "on the coordinator's CPU cost the coordinator about 0.07 cores and tripled its client "
        "route p99 (29.9-35.6 ms with it, 3.8-15.6 ms without, alternating, 2026-12-04)",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "postgresql"),
        default=None,
        help="the coordinator's store (default sqlite; postgresql: a throwaway cluster here, "
        "or --store-url)",
    )
    parser.add_argument(
        "--store-url",
        default="",
        help="postgresql://USER@HOST:PORT/DB to run on (implies --store postgresql; password "
        "from EDGEFLEET_COORDINATOR_STORE_PASSWORD)",
    )
    parser.add_argument(
        "--results",
        default="",
        metavar="NAME",
        help="write benchmarks/results/NAME.json (default: coordinator_scale[_secure][_postgres])",
    )
    args = parser.parse_args(argv)
    if args.store is None:
        args.store = "postgresql" if args.store_url else "sqlite"
    elif args.store_url and args.store != "postgresql":
        parser.error("--store-url names PostgreSQL: use it with --store postgresql")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
