"""edgefleet_client: find the nearest, least loaded edgefleet agent and talk to it.

Imports nothing heavy (no onnxruntime, numpy or grpc): route lookups use the
standard library, LAN discovery uses zeroconf, and the ``openai`` / ``httpx2``
packages are imported only when an OpenAI client is asked for.
"""

from __future__ import annotations

from edgefleet_client._client import FleetClient
from edgefleet_client._exceptions import (
    DiscoveryError,
    EdgefleetClientError,
    NoAgentAvailableError,
)
from edgefleet_client._mdns import browse_mdns
from edgefleet_client._models import Agent
from edgefleet_client._probe import probe_rtt_ms
from edgefleet_client._route import route_lookup

__all__ = [
    "Agent",
    "DiscoveryError",
    "EdgefleetClientError",
    "FleetClient",
    "NoAgentAvailableError",
    "browse_mdns",
    "probe_rtt_ms",
    "route_lookup",
]
