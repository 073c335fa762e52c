"""Every exception edgefleet_client raises on purpose.

::

    EdgefleetClientError          root
     ├── DiscoveryError           no agent could be found (coordinator lookup or mDNS)
     └── NoAgentAvailableError    every known agent failed this request
"""

from __future__ import annotations


class EdgefleetClientError(Exception):
    """Root of the client library's errors."""


class DiscoveryError(EdgefleetClientError):
    """Finding agents failed: the coordinator is unreachable or nothing answered on mDNS."""


class NoAgentAvailableError(EdgefleetClientError):
    """Every agent was tried and failed (connection errors, 429 or 503)."""


def no_agent_error(model: str, failures: list[str]) -> NoAgentAvailableError:
    """The error for a request every agent of ``model`` failed (``failures``: why each)."""
    return NoAgentAvailableError(
        f"every agent for {model!r} failed: " + "; ".join(failures or ["none known"])
    )
