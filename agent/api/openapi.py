"""The OpenAPI 3.1 document of every HTTP route, built from the pydantic models."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from agent.api import protocol as p
from agent.api.http_io import STREAM_ERROR_CODES
from agent.auth.middleware import OPEN_PATHS

_REF = "#/components/schemas/{model}"

# path, method, summary, request model, success model, streams
BLOB_PATH = "/v1/blobs/sha256/{hex}"
_OPERATIONS: list[tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None, bool]] = [
    (
        "/v1/chat/completions",
        "post",
        "Chat completion (stream: true gives SSE). Content safety per API key: user and "
        "tool messages checked first (400 content_filter naming the categories the key "
        "blocks; X-Edgefleet-Moderation: flagged=... for those it flags; 503 "
        "moderation_unavailable when the key blocks and this agent has no classifier), the "
        "output checked in windows (finish_reason content_filter where it was cut)",
        p.ChatCompletionRequest,
        p.ChatCompletionResponse,
        True,
    ),
    (
        "/v1/completions",
        "post",
        "Text completion (stream: true gives SSE); text prompts and the output are checked "
        "as for chat completions (400 content_filter, finish_reason content_filter)",
        p.CompletionRequest,
        p.CompletionResponse,
        True,
    ),
    (
        "/v1/embeddings",
        "post",
        "Sentence embeddings",
        p.EmbeddingRequest,
        p.EmbeddingResponse,
        False,
    ),
    (
        "/v1/moderations",
        "post",
        "Content-safety classification of texts (OpenAI's moderation shape, plus "
        "prompt_injection); 503 moderation_unavailable when this agent has no classifier",
        p.ModerationRequest,
        p.ModerationResponse,
        False,
    ),
    ("/v1/models", "get", "Models served by this agent", None, p.ModelList, False),
    ("/healthz", "get", "Liveness and current load", None, p.Health, False),
    ("/metrics", "get", "Prometheus metrics (text format)", None, None, False),
    ("/openapi.json", "get", "This document", None, None, False),
    (
        BLOB_PATH,
        "get",
        "A blob of this agent's model store, for site peers (Range, strong ETag)",
        None,
        None,
        False,
    ),
]

_ERRORS = {
    "400": "Invalid request (the field is named in error.param)",
    "404": "Unknown model or route",
    "413": "Request body over the configured limit",
    "429": "Overloaded, or the key's rate limit reached; retry after the Retry-After header",
    "500": "Inference failed",
    "503": "The engine restarted (retry) or stopped (the agent is unhealthy), or "
    "moderation_unavailable",
    "504": "The request ran past its timeout (X-Request-Timeout or the default)",
}

# What the API-key gate answers on every route it guards (agent/auth/middleware.py), when
# the agent requires keys (a keys file or a coordinator).
_KEY_ERRORS = {
    "401": "No API key, or not a valid one (WWW-Authenticate: Bearer)",
    "403": "The key may not use this model (model_not_allowed)",
    "429": "The key's requests or tokens per minute are spent; retry after Retry-After",
}


_SSE_DESCRIPTION = (
    "data: <chunk JSON> events, ending with data: [DONE]. A failure after the first event "
    "(the status line is already out) ends the stream with one error event in the shape of "
    'ErrorResponse, data: {"error": {"message", "type", "param", "code"}}, then '
    "data: [DONE]; it never ends silently. error.code by cause: "
    + "; ".join(f"{code}: {why}" for code, why in STREAM_ERROR_CODES.items())
    + ". With return_token_ids each chunk's choice carries token_ids; a client resumes a "
    "broken stream by sending the concatenated ids back as continue_token_ids (to this or "
    "another agent serving the same model version, see system_fingerprint)."
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _sse_event(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event (OpenAPI 3.1: a text/event-stream ``schema`` describes each
    event): its data is a chunk, the error event that ends a broken stream, or [DONE]."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": {"const": "message"},
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [_ref(chunk), _ref(p.ErrorResponse)]},
                    },
                ]
            },
        },
    }


@cache
def _admin_paths() -> dict[str, Any]:
    """The loopback admin API (agent/api/admin.py)."""
    error = {"application/json": {"schema": _ref(p.ErrorResponse)}}
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    refused = {
        "401": {"description": "No admin token, or not this agent's", "content": error},
        "403": {"description": "Not from this box (admin_loopback_only)", "content": error},
    }
    found = {
        "400": {"description": "Not a model name", "content": error},
        "404": {"description": "Not a model served here", "content": error},
        "409": {"description": "An embedding model: always loaded", "content": error},
    }
    json_ok = {"application/json": {"schema": {"type": "object"}}}

    def op(summary: str, extra: dict[str, Any], params: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "summary": summary,
            "security": [{"adminToken": []}],
            "responses": {"200": {"description": "Success", "content": json_ok}} | refused
            | extra,
        }  # fmt: skip
        if params:
            body["parameters"] = [model]
        return body

    loading = found | {
        "202": {"description": "Still loading after 120 s (it goes on)", "content": json_ok},
        "503": {"description": "No room in the memory budget, or the load failed "
                "(Retry-After)", "content": error},
    }  # fmt: skip
    return {
        "/v1/admin/models": {"get": op("Every text model's residency (admin)", {}, False)},
        "/v1/admin/models/{model}/load": {
            "post": op("Load the model's weights now (admin, loopback)", loading, True)
        },
        "/v1/admin/models/{model}/unload": {
            "post": op("Unload the model's weights once idle (admin, loopback)", found, True)
        },
    }


def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [p.ErrorResponse, p.ChatCompletionChunk]
    for _, _, _, req, resp, _ in _OPERATIONS:
        models += [m for m in (req, resp) if m is not None]
    unique = list(dict.fromkeys(models))
    _, schemas = models_json_schema([(m, "validation") for m in unique], ref_template=_REF)
    paths: dict[str, Any] = {}
    for path, method, summary, req, resp, streams in _OPERATIONS:
        ok: dict[str, Any] = {"description": "Success"}
        if resp is not None:
            ok["content"] = {"application/json": {"schema": _ref(resp)}}
        elif path == "/metrics":
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        elif path == BLOB_PATH:
            ok["content"] = {"application/octet-stream": {"schema": {"type": "string"}}}
        else:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        if streams and resp is not None:
            ok["content"]["text/event-stream"] = {
                "schema": _sse_event(
                    p.ChatCompletionChunk if resp is p.ChatCompletionResponse else resp
                ),
                "description": _SSE_DESCRIPTION,
            }
        op: dict[str, Any] = {"summary": summary, "responses": {"200": ok}}
        if req is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(req)}},
            }
            for status, description in _ERRORS.items():
                op["responses"][status] = {
                    "description": description,
                    "content": {"application/json": {"schema": _ref(p.ErrorResponse)}},
                }
        if path == BLOB_PATH:
            op["parameters"] = [{
                "name": "hex", "in": "path", "required": True,
                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            }]  # fmt: skip
            octets = {"application/octet-stream": {"schema": {"type": "string"}}}
            error = {"application/json": {"schema": _ref(p.ErrorResponse)}}
            op["responses"].update({
                "206": {"description": "The requested byte range", "content": octets},
                "304": {"description": "Not modified (If-None-Match)"},
                "404": {"description": "No such blob here", "content": error},
                "416": {"description": "Range not satisfiable", "content": error},
            })  # fmt: skip
        elif path not in OPEN_PATHS:
            op["security"] = [{"bearer": []}]
            for status, description in _KEY_ERRORS.items():
                op["responses"].setdefault(status, {
                    "description": description,
                    "content": {"application/json": {"schema": _ref(p.ErrorResponse)}},
                })  # fmt: skip
        if path == "/v1/moderations":
            op["responses"]["503"]["description"] = (
                "moderation_unavailable: this agent has no classifier (no heads for a served "
                "embedding model, or that model is not served); engine_restarted or "
                "engine_unavailable as elsewhere"
            )
        if path == "/healthz":
            op["responses"]["503"] = {
                "description": "The agent cannot serve (a dead engine): the reason is in "
                "unhealthy_reason",
                "content": {"application/json": {"schema": _ref(p.Health)}},
            }
        paths[path] = {method: op}
    paths.update(_admin_paths())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "edgefleet agent API",
            "version": "1",
            "description": "OpenAI-compatible inference API of an edgefleet agent.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            # API keys (when the agent requires them: a keys file or a coordinator); the
            # OpenAI SDK sends its api_key this way
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the agent's admin token (auth.admin_token_file), from "
                    "loopback only: never an API key",
                },
            },
        },
    }
