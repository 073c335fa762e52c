"""End to end: streams survive an agent's death.

A coordinator and two agents serving the real SmolLM2 run as real processes, as a site
beyond loopback runs them: TLS on the coordinator (mutual TLS sessions, HTTPS API), agents
enrolled with join tokens serving HTTPS with their enrollment certificates, API keys
required. Twenty streamed chat completions (half greedy, half seeded) go through the client
library with a minted API key and the fleet CA; while they stream, the agent serving them is
SIGKILLed. Every stream must finish, those cut after at least one token on the other agent
(each segment's agent is recorded), and every output is compared with an uninterrupted
reference computed on the surviving agent. (With keys on, the resume's version probe once
went without the key: every candidate read 401, "other version", and the streams broke.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from devtools.fleet import CoordinatorProcess, enrolled_agent
from devtools.process import wait_until
from edgefleet_client import FleetClient, StreamSegment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LLM = "smollm2-135m-instruct"
STREAMS = 20
MAX_TOKENS = 80
TOPICS = [
    "a cat", "the sea", "a lighthouse", "bread", "a bicycle", "winter", "a robot", "tea",
    "a library", "the moon", "a garden", "trains", "a violin", "rain", "a mountain", "coffee",
    "a river", "chess", "a market", "snow",
]  # fmt: skip


def request(i: int) -> dict[str, Any]:
    sampling: dict[str, Any] = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
    return {
        "model": LLM,
        "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[i]}."}],
        "max_tokens": MAX_TOKENS,
        # no end-of-turn before 64 tokens: every stream is still going when the agent dies
        "extra_body": {"min_tokens": 64, "cache": False, "return_token_ids": True},
        **sampling,
    }


@dataclass
class Outcome:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    segments: list[StreamSegment] = field(default_factory=list)
    error: BaseException | None = None


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


async def test_streams_cut_by_a_sigkill_finish_on_the_other_agent(
    real_artifacts: Path, tmp_path: Path
) -> None:
    async with CoordinatorProcess(report_interval_ms=300, tls=True) as coordinator:
        agents = [
            enrolled_agent(
                coordinator,
                agent_id=f"resume-{name}",
                site="lab",
                state_dir=tmp_path / name,
                models_dir=str(real_artifacts),
                serve=[LLM],
                extra_args=["--threads", "1"],
            )
            for name in ("a", "b")
        ]
        await asyncio.gather(*(a.start() for a in agents))
        try:
            api_key = await coordinator.api_key_for(agents)

            async def both_routed() -> bool:
                body = await coordinator.get_json(f"/v1/route?model={LLM}")
                return len(body["agents"]) == 2

            await wait_until(both_routed, timeout_s=30, message="both agents routable")
            fleet = FleetClient(
                LLM,
                coordinator_url=coordinator.http_url,
                cooldown_s=120,
                ca_file=coordinator.ca_file,
                api_key=api_key,
            )
            await asyncio.to_thread(fleet.discover)
            client = fleet.openai(timeout=120)
            outcomes = [Outcome() for _ in range(STREAMS)]
            received = [0] * STREAMS

            def run(i: int) -> None:
                out = outcomes[i]
                try:
                    stream = client.chat.completions.create(stream=True, **request(i))
                    out.segments = stream.response.extensions["edgefleet_segments"]
                    for chunk in stream:
                        for choice in chunk.choices:
                            out.text += choice.delta.content or ""
                            ids = (choice.model_extra or {}).get("token_ids") or []
                            out.token_ids += ids
                            received[i] += len(ids)
                except BaseException as exc:  # every failure is reported, none may happen
                    out.error = exc

            threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
            started = time.monotonic()
            for t in threads:
                t.start()

            def streaming() -> bool:
                return sum(1 for n in received if n >= 4) >= STREAMS - 2

            await wait_until(streaming, timeout_s=90, interval_s=0.02, message="streams under way")
            serving = Counter(o.segments[0].agent_id for o in outcomes if o.segments)
            victim_id = serving.most_common(1)[0][0]
            victim = next(a for a in agents if a.agent_id == victim_id)
            survivor = next(a for a in agents if a is not victim)
            at_kill = list(received)
            await victim.kill()
            await asyncio.gather(*(asyncio.to_thread(t.join, 180) for t in threads))
            streamed_s = time.monotonic() - started

            # uninterrupted references, from the survivor, all at once (batched as the
            # streams were)
            direct = openai.AsyncOpenAI(
                base_url=survivor.url + "/v1", api_key=api_key, max_retries=0, timeout=120,
                http_client=openai.DefaultAsyncHttpxClient(verify=coordinator.ca_context()),
            )  # fmt: skip
            references = await asyncio.gather(
                *(direct.chat.completions.create(**request(i)) for i in range(STREAMS))
            )
            await direct.close()
        finally:
            for agent in agents:
                await agent.terminate()

    failed = [(i, repr(o.error)) for i, o in enumerate(outcomes) if o.error is not None]
    cut = [
        i
        for i, o in enumerate(outcomes)
        if len(o.segments) >= 2
        and o.segments[0].agent_id == victim_id
        and o.segments[1].first_token >= 1
    ]
    identical = []
    divergences: dict[int, int | None] = {}
    for i, (o, ref) in enumerate(zip(outcomes, references, strict=True)):
        ref_ids = (ref.choices[0].model_extra or {}).get("token_ids") or []
        if o.text == ref.choices[0].message.content and o.token_ids == ref_ids:
            identical.append(i)
        else:
            divergences[i] = first_difference(o.token_ids, ref_ids)
    print(
        f"\nstream resume: {STREAMS} streams, killed {victim_id} after "
        f"{min(at_kill)}..{max(at_kill)} tokens; cut after >=1 token and resumed: {len(cut)}; "
        f"failed: {len(failed)}; identical to the uninterrupted reference: "
        f"{len(identical)}/{STREAMS} (of the resumed: {len(set(cut) & set(identical))}/"
        f"{len(cut)}); first diverging token of the others "
        f"(stream: index, cut at): "
        + str({i: (d, outcomes[i].segments[-1].first_token) for i, d in divergences.items()})
        + f"; streaming took {streamed_s:.1f} s"
    )
    assert failed == []
    assert len(cut) >= 8
    for i in cut:
        o = outcomes[i]
        assert o.segments[-1].agent_id == survivor.agent_id
        assert sum(s.tokens for s in o.segments) == len(o.token_ids)
    for i, o in enumerate(outcomes):
        # max_tokens counted the remaining tokens and min_tokens held across the cut
        assert 64 <= len(o.token_ids) <= MAX_TOKENS, (i, len(o.token_ids))
    # Not every output is byte-identical to its reference, resumed or not: the engine's
    # decode of a lone sequence (1 row) rounds differently from a batched one (>= 2 rows),
    # so a stream that decoded a step alone (the first one admitted, say) can differ from
    # a reference batched there. The continuation replays delivered tokens through the
    # decode path, which restores the uninterrupted arithmetic whenever batching agrees;
    # prefilling them instead gave identical greedy outputs for only 8 of 24 cuts. The
    # share is reported above; at least half identical guards the replay.
    assert len(identical) >= STREAMS // 2
