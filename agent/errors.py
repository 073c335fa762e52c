"""The agent's exceptions, one tree, rooted at :class:`AgentError`.

```
AgentError
├── RequestError                 recoverable: the caller sent something we refuse
│   ├── InvalidRequestError      400 invalid_request_error (names the field in ``param``)
│   │   ├── ContextLengthError   400 context_length_exceeded (states the limits)
│   │   └── InvalidSchemaError   400 invalid_schema: a response_format or tool schema that
│   │                            cannot be compiled (bad, too large, too slow to compile)
│   ├── PayloadTooLargeError     413
│   ├── ModelNotFoundError       404 model_not_found
│   ├── ContentFilterError       400 content_filter: the input was flagged by a category the
│   │                            key's moderation policy blocks (names the categories)
│   └── UnsupportedError         400 a known OpenAI feature this server does not offer
├── InvalidApiKeyError           401 invalid_api_key: no key, or unknown, revoked or expired
├── KeyScopeError                403 model_not_allowed: the key's scopes do not cover the request
├── OverloadedError              429 recoverable: try again later (``retry_after`` seconds)
│   └── KeyRateLimitError        429 rate_limit_exceeded: the key's requests/min or tokens/min
├── RequestTimeoutError          504 recoverable: the request ran past its timeout
├── ModelSyncError               recoverable: a model version could not be fetched, verified,
│   │                            loaded or checked (reported in the inventory; the old
│   │                            version keeps serving)
│   ├── BlobIntegrityError       a fetched file's bytes do not match its sha256
│   ├── ManifestTrustError       a manifest unsigned, wrongly signed or not what was named
│   ├── InsufficientMemoryError  not enough free memory to load a version beside the old one
│   └── SelfCheckFailedError     the on-box accuracy check failed
├── EngineError                  500 recoverable: one request failed inside the engine
│   ├── EngineRestartedError     503 the engine's loop failed and restarted: retry the request
│   └── EngineDeadError          503 the engine failed too often and stopped: not recoverable
├── ModerationUnavailableError   503 moderation_unavailable: no classifier here (no heads, or
│                                their embedding model not served): fail closed
├── InvalidOutputError           502 a constrained output (e.g. from an overflow target) that
│                                does not parse or validate against the request's schema
└── FatalError                   not recoverable: the process cannot serve (bad config, model files)
    ├── ConfigError
    └── ModelLoadError
```

Library errors (onnxruntime, tokenizers, jinja2, json) are converted at the boundary with
``raise ... from exc`` so callers only ever catch these.
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""

    status = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class RequestError(AgentError):
    """The request is at fault; the process is fine."""

    status = 400
    error_type = "invalid_request_error"


class InvalidRequestError(RequestError):
    """A field is missing, of the wrong type, or out of range."""


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested completion does not fit the model's context window."""

    code = "context_length_exceeded"


class InvalidSchemaError(InvalidRequestError):
    """A response_format or tool schema the grammar engine cannot compile, one over the size
    limit, or one whose compilation takes too long; ``param`` names the field."""

    code = "invalid_schema"


class PayloadTooLargeError(RequestError):
    status = 413
    code = "payload_too_large"


class ModelNotFoundError(RequestError):
    status = 404
    code = "model_not_found"


class ContentFilterError(RequestError):
    """The request's input was flagged in a category its key's policy blocks."""

    code = "content_filter"


class UnsupportedError(RequestError):
    """A documented OpenAI feature that this server does not implement."""

    code = "unsupported_parameter"


class OverloadedError(AgentError):
    status = 429
    error_type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0, reason: str = "busy") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason  # queue_full, predicted_wait, queue_timeout (a metrics label)


class RequestTimeoutError(AgentError):
    status = 504
    error_type = "timeout_error"
    code = "request_timeout"


class EngineError(AgentError):
    """Inference failed for one request; other requests are unaffected."""

    status = 500
    error_type = "server_error"
    code = "engine_error"


class EngineRestartedError(EngineError):
    """The engine's loop failed unexpectedly; every sequence in it was dropped and the loop
    restarted. The request did nothing wrong: retrying it (here or elsewhere) should work."""

    status = 503
    code = "engine_restarted"


class EngineDeadError(EngineError):
    """The engine failed more often than its restart policy allows and stopped for good:
    this agent cannot serve the model until it is restarted (it reports itself unhealthy)."""

    status = 503
    code = "engine_unavailable"


class ModelSyncError(AgentError):
    """A model version could not be fetched, verified, loaded or checked. Recoverable: the
    version is reported failed and the one serving keeps serving."""


class BlobIntegrityError(ModelSyncError):
    """A fetched file's bytes do not hash to what its manifest says."""


class ManifestTrustError(ModelSyncError):
    """A manifest that is unsigned (without ``models.allow_unsigned``), not signed by the
    pinned key, or not the name, version or sha256 the coordinator named."""


class InsufficientMemoryError(ModelSyncError):
    """Loading the new version beside the old one would not fit in free memory."""


class SelfCheckFailedError(ModelSyncError):
    """The on-box accuracy check failed against the manifest's recorded figures."""


class ModerationUnavailableError(AgentError):
    """The content-safety classifier cannot run here (no heads artifact, or the embedding
    model it reads is not served): a check that must happen fails closed."""

    status = 503
    error_type = "server_error"
    code = "moderation_unavailable"


class InvalidOutputError(AgentError):
    """A constrained request's output does not parse or validate against its schema (an
    overflow target that ignored the constraint); never returned to the client as is."""

    status = 502
    error_type = "server_error"
    code = "invalid_constrained_output"


class FatalError(AgentError):
    """The agent cannot serve: stop the process with a clear message."""


class ConfigError(FatalError):
    pass


class ModelLoadError(FatalError):
    pass


class InvalidApiKeyError(AgentError):
    """No API key, or one that is unknown, revoked or expired (401)."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class KeyScopeError(AgentError):
    """A valid API key whose scopes do not cover this request (403)."""

    status = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class KeyRateLimitError(OverloadedError):
    """An API key over its requests/min or tokens/min budget on this agent (429)."""

    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, retry_after=retry_after, reason="key_rate_limit")


class AdminForbiddenError(AgentError):
    """The admin API answers only calls from its own box (loopback, or the address called)."""

    status = 403
    error_type = "permission_error"
    code = "admin_loopback_only"


class InvalidAdminTokenError(AgentError):
    """No admin token, or not this agent's (401)."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_admin_token"


class NotManagedError(AgentError):
    """The model is served but its memory is not managed here (an embedding model)."""

    status = 409
    error_type = "invalid_request_error"
    code = "model_not_managed"
