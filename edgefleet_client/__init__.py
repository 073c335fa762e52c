"""edgefleet_client: find the nearest, least loaded edgefleet agent and talk to it.

Imports nothing heavy (no onnxruntime, numpy or grpc): route lookups use the
standard library, LAN discovery uses zeroconf, and the ``openai`` / ``httpx2``
packages (the ``client`` extra) are imported only when an OpenAI client is asked for.
Streamed completions that break after some tokens resume on another agent serving the same
model version (:class:`StreamSegment` records which agent served which part).
"""

from __future__ import annotations

from edgefleet_client._client import FleetClient
from edgefleet_client._exceptions import (
    DiscoveryError,
    EdgefleetClientError,
    NoAgentAvailableError,
)
from edgefleet_client._mdns import browse_mdns
from edgefleet_client._models import Agent, StreamSegment
from edgefleet_client._probe import probe_rtt_ms
from edgefleet_client._route import route_lookup

__all__ = [
    "Agent",
    "DiscoveryError",
    "EdgefleetClientError",
    "FleetClient",
    "NoAgentAvailableError",
    "StreamSegment",
    "browse_mdns",
    "probe_rtt_ms",
    "route_lookup",
]
