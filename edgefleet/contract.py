"""The agent<->coordinator contract as plain Python: one dataclass per protobuf message.

Both processes use these types (the agent to build what it sends and hold what it
gets, the coordinator to record and route); protobuf stays at the edges
(``edgefleet.contract_pb`` converts, ``coordinator.rpc.convert`` validates what agents
send). Names and fields are those of ``protos/edgefleet/v1/fleet.proto``; the comments
there define each field. Standard library only, so both sides import it cheaply.

Where the proto has an optional field (``Hello.location``, the DesiredState sections),
the dataclass says ``None`` for unset: unknown stays unknown.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

#: The contract's major version is the proto package (``edgefleet.v1``).
CONTRACT_MAJOR = 1
#: The minor version this code speaks; see the top of fleet.proto for the history.
CONTRACT_MINOR = 3


def contract_minor_accepted(minor: int, ours: int = CONTRACT_MINOR) -> bool:
    """True when a peer speaking ``minor`` can talk to us: one minor version apart at most."""
    return abs(minor - ours) <= 1


# ------------------------------------------------------------------ shared types


@dataclass(frozen=True, slots=True)
class Location:
    """A point on Earth in WGS84 degrees."""

    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class Hardware:
    """What an edge box has to run models on."""

    cpu_count: int = 0
    memory_bytes: int = 0
    # ONNX Runtime execution providers, e.g. "CUDAExecutionProvider".
    execution_providers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model an agent has loaded and serves now."""

    name: str
    version: str
    # "text-generation", "feature-extraction", ...
    task: str = ""
    # Quantization / build variant, e.g. "int4", "fp16".
    variant: str = ""


class OverflowKind(enum.StrEnum):
    UNSPECIFIED = "unspecified"
    # Another agent at the same site.
    PEER = "peer"
    # A cloud GPU pool we run.
    GPU_POOL = "gpu_pool"
    # A hosted provider speaking the OpenAI wire format.
    HOSTED_PROVIDER = "hosted_provider"


class OverflowApi(enum.StrEnum):
    """The wire format an overflow target speaks (v1.3)."""

    UNSPECIFIED = "unspecified"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    # Another edgefleet agent: OpenAI's format plus the hop marker and continuation.
    EDGEFLEET = "edgefleet"


class OverflowEndpoint(NamedTuple):
    """One endpoint of a pool (v1.3): picked by weight among those with room."""

    url: str
    weight: float = 1.0
    # Requests in flight at most; 0: no cap.
    capacity: int = 0


@dataclass(frozen=True, slots=True)
class OverflowTarget:
    """Where an agent may send work it cannot take itself."""

    name: str
    kind: OverflowKind
    # Base URL of the target's OpenAI-compatible API.
    url: str
    # Models the target serves; empty means any.
    models: tuple[str, ...] = ()
    # v1.3 from here on.
    api: OverflowApi = OverflowApi.UNSPECIFIED
    # A pool's endpoints (empty: just ``url``).
    endpoints: tuple[OverflowEndpoint, ...] = ()
    # NAMES of where the credential is on the agent (environment variable, secret file);
    # never the value.
    credential_env: str = ""
    credential_file: str = ""
    # Prices per 1,000 tokens.
    prompt_price_per_1k: float = 0.0
    completion_price_per_1k: float = 0.0
    # A broken stream may be continued on this target.
    supports_continuation: bool = False
    # Constrained requests (response_format json_schema, grammars) may go here.
    supports_constraints: bool = False
    # Model name at the target, by the fleet's model name (absent: the same name).
    model_names: Mapping[str, str] = field(default_factory=dict)
    # Peers: their site and free sequence slots as the coordinator last saw them.
    site: str = ""
    free_slots: int = 0
    # Timeouts in milliseconds (0: the agent's defaults).
    connect_timeout_ms: int = 0
    first_token_timeout_ms: int = 0
    total_timeout_ms: int = 0


# ------------------------------------------------------------------ agent -> coordinator


@dataclass(frozen=True, slots=True)
class Hello:
    """First message of every session: who the agent is and what it serves."""

    agent_id: str
    site: str = ""
    # Base URL of the agent's HTTP API; empty when the agent did not say.
    http_url: str = ""
    # The agent software's version.
    agent_version: str = ""
    # None when the agent does not know where it is.
    location: Location | None = None
    hardware: Hardware = field(default_factory=Hardware)
    models: tuple[LoadedModel, ...] = ()
    # Credential from Enroll; never printed.
    token: str = field(default="", repr=False)
    # The minor contract version the agent speaks (0 for agents from before versions,
    # which a coordinator at v1.2 or later refuses).
    contract_minor: int = CONTRACT_MINOR


class SectionGenerations(NamedTuple):
    """A generation per DesiredState section (0: never set / never applied)."""

    models: int = 0
    overflow_targets: int = 0
    keys: int = 0
    config: int = 0


class KeyUsage(NamedTuple):
    """What one API key used on one agent over one report interval."""

    key_id: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Requests refused for this key (rate limit, scope, expiry).
    rejected: int = 0


class OverflowUsage(NamedTuple):
    """One overflow target's use by one agent over one report interval (v1.3)."""

    target: str
    requests: int = 0
    # Of those, the ones the target failed (after retries and failover).
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # From the target's prices, summed from the per-request records.
    cost: float = 0.0


class ModelInventoryState(enum.StrEnum):
    """Where one model version stands on one agent (``ModelInventory.State``)."""

    UNSPECIFIED = "unspecified"
    DOWNLOADING = "downloading"
    ON_DISK = "on_disk"
    LOADING = "loading"
    CHECKING = "checking"
    LOADED = "loaded"
    FAILED = "failed"


class SelfCheckResult(NamedTuple):
    """The accuracy gate recomputed on the box (v1.3)."""

    passed: bool
    perplexity: float = 0.0
    # perplexity / the manifest's fp32 reference perplexity.
    perplexity_ratio: float = 0.0
    greedy_matched: int = 0
    greedy_total: int = 0
    seconds: float = 0.0
    # Why it failed; empty when it passed.
    detail: str = ""


class ModelInventory(NamedTuple):
    """One model version on one agent (v1.3)."""

    name: str
    version: str
    state: ModelInventoryState = ModelInventoryState.UNSPECIFIED
    bytes_done: int = 0
    bytes_total: int = 0
    last_error: str = ""
    self_check: SelfCheckResult | None = None
    bytes_from_peers: int = 0
    bytes_from_coordinator: int = 0
    # Bytes its weights hold in memory now; 0: served here, loaded on its next request.
    resident_bytes: int = 0


class Histogram(NamedTuple):
    """Per-bucket counts (not cumulative): ``counts[i]`` is observations in
    ``(upper_bounds[i-1], upper_bounds[i]]``; the last count is above every bound."""

    upper_bounds: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    sum: float = 0.0


class ModelStats(NamedTuple):
    """What one model version served on one agent since the previous report (v1.3)."""

    name: str
    version: str
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Time to first token, seconds.
    ttft_seconds: Histogram = Histogram()


class LoadReport(NamedTuple):
    """One load sample from an agent; fleet.proto defines each field.

    A NamedTuple of plain values, not a dataclass: the collector stops tracking such
    tuples, so the thousands of samples a coordinator replaces every second never pile
    up in the old generation and never make full collections due sooner.
    """

    running_sequences: int = 0
    waiting_sequences: int = 0
    tokens_per_second: float = 0.0
    kv_cache_used_fraction: float = 0.0
    kv_cache_used_tokens: int = 0
    free_memory_bytes: int = 0
    requests_total: int = 0
    requests_failed_total: int = 0
    draining: bool = False
    # Empty while the agent is healthy.
    unhealthy_reason: str = ""
    # The generation of each DesiredState section the agent has applied.
    applied: SectionGenerations = SectionGenerations()
    # What each API key used here since the previous report (v1.2).
    key_usage: tuple[KeyUsage, ...] = ()
    # Every model version on this agent (v1.3).
    inventory: tuple[ModelInventory, ...] = ()
    # What each model version served since the previous report (v1.3).
    model_stats: tuple[ModelStats, ...] = ()
    # Values redacted before requests left the site since agent start, as (entity type,
    # count) pairs sorted by type; never a value (v1.3).
    redactions: tuple[tuple[str, int], ...] = ()
    # What each overflow target served for this agent since the previous report (v1.3).
    overflow_usage: tuple[OverflowUsage, ...] = ()
    # Models served here whose weights are not in memory now, as (name, expected load
    # seconds) pairs sorted by name: a request for one waits for its load (v1.3).
    cold_models: tuple[tuple[str, float], ...] = ()
    # The memory budget of the loaded models and what they commit of it (v1.3).
    memory_budget_bytes: int = 0
    memory_committed_bytes: int = 0
    # The moderation heads this agent scores with now, "name@version"; "" none (v1.3).
    moderation_heads: str = ""
    # Requests flagged or blocked since agent start, as ("category:action", count) and
    # (API key id, count) pairs sorted by name; never any text (v1.3).
    moderation_flags: tuple[tuple[str, int], ...] = ()
    moderation_flags_by_key: tuple[tuple[str, int], ...] = ()
    # The semantic cache's lookups since agent start, as (outcome, count) pairs sorted by
    # outcome: hit, miss, refused (the guard said no), ineligible (v1.3).
    semantic_cache_lookups: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RenewCertificate:
    """The agent asks for a new certificate on the key it keeps (v1.2)."""

    csr_pem: str


@dataclass(frozen=True, slots=True)
class RequestRecords:
    """A batch of per-request records from the agent's spool (v1.2)."""

    # Sequence number of the first record; records are numbered from 1.
    first_seq: int
    # msgpack array of record maps (agent/request_log.py says the fields).
    records_msgpack: bytes = field(repr=False)
    # Records lost before this batch because the spool was full.
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class Bye:
    """The agent is leaving on purpose (shutdown or drain); not an error."""

    reason: str = ""


# ------------------------------------------------------------------ coordinator -> agent


@dataclass(frozen=True, slots=True)
class Welcome:
    """Answer to Hello: the session is accepted."""

    session_id: str
    report_interval_ms: int
    contract_minor: int = CONTRACT_MINOR
    # The coordinator's model-signing public key, raw 32 bytes (v1.3; empty: none).
    model_signing_key: bytes = b""
    # The gRPC addresses (host:port) of the coordinators alive now, this one first (v1.3,
    # added within the minor; empty: none known). Unchecked here: the agent checks each.
    coordinators: tuple[str, ...] = ()


class Residency(enum.StrEnum):
    """How an agent holds one model's weights (``ModelTarget.residency``)."""

    # Loaded by its first request; unloaded when idle past the keep-alive or for room.
    ON_DEMAND = "on_demand"
    # Loaded once verified; never unloaded for room or idleness.
    PINNED = "pinned"
    # Kept verified on disk but not served (routing skips the agent for it).
    STORE_ONLY = "store_only"


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """A model version an agent should have loaded and serving, and where to fetch it."""

    name: str
    version: str
    # Base URL of the coordinator's blob store: a file with sha256 H is at
    # ``{artifact_url}/sha256/{H}``.
    artifact_url: str
    # Hex sha256 of ``manifest``.
    sha256: str
    # The signed manifest bytes and their ed25519 signature (v1.3).
    manifest: bytes = field(default=b"", repr=False)
    signature: bytes = field(default=b"", repr=False)
    # Site peers' blob base URLs to ask first (v1.3).
    peer_urls: tuple[str, ...] = ()
    # The rollout that set this target; empty for a static assignment (v1.3).
    rollout_id: str = ""
    # How the agent holds the weights in memory (v1.3, additive).
    residency: Residency = Residency.ON_DEMAND


@dataclass(frozen=True, slots=True)
class ModelsSection:
    generation: int
    models: tuple[ModelTarget, ...] = ()


@dataclass(frozen=True, slots=True)
class OverflowTargetsSection:
    generation: int
    targets: tuple[OverflowTarget, ...] = ()


class ModerationDirection(enum.StrEnum):
    """Which text a moderation rule checks."""

    INPUT = "input"  # what goes into the model (chat user/tool messages, prompts)
    OUTPUT = "output"  # what comes out of it


class ModerationAction(enum.StrEnum):
    """What a flagged category does to a request."""

    BLOCK = "block"  # input: 400 content_filter; output: cut with finish_reason content_filter
    FLAG = "flag"  # a header and a metric only
    OFF = "off"  # not checked


class ModerationStreamMode(enum.StrEnum):
    """How a streamed completion's output is checked."""

    BUFFERED = "buffered"  # a window held back, checked, then sent
    UNBUFFERED = "unbuffered"  # sent at once, checked behind (sent text cannot be recalled)


@dataclass(frozen=True, slots=True)
class ModerationRule:
    """One category's action in one direction."""

    category: str
    direction: ModerationDirection
    action: ModerationAction
    # Score (0..1] at which the category counts; 0: the classifier's own threshold.
    threshold: float = 0.0


@dataclass(frozen=True, slots=True)
class ModerationPolicy:
    """A key's moderation policy; a category without a rule keeps the default (block for
    sexual/minors, flag for the rest)."""

    rules: tuple[ModerationRule, ...] = ()
    stream_mode: ModerationStreamMode = ModerationStreamMode.BUFFERED


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """A key's policy: one structure that later per-key settings extend (v1.3)."""

    moderation: ModerationPolicy = ModerationPolicy()
    # Deterministic requests may be answered from the semantic cache (issue 29); off: the
    # exact response cache only.
    semantic_cache: bool = False


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as an agent checks it: its digest and scopes, never the secret."""

    # Public id; the secret is "ef-<key_id>-<random>".
    key_id: str
    # SHA-256 of the whole secret string.
    secret_sha256: bytes = field(repr=False)
    # "name" or "name@version"; empty: every model.
    models: tuple[str, ...] = ()
    # Requests with this key may leave the site (overflow to cloud pools and providers).
    allow_cloud: bool = False
    # Highest priority a request may ask for: "high", "normal" or "low".
    max_priority: str = "normal"
    # Most tokens one request may ask for; 0: the model's limit.
    max_tokens_per_request: int = 0
    # This agent's share of the key's rate limits; 0: unlimited.
    requests_per_minute: float = 0.0
    tokens_per_minute: float = 0.0
    # Unix seconds after which the key is refused; 0: never.
    expires_at_unix: int = 0
    # Human label (not secret).
    name: str = ""
    # Longest keep_alive a request with this key may ask, seconds; 0: the agent's own
    # cap, which also bounds this one (v1.3, additive).
    max_keep_alive_s: float = 0.0
    # Requests with this key may pin a model (keep_alive < 0) (v1.3, additive).
    may_pin_models: bool = False
    # What the agent does for this key's requests beyond its scopes (v1.3, additive).
    policy: KeyPolicy = field(default_factory=KeyPolicy)


@dataclass(frozen=True, slots=True)
class KeysSection:
    generation: int
    # Every API key valid on the agent (v1.2); a key not listed is refused.
    keys: tuple[ApiKey, ...] = ()


@dataclass(frozen=True, slots=True)
class ConfigSection:
    generation: int
    # Agent settings by config key, e.g. {"engine.max_batch_size": "8"}.
    values: Mapping[str, str] = field(default_factory=dict)


Section = ModelsSection | OverflowTargetsSection | KeysSection | ConfigSection

#: DesiredState's field for each section type.
SECTION_FIELDS: dict[type[Section], str] = {
    ModelsSection: "models",
    OverflowTargetsSection: "overflow_targets",
    KeysSection: "keys",
    ConfigSection: "config",
}


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What the coordinator wants an agent to run, in sections.

    In a message, an unset (None) section is unchanged; as what a side holds, None
    means "never set".
    """

    # Grows whenever any section changes for the agent.
    version: int = 0
    models: ModelsSection | None = None
    overflow_targets: OverflowTargetsSection | None = None
    keys: KeysSection | None = None
    config: ConfigSection | None = None

    def sections(self) -> tuple[Section, ...]:
        """The sections that are set."""
        found = (self.models, self.overflow_targets, self.keys, self.config)
        return tuple(s for s in found if s is not None)

    def generations(self) -> SectionGenerations:
        return SectionGenerations(
            models=_generation(self.models),
            overflow_targets=_generation(self.overflow_targets),
            keys=_generation(self.keys),
            config=_generation(self.config),
        )

    def with_section(self, section: Section) -> DesiredState:
        """This state with ``section`` in place of the one of its kind."""
        if isinstance(section, ModelsSection):
            return replace(self, models=section)
        if isinstance(section, OverflowTargetsSection):
            return replace(self, overflow_targets=section)
        if isinstance(section, KeysSection):
            return replace(self, keys=section)
        return replace(self, config=section)

    def merged(self, update: DesiredState) -> tuple[DesiredState, tuple[str, ...]]:
        """Apply a received ``update``: each of its sections newer than ours replaces ours.

        Returns the new state and the names of the sections that changed.
        """
        merged, changed = self, []
        for section in update.sections():
            name = SECTION_FIELDS[type(section)]
            if section.generation > _generation(getattr(self, name)):
                merged = merged.with_section(section)
                changed.append(name)
        if update.version > merged.version:
            merged = replace(merged, version=update.version)
        return merged, tuple(changed)


def _generation(section: Section | None) -> int:
    return 0 if section is None else section.generation


@dataclass(frozen=True, slots=True)
class CertificateIssued:
    """The answer to RenewCertificate (v1.2)."""

    client_cert_pem: str
    ca_cert_pem: str
    # When client_cert_pem expires, Unix seconds.
    not_after_unix: int


@dataclass(frozen=True, slots=True)
class RecordsAck:
    """Request records stored durably up to and including ``through_seq`` (v1.2)."""

    through_seq: int


class CommandKind(enum.StrEnum):
    UNSPECIFIED = "unspecified"
    # Stop accepting new requests, finish running ones.
    DRAIN = "drain"
    # Re-read local configuration and model store.
    RELOAD = "reload"
    # End a drain: accept new requests again.
    RESUME = "resume"
    # Load ``Command.model``'s weights now; unload them (it stays served) (v1.3).
    LOAD_MODEL = "load_model"
    UNLOAD_MODEL = "unload_model"


@dataclass(frozen=True, slots=True)
class Command:
    """An instruction from the coordinator."""

    kind: CommandKind
    reason: str = ""
    # The model a LOAD_MODEL or UNLOAD_MODEL command is about (v1.3).
    model: str = ""
