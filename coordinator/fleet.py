"""The coordinator's internal picture of the fleet, as plain dataclasses.

Transport code converts wire messages into these (see ``coordinator.proto_convert``);
everything behind the transport works with these only.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def valid_agent_id(agent_id: str) -> bool:
    """1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit."""
    return _AGENT_ID.match(agent_id) is not None


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
    # Accelerator names, e.g. "NVIDIA L4".
    accelerators: tuple[str, ...] = ()
    # ONNX Runtime execution providers, e.g. "CUDAExecutionProvider".
    execution_providers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model an agent has loaded and serves now."""

    name: str
    version: str
    task: str = ""
    variant: str = ""


@dataclass(frozen=True, slots=True)
class AgentHello:
    """What an agent says about itself when it opens a session."""

    agent_id: str
    site: str
    # Base URL of the agent's HTTP API; empty when the agent did not say.
    http_url: str
    agent_version: str = ""
    location: Location | None = None
    hardware: Hardware = field(default_factory=Hardware)
    models: tuple[LoadedModel, ...] = ()
    # Credential from Enroll; never printed.
    token: str = field(default="", repr=False)


class LoadReport(NamedTuple):
    """One load sample from an agent.

    A NamedTuple of plain numbers, not a dataclass: the collector stops tracking such
    tuples, so the thousands of samples replaced every second never pile up in the
    old generation and never make full collections due sooner.
    """

    # When the agent took the sample (UTC); None when it did not say.
    timestamp: datetime | None
    # Requests accepted but not yet started.
    queue_depth: int = 0
    # Sequences in the running batch.
    running_sequences: int = 0
    # Sequences waiting for a batch slot.
    waiting_sequences: int = 0
    # Generated tokens per second over the last interval.
    tokens_per_second: float = 0.0
    # Fraction [0, 1] of the KV cache in use.
    kv_cache_used_fraction: float = 0.0
    kv_cache_used_tokens: int = 0
    free_memory_bytes: int = 0
    # Counters since agent start.
    requests_total: int = 0
    requests_failed_total: int = 0
    overflow_requests_total: int = 0
    # The agent says it is draining (it got a drain Command): no new routes.
    draining: bool = False


class AgentStatus(enum.StrEnum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


class Liveness(enum.StrEnum):
    """How recently an agent reported, in report intervals (see coordinator.liveness)."""

    # Reported within the last `suspect_after_reports` intervals: routed normally.
    LIVE = "live"
    # Missed `suspect_after_reports` reports: still routed, after every live agent.
    SUSPECT = "suspect"
    # Known before a coordinator restart, not reconnected yet: routed with its last
    # saved state, after every live agent, until `restart_grace_s` ends (then down).
    UNCONFIRMED = "unconfirmed"
    # Missed `down_after_reports` reports, said Bye, or not heard of since a restart.
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """Everything the registry knows about one agent."""

    hello: AgentHello
    status: AgentStatus
    # Id of the current (or last) session.
    session_id: str
    # When the current session opened; None while disconnected.
    connected_since: datetime | None
    # Last time any message from the agent arrived (UTC).
    last_seen: datetime
    # Latest load sample; None until the first one arrives.
    last_report: LoadReport | None = None
    # Reason from the agent's Bye, if it said goodbye.
    bye_reason: str | None = None
    liveness: Liveness = Liveness.LIVE
    # An operator drained the agent: it finishes running work and gets no new routes.
    draining: bool = False
    # The agent enrolled with a join token (its sessions are authenticated).
    enrolled: bool = False

    @property
    def agent_id(self) -> str:
        return self.hello.agent_id


class OverflowKind(enum.StrEnum):
    PEER = "peer"
    GPU_POOL = "gpu_pool"
    HOSTED_PROVIDER = "hosted_provider"


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """A model version an agent should have and where to fetch it."""

    name: str
    version: str
    artifact_url: str
    sha256: str


@dataclass(frozen=True, slots=True)
class OverflowTarget:
    """Where an agent may send work it cannot take itself."""

    name: str
    kind: OverflowKind
    url: str
    # Models the target serves; empty means any.
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What the coordinator wants an agent to run. Versions only grow."""

    version: int = 0
    models: tuple[ModelTarget, ...] = ()
    overflow_targets: tuple[OverflowTarget, ...] = ()
    # Free-form settings for the agent, e.g. {"max_batch_size": "8"}.
    config: Mapping[str, str] = field(default_factory=dict)
