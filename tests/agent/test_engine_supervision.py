"""The engine's loops are supervised: a failure anywhere in them fails what they held with a
clear error, restarts them, and past the restart policy marks the engine (and the agent)
dead, instead of ending the task silently and leaving requests hanging."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.agent_state import AgentState
from agent.api.app import REGISTRY, STATE, create_app
from agent.config import load_config
from agent.engine.continuous_batcher import BatcherConfig, ContinuousBatcher
from agent.engine.embed_batcher import DynamicEmbeddingBatcher, EmbeddingBatchConfig
from agent.engine.embedder import OnnxEmbeddingModel
from agent.engine.interface import GenerationRequest, SamplingParams, StepStats
from agent.engine.ort_session import SessionConfig
from agent.engine.supervisor import RestartBudget, RestartPolicy
from agent.engine.text_model import OnnxTextModel
from agent.errors import (
    AgentError,
    EngineDeadError,
    EngineError,
    EngineRestartedError,
    OverloadedError,
    RequestTimeoutError,
)
from agent.model_loader import load_registry

TINY = "tiny-llama"
EMBEDDER = "all-minilm-l6-v2"
CHAT = "/v1/chat/completions"
LIMIT_S = 30.0  # no request may hang: every wait is bounded (the box is loaded)

ClientFactory = Callable[..., Any]


def tiny_model(artifacts: Path, **config: Any) -> OnnxTextModel:
    registry = load_registry(
        artifacts,
        [TINY],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
        batcher_config=BatcherConfig(**config),
    )
    model = registry.text_models[TINY]
    assert isinstance(model, OnnxTextModel)
    return model


@pytest.fixture
async def started(tiny_artifacts: Path) -> AsyncIterator[tuple[OnnxTextModel, list[str]]]:
    """The tiny model with its engine started; the list gathers what on_dead was told."""
    model = tiny_model(tiny_artifacts, max_running=2)
    told: list[str] = []
    await model.start(told.append)
    yield model, told
    await model.close()


PROMPT = [int(t) for t in np.random.default_rng(0).integers(100, 40000, size=12)]


async def generate(model: OnnxTextModel, max_tokens: int = 8, tag: str = "t") -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    request = GenerationRequest(tag, PROMPT, params)
    async with asyncio.timeout(LIMIT_S):
        return [t async for out in model.generate(request) for t in out.token_ids]


class FailingListener:
    """A metrics listener whose on_step raises on the steps numbered in ``fail_on``."""

    def __init__(self, fail_on: set[int]) -> None:
        self.fail_on = fail_on
        self.steps = 0

    def on_step(self, stats: StepStats) -> None:
        self.steps += 1
        if self.steps in self.fail_on:
            raise RuntimeError("listener bug")

    def on_admitted(self, queue_wait_s: float) -> None: ...

    def on_rejected(self, reason: str) -> None: ...

    def on_prefix_reused(self, tokens: int) -> None: ...


def failing_planner(engine: ContinuousBatcher, calls: set[int] | None) -> list[int]:
    """Makes ``engine._plan`` raise on these calls (numbered from 1; None: always)."""
    real = engine._plan
    count = [0]

    def plan() -> Any:
        count[0] += 1
        if calls is None or count[0] in calls:
            raise KeyError("planner bug")
        return real()

    engine._plan = plan  # type: ignore[method-assign]
    return count


# ---- the restart policy --------------------------------------------------------------------


def test_restart_budget_allows_three_in_the_window_and_forgets_old_failures() -> None:
    now = [0.0]
    budget = RestartBudget(RestartPolicy(max_restarts=3, window_s=60.0), clock=lambda: now[0])
    assert [budget.record_failure() for _ in range(3)] == [True, True, True]
    now[0] = 59.0
    assert budget.record_failure() is False  # the 4th within 60 s
    spread = RestartBudget(RestartPolicy(), clock=lambda: now[0])
    for t in (0.0, 10.0, 20.0, 61.0, 75.0):  # old failures leave the 60 s window
        now[0] = t
        assert spread.record_failure() is True
    assert spread.failures_in_window == 3  # 20, 61, 75
    now[0] = 79.0
    assert spread.record_failure() is False  # 20, 61, 75, 79: a 4th within 60 s


def test_restart_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match="window_s"):
        RestartPolicy(window_s=0)


def test_agent_state_keeps_every_dead_engine_reason_once() -> None:
    state = AgentState()
    assert (state.status, state.unhealthy_reason) == ("ok", "")
    state.set_draining(True)
    state.mark_unhealthy("model a: dead")
    state.mark_unhealthy("model a: dead")
    state.mark_unhealthy("model b: dead")
    assert state.status == "unhealthy"  # over draining
    assert state.unhealthy_reason == "model a: dead; model b: dead"


# ---- the scheduler loop --------------------------------------------------------------------


async def test_engine_is_not_started_lazily(tiny_artifacts: Path) -> None:
    model = tiny_model(tiny_artifacts)
    with pytest.raises(EngineError, match="not running"):
        await generate(model)
    await model.close()


async def test_failing_listener_fails_in_flight_requests_and_the_loop_restarts(
    started: tuple[OnnxTextModel, list[str]],
) -> None:
    model, told = started
    expected = await generate(model)
    model.add_listener(FailingListener(fail_on={3}))
    with pytest.raises(EngineRestartedError, match="retry the request") as caught:
        await generate(model, max_tokens=50)
    assert caught.value.status == 503
    assert model.engine.restarts == 1
    assert (model.load().running, model.load().waiting, model.load().kv_used_tokens) == (0, 0, 0)
    assert await generate(model) == expected  # the restarted loop serves as before
    assert told == []


async def test_failing_planner_fails_running_and_waiting_then_serves(
    started: tuple[OnnxTextModel, list[str]],
) -> None:
    model, told = started
    expected = await generate(model)
    failing_planner(model.engine, calls={6})
    # max_running=2: two run, two wait when the planner fails
    results = await asyncio.gather(
        *(generate(model, max_tokens=40, tag=f"r{i}") for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, EngineRestartedError) for r in results), results
    assert model.load().running == model.load().waiting == 0
    assert await generate(model) == expected
    assert model.engine.restarts == 1 and told == []


async def test_fourth_failure_in_the_window_kills_the_engine(
    started: tuple[OnnxTextModel, list[str]],
) -> None:
    model, told = started
    failing_planner(model.engine, calls=None)
    for _ in range(3):
        with pytest.raises(EngineRestartedError):
            await generate(model)
    with pytest.raises(EngineDeadError, match="failed 4 times in 60 s"):
        await generate(model)
    assert len(told) == 1 and "KeyError" in told[0]
    began = time.perf_counter()
    with pytest.raises(EngineDeadError) as caught:
        await generate(model)  # fails at once: nothing is queued for a dead loop
    assert time.perf_counter() - began < 1.0
    assert caught.value.status == 503 and model.load().waiting == 0
    assert len(told) == 1  # told once


async def test_onnx_runtime_failure_fails_that_step_only(
    started: tuple[OnnxTextModel, list[str]],
) -> None:
    model, told = started
    expected = await generate(model)
    lm = model.engine._lm
    real = lm.run
    calls = [0]

    def run(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("onnxruntime: out of memory")
        return real(*args)

    lm.run = run  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="inference failed: onnxruntime") as caught:
        await generate(model, max_tokens=20)
    assert not isinstance(caught.value, EngineRestartedError) and caught.value.status == 500
    assert model.engine.restarts == 0  # a failed step is not a failed loop
    assert await generate(model) == expected
    assert told == []


async def test_close_does_not_block_the_event_loop(tiny_artifacts: Path) -> None:
    model = tiny_model(tiny_artifacts)
    await model.start()
    lm = model.engine._lm
    real = lm.run
    in_run = threading.Event()

    def slow_run(*args: Any) -> Any:
        in_run.set()
        time.sleep(0.6)  # a long ONNX Runtime call, still running when close() comes
        return real(*args)

    lm.run = slow_run  # type: ignore[method-assign]
    request = asyncio.create_task(generate(model, max_tokens=50))
    async with asyncio.timeout(LIMIT_S):
        while not in_run.is_set():
            await asyncio.sleep(0.005)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    began = time.perf_counter()
    await model.close()
    closing_s = time.perf_counter() - began
    ticking.cancel()
    with pytest.raises(EngineError, match="shutting down"):
        await request
    assert closing_s > 0.2  # close waited for the call in flight...
    assert ticks >= 5  # ...while the event loop kept running (0 when it blocks)


# ---- the embedding batcher -----------------------------------------------------------------


def embed_run(batch: list[list[int]]) -> np.ndarray:
    return np.array([[float(len(ids)), float(sum(ids))] for ids in batch], dtype=np.float32)


@pytest.fixture
async def embed_batcher() -> AsyncIterator[tuple[DynamicEmbeddingBatcher, list[str]]]:
    executor = ThreadPoolExecutor(max_workers=1)
    batcher = DynamicEmbeddingBatcher(
        embed_run, executor, EmbeddingBatchConfig(max_batch_size=4, max_queue_delay_us=0)
    )
    told: list[str] = []
    await batcher.start(told.append)
    yield batcher, told
    await batcher.close()
    executor.shutdown()


def failing_take(batcher: DynamicEmbeddingBatcher, calls: set[int] | None) -> None:
    real = batcher._take_batch
    count = [0]

    def take() -> Any:
        count[0] += 1
        if calls is None or count[0] in calls:
            raise IndexError("batching bug")
        return real()

    batcher._take_batch = take  # type: ignore[method-assign]


async def embed(batcher: DynamicEmbeddingBatcher, inputs: list[list[int]]) -> np.ndarray:
    async with asyncio.timeout(LIMIT_S):
        return await batcher.embed(inputs)


async def test_embedding_batcher_fails_pending_inputs_and_restarts(
    embed_batcher: tuple[DynamicEmbeddingBatcher, list[str]],
) -> None:
    batcher, told = embed_batcher
    failing_take(batcher, calls={1})
    results = await asyncio.gather(
        embed(batcher, [[1, 2], [3]]), embed(batcher, [[4]]), return_exceptions=True
    )
    assert all(isinstance(r, EngineRestartedError) for r in results), results
    assert batcher.restarts == 1
    vectors = await embed(batcher, [[1, 2], [3]])
    assert vectors.tolist() == [[2.0, 3.0], [1.0, 3.0]]
    assert told == []


async def test_embedding_batcher_dies_on_the_fourth_failure(
    embed_batcher: tuple[DynamicEmbeddingBatcher, list[str]],
) -> None:
    batcher, told = embed_batcher
    failing_take(batcher, calls=None)
    for _ in range(3):
        with pytest.raises(EngineRestartedError):
            await embed(batcher, [[1]])
    with pytest.raises(EngineDeadError, match="embedding batcher failed 4 times"):
        await embed(batcher, [[1]])
    began = time.perf_counter()
    with pytest.raises(EngineDeadError):
        await embed(batcher, [[1]])
    assert time.perf_counter() - began < 1.0
    assert len(told) == 1 and "IndexError" in told[0]


async def test_embedding_run_failure_fails_that_call_only(
    embed_batcher: tuple[DynamicEmbeddingBatcher, list[str]],
) -> None:
    batcher, told = embed_batcher
    real = batcher._run
    calls = [0]

    def run(batch: list[list[int]]) -> np.ndarray:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("onnxruntime: bad input")
        return real(batch)

    batcher._run = run  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="bad input"):
        await embed(batcher, [[5]])
    assert (await embed(batcher, [[5]])).tolist() == [[1.0, 5.0]]
    assert batcher.restarts == 0 and told == []


# ---- over HTTP -----------------------------------------------------------------------------


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": TINY,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "cache": False,
        **extra,
    }


def text_engine(client: TestClient) -> ContinuousBatcher:
    assert client.app is not None
    model = client.app[REGISTRY].text_models[TINY]
    assert isinstance(model, OnnxTextModel)
    return model.engine


async def test_app_starts_the_engine_and_a_restart_is_a_clear_503(
    make_client: ClientFactory,
) -> None:
    client: TestClient = await make_client()
    engine = text_engine(client)
    assert engine._task is not None and not engine._task.done()  # started with the app
    assert (await client.post(CHAT, json=chat())).status == 200
    engine.listeners.append(FailingListener(fail_on={3}))  # the 3rd step from now
    async with asyncio.timeout(LIMIT_S):
        resp = await client.post(CHAT, json=chat(max_tokens=30))
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"  # the loop is already running again
    error = (await resp.json())["error"]
    assert error["code"] == "engine_restarted" and "retry the request" in error["message"]
    assert (await client.get("/healthz")).status == 200  # one restart is not unhealthy
    assert (await client.post(CHAT, json=chat())).status == 200


async def test_streamed_request_cut_by_a_restart_ends_with_an_error_event(
    make_client: ClientFactory,
) -> None:
    client: TestClient = await make_client()
    engine = text_engine(client)
    engine.listeners.append(FailingListener(fail_on={4}))
    async with asyncio.timeout(LIMIT_S):
        resp = await client.post(CHAT, json=chat(max_tokens=30, stream=True))
        raw = (await resp.read()).decode()
    assert resp.status == 200  # the stream had started
    assert "engine_restarted" in raw
    assert raw.rstrip().endswith("data: [DONE]")


async def test_dead_engine_makes_healthz_503_and_requests_fail_fast(
    make_client: ClientFactory,
) -> None:
    client: TestClient = await make_client()
    assert client.app is not None
    failing_planner(text_engine(client), calls=None)
    codes = []
    async with asyncio.timeout(LIMIT_S):
        for _ in range(4):
            resp = await client.post(CHAT, json=chat())
            assert resp.status == 503
            codes.append((await resp.json())["error"]["code"])
    assert codes == ["engine_restarted"] * 3 + ["engine_unavailable"]
    health = await client.get("/healthz")
    assert health.status == 503
    body = await health.json()
    assert body["status"] == "unhealthy"
    assert "tiny-llama" in body["unhealthy_reason"]
    assert "failed 4 times" in body["unhealthy_reason"]
    assert client.app[STATE].unhealthy_reason == body["unhealthy_reason"]
    began = time.perf_counter()
    resp = await client.post(CHAT, json=chat())
    assert resp.status == 503 and (await resp.json())["error"]["code"] == "engine_unavailable"
    assert time.perf_counter() - began < 2.0


@pytest.fixture
async def embedding_client(real_artifacts: Path) -> AsyncIterator[TestClient]:
    config = load_config(
        environ={}, overrides={"models": {"dir": str(real_artifacts), "serve": [EMBEDDER]}}
    )
    client = TestClient(TestServer(create_app(config)))
    await client.start_server()
    yield client
    await client.close()


async def test_dead_embedding_engine_makes_healthz_503(embedding_client: TestClient) -> None:
    client = embedding_client
    assert client.app is not None
    model = client.app[REGISTRY].embedding_models[EMBEDDER]
    assert isinstance(model, OnnxEmbeddingModel)
    body = {"model": EMBEDDER, "input": "The cat sat on the mat."}
    assert (await client.post("/v1/embeddings", json=body)).status == 200
    failing_take(model.batcher, calls=None)
    codes = []
    async with asyncio.timeout(LIMIT_S):
        for _ in range(5):
            resp = await client.post("/v1/embeddings", json=body)
            assert resp.status == 503
            codes.append((await resp.json())["error"]["code"])
    assert codes == ["engine_restarted"] * 3 + ["engine_unavailable"] * 2
    health = await client.get("/healthz")
    assert health.status == 503
    assert (await health.json())["status"] == "unhealthy"


def test_every_engine_failure_code_is_documented_and_resumable_by_the_client() -> None:
    """A code an engine failure can end a stream with is in the OpenAPI document's list,
    and the client library resumes a stream it ends (a new EngineError subclass must
    choose both)."""
    from agent.api.http_io import STREAM_ERROR_CODES
    from edgefleet_client._resume import RESUMABLE_ERROR_CODES

    def subclasses(cls: type[AgentError]) -> list[type[AgentError]]:
        return [cls] + [s for sub in cls.__subclasses__() for s in subclasses(sub)]

    runtime = [*subclasses(EngineError), OverloadedError, RequestTimeoutError]
    codes = {cls.code for cls in runtime}
    assert {"engine_error", "engine_restarted", "engine_unavailable"} <= codes
    assert codes <= set(STREAM_ERROR_CODES)
    assert {cls.code for cls in subclasses(EngineError)} <= RESUMABLE_ERROR_CODES
