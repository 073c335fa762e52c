"""Model rollouts as stored (table ``rollouts``): one JSON body per rollout, rewritten on
every change, so that a coordinator restarted mid-rollout resumes where it was. What the
body holds is coordinator/rollouts/model.py's ``Rollout.json()``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from coordinator.store.membership import LeaseFence


@dataclass(frozen=True, slots=True)
class StoredRollout:
    rollout_id: str
    model: str
    version: str
    state: str
    # POSIX seconds.
    created_at: float
    updated_at: float
    body: dict[str, Any]


class RolloutTable(Protocol):
    async def save_rollout(
        self, rollout: StoredRollout, *, fence: LeaseFence | None = None
    ) -> None:
        """Add the rollout, or replace its state, update time and body. With ``fence``: only
        while that lease is still held at that epoch, unexpired (checked in the same
        statement, by the database's clock); else ``LeaseLostError`` and nothing written."""
        ...

    async def get_rollout(self, rollout_id: str) -> StoredRollout | None: ...

    async def list_rollouts(self, *, states: Sequence[str], limit: int) -> list[StoredRollout]:
        """Newest first; ``states`` empty: every state."""
        ...

    async def count_rollouts_by_state(self) -> dict[str, int]: ...


def rollout_from_row(row: Mapping[str, Any]) -> StoredRollout:
    """A ``rollouts`` row as either backend reads it (columns by name)."""
    return StoredRollout(
        rollout_id=row["rollout_id"],
        model=row["model"],
        version=row["version"],
        state=row["state"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        body=json.loads(row["body_json"]),
    )
