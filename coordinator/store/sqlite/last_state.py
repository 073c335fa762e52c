"""Table ``agent_last_state`` in SQLite: thousands of rows per snapshot, so times are POSIX
seconds and each load report a JSON list of values named once per row."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from coordinator.fleet.records import Liveness
from coordinator.store.last_state import AgentLastState
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write
from edgefleet.contract import (
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    SectionGenerations,
    SelfCheckResult,
)

logger = logging.getLogger(__name__)


class SQLiteLastStates(SQLiteTable):
    async def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        if states:
            await self._worker.call(_save_last_states, list(states), saved_at)

    async def list_last_states(self) -> list[AgentLastState]:
        return await self._worker.call(_list_last_states)


def _save_last_states(
    db: sqlite3.Connection, states: list[AgentLastState], saved_at: datetime
) -> None:
    saved, names = saved_at.timestamp(), _REPORT_FIELDS
    rows = [
        (
            s.agent_id,
            s.liveness.value,
            s.last_seen.timestamp(),
            None if s.report is None else names,
            _report_to_json(s.report),
            saved,
        )
        for s in states
    ]
    with write(db):
        db.executemany("INSERT OR REPLACE INTO agent_last_state VALUES (?, ?, ?, ?, ?, ?)", rows)


def _list_last_states(db: sqlite3.Connection) -> list[AgentLastState]:
    states = []
    for row in db.execute("SELECT * FROM agent_last_state ORDER BY agent_id"):
        try:
            liveness = Liveness(row["liveness"])
        except ValueError:
            liveness = Liveness.DOWN
        states.append(
            AgentLastState(
                agent_id=row["agent_id"],
                liveness=liveness,
                last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
                report=_report_from_json(row["agent_id"], row["report_fields"], row["report_json"]),
                saved_at=datetime.fromtimestamp(row["saved_at"], UTC),
            )
        )
    return states


_REPORT_FIELDS = ",".join(LoadReport._fields)
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _report_to_json(report: LoadReport | None) -> str | None:
    """The report's values as a JSON list, in ``_REPORT_FIELDS`` order (the row keeps
    the names, so a version with renamed or added fields loses only those fields)."""
    if report is None:
        return None
    # Per-key usage is per interval (recorded by coordinator/access/api_keys.py), not state.
    # So are per-version model stats (handed to the report hooks as they arrive).
    return _encode(list(report._replace(key_usage=(), model_stats=(), overflow_usage=())))


def _inventory(item: list[object]) -> ModelInventory:
    """A ModelInventory saved as a JSON list (its fields in order)."""
    inventory = ModelInventory(*item)  # type: ignore[arg-type]
    check = inventory.self_check
    return inventory._replace(
        state=ModelInventoryState(inventory.state),
        self_check=None if check is None else SelfCheckResult(*check),
    )


def _report_from_json(agent_id: str, names: str | None, text: str | None) -> LoadReport | None:
    if text is None or not names:
        return None
    try:
        stored = dict(zip(names.split(","), json.loads(text), strict=True))
        fields = {name: stored[name] for name in LoadReport._fields if name in stored}
        if "applied" in fields:  # nested tuples, saved as JSON lists
            fields["applied"] = SectionGenerations(*fields["applied"])
        fields.pop("key_usage", None)  # not state: see _report_to_json
        fields.pop("model_stats", None)
        if "inventory" in fields:
            fields["inventory"] = tuple(_inventory(item) for item in fields["inventory"])
        fields.pop("overflow_usage", None)
        if "redactions" in fields:  # (type, count) pairs, saved as JSON lists
            fields["redactions"] = tuple((str(t), int(n)) for t, n in fields["redactions"])
        return LoadReport(**fields)
    except (TypeError, ValueError) as exc:
        logger.info("ignoring the saved load report of agent %s: %s", agent_id, exc)
        return None
