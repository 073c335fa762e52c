"""The agent's aiohttp application: thin handlers over the serving objects."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.agent_state import AgentState
from agent.api.admin import ADMIN_TOKEN, AdminToken, admin_routes, admin_token_path
from agent.api.content_check import MODERATED, MODERATION_HEADER, input_texts
from agent.api.http_io import (
    CLIENT_CLOSED,
    CLIENT_GONE,
    error_body,
    error_response,
    json_response,
    read_json,
    stream_sse,
)
from agent.api.openapi import openapi_document
from agent.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    Health,
    ModelCard,
    ModelList,
    ModelSyncStatus,
    ModerationRequest,
)
from agent.api.serving_chat import ChatService
from agent.api.serving_common import (
    CURRENT_USAGE,
    GenerationLimits,
    GenerationRunner,
    PreparedGeneration,
    RequestOptions,
    RequestUsage,
    request_options,
)
from agent.api.serving_completions import CompletionService
from agent.api.serving_embeddings import EmbeddingService
from agent.api.serving_moderations import ModerationService
from agent.api.serving_structured import EMBEDDING_MODEL_CAPABILITIES, TEXT_MODEL_CAPABILITIES
from agent.auth.keys import KeyTable
from agent.auth.middleware import grant_of, key_gate
from agent.auth.startup import key_table_for
from agent.config import AgentConfig
from agent.engine.residency import Residency
from agent.engine.step_cores import new_step_executor
from agent.errors import AgentError
from agent.metrics import AgentMetrics
from agent.model_loader import load_registry
from agent.model_registry import ModelRegistry
from agent.moderation import ModerationShelf
from agent.moderation.gate import ModerationGate
from agent.overflow.hook import (
    OVERFLOW,
    OVERFLOW_REQUEST,
    SERVED_BY_HEADER,
    forward,
    forwardable,
    record_fields,
)
from agent.overflow.wiring import overflow_service_for
from agent.redaction import Redactor
from agent.request_log import RequestLog, RequestLogSlot
from agent.response_cache import ResponseCache
from agent.semantic_cache import SemanticCache
from agent.semantic_responder import SemanticResponder
from agent.sync.blob_server import blob_handler
from agent.sync.manager import ModelSync
from agent.sync.setup import build_model_sync, models_source, sync_wanted
from agent.sync.stats import ModelStatsCollector
from agent.sync.store import ModelStore
from edgefleet.contract import ModelInventoryState

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", AgentConfig)
METRICS = web.AppKey("metrics", AgentMetrics)
REGISTRY = web.AppKey("registry", ModelRegistry)
CHAT = web.AppKey("chat", ChatService)
COMPLETIONS = web.AppKey("completions", CompletionService)
EMBEDDINGS = web.AppKey("embeddings", EmbeddingService)
MODERATION = web.AppKey("moderation", ModerationService)
# content checks in the request path (agent/moderation/gate.py)
MODERATION_GATE = web.AppKey("moderation_gate", ModerationGate)
STARTED = web.AppKey("started", float)
STATE = web.AppKey("state", AgentState)
REQUEST_LOG = web.AppKey("request_log", RequestLogSlot)
# What the request generated (model@version, tokens, first-token time), filled in by the
# serving layer (GenerationRunner) for streamed and whole responses alike.
USAGE = web.RequestKey("edgefleet_usage", RequestUsage)
KEYS = web.AppKey("keys", KeyTable)
# The agent's one redactor (agent/redaction): what leaves the site is redacted with it.
REDACTOR = web.AppKey("redactor", Redactor)
# Model sync (absent when this agent runs without it: no coordinator, no store).
SYNC = web.AppKey("model_sync", ModelSync)
MODEL_STATS = web.AppKey("model_stats", ModelStatsCollector)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI error body; every request is counted and timed."""
    metrics = request.app[METRICS]
    route = request.match_info.route.resource
    endpoint = route.canonical if route is not None else "unmatched"
    started = time.perf_counter()
    status = 500
    response: web.StreamResponse | None = None
    usage = request[USAGE] = RequestUsage()
    usage_token = CURRENT_USAGE.set(usage)
    request[RECORD_FROM] = (endpoint, started)
    try:
        response = await handler(request)
        status = CLIENT_CLOSED if request.get(CLIENT_GONE) else response.status
        return response
    except asyncio.CancelledError:
        status = CLIENT_CLOSED  # the connection closed under the handler
        raise
    except AgentError as exc:
        status = exc.status
        if status >= 500:
            log.error("request %s failed: %s", request.path, exc.message)
        return error_response(exc)
    except web.HTTPException as exc:
        status = exc.status
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        message = f"{exc.reason}: {request.method} {request.path}"
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response(error_body(message, kind), status=exc.status, headers=headers)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response(
            error_body("internal server error", "server_error", code="internal_error"),
            status=500,
        )
    finally:
        CURRENT_USAGE.reset(usage_token)
        if usage.model and endpoint in RECORDED_ENDPOINTS:
            request.app[MODEL_STATS].record(
                usage.model,
                usage.version,
                failed=status >= 500,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                ttft_s=None
                if usage.first_token_at is None
                else max(0.0, usage.first_token_at - started),
            )
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.request_latency.labels(endpoint).observe(time.perf_counter() - started)
        overflow = record_fields(request)  # a forwarded request's legs and cost, once
        if endpoint in GENERATION_ENDPOINTS and status == 200:
            _count_served(request, overflow)
        if (
            endpoint in RECORDED_ENDPOINTS
            and not request.get(RECORDED)
            and (log_ := request.app[REQUEST_LOG].log) is not None
        ):
            _record_request(request, log_, endpoint, status, started, response, overflow)


# The record's endpoint and start (the middleware's), for a stream recorded early.
RECORD_FROM = web.RequestKey("edgefleet_record_from", tuple)
# Set once the request's record is written (a finished stream's, before its [DONE]).
RECORDED = web.RequestKey("edgefleet_recorded", bool)
CACHE_SIMILARITY_HEADER = "X-Edgefleet-Cache-Similarity"
# Requests that get a per-request record (agent/request_log.py).
RECORDED_ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/moderations"}
)
GENERATION_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})


def _count_served(request: web.Request, overflow: dict[str, Any] | None) -> None:
    """The served-by metric label: this agent, or the overflow target that answered."""
    service = request.app[OVERFLOW]
    if overflow is None:
        service.book.served.labels(_self_id(request), "local").inc()
        return
    kind = next((leg["kind"] for leg in overflow["overflow"] if not leg["failed"]), "unknown")
    service.book.served.labels(overflow["served_by"] or "none", kind).inc()


def _self_id(request: web.Request) -> str:
    return request.app[OVERFLOW].agent_id or request.app[CONFIG].identity.agent_id or "local"


def _record_request(
    request: web.Request,
    log_: RequestLog,
    endpoint: str,
    status: int,
    started: float,
    response: web.StreamResponse | None,
    overflow: dict[str, Any] | None = None,
) -> None:
    """One record: key id, model@version, token counts, latency, time to first token,
    served-by and status; never any text.

    Generations (streamed or whole, cache hits included) are counted by the serving layer
    on the request's ``USAGE``; embeddings, which do not go through it, from their JSON
    body's ``usage``.
    """
    usage = request.get(USAGE) or RequestUsage()
    grant = grant_of(request)
    record: dict[str, Any] = {
        "key_id": None if grant is None else grant.key_id,
        "endpoint": endpoint,
        "status": status,
        "latency_ms": (time.perf_counter() - started) * 1000.0,
        "ttft_ms": None if usage.first_token_at is None
        else max(0.0, (usage.first_token_at - started) * 1000.0),
        "served_by": log_.served_by,
        "model": usage.model[:256],
        "version": usage.version[:256],
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
    }  # fmt: skip
    moderated = request.get(MODERATED)
    if moderated is not None and moderated.found:
        record["moderation"] = moderated.record()  # stage:category:action, never text
    forwarded = request.get(OVERFLOW_REQUEST)
    if overflow is not None and forwarded is not None:
        # served elsewhere: the targets' usage, cost (agent/overflow/service.py) and who
        record.update(overflow)
        record["model"] = forwarded.model[:256]
        record["prompt_tokens"] = sum(leg["prompt_tokens"] for leg in overflow["overflow"])
        record["completion_tokens"] = sum(leg["completion_tokens"] for leg in overflow["overflow"])
        if forwarded.first_token_at is not None:
            record["ttft_ms"] = max(0.0, (forwarded.first_token_at - started) * 1000.0)
    elif (
        not usage.model and isinstance(response, web.Response) and isinstance(response.body, bytes)
    ):
        try:
            body = json.loads(response.body)
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            counts = body.get("usage")
            if not isinstance(counts, dict):
                counts = {}
            name, _, version = body["model"].partition("@")  # replies name name@version
            record["model"] = name[:256]
            record["prompt_tokens"] = _count(counts.get("prompt_tokens"))
            record["completion_tokens"] = _count(counts.get("completion_tokens"))
            record["version"] = (version or _version_of(request.app)(name) or "")[:256]
    try:
        log_.append(record)
    except OSError as exc:
        log.error("could not write the request record: %s", exc)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


async def _recorded_when_done(
    request: web.Request, events: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    """``events``, and the request's record written once the last one has gone out, before
    the stream's ``[DONE]``: a client that saw the whole stream knows its record is in the
    spool (a SIGKILL after that loses none). A stream that fails or is left by its client
    is recorded by the middleware, with its status."""
    try:
        async for event in events:
            yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()  # a client gone: its sequence ends now, not when collected
    log_ = request.app[REQUEST_LOG].log
    if log_ is not None and RECORD_FROM in request and not request.get(CLIENT_GONE):
        endpoint, started = request[RECORD_FROM]
        _record_request(request, log_, endpoint, 200, started, None)
        request[RECORDED] = True


def _limit(request: web.Request) -> int:
    return request.app[CONFIG].server.max_body_bytes


def _headers(prepared: PreparedGeneration) -> dict[str, str]:
    headers = {
        "X-Edgefleet-Cache": prepared.cache_status,
        "X-Request-Id": prepared.request.request_id,
    }
    if prepared.similarity is not None:  # a semantic hit: how close the prompts were
        headers[CACHE_SIMILARITY_HEADER] = f"{prepared.similarity:.4f}"
    return headers


def _options(request: web.Request) -> RequestOptions:
    return request_options(
        request.headers.get("X-Priority"),
        request.headers.get("X-Request-Timeout"),
        grant=grant_of(request),
        max_timeout_s=request.app[CONFIG].auth.max_request_timeout_s,
        max_keep_alive_s=request.app[CONFIG].residency.max_request_keep_alive_s,
    )


async def _generate(
    request: web.Request,
    body_model: type[ChatCompletionRequest] | type[CompletionRequest],
    service: ChatService | CompletionService,
    endpoint: str,
) -> web.StreamResponse:
    """Served here; or, when the engine refuses (queue full, predicted wait past the
    deadline) or the model is not loaded here, forwarded (agent/overflow)."""
    body = await read_json(request, body_model, _limit(request))
    keys_enabled = request.app[KEYS].enabled
    options = _options(request)
    # content safety first: before the response cache and before any overflow
    grant = options.grant
    moderation = request.app[MODERATION_GATE].for_request(
        None if grant is None else grant.key.policy, None if grant is None else grant.key_id
    )
    if moderation is not None:
        request[MODERATED] = moderation  # its record names what was found, a block too
        await moderation.check_input(input_texts(body))
        options = dataclasses.replace(options, moderation=moderation)
    try:
        prepared = await service.prepare(body, options)  # type: ignore[arg-type]
    except AgentError as exc:
        if forwardable(request, exc):
            return await forward(request, endpoint, exc, keys_enabled)
        raise
    headers = _headers(prepared)
    headers[SERVED_BY_HEADER] = _self_id(request)
    if moderation is not None and (flagged := moderation.flagged_header()) is not None:
        headers[MODERATION_HEADER] = flagged
    if prepared.stream:
        stream = service.stream(prepared)
        try:
            first = await anext(stream)  # admission (queue full, ...) is decided here
        except AgentError as exc:
            if forwardable(request, exc):
                await stream.aclose()  # type: ignore[union-attr]
                return await forward(request, endpoint, exc, keys_enabled)
            raise
        events = _recorded_when_done(request, _prepend(first, stream))
        return await stream_sse(request, events, headers, with_usage=prepared.include_usage)
    try:
        answer = await service.complete(prepared)
        if moderation is not None and (flagged := moderation.flagged_header()) is not None:
            headers[MODERATION_HEADER] = flagged  # the output's flags too
        return json_response(answer, headers=headers)
    except AgentError as exc:
        if forwardable(request, exc):
            return await forward(request, endpoint, exc, keys_enabled)
        raise


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        close = getattr(rest, "aclose", None)
        if close is not None:
            await close()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, ChatCompletionRequest, request.app[CHAT], "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, CompletionRequest, request.app[COMPLETIONS], "completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    body = await read_json(request, EmbeddingRequest, _limit(request))
    return json_response(await request.app[EMBEDDINGS].create(body))


async def moderations(request: web.Request) -> web.StreamResponse:
    body = await read_json(request, ModerationRequest, _limit(request))
    return json_response(await request.app[MODERATION].create(body))


async def list_models(request: web.Request) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    created = int(request.app[STARTED])
    residency = {}
    if registry.residency is not None:
        residency = {s["model"]: s for s in registry.residency.snapshot()}

    def resident(model_id: str) -> dict[str, Any]:
        slot = residency.get(model_id)
        if slot is None:
            return {}
        expires = slot["expires_at"]
        return {
            "state": slot["state"],
            "resident_bytes": slot["resident_bytes"],
            "expires_at": int(expires) if isinstance(expires, float) else None,
            "pinned": slot["pinned"],
        }

    cards = [
        ModelCard(
            id=m.model_id,
            created=created,
            version=m.version,
            task="text-generation",
            context_length=m.context_length,
            capabilities=TEXT_MODEL_CAPABILITIES,
            **resident(m.model_id),
        )
        for m in registry.text_models.values()
    ] + [
        ModelCard(
            id=e.model_id,
            created=created,
            version=e.version,
            task="feature-extraction",
            context_length=e.max_input_tokens,
            capabilities=EMBEDDING_MODEL_CAPABILITIES,
        )
        for e in registry.embedding_models.values()
    ]
    return json_response(ModelList(data=sorted(cards, key=lambda c: c.id)))


async def healthz(request: web.Request) -> web.StreamResponse:
    """200 while the agent serves (also while draining); 503 once it cannot (a dead
    engine), with the reason in the body."""
    registry = request.app[REGISTRY]
    state = request.app[STATE]
    load = registry.load()
    status = state.status
    return json_response(
        Health(
            status=status,
            models=registry.ids,
            running=load.running,
            waiting=load.waiting,
            kv_cache_used_tokens=load.kv_used_tokens,
            unhealthy_reason=state.unhealthy_reason,
            model_sync=_sync_status(request.app),
        ),
        status=503 if status == "unhealthy" else 200,
    )


def _sync_status(app: web.Application) -> list[ModelSyncStatus]:
    sync = app.get(SYNC)
    if sync is None:
        return []
    return [
        ModelSyncStatus(
            model=f"{i.name}@{i.version}",
            state=i.state.value,  # type: ignore[arg-type]
            bytes_done=i.bytes_done,
            bytes_total=i.bytes_total,
            last_error=i.last_error,
        )
        for i in sync.inventory()
        if i.state not in (ModelInventoryState.LOADED, ModelInventoryState.ON_DISK)
    ]


async def metrics_page(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    registry = request.app[REGISTRY]
    load = registry.load()
    metrics.running.set(load.running)
    metrics.waiting.set(load.waiting)
    metrics.kv_cache_used_tokens.set(load.kv_used_tokens)
    metrics.kv_cache_used_ratio.set(load.kv_used_fraction)
    metrics.kv_cache_bytes.labels("slots").set(load.kv_allocated_bytes)
    metrics.kv_cache_bytes.labels("prefix").set(load.prefix_cache_bytes)
    if registry.residency is not None:
        r = registry.residency
        metrics.set_residency(r.snapshot(), r.config.budget_bytes, r.committed_bytes())
    response = web.Response(body=generate_latest(metrics.registry))
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


async def openapi(request: web.Request) -> web.StreamResponse:
    return web.json_response(openapi_document())


ROUTES = [
    web.post("/v1/chat/completions", chat_completions),
    web.post("/v1/completions", completions),
    web.post("/v1/embeddings", embeddings),
    web.post("/v1/moderations", moderations),
    web.get("/v1/models", list_models),
    web.get("/healthz", healthz),
    web.get("/metrics", metrics_page),
    web.get("/openapi.json", openapi),
]
# The model store's blobs for site peers (added per app: it serves that app's store).
BLOBS_PATH = "/v1/blobs/sha256/{hex}"


def _registry_ctx(
    registry: ModelRegistry | None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        config = app[CONFIG]
        reg = registry
        metrics = app[METRICS]
        sync: ModelSync | None = None
        if reg is None and models_source(config) == "store":
            reg = ModelRegistry(
                {},
                {},
                residency=Residency(config.residency.resolved()),
                step_executor=new_step_executor(),
            )
        if reg is None:
            engine = config.engine
            reg = load_registry(
                Path(config.models.dir),
                config.models.serve,
                session_config=engine.session(),
                max_context_tokens=engine.max_context_tokens,
                batcher_config=engine.batcher(),
                embedding_batch_config=config.embeddings.batch(),
                verify=config.models.verify_checksums,
                residency=config.residency.resolved(),
            )
        shelf = ModerationShelf(reg, verify=config.models.verify_checksums)
        if sync_wanted(config):
            sync = build_model_sync(config, reg, [metrics], on_loaded=shelf.add)
            if not reg.text_models and not reg.embedding_models:
                loaded = await sync.cold_start()
                log.info("model store %s: serving %s", sync.store.root, ", ".join(loaded) or
                         "nothing yet (waiting for the coordinator's models)")  # fmt: skip
        if sync is not None:
            app[SYNC] = sync
        limits = GenerationLimits(default_max_tokens=config.engine.default_max_tokens)
        for model in reg.text_models.values():
            model.add_listener(metrics)
        if reg.residency is not None:
            reg.residency.listeners.append(metrics)
        app[REGISTRY] = reg
        cache = ResponseCache(config.cache.max_bytes) if config.cache.enabled else None
        semantic = None
        if cache is not None and config.cache.semantic_max_bytes > 0:
            semantic = SemanticResponder(
                SemanticCache(
                    threshold=1.0,  # each lookup gives its embedding version's threshold
                    max_bytes=config.cache.semantic_max_bytes,
                    ttl_s=config.cache.semantic_ttl_s,
                    max_prompt_chars=config.cache.semantic_max_prompt_chars,
                ),
                reg,
                metrics,
            )
        runner = GenerationRunner(metrics, cache, semantic)
        app[CHAT] = ChatService(reg, limits, runner)
        app[COMPLETIONS] = CompletionService(reg, limits, runner)
        app[EMBEDDINGS] = EmbeddingService(reg)
        if models_source(config) == "dir":  # else models.dir is not read
            await asyncio.to_thread(shelf.add_from_dir, Path(config.models.dir))
        shelf.say_at_start()
        # the content-safety heads each embedding model version brought (said at start
        # when none): looked up per request, so a synced or swapped-in version brings its own
        app[MODERATION] = ModerationService(shelf.current)
        app[MODERATION_GATE] = ModerationGate(shelf.current, metrics)
        # the app owns the engines' loops: started here, awaited at cleanup; an engine that
        # fails past its restart policy marks the agent unhealthy (/healthz 503, reports)
        try:
            await reg.start(on_dead=app[STATE].mark_unhealthy)
            if sync is not None:
                sync.set_on_dead(app[STATE].mark_unhealthy)
            yield
        finally:
            await app[OVERFLOW].close()
            if sync is not None:
                await sync.close()
            await reg.close()

    return ctx


def _version_of(app: web.Application) -> Callable[[str], str | None]:
    def version_of(model_id: str) -> str | None:
        registry = app.get(REGISTRY)
        if registry is None:
            return None
        model = registry.text_models.get(model_id) or registry.embedding_models.get(model_id)
        return None if model is None else model.version

    return version_of


def create_app(
    config: AgentConfig, registry: ModelRegistry | None = None, *, keys: KeyTable | None = None
) -> web.Application:
    """Build the agent's app. Models load at startup unless a ``registry`` is given (not
    started: the app starts its engines and closes them at cleanup, as for its own).
    API keys are checked against ``keys`` (default: what ``config`` says, see
    ``agent.auth.startup``) by a middleware of their own, inside errors_and_metrics."""
    keys = key_table_for(config) if keys is None else keys
    app = web.Application(client_max_size=config.server.max_body_bytes)
    app.middlewares.extend([errors_and_metrics, key_gate(keys, _version_of(app))])
    app[CONFIG] = config
    app[METRICS] = AgentMetrics()
    app[STARTED] = time.time()
    app[STATE] = AgentState()
    app[KEYS] = keys
    app[REDACTOR] = Redactor.from_config(config.redaction, registry=app[METRICS].registry)
    # Overflow to peers, pools and providers (agent/overflow); targets come from the
    # coordinator's desired state (the session's on_desired_state), or tests.
    app[OVERFLOW] = overflow_service_for(config, app[METRICS].registry, app[REDACTOR])
    app[MODEL_STATS] = ModelStatsCollector()
    routes = [r for r in ROUTES if r.path != BLOBS_PATH]
    if config.models.serve_blobs:

        def store() -> ModelStore | None:
            sync = app.get(SYNC)
            return None if sync is None else sync.store

        def fetching(hex_: str) -> bool:
            sync = app.get(SYNC)
            return sync is not None and hex_ in sync.fetcher.downloading

        routes.append(web.get(BLOBS_PATH, blob_handler(store, fetching)))
    app[ADMIN_TOKEN] = AdminToken(admin_token_path(config))
    routes.extend(admin_routes(lambda request: request.app[REGISTRY]))
    app.add_routes(routes)
    app.cleanup_ctx.append(_registry_ctx(registry))
    # Per-request records: the agent's entry point opens the spool once it knows its id
    # (``RequestLogSlot.open``); until then, and when standalone, none are kept.
    app[REQUEST_LOG] = RequestLogSlot(app[METRICS].registry)
    return app
