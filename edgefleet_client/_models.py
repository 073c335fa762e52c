"""Plain data the client library hands out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent a client can send requests to."""

    agent_id: str
    # Base URL of the agent's HTTP API, without /v1, e.g. "http://10.0.0.7:8000".
    url: str
    site: str = ""
    # The coordinator's score (higher is better); None for agents found by mDNS.
    score: float | None = None
    # Models the agent advertised (mDNS); empty when unknown.
    models: tuple[str, ...] = ()
    # Queue depth the agent advertised (mDNS); None when unknown.
    load: int | None = None
    # Round-trip time measured by this client (TCP connect), ms; None until probed.
    rtt_ms: float | None = None
    # "coordinator" or "mdns".
    source: str = "coordinator"
    score_parts: dict[str, float] = field(default_factory=dict, compare=False)


@dataclass(slots=True)
class StreamSegment:
    """One agent's part of a streamed completion (a resumed stream has several)."""

    agent_id: str
    url: str
    # index, in the completion, of this segment's first token
    first_token: int = 0
    # completion tokens this agent delivered
    tokens: int = 0
