"""End to end: a bad version of the real SmolLM2 rolled back by itself, on real processes:
the int8 variant (perplexity about 1.8x fp32) fails the on-box self-check on the canary and
is rolled back automatically, with no failed client request. The fleet runs as beyond
loopback (tests/e2e/test_rollouts_e2e.py says how; its helpers are used here). A file of
its own: `make test` runs it on one worker while test_rollouts_e2e.py's tiny-model tests
run on the other, and neither fleet runs idle through the other's tests."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from devtools.process import wait_until
from tests.e2e.test_rollouts_e2e import (
    LLM,
    Fleet,
    cli,
    converged,
    manifest_version,
    publish,
    wait_for_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def llm_fleet(real_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> AsyncIterator[Fleet]:  # fmt: skip
    fleet = Fleet(tmp_path_factory.mktemp("llm-rollouts"))
    await fleet.coordinator.start()
    variants = real_artifacts / "_variants"
    try:
        # Each variant's manifest names its own version (int4-..., int8-...); the tests
        # roll out int8 only (the fp32 variant, 627 MB, is not published: nothing used it)
        for name, directory in (("int4", real_artifacts / LLM),
                                ("int8", variants / f"{LLM}-int8")):  # fmt: skip
            fleet.v[name] = manifest_version(directory)
            await publish(fleet.coordinator, directory, LLM, fleet.v[name])
        await cli(fleet.coordinator, "models", "deploy", f"{LLM}@{fleet.v['int4']}")
        # Each agent on a core of its own with one ONNX Runtime thread, as two edge boxes
        # would be (sharing cores, the canary's slowness would slow its control group too),
        # and at capacity: two sequences decode at a time while clients keep three in
        # flight per agent, so a request waits for a running one and a version that
        # decodes slower shows in TTFT by about its decode slowdown.
        await fleet.start_agents(
            2, sites=("lab",), pin=True,
            extra=("--set", "engine.max_running=2", "--set", "engine.intra_op_threads=1"),
        )  # fmt: skip
        await converged(fleet, LLM, fleet.v["int4"])
        yield fleet
    finally:
        await fleet.close()


async def _rolled_back(fleet: Fleet, version: str, extra: list[str],
                       until: Callable[[Any], Awaitable[bool]] | None = None) -> Any:  # fmt: skip
    async with fleet.traffic(LLM, max_tokens=24).running(per_agent=3) as traffic:
        started = await cli(fleet.coordinator, "rollouts", "start", f"{LLM}@{fleet.v[version]}",
                            "--canary", "1", *extra)  # fmt: skip
        canary_url = next(a.url for a in fleet.agents if a.agent_id == started["plan"][0][0])
        began = time.monotonic()
        done = await wait_for_state(fleet.coordinator, started["rollout_id"], "rolled_back",
                                    timeout_s=300)  # fmt: skip
        # Clients keep being served after the rollback: by the bad version until the old
        # one is loaded again beside it (its self-check passed on that box before: it is
        # not rerun), then by the old version.
        back = time.monotonic()

        async def canary_back() -> bool:
            return traffic.last_version(canary_url) == fleet.v["int4"]

        await wait_until(canary_back, timeout_s=60, message="the canary serves int4 again")
        swapped_back_s = time.monotonic() - back
        await asyncio.sleep(2)
    print(
        f"{version}: rolled back; the canary served int4 again {swapped_back_s:.1f} s later; "
        f"last gate {done.get('last_gate')}; streamed chunks per reply, median "
        f"{statistics.median(traffic.chunks) if traffic.chunks else None}"
    )
    if traffic.failures:  # the agents' last words, whole (an assertion message is cut)
        for agent in fleet.agents:
            print(f"--- {agent.agent_id}, last 40 log lines:\n" + "".join(list(agent.log)[-40:]))
    assert traffic.failures == [], (len(traffic.failures), traffic.failures[:5])
    assert traffic.last_version(canary_url) == fleet.v["int4"]
    assert time.monotonic() - began < 300
    # Never beyond the canary.
    assert [h["event"] for h in done["history"]].count("step_moved") == 1, (
        done["history"],
        done.get("last_gate"),
    )
    await converged(fleet, LLM, fleet.v["int4"])
    return done


async def test_the_int8_version_fails_its_self_check_and_is_rolled_back(llm_fleet: Fleet) -> None:
    done = await _rolled_back(llm_fleet, "int8", ["--soak", "5s", "--min-requests", "5"])
    assert "self-check failed" in done["detail"] or "failed on the agent" in done["detail"]
    assert "perplexity" in done["detail"]
