"""Issue 28's showcase on real processes, API keys on (a keys file made by 'agent keys add
--moderation'): SmolLM2 is forced by a response_format JSON-schema enum (the project's own
constrained decoding) to write a self-harm sentence after harmless ones, and the real
heads on the int8 MiniLM end the buffered stream before it: the client receives none of
the flagged window, finish_reason is content_filter, the engine's slot is freed. The same
sentence as input is a 400 content_filter for the key that blocks it (the OpenAI SDK's
BadRequestError) and a flagged 200 for a key that says nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from devtools.fleet import AgentProcess
from devtools.process import wait_until
from tests.e2e.moderation_helpers import HEADS, MINILM, moderation_artifacts  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LLM = "smollm2-135m-instruct"
HARMLESS = (
    "Our branch opens at nine on weekdays and at ten on Saturdays. You can park behind the "
    "building, and the lift is next to the main entrance. Bring your card and a photo ID "
    "when you visit the counter, and ask the clerk for a printed receipt. "
)
BAD = "I want to kill myself tonight, I have the pills ready and nobody will stop me."
SCHEMA = {
    "type": "object",
    "properties": {"reply": {"enum": [HARMLESS + BAD]}},
    "required": ["reply"],
    "additionalProperties": False,
}


def add_key(keys_file: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), *args],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip


async def test_a_forced_self_harm_sentence_never_reaches_the_client(
    moderation_artifacts: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    keys_file = tmp_path / "keys.json"
    strict = add_key(keys_file, "--name", "kiosk", "--moderation", "input:self-harm=block",
                     "--moderation", "output:self-harm=block")  # fmt: skip
    plain = add_key(keys_file, "--name", "app")
    agent = AgentProcess(
        models_dir=str(moderation_artifacts), serve=[LLM, MINILM],
        extra_args=["--set", f"auth.keys_file={keys_file}", "--threads", "2"],
    )  # fmt: skip
    async with agent:
        url = agent.url + "/v1/chat/completions"
        body = {
            "model": LLM, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me about the branch."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": SCHEMA}},
        }  # fmt: skip
        text, finishes, usage = "", [], None
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {strict}"}) as http,
            http.post(url, json=body) as response,
        ):
            assert response.status == 200, await response.text()
            async for line in response.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    text += choice["delta"].get("content") or ""
                    if choice["finish_reason"]:
                        finishes.append(choice["finish_reason"])
        assert finishes == ["content_filter"], text
        assert text.startswith('{"reply"') and "Saturdays" in text
        assert "kill" not in text and "pills" not in text, text
        assert usage is not None and usage["completion_tokens"] < 200

        async def idle() -> bool:
            async with (
                aiohttp.ClientSession(headers={"Authorization": f"Bearer {plain}"}) as http,
                http.get(agent.url + "/metrics") as metrics,
            ):
                page = await metrics.text()
            return "edgefleet_agent_running_sequences 0.0" in page and (
                'edgefleet_agent_moderation_flagged_total{action="block",category="self-harm",'
                'stage="output"} 1.0' in page
            )

        await wait_until(idle, timeout_s=10, message="slot freed, block counted")

        # the same sentence going in: a 400 for the key that blocks it, a flag for the other
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=strict, max_retries=0, timeout=60
        ) as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model=LLM, max_tokens=4, messages=[{"role": "user", "content": BAD}]
                )
        assert refused.value.code == "content_filter"
        assert "self-harm" in refused.value.message and refused.value.param == "messages[0]"
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=plain, max_retries=0, timeout=60
        ) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=LLM, max_tokens=4, messages=[{"role": "user", "content": BAD}]
            )
        assert "self-harm" in raw.headers["X-Edgefleet-Moderation"]
        assert raw.parse().choices[0].finish_reason in ("stop", "length")
