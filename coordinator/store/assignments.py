"""Which model versions agents should run, as stored (tables ``model_rules`` and
``model_assignments``). coordinator/catalog/assignments.py keeps both in memory and
writes each change here first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RuleRecord:
    """A selector rule: agents it matches run ``name@version`` (the newest rule wins)."""

    seq: int
    name: str
    # The selector as canonical JSON; one rule per (name, selector).
    selector: str
    version: str
    rollout_id: str
    set_at: datetime
    # How agents hold the weights: "on_demand", "pinned" or "store_only" (migration 15).
    residency: str = "on_demand"


@dataclass(frozen=True, slots=True)
class AssignmentRecord:
    """An explicit per-agent choice, over the rules."""

    agent_id: str
    name: str
    version: str
    rollout_id: str
    set_at: datetime
    residency: str = "on_demand"


class AssignmentTable(Protocol):
    async def set_model_rule(
        self,
        name: str,
        selector: str,
        version: str,
        rollout_id: str,
        set_at: datetime,
        residency: str = "on_demand",
    ) -> int:
        """Replace the rule for (name, selector); the new rule's seq (newer: larger)."""
        ...

    async def delete_model_rule(self, name: str, selector: str) -> None: ...

    async def list_model_rules(self) -> list[RuleRecord]:
        """Oldest first."""
        ...

    async def set_model_assignments(self, assignments: Sequence[AssignmentRecord]) -> None:
        """Add or replace these (agent_id, name) choices, in one transaction."""
        ...

    async def delete_model_assignments(self, agent_ids: Sequence[str], name: str) -> None: ...

    async def list_model_assignments(self) -> list[AssignmentRecord]: ...
