"""schemathesis against both OpenAPI documents, on real processes serving the tiny model.

A coordinator and an agent (``tiny-llama``, and ``all-minilm-l6-v2`` with its moderation
heads so /v1/moderations is fuzzed against the real classifier; API keys from a keys file,
connected to the coordinator so the fleet view and route lookups have a real agent in
them) are fuzzed through the documents they serve, each with a valid credential (to
reach the handlers) and without one (401 must be documented). Every answer must be below
500 and match the document: a documented status code, content type and body schema.

Generated requests stay cheap: the agent's default ``max_tokens`` is lowered by a
test-only setting, and the fuzzed copy of the agent's document caps ``max_tokens``, ``n``
and ``max_completion_tokens`` (the agent's real limits are unchanged), so no case asks the
engine for thousands of tokens; it also names the served model as the only valid
``model``, so schema-valid cases reach the engine and invalid ones get the 404.

Every case follows from one seed per run (schemathesis mixes it with each operation's
name): a failure names it, and ``EDGEFLEET_FUZZ_SEED=<seed>`` replays that run's cases. The
credentials are the test's own, so failures show requests as sent (schemathesis' output
sanitization is off: it hid every field named like a credential, ``max_tokens_per_request``
among them).
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from agent.api.openapi import openapi_document as agent_document
from coordinator.api.routes import api_document as coordinator_document
from devtools.fleet import AgentProcess, CoordinatorProcess
from tests.e2e.moderation_helpers import MINILM, built_minilm_with_heads

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TINY = "tiny-llama"
AGENT_ID = "fuzz-agent"
# generation stays this short whatever a case asks for
MAX_TOKENS = 4
EXAMPLES = 12

T = TypeVar("T")


# Fields the agent accepts only at their neutral value (a 400 otherwise, as its protocol
# module says): left out of the fuzzed copy, so that schema-valid cases reach the engine.
NEUTRAL_ONLY = (
    "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs",
    "tools", "tool_choice", "functions", "response_format", "echo", "best_of", "suffix",
    "max_completion_tokens",  # chat: max_tokens or this, not both
)  # fmt: skip


def _cheap(document: dict[str, Any]) -> dict[str, Any]:
    """The agent's document narrowed for fuzzing: cheap generation, the served model, the
    fields it implements."""
    doc = copy.deepcopy(document)
    schemas = doc["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = schemas[name]["properties"]
        for field in NEUTRAL_ONLY:
            props.pop(field, None)
        props["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}
        props["min_tokens"] = {"type": "integer", "minimum": 0, "maximum": MAX_TOKENS}
        props["n"] = {"const": 1}
        # valid cases reach the engine; the negative ones name other models (404)
        props["model"] = {"enum": [TINY]}
        props["continue_token_ids"] = {
            "type": "array", "minItems": 1, "maxItems": 8,
            "items": {"type": "integer", "minimum": 0, "maximum": 255},
        }  # fmt: skip
    schemas["CompletionRequest"]["properties"]["prompt"] = {"type": "string", "minLength": 1}
    # /v1/moderations is fuzzed against the real classifier: the agent serves MiniLM with
    # its moderation heads bundled (without them every valid case would be the documented
    # 503 moderation_unavailable, which not_a_server_error counts as a failure)
    schemas["ChatMessageIn"]["properties"]["role"] = {"enum": ["system", "user", "assistant"]}
    return doc


def _our_agent(document: dict[str, Any]) -> dict[str, Any]:
    """The coordinator's document with ``agent_id`` naming the fuzz agent, so that valid
    cases reach its record (drain, resume, patch, revoke, remove); invalid ones get 404."""
    doc = copy.deepcopy(document)
    for operations in doc["paths"].values():
        for operation in operations.values():
            for param in operation["parameters"]:
                if param["name"] == "agent_id" and param["in"] == "path":
                    param["schema"] = {"enum": [AGENT_ID]}
    return doc


# schemathesis' own seed for the run when it has one (shared by pytest-xdist's workers)
SEED = int(
    os.environ.get("EDGEFLEET_FUZZ_SEED")
    or SchemathesisConfig.shared_seed
    or random.getrandbits(64)
)
CONFIG = SchemathesisConfig.from_dict(
    {"seed": SEED, "output": {"sanitization": {"enabled": False}}}
)
AGENT = schemathesis.openapi.from_dict(_cheap(agent_document()), config=CONFIG)
COORDINATOR = schemathesis.openapi.from_dict(_our_agent(coordinator_document()), config=CONFIG)


class _LoopThread:
    """An event loop in a thread: the processes' stderr drains run there while the
    (synchronous) hypothesis tests run in the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 180.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Fleet:
    coordinator_url: str
    admin_headers: dict[str, str]
    agent_url: str
    key_headers: dict[str, str]


@pytest.fixture(scope="module")
def fleet(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    keys_file = tmp_path_factory.mktemp("fuzz") / "keys.json"
    added = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file),
         "--name", "fuzz"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    secret = added.stdout.strip()
    minilm = built_minilm_with_heads()  # in the same artifacts directory as the tiny model
    assert minilm.parent == tiny_artifacts
    thread = _LoopThread()
    coordinator = CoordinatorProcess()
    thread.run(coordinator.start())
    agent = AgentProcess(
        models_dir=str(tiny_artifacts),
        serve=[TINY, MINILM],
        agent_id=AGENT_ID,
        coordinator=coordinator.grpc_target,
        extra_args=[
            f"--set=auth.keys_file={keys_file}",
            f"--set=engine.default_max_tokens={MAX_TOKENS}",
        ],
    )
    try:
        thread.run(agent.start())
        try:
            yield Fleet(
                coordinator_url=coordinator.http_url,
                admin_headers=coordinator.admin_headers,
                agent_url=agent.url,
                key_headers={"Authorization": f"Bearer {secret}"},
            )
        finally:
            thread.run(agent.terminate())
    finally:
        thread.run(coordinator.terminate())
        thread.close()


# No 5xx, and every answer as documented. Not positive_data_acceptance: a schema-valid
# request may still be refused for what only the server knows (a prompt longer than the
# model's context, a field accepted only at its neutral value), and that 400 is documented.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True)
def _seed_in_the_report() -> None:
    """A failure's report shows the seed (captured output of its setup); a note on the
    exception would not survive: schemathesis' plugin clears them."""
    print(f"fuzz seed {SEED}: EDGEFLEET_FUZZ_SEED={SEED} replays this run's cases")


def test_the_served_documents_are_the_fuzzed_ones(fleet: Fleet) -> None:
    agent = requests.get(fleet.agent_url + "/openapi.json", timeout=10).json()
    coordinator = requests.get(fleet.coordinator_url + "/openapi.json", timeout=10).json()
    assert agent == agent_document()
    assert coordinator == coordinator_document()


@AGENT.parametrize()
@FUZZ
def test_agent_with_a_key(case: schemathesis.Case[Any], fleet: Fleet) -> None:
    case.call_and_validate(
        base_url=fleet.agent_url, headers=fleet.key_headers, checks=CHECKS, timeout=60
    )


@AGENT.parametrize()
@FUZZ
def test_agent_without_a_key(case: schemathesis.Case[Any], fleet: Fleet) -> None:
    case.call_and_validate(base_url=fleet.agent_url, checks=CHECKS, timeout=60)


@COORDINATOR.parametrize()
@FUZZ
def test_coordinator_as_admin(case: schemathesis.Case[Any], fleet: Fleet) -> None:
    case.call_and_validate(
        base_url=fleet.coordinator_url, headers=fleet.admin_headers, checks=CHECKS, timeout=60
    )


@COORDINATOR.parametrize()
@FUZZ
def test_coordinator_without_a_token(case: schemathesis.Case[Any], fleet: Fleet) -> None:
    case.call_and_validate(base_url=fleet.coordinator_url, checks=CHECKS, timeout=60)
