"""Desired-state generations keep rising when an agent's session moves between coordinators.

Two in-process coordinators on one PostgreSQL database; each holds blocks of generations
reserved from the database's one counter, A's reserved before B's. An enrolled agent's
session opens on B, then moves to A, back to B and to A again; the agent keeps, per
section, the newest generation it received and ignores an older one
(``DesiredState.merged``, what the real agent does). Every section each new session sends
must be newer than what the agent holds: without ``fresh()`` at session open, A's sections
(from its older block) would be ignored after the move from B. A reconnect to the
coordinator of the previous session sends the same generations again, none newer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from coordinator.api.app_keys import API_KEYS_KEY, KEY_DISTRIBUTOR_KEY, TOKENS_KEY
from edgefleet import contract_pb
from edgefleet.contract import DesiredState
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import Coordinator, MakeCoordinator, hello

pytestmark = pytest.mark.timeout(90)


async def _session(coordinator: Coordinator, credential: str) -> list[DesiredState]:
    """Open a session, read what it sends for a moment, close it: the desired states."""
    call = coordinator.stub.Session()
    await call.write(hello("edge-1", token=credential))
    states: list[DesiredState] = []
    deadline = asyncio.get_running_loop().time() + 10
    try:
        while True:
            # until the keys section came, then whatever else follows within 0.5 s
            keys = any(s.keys is not None for s in states)
            wait = 0.5 if keys else deadline - asyncio.get_running_loop().time()
            message = await asyncio.wait_for(call.read(), wait)
            if message is grpc.aio.EOF:
                break
            if message.WhichOneof("body") == "desired_state":
                states.append(contract_pb.desired_state_from_pb(message.desired_state))
    except TimeoutError:
        pass
    call.cancel()
    return states


async def test_generations_keep_rising_when_the_session_moves(
    make_coordinator: MakeCoordinator, postgres_url: str, tmp_path: Path
) -> None:
    a = await make_coordinator(store_url=postgres_url, data_dir=str(tmp_path / "a"),
                               coordinator_id="coord-a", report_interval_ms=500)  # fmt: skip
    await a.app[API_KEYS_KEY].mint(name="app")  # a keys section for every agent
    b = await make_coordinator(store_url=postgres_url, data_dir=str(tmp_path / "b"),
                               coordinator_id="coord-b", report_interval_ms=500)  # fmt: skip
    await a.app[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    token = (await a.app[TOKENS_KEY].create()).token
    enrolled = await a.stub.Enroll(pb.EnrollRequest(join_token=token, requested_name="edge-1"))
    held = DesiredState()
    for number, where in enumerate((b, a, b, a)):
        states = await _session(where, enrolled.credentials)
        assert states, f"session {number}: no desired state"
        for state in states:
            for section in state.sections():
                before = held.generations()
                name = type(section).__name__
                assert held.merged(DesiredState().with_section(section))[1], (
                    f"session {number} on {'AB'[where is b]}: {name} generation "
                    f"{section.generation} ignored (the agent holds {before})"
                )
            held, _ = held.merged(state)
        assert held.keys is not None
    # A reconnect to A, which held the previous session: the same sections, nothing newer
    # (the agent would re-apply every section at every reconnect).
    again = await _session(a, enrolled.credentials)
    assert again and all(s.generations() == held.generations() for s in again), (
        f"reconnect to A sent {[s.generations() for s in again]}, the agent holds "
        f"{held.generations()}"
    )
