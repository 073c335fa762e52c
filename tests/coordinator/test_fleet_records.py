"""The agent record's own helpers (coordinator.fleet.records)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from edgefleet.contract import DesiredState, Hello, LoadReport


def test_a_reported_record_is_what_replace_makes() -> None:
    """AgentRecord.reported builds the record positionally (cheaper than replace): every
    other field stays as it was, so a new field in another place fails here."""
    now = datetime(2026, 12, 2, tzinfo=UTC)
    record = AgentRecord(
        hello=Hello(agent_id="a", site="s"),
        status=AgentStatus.DISCONNECTED,
        session_id="sess",
        connected_since=now - timedelta(minutes=5),
        last_seen=now - timedelta(minutes=1),
        last_report=LoadReport(waiting_sequences=1),
        bye_reason="bye",
        liveness=Liveness.SUSPECT,
        draining=True,
        enrolled=True,
        desired=DesiredState(version=3),
    )
    report = LoadReport(waiting_sequences=7)
    assert record.reported(report, now) == replace(
        record, last_report=report, last_seen=now, liveness=Liveness.LIVE
    )
