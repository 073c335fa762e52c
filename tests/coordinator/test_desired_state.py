"""DesiredState end to end: the coordinator sets a section, the agent's session applies it
and acknowledges its generation, the coordinator shows the acknowledgement."""

from __future__ import annotations

import pytest

from agent.control import CoordinatorSession
from coordinator.api.app_keys import GRPC_SERVER_KEY, REGISTRY_KEY
from devtools.process import wait_until
from edgefleet.contract import (
    ConfigSection,
    DesiredState,
    Hello,
    LoadedModel,
    LoadReport,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
    SectionGenerations,
)
from tests.coordinator.coordinator_testing import MakeCoordinator
from tests.coordinator.store_backends import on_both_stores

pytestmark = pytest.mark.timeout(30)
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores

HELLO = Hello(agent_id="edge-1", site="lab", models=(LoadedModel("m", "v1"),))


async def test_sections_are_applied_acknowledged_and_kept_across_reconnects(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator()
    seen: list[DesiredState] = []
    failing = False

    def apply(state: DesiredState) -> None:
        if failing:
            raise RuntimeError("cannot apply")
        seen.append(state)

    session = CoordinatorSession(
        c.grpc_target, lambda: HELLO, LoadReport, on_desired_state=apply, initial_backoff_s=0.05
    )
    await session.start()
    servicer, registry = c.app[GRPC_SERVER_KEY].servicer, c.app[REGISTRY_KEY]
    try:
        await wait_until(lambda: session.connected, message="session")
        peer = OverflowTarget("peer", OverflowKind.PEER, "http://10.0.0.9:8000")
        servicer.set_section("edge-1", OverflowTargetsSection(0, (peer,)))
        first = servicer.set_section("edge-1", ConfigSection(0, {"engine.max_batch_size": "8"}))
        # one counter for every section, above the clock-based generations of old
        generations = first.generations()
        assert generations.config > generations.overflow_targets > 1_700_000_000_000

        def acked(expected: SectionGenerations) -> bool:
            report = registry.get("edge-1").last_report
            return report is not None and report.applied == expected

        await wait_until(lambda: acked(generations))
        held = session.desired_state
        assert held.overflow_targets == OverflowTargetsSection(
            generations.overflow_targets, (peer,)
        )
        assert held.config is not None and held.config.values == {"engine.max_batch_size": "8"}
        assert seen[-1] == held and held.version == 2

        # A section the agent fails to apply is kept as received but not acknowledged.
        failing = True
        second = servicer.set_section("edge-1", ConfigSection(0, {"engine.max_batch_size": "2"}))
        newer = second.generations().config
        await wait_until(lambda: session.desired_state.generations().config == newer)
        await wait_until(lambda: registry.get("edge-1").last_report.applied == generations)
        assert session.applied == generations
        failing = False

        # After a reconnect the full state arrives again; nothing newer, nothing re-applied.
        applied_before = len(seen)
        servicer.end_all_sessions()
        await wait_until(lambda: session.sessions_opened == 2, message="reconnect")
        view = await c.get_json("/v1/agents/edge-1")
        assert view["desired_state"]["generations"]["config"] == newer
        assert len(seen) == applied_before
    finally:
        await session.stop()
