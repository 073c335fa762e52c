"""``POST /v1/moderations`` on a real agent process, API keys on, through the ``openai``
SDK's ``client.moderations.create``: the heads built by ``python -m models build`` on the
shipped int8 MiniLM flag what they cover, leave ordinary questions alone, answer in OpenAI's
shape, and hostile requests get OpenAI error bodies naming the field. An agent without
heads says 503 moderation_unavailable (fails closed)."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from devtools.fleet import AgentProcess
from models.moderation_spec import CATEGORIES, OPENAI_CATEGORIES
from tests.e2e.moderation_helpers import (
    BOMB,
    HEADS,
    MINILM,
    moderation_artifacts,  # noqa: F401  (a fixture)
    without_heads,
)

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def api_key(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    keys_file = tmp_path / "keys.json"
    secret = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), "--name", "m"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    yield keys_file, secret


async def test_moderations_through_the_openai_sdk(
    moderation_artifacts: Path,  # noqa: F811  (the fixture)
    api_key: tuple[Path, str],
) -> None:
    keys_file, secret = api_key
    agent = AgentProcess(
        models_dir=str(moderation_artifacts), serve=[MINILM],
        extra_args=["--set", f"auth.keys_file={keys_file}", "--threads", "2"],
    )  # fmt: skip
    async with agent:
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key="ef-000000000000-wrong", max_retries=0
        ) as stranger:
            with pytest.raises(openai.AuthenticationError):
                await stranger.moderations.create(input="hello")
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=secret, max_retries=0, timeout=60
        ) as client:
            one = await client.moderations.create(input=BOMB)
            texts = [
                "What time does the store open on Sunday?",
                "I want to kill myself tonight, I have the pills ready.",
                "Can I change the delivery address on my order?",
                "Write an explicit sex scene between two consenting adults.",
            ]
            many = await client.moderations.create(input=texts, model="omni-moderation-latest")
            with pytest.raises(openai.NotFoundError):
                await client.moderations.create(input="hi", model="gpt-4o")
        assert one.id.startswith("modr-") and one.model.startswith(f"{HEADS}@fp32-")
        [bomb] = one.results
        assert bomb.flagged and bomb.categories.illicit and bomb.categories.illicit_violent
        assert bomb.category_scores.illicit > 0.5
        # OpenAI's field names, every category named (ours beside them), applied types
        raw = bomb.model_dump(by_alias=True)
        assert set(raw["categories"]) == set(CATEGORIES)
        assert set(OPENAI_CATEGORIES) <= set(raw["category_scores"])
        assert raw["category_applied_input_types"]["illicit"] == ["text"]
        assert raw["category_applied_input_types"]["violence/graphic"] == []  # not covered
        assert [r.flagged for r in many.results] == [False, True, False, True]
        assert many.results[1].categories.self_harm
        assert many.results[3].categories.sexual and not many.results[3].categories.sexual_minors

        # hostile requests: OpenAI error bodies, the field named, nothing 5xx
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        url = agent.url + "/v1/moderations"
        cases: list[tuple[bytes, int, str | None]] = [
            (b'{"input": 5}', 400, "input"),
            (b'{"input": [1, 2]}', 400, "input"),
            (b'{"input": []}', 400, "input"),
            (b'{"input": "hi", "model": 7}', 400, "model"),
            (b'{"model": "omni-moderation-latest"}', 400, "input"),
            (b'{"input": ' + b'["x"' + b', "x"' * 32 + b"]}", 400, "input"),
            (b'{"input": ["ok", "' + b"y" * 40_000 + b'"]}', 400, "input[1]"),
            (b'{"input": "\xff\xfe"}', 400, None),
            (b"[1, 2]", 400, None),
            (b'{"input": "' + b"z" * 2_000_000 + b'"}', 413, None),
        ]
        async with aiohttp.ClientSession(headers=headers) as http:
            for body, status, param in cases:
                async with http.post(url, data=io.BytesIO(body)) as resp:
                    error = (await resp.json())["error"]
                    assert resp.status == status, (body[:60], error)
                    assert error["param"] == param and error["message"]
                    assert error["type"] == "invalid_request_error"


async def test_an_agent_without_heads_fails_closed(
    moderation_artifacts: Path,  # noqa: F811  (the fixture)
    api_key: tuple[Path, str],
    tmp_path: Path,
) -> None:
    keys_file, secret = api_key
    bare = tmp_path / "models"
    without_heads(moderation_artifacts / MINILM, bare / MINILM)  # the embedder, no heads
    agent = AgentProcess(
        models_dir=str(bare), serve=[MINILM],
        extra_args=["--set", f"auth.keys_file={keys_file}", "--threads", "2"],
    )  # fmt: skip
    async with (
        agent,
        openai.AsyncOpenAI(base_url=agent.url + "/v1", api_key=secret, max_retries=0) as client,
    ):
        with pytest.raises(openai.InternalServerError) as refused:
            await client.moderations.create(input="hello")
    assert refused.value.status_code == 503
    assert refused.value.code == "moderation_unavailable"
    assert any("no moderation heads" in line for line in agent.log)  # said at start
