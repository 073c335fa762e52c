"""Helpers for coordinator tests: in-process coordinators and Hello messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.api.app_keys import BLOB_BASE_URL_KEY, GRPC_SERVER_KEY, TOKENS_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from edgefleet.contract import CONTRACT_MINOR
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

# The bootstrap admin token every test coordinator gets (the fleet view needs a viewer).
TEST_ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123"
ADMIN_HEADERS = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


@dataclass
class Coordinator:
    app: web.Application
    http_url: str
    grpc_target: str
    stub: Any

    async def new_token(self, **kwargs: Any) -> str:
        return str((await self.app[TOKENS_KEY].create(**kwargs)).token)

    async def get_json(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
            http.get(self.http_url + path) as response,
        ):
            return await response.json()


MakeCoordinator = Callable[..., Awaitable[Coordinator]]


async def coordinator_factory(
    tmp_path: Path, new_database: Callable[[], str] | None = None
) -> AsyncIterator[MakeCoordinator]:
    """``make(**settings)`` builds and starts a coordinator. With ``new_database`` (a fresh
    PostgreSQL database's URL per call) each data_dir gets a database of its own as its
    store_url (the same one again when a test restarts a coordinator on that data_dir)."""
    servers: list[TestServer] = []
    channels: list[Any] = []
    databases: dict[str, str] = {}

    async def make(**settings: Any) -> Coordinator:
        defaults: dict[str, Any] = {
            "grpc_port": 0,
            "http_port": 0,
            "enroll_port": 0,
            "report_interval_ms": 200,
            "hello_timeout_s": 2.0,
            "data_dir": str(tmp_path / f"coordinator-{len(servers)}"),
            "admin_token": TEST_ADMIN_TOKEN,
        }
        if new_database is not None and "store_url" not in settings:
            data_dir = str((defaults | settings)["data_dir"])
            defaults["store_url"] = databases.setdefault(data_dir, new_database())
        app = create_app(CoordinatorConfig(**(defaults | settings)))
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        app[BLOB_BASE_URL_KEY].listening("http", "127.0.0.1", int(server.port or 0))
        target = app[GRPC_SERVER_KEY].enroll_address
        channel = grpc.aio.insecure_channel(target)
        channels.append(channel)
        return Coordinator(
            app=app,
            http_url=str(server.make_url("")).rstrip("/"),
            grpc_target=target,
            stub=pb_grpc.CoordinatorStub(channel),
        )

    yield make
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.close()


def hello(agent_id: str, **fields: Any) -> pb.AgentMessage:
    defaults: dict[str, Any] = {
        "site": "lab",
        "http_url": "http://127.0.0.1:8001",
        "models": [pb.LoadedModel(name="m", version="v1", task="chat")],
        "contract_minor": CONTRACT_MINOR,
    }
    return pb.AgentMessage(hello=pb.Hello(agent_id=agent_id, **(defaults | fields)))


T = TypeVar("T")


async def sampled_meanwhile(work: Awaitable[T], sample: Callable[[], int]) -> tuple[T, list[int]]:
    """Await ``work`` while another task records ``sample()`` at each turn it gets of the
    event loop: the samples show whether ``work`` let the loop serve in between (values
    between its start and its end), or only before and after it."""
    seen: list[int] = []

    async def other() -> None:
        while True:
            seen.append(sample())
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        task.cancel()
    return result, seen
