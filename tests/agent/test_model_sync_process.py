"""A real ``python -m agent`` process, started with an empty model store, syncs the models
its coordinator session pushes.

The coordinator's side of model sync (catalog, ModelsSection push, signing key in
Welcome) is built apart and not merged yet, so a gRPC servicer here speaks the exact
``edgefleet.v1.Coordinator/Session`` wire format: Welcome with the model-signing key, a
DesiredState with a ModelsSection, and it keeps every LoadReport. Blobs come from a real
HTTP blob origin. Checked: the key from Welcome is pinned (trust on first use), the
version is fetched, verified, loaded and served as ``name@version``, the section is
acknowledged only once loaded, LoadReports carry the inventory and per-version stats with
a TTFT histogram, and a restart without any coordinator serves from the store.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from devtools.fleet import AgentProcess
from devtools.process import wait_until
from edgefleet import contract_pb
from edgefleet.contract import (
    ApiKey,
    DesiredState,
    KeysSection,
    LoadReport,
    ModelInventoryState,
    Welcome,
)
from edgefleet.model_signing import ManifestSigner
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.agent.conftest import TINY
from tests.agent.model_sets import BlobOrigin, SignedVersion, signed_version

pytestmark = pytest.mark.timeout(120)
VERSION = "fp32-0000000000c1"
# API keys are on (the agent has a coordinator): the session pushes this one in its keys
# section, as a real coordinator does, and the requests present it.
KEY = "ef-test0000sync-secret"
KEYS = KeysSection(1, (ApiKey("test0000sync", hashlib.sha256(KEY.encode()).digest()),))
HEADERS = {"Authorization": f"Bearer {KEY}"}


class SessionServicer(pb_grpc.CoordinatorServicer):
    def __init__(self, key: bytes, desired: DesiredState) -> None:
        self.key = key
        self.desired = desired
        self.reports: list[LoadReport] = []
        self.http_url = ""

    async def Session(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        first = await anext(aiter(request_iterator))
        self.http_url = first.hello.http_url
        welcome = Welcome(session_id="s-1", report_interval_ms=200, model_signing_key=self.key)
        yield pb.CoordinatorMessage(welcome=contract_pb.welcome_to_pb(welcome))
        yield pb.CoordinatorMessage(desired_state=contract_pb.desired_state_to_pb(self.desired))
        async for message in request_iterator:
            if message.WhichOneof("body") == "load_report":
                self.reports.append(contract_pb.load_report_from_pb(message.load_report))


@pytest.mark.slow
async def test_agent_pins_the_welcome_key_syncs_acks_reports_and_cold_starts(
    tiny_artifacts: Path, tmp_path: Path
) -> None:
    signer = ManifestSigner.load_or_create(tmp_path / "coordinator-signing.pem")
    version: SignedVersion = signed_version(tiny_artifacts / TINY, signer, version=VERSION)
    origin = BlobOrigin()
    origin.add(version)
    await origin.start()
    section = version.section(7, origin.url)
    servicer = SessionServicer(
        signer.public_key, DesiredState(version=1, models=section, keys=KEYS)
    )
    server = grpc.aio.server()
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    state = tmp_path / "state"
    common = ["--threads", "1", "--set", "models.self_check=false", "--set", "models.source=store"]
    try:
        agent = AgentProcess(
            coordinator=f"127.0.0.1:{port}", agent_id="edge-sync-1", site="lab",
            state_dir=state, extra_args=common,
        )  # fmt: skip
        async with agent:

            def acked() -> bool:
                return any(r.applied.models == 7 for r in servicer.reports)

            await wait_until(acked, timeout_s=60, message="the models section acknowledged")
            assert (state / "model-signing-key.pub").is_file(), "Welcome's key was not pinned"
            before = [r for r in servicer.reports if r.applied.models != 7]
            assert all(
                i.state is not ModelInventoryState.LOADED for r in before for i in r.inventory
            ), "acknowledged only once loaded"
            loaded = next(r for r in servicer.reports if r.applied.models == 7)
            [inv] = [i for i in loaded.inventory if i.name == TINY]
            assert (inv.version, inv.state) == (VERSION, ModelInventoryState.LOADED)
            assert inv.bytes_from_coordinator == version.total_bytes
            async with aiohttp.ClientSession(headers=HEADERS) as http:
                payload = {"model": f"{TINY}@{VERSION}", "max_tokens": 3,
                           "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                async with http.post(agent.url + "/v1/chat/completions", json=payload) as r:
                    assert r.status == 200
                    assert (await r.json())["model"] == f"{TINY}@{VERSION}"
            seen = len(servicer.reports)

            def counted() -> bool:
                return any(
                    s.name == TINY and s.version == VERSION and s.requests == 1
                    for r in servicer.reports[seen - 1 :]
                    for s in r.model_stats
                )

            await wait_until(counted, timeout_s=10, message="model_stats in a LoadReport")
            stats = next(
                s for r in servicer.reports[seen - 1 :] for s in r.model_stats if s.requests
            )
            assert stats.failed == 0 and stats.completion_tokens >= 1
            assert sum(stats.ttft_seconds.counts) == 1
            assert len(stats.ttft_seconds.counts) == len(stats.ttft_seconds.upper_bounds) + 1
    finally:
        await server.stop(None)
        await origin.close()

    # no coordinator, no origin: the installed version serves from the store (and the last
    # keys section it received still guards it)
    again = AgentProcess(
        coordinator=f"127.0.0.1:{port}", agent_id="edge-sync-1", site="lab",
        state_dir=state, extra_args=common,
    )  # fmt: skip
    async with again, aiohttp.ClientSession(headers=HEADERS) as http:
        payload = {"model": TINY, "max_tokens": 3,
                   "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        async with http.post(again.url + "/v1/chat/completions", json=payload) as r:
            assert r.status == 200
            assert (await r.json())["model"] == f"{TINY}@{VERSION}"
        no_key = {"Authorization": ""}
        url = again.url + "/v1/chat/completions"
        async with http.post(url, json=payload, headers=no_key) as r:
            assert r.status == 401
