"""End to end: staged rollouts on real processes. A coordinator publishes versions to its
catalog; agents start with empty model stores and sync them; the rollout engine moves a
canary, then waves, judges each step on what the agents report (inventory with the on-box
self-check, per-version stats with TTFT histograms) and rolls back a bad version by itself
while clients keep being served.

- canary then waves, each agent ends on the new version (replies name ``name@version``);
- a coordinator restarted mid-rollout resumes it from its stored step and soak start;
- the tiny model's ``deep`` variant (the same interface, a bigger network: several times
  slower to first token) passes the self-check but fails the TTFT gate against the agents
  not moved and is rolled back automatically, with requests in flight and none failed
  (not SmolLM2's fp32 variant, as the issue suggested: on this CPU it is only 1.0-1.5x
  int4 in TTFT, too close to a 1.15x limit to assert a rollback without flaking);
- the int8 SmolLM2 variant (perplexity about 1.8x fp32) fails the self-check on the canary
  and is rolled back automatically, with no failed client request
  (tests/e2e/test_rollouts_llm_e2e.py, which uses this file's fleet and helpers).

The fleet runs as beyond loopback: the coordinator with TLS (mutual-TLS sessions, HTTPS
admin API and model files, enrollment required), agents enrolled with join tokens serving
HTTPS on their enrollment certificates, API keys required (the clients send a minted key
and trust the fleet CA; the operator CLI gets ``--ca-file``).

Needs the three parts of issue 10 merged (catalog: ``models publish|deploy`` and the
blob server; sync: agents with a model store; rollouts: this engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from coordinator.rollouts.gates import MergedHistogram
from devtools.fleet import ADMIN_TOKEN_ENV, AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.process import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny-llama"
LLM = "smollm2-135m-instruct"
CLIENT_TOKEN_ENV = "EDGEFLEET_ADMIN_TOKEN"  # what the operator CLI reads
# The tiny model's two versions are the same files: these tests are about the flow, and a
# freshly swapped agent's first requests on a shared 2-core machine are several times
# slower than the fleet's warm history, so the TTFT gate is loose here (the deep-variant
# test below is the TTFT gate's test).
TINY_TTFT = "20"
# The deep variant is judged by a real gate: at most 2x the old version's TTFT p99.
DEEP_TTFT = "2"


async def cli(coordinator: CoordinatorProcess, *args: str) -> Any:
    """``python -m coordinator ARGS --url ...`` as an operator would run it (``--json``
    for the rollouts commands, whose answer the tests read)."""
    extra = ["--json"] if args[0] == "rollouts" else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", *args, "--url", coordinator.http_url,
        "--ca-file", str(coordinator.ca_file), *extra,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, CLIENT_TOKEN_ENV: coordinator.admin_token},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, f"coordinator {' '.join(args)}: {err.decode()}"
    return json.loads(out) if extra else out.decode()


def manifest_version(directory: Path) -> str:
    return str(json.loads((directory / "manifest.json").read_text())["version"])


def other_version(version: str) -> str:
    """Another catalog version name for the same files: same variant, other 12 hex digits
    (the agent's manifest parser wants ``<variant>-<12 hex>``)."""
    variant, _, digest = version.rpartition("-")
    return f"{variant}-{int(digest, 16) ^ 1:012x}"


async def publish(
    coordinator: CoordinatorProcess, directory: Path, name: str, version: str
) -> None:
    await cli(coordinator, "models", "publish", str(directory), "--name", name,
              "--version", version)  # fmt: skip


@dataclass
class Traffic:
    """Clients sending completions to every agent until stopped; every reply counted."""

    urls: list[str]
    model: str
    api_key: str
    ssl_context: ssl.SSLContext
    # Long enough replies keep the agents decoding, so a new request waits for a decode
    # step: a version that decodes slower shows it in TTFT too.
    max_tokens: int = 4
    # Counting numbers per prompt (6: about 30 tokens). A bigger network's longer prefill
    # shows in TTFT; the tiny model's TTFT is mostly the request's overhead either way.
    prompt_numbers: int = 6
    # Each client's pause after a reply. Unpaced, 8 clients sent about 110 requests a second
    # to the tiny model, and this file used 270 CPU-s of `make test`'s two cores; the gates
    # need far fewer (at most 50 in a step's soak) and a slower version still shows in TTFT.
    pause_s: float = 0.2
    sent: int = 0
    served: dict[str, list[str]] = field(default_factory=dict)  # agent url -> reply models
    failures: list[str] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # streamed chunks per reply
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def _loop(self, http: aiohttp.ClientSession, url: str) -> None:
        starting = True
        while True:
            if not starting:
                await asyncio.sleep(self.pause_s)
            starting = False
            # Every prompt differs (the agents' response cache answers a repeated greedy
            # request at once, which measures the cache, not the version) and is one the
            # model keeps continuing (it counts on), so a reply runs to max_tokens.
            self.sent += 1
            start = self.sent * 7
            prompt = ", ".join(str(n) for n in range(start, start + self.prompt_numbers)) + ","
            body = {"model": self.model, "prompt": prompt,
                    "max_tokens": self.max_tokens, "temperature": 0, "stream": True}  # fmt: skip
            try:
                async with http.post(
                    url + "/v1/completions", json=body, ssl=self.ssl_context
                ) as response:
                    text = await response.text()
                    if response.status != 200 or "[DONE]" not in text or '"error"' in text:
                        self.failures.append(f"{url}: {response.status} {text[:200]}")
                        continue
                    first = json.loads(text.split("data: ", 2)[1].split("\n", 1)[0])
                    self.served.setdefault(url, []).append(first["model"])
                    self.chunks.append(text.count("data: ") - 1)
            except aiohttp.ClientError as exc:
                self.failures.append(f"{url}: {exc!r}")

    @contextlib.asynccontextmanager
    async def running(self, per_agent: int = 2) -> AsyncIterator[Traffic]:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120),
            headers={"Authorization": f"Bearer {self.api_key}"},
        ) as http:
            self._tasks = [asyncio.create_task(self._loop(http, url))
                           for url in self.urls for _ in range(per_agent)]  # fmt: skip
            try:
                yield self
            finally:
                for task in self._tasks:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def last_version(self, url: str) -> str:
        return self.served.get(url, ["@"])[-1].partition("@")[2]


async def rollout(coordinator: CoordinatorProcess, rollout_id: str) -> Any:
    return await coordinator.get_json(f"/v1/admin/rollouts/{rollout_id}")


async def wait_for_state(coordinator: CoordinatorProcess, rollout_id: str, state: str,
                         timeout_s: float = 240) -> Any:  # fmt: skip
    """Poll the rollout until it is in ``state``; a timeout says where it stood."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await rollout(coordinator, rollout_id)
        if found["state"] == state:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rollout {rollout_id} not {state} after {timeout_s:g} s: {found['state']}, "
                f"step {found['step']}: {found['detail']}; gate {found.get('gate')}"
            )
        await asyncio.sleep(0.2)


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.coordinator = CoordinatorProcess(
            report_interval_ms=500, data_dir=tmp / "coordinator", tls=True
        )
        self.agents: list[AgentProcess] = []
        self.api_key = ""  # minted once the agents run
        # The tests' names for catalog versions -> the versions.
        self.v: dict[str, str] = {}

    async def start_agents(self, count: int, sites: tuple[str, ...],
                           extra: tuple[str, ...] = (), pin: bool = False) -> None:  # fmt: skip
        cores = sorted(os.sched_getaffinity(0))

        def agent(i: int) -> AgentProcess:  # its join token minted with the operator CLI
            return enrolled_agent(
                self.coordinator,
                agent_id=f"ro-agent-{i}",
                site=sites[i % len(sites)],
                state_dir=self.tmp / f"agent-{i}",
                # An empty model store synced from the coordinator, not --models-dir.
                # One ONNX Runtime thread each: four agents share two cores, and a second
                # thread spinning after every step cost each agent 0.16 of a core at 5
                # requests/s of the tiny model (0.23 cores with two threads, 0.07 with one).
                extra_args=[
                    "--set",
                    "models.source=store",
                    "--set",
                    "engine.intra_op_threads=1",
                    *extra,
                ],
                cpus={cores[i % len(cores)]} if pin else None,
            )

        made = [agent(i) for i in range(count)]
        self.agents += made
        # started side by side, not one after another
        await asyncio.gather(*(a.start() for a in made))
        self.api_key = await self.coordinator.api_key_for(self.agents)

    @property
    def urls(self) -> list[str]:
        return [a.url for a in self.agents]

    def traffic(self, model: str, **kwargs: Any) -> Traffic:
        """Clients of every agent, with the fleet's key, trusting the fleet CA."""
        return Traffic(self.urls, model, self.api_key, self.coordinator.ca_context(), **kwargs)

    async def restart_coordinator(self) -> None:
        """Stop it and start a new process on the same data directory and ports."""
        old = self.coordinator
        await old.terminate()
        self.coordinator = CoordinatorProcess(
            grpc_port=old.grpc_port, http_port=old.http_port, report_interval_ms=500,
            data_dir=old.data_dir, env={ADMIN_TOKEN_ENV: old.admin_token}, tls=True,
            enroll_port=old.enroll_port,
        )  # fmt: skip
        await self.coordinator.start()

    async def close(self) -> None:
        for agent in self.agents:
            await agent.terminate()
        await self.coordinator.terminate()


async def converged(fleet: Fleet, model: str, version: str) -> None:
    """Every agent answers with ``model@version``."""

    async def check() -> bool:
        headers = {"Authorization": f"Bearer {fleet.api_key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for url in fleet.urls:
                body = {"model": model, "prompt": "Hi", "max_tokens": 1}
                async with http.post(
                    url + "/v1/completions", json=body, ssl=fleet.coordinator.ca_context()
                ) as response:
                    if response.status != 200:
                        return False
                    if (await response.json())["model"] != f"{model}@{version}":
                        return False
        return True

    await wait_until(check, timeout_s=240, message=f"every agent serves {model}@{version}")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def tiny_fleet(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> AsyncIterator[Fleet]:  # fmt: skip
    fleet = Fleet(tmp_path_factory.mktemp("tiny-rollouts"))
    await fleet.coordinator.start()
    try:
        # Two catalog versions of the tiny model (the same files: nothing new to move).
        fleet.v["v1"] = manifest_version(tiny_artifacts / TINY)
        fleet.v["v2"] = other_version(fleet.v["v1"])
        await publish(fleet.coordinator, tiny_artifacts / TINY, TINY, fleet.v["v1"])
        await publish(fleet.coordinator, tiny_artifacts / TINY, TINY, fleet.v["v2"])
        await cli(fleet.coordinator, "models", "deploy", f"{TINY}@{fleet.v['v1']}")
        await fleet.start_agents(4, sites=("east", "west"))
        await converged(fleet, TINY, fleet.v["v1"])
        yield fleet
    finally:
        await fleet.close()


async def test_canary_then_waves_then_every_agent_on_the_new_version(tiny_fleet: Fleet) -> None:
    coordinator = tiny_fleet.coordinator
    async with tiny_fleet.traffic(TINY).running() as traffic:
        started = await cli(
            coordinator, "rollouts", "start", f"{TINY}@{tiny_fleet.v['v2']}", "--canary", "1",
            "--waves", "50,100", "--soak", "2s", "--min-requests", "10",
            "--max-ttft-ratio", TINY_TTFT,
        )  # fmt: skip
        assert [len(step) for step in started["plan"]] == [1, 1, 2]
        canary = started["plan"][0][0]
        done = await wait_for_state(coordinator, started["rollout_id"], "completed")
    assert traffic.failures == []
    events = [h["event"] for h in done["history"]]
    assert events == ["started", "step_moved", "step_passed", "step_moved", "step_passed",
                      "step_moved", "step_passed", "completed"]  # fmt: skip
    # The canary moved first: its replies named v2 before any wave agent's did.
    assert done["history"][1]["agents"] == 1 and canary in done["plan"][0]
    await converged(tiny_fleet, TINY, tiny_fleet.v["v2"])
    for gate in (h["gate"] for h in done["history"] if h["event"] == "step_passed"):
        assert gate["requests"] >= 10 and gate["failed"] == 0 and gate["loaded"] == gate["agents"]
    listed = await cli(coordinator, "rollouts", "list")
    assert any(r["rollout_id"] == started["rollout_id"] and r["state"] == "completed"
               for r in listed["data"])  # fmt: skip


async def served_version(fleet: Fleet, url: str, model: str) -> str:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {fleet.api_key}"}) as http:
        body = {"model": model, "prompt": "Hi", "max_tokens": 1}
        async with http.post(
            url + "/v1/completions", json=body, ssl=fleet.coordinator.ca_context()
        ) as response:
            assert response.status == 200
            return str((await response.json())["model"]).partition("@")[2]


async def test_a_restarted_coordinator_resumes_the_rollout(tiny_fleet: Fleet) -> None:
    current = await served_version(tiny_fleet, tiny_fleet.urls[0], TINY)
    target = tiny_fleet.v["v2"] if current == tiny_fleet.v["v1"] else tiny_fleet.v["v1"]
    soak_s = 20  # two steps (the canary, then the rest): the test's time is mostly soaks
    async with tiny_fleet.traffic(TINY).running() as traffic:
        started = await cli(tiny_fleet.coordinator, "rollouts", "start", f"{TINY}@{target}",
                            "--canary", "1", "--soak", f"{soak_s}s", "--min-requests", "5",
                            "--max-ttft-ratio", TINY_TTFT)  # fmt: skip
        rollout_id = started["rollout_id"]
        before = await rollout(tiny_fleet.coordinator, rollout_id)
        assert before["state"] == "running" and before["step"] == 0
        await asyncio.sleep(8)
        stopped_at = time.time()  # the rollouts' clock: wall-clock seconds
        await tiny_fleet.restart_coordinator()
        resumed = await rollout(tiny_fleet.coordinator, rollout_id)
        assert resumed["state"] == "running", resumed["detail"]
        if resumed["step"] == 0:
            # The soak counts from the start stored before the restart.
            assert resumed["step_started_at"] == before["step_started_at"]
        else:  # the restart outlasted the rest of the soak (a loaded machine): step 1 is
            # due, and only then (the step_passed times below say when it passed)
            assert resumed["step"] == 1, resumed
            assert time.time() - before["step_started_at"] >= soak_s, resumed
        done = await wait_for_state(tiny_fleet.coordinator, rollout_id, "completed")
    assert done["previous_version"] == current
    passed = [h["at"] for h in done["history"] if h["event"] == "step_passed"]
    assert passed[0] - before["step_started_at"] >= soak_s
    # Not a new soak from the restart (that would pass after stopped_at + soak_s; the stored
    # soak ends at least 8 s before).
    assert passed[0] < stopped_at + soak_s
    assert traffic.failures == []
    await converged(tiny_fleet, TINY, target)


async def test_the_slower_deep_version_fails_the_ttft_gate_and_is_rolled_back(
    tiny_artifacts: Path, tiny_fleet: Fleet
) -> None:
    """The deep variant is another version of tiny-llama, built by the models build from a
    bigger random network (32 layers with an MLP of 1024 against 2 with 128): several times
    the tiny model's time to first token on these longer prompts (~170 tokens; a bigger
    network's prefill grows with them, the tiny model's TTFT is mostly overhead), so a 2x
    TTFT gate rolls it back."""
    coordinator = tiny_fleet.coordinator
    deep_dir = tiny_artifacts / "_variants" / f"{TINY}-deep"
    deep = manifest_version(deep_dir)
    await publish(coordinator, deep_dir, TINY, deep)
    # The earlier tests leave the fleet on v1 or v2 (the same files).
    current = await served_version(tiny_fleet, tiny_fleet.urls[0], TINY)
    async with tiny_fleet.traffic(TINY, prompt_numbers=24).running() as traffic:
        started = await cli(coordinator, "rollouts", "start", f"{TINY}@{deep}", "--canary", "1",
                            "--soak", "60s", "--min-requests", "50",
                            "--max-ttft-ratio", DEEP_TTFT)  # fmt: skip
        canary_url = next(a.url for a in tiny_fleet.agents if a.agent_id == started["plan"][0][0])
        began = time.monotonic()
        done = await wait_for_state(coordinator, started["rollout_id"], "rolled_back",
                                    timeout_s=180)  # fmt: skip
        rolled_back_s = time.monotonic() - began

        async def canary_back() -> bool:
            return traffic.last_version(canary_url) == current

        await wait_until(canary_back, timeout_s=60, message="the canary serves the old version")
        await asyncio.sleep(1)
    gate = done["last_gate"]
    # The new version's TTFT on the canary and the old one's on the agents not moved, over
    # the step (the histograms the gate merged).
    new_p50 = MergedHistogram.from_json(done["step_stats"]["ttft"]).quantile(0.5) or 0.0
    control = MergedHistogram.from_json(done["control"])
    old_p50 = control.quantile(0.5) or 0.0
    print(
        f"deep: rolled back {rolled_back_s:.1f} s after the start; TTFT p99 "
        f"{gate['ttft_p99_s']:.4f} s against {gate['baseline_ttft_p99_s']:.4f} s "
        f"({gate['baseline_source']}): {gate['ttft_ratio']:.2f}x over {gate['requests']} "
        f"requests; p50 {new_p50:.4f} s against {old_p50:.4f} s over {control.total}; "
        f"{traffic.sent} sent; judged {gate['soak_elapsed_s']:.1f} s into the step"
    )
    assert traffic.failures == [], traffic.failures[:5]
    # Rolled back by the TTFT gate, at the canary, against the agents not moved.
    assert "TTFT p99" in done["detail"], done["detail"]
    assert [h["event"] for h in done["history"]].count("step_moved") == 1, done["history"]
    assert done["previous_version"] == current
    assert gate["verdict"] == "fail" and gate["failed"] == 0 and gate["loaded"] == 1
    assert gate["requests"] >= 50
    assert gate["baseline_source"] == "control"
    assert gate["ttft_ratio"] > float(DEEP_TTFT)
    assert gate["ttft_p99_s"] > float(DEEP_TTFT) * gate["baseline_ttft_p99_s"]
    # Slower throughout, not only in the first requests after its swap (of 50, the p99 is
    # about the slowest): its median too.
    assert new_p50 > float(DEEP_TTFT) * old_p50 > 0
    # Every agent (the canary too) ends on the old version.
    assert traffic.last_version(canary_url) == current
    await converged(tiny_fleet, TINY, current)
