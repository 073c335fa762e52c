"""A burst of sessions while the coordinator's event loop is busy: gRPC holds the calls
the server has not picked up yet, and with the coordinator's server options it holds all
of them (by default it refuses new calls at random past 1,000 waiting and all past 3,000:
the ramp of benchmarks/coordinator_scale lost hundreds of sessions that way, CANCELLED or
INTERNAL at the agent)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from typing import Any

import grpc
import pytest

from coordinator.config import CoordinatorConfig
from coordinator.rpc.service import server_options
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SESSIONS = 2000
BUSY_S = 0.002  # the loop held per session: a coordinator opening it under load


class _BusyServicer(pb_grpc.CoordinatorServicer):
    async def Session(self, request_iterator: Any, context: Any) -> Any:
        await anext(request_iterator)  # Hello
        until = time.perf_counter() + BUSY_S
        while time.perf_counter() < until:  # the event loop held, as by a busy coordinator
            pass
        yield pb.CoordinatorMessage(welcome=pb.Welcome(session_id="s", report_interval_ms=2000))
        async for _ in request_iterator:
            pass


def _serve(options: list[tuple[str, int]], port: Any, stop: Any) -> None:
    async def main() -> None:
        server = grpc.aio.server(options=options)
        pb_grpc.add_CoordinatorServicer_to_server(_BusyServicer(), server)
        port.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await asyncio.to_thread(stop.wait)
        await server.stop(0)

    asyncio.run(main())


async def _burst(target: str) -> int:
    """Open SESSIONS sessions at once (250 per connection, as the benchmark's agents);
    the number that failed before their Welcome."""
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(SESSIONS // 250)
    ]
    hello = pb.AgentMessage(hello=pb.Hello(agent_id="a", site="s"))

    async def one(i: int) -> bool:
        call = pb_grpc.CoordinatorStub(channels[i % len(channels)]).Session()
        try:
            await call.write(hello)
            await call.read()
            return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            call.cancel()

    try:
        results = await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    finally:
        for channel in channels:
            await channel.close()
    return results.count(False)


def test_a_burst_of_sessions_waits_for_a_busy_server() -> None:
    ctx = mp.get_context("spawn")
    port, stop = ctx.Value("i", 0), ctx.Event()
    options = server_options(CoordinatorConfig(data_dir=os.devnull))
    server = ctx.Process(target=_serve, args=(options, port, stop))
    server.start()
    try:
        deadline = time.monotonic() + 30
        while not port.value and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asyncio.run(_burst(f"127.0.0.1:{port.value}")) == 0
    finally:
        stop.set()
        server.join(10)
        if server.is_alive():
            server.kill()
