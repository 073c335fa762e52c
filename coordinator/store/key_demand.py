"""Table ``key_demand``: each coordinator's share of the fleet's API-key demand.

An API key's ``requests_per_minute`` and ``tokens_per_minute`` are fleet-wide budgets,
split into per-agent shares (coordinator/access/api_keys.py). With several coordinators
each serving some of the agents, a coordinator that split a budget over its own agents
only would hand out the whole budget once per coordinator (LiteLLM's known failure: a
limit multiplied by the replica count). So every coordinator writes, once per report
interval, how many agents it serves and its agents' smoothed demand per key (one row per
key, plus a row with ``key_id`` "" for the count), and reads the others' rows written
within ``fresh_s`` by the database's clock: the split is over the whole fleet. A
coordinator that died stops counting once its rows are older than ``fresh_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

#: The row holding a coordinator's agent count.
COUNT_ROW = ""


@dataclass(frozen=True, slots=True)
class FleetDemand:
    """The other coordinators' agents and per-key demand (requests/min, tokens/min)."""

    agents: int = 0
    demand: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    coordinators: int = 0


class KeyDemandTable(Protocol):
    async def save_key_demand(
        self, coordinator_id: str, agents: int, demand: Mapping[str, tuple[float, float]]
    ) -> None:
        """Replace this coordinator's rows: its agent count and per-key demand."""
        ...

    async def other_key_demand(self, coordinator_id: str, fresh_s: float) -> FleetDemand:
        """The sums over the other coordinators' rows written within ``fresh_s``."""
        ...
