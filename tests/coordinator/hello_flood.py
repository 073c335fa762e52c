"""The Hello flood: many unauthenticated sessions, each under a new agent id with a big
Hello. Shared by the test that replays it and by before/after measurements."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc


def big_hello(agent_id: str, *, models: int, chars: int) -> pb.AgentMessage:
    pad = "x" * chars
    return pb.AgentMessage(
        hello=pb.Hello(
            agent_id=agent_id,
            site=f"junk-{agent_id}",
            http_url=f"http://127.0.0.1:1/{pad}",
            agent_version=pad,
            models=[
                pb.LoadedModel(name=f"m{i}-{pad}", version=pad, task=pad, variant=pad)
                for i in range(models)
            ],
            contract_minor=CONTRACT_MINOR,
        )
    )


@dataclass
class FloodResult:
    welcomed: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # one per status


async def _one(stub: pb_grpc.CoordinatorStub, message: pb.AgentMessage, out: FloodResult) -> None:
    call = stub.Session()
    try:
        await call.write(message)
        reply = await asyncio.wait_for(call.read(), 20)
        if reply is not grpc.aio.EOF and reply.WhichOneof("body") == "welcome":
            out.welcomed += 1
    except grpc.aio.AioRpcError as exc:
        name = exc.code().name
        out.refused[name] = out.refused.get(name, 0) + 1
        out.details.setdefault(name, exc.details() or "")
    finally:
        call.cancel()


async def hello_flood(
    target: str, sessions: int, *, models: int, chars: int, channels: int = 10
) -> FloodResult:
    """Open ``sessions`` sessions with new ids; each ends after its Welcome (or refusal)."""
    out = FloodResult()
    opened = [grpc.aio.insecure_channel(target) for _ in range(channels)]
    try:
        stubs = [pb_grpc.CoordinatorStub(c) for c in opened]
        await asyncio.gather(
            *(
                _one(stubs[i % channels], big_hello(f"junk-{i}", models=models, chars=chars), out)
                for i in range(sessions)
            )
        )
    finally:
        for channel in opened:
            await channel.close()
    return out


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
