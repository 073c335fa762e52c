"""An operator's drain is confirmed only once it is in the store.

The registry writes its durable changes behind the change in memory (a queue run by one
task, coordinator/store/write_behind.py). The drain and resume answers wait for that
queue, so a coordinator killed right after answering "draining: true" still has the
agent draining when it comes back.
"""

from __future__ import annotations

import asyncio

import aiohttp

from coordinator.api.app_keys import STORE_KEY
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, MakeCoordinator, hello
from tests.coordinator.store_backends import on_both_stores

# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores


async def test_the_drain_answer_waits_for_the_store_write(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator()
    call = c.stub.Session()
    await call.write(hello("edge-1"))
    await call.read()  # the Welcome: the agent is known and connected
    store = c.app[STORE_KEY]
    real_set_draining = store.set_draining
    gate = asyncio.Event()
    written: list[bool] = []

    async def held_set_draining(agent_id: str, draining: bool) -> bool:
        await gate.wait()
        result = await real_set_draining(agent_id, draining)
        written.append(draining)
        return result

    store.set_draining = held_set_draining  # type: ignore[method-assign]
    try:
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as http:
            answer = asyncio.create_task(http.post(f"{c.http_url}/v1/admin/agents/edge-1/drain"))
            await asyncio.sleep(0.5)
            assert not answer.done(), "drain answered before its store write ran"
            gate.set()
            response = await asyncio.wait_for(answer, 5)
            body = await response.json()
            assert response.status == 200 and body["draining"] is True
            assert written == [True]
            stored = await store.get_agent("edge-1")
            assert stored is not None and stored.draining is True
    finally:
        gate.set()
        call.cancel()
