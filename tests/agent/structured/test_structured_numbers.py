"""JSON numbers on the real SmolLM2 model over HTTP: an unbounded ``number`` field ends.

Under greedy decoding the 135M model writes ``"population_millions":1111...`` for these
prompts, and a JSON number's grammar admits digits without end: without the number cap
(:mod:`agent.structured.number_cap`) every one of them ran to max_tokens.
"""

from __future__ import annotations

import json
import math

import jsonschema_rs
import pytest
from aiohttp.test_utils import TestClient

from tests.agent.structured.conftest import REAL

pytestmark = pytest.mark.timeout(180)

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "number"},  # no bounds: any number of digits
    },
    "required": ["name", "country", "population_millions"],
    "additionalProperties": False,
}
PROMPTS = ["Describe Paris.", "Give me the capital of France as JSON.", "Describe Tokyo."]
MAX_TOKENS = 200


async def test_unbounded_number_field_ends_and_parses(real_client: TestClient) -> None:
    for prompt in PROMPTS:
        resp = await real_client.post(
            "/v1/chat/completions",
            json={
                "model": REAL,
                "messages": [{"role": "user", "content": prompt}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "City", "schema": CITY, "strict": True},
                },
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "cache": False,
            },
        )
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        choice = body["choices"][0]
        content = choice["message"]["content"]
        assert choice["finish_reason"] == "stop", (prompt, content)
        assert body["usage"]["completion_tokens"] < MAX_TOKENS
        city = json.loads(content)
        assert jsonschema_rs.validator_for(CITY).is_valid(city), content
        assert math.isfinite(city["population_millions"])
