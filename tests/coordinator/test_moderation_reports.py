"""What agents report about content safety (LoadReport.moderation_heads, moderation_flags,
moderation_flags_by_key; contract v1.3, additive) reaches the coordinator checked and
bounded, and survives the store's saved last report."""

from __future__ import annotations

import pytest

from coordinator.errors import ProtocolError
from coordinator.rpc.convert import load_report_from_pb
from coordinator.store.report_json import REPORT_FIELDS, report_from_json, report_to_json
from edgefleet.contract import LoadReport
from edgefleet.contract_pb import load_report_to_pb

REPORT = LoadReport(
    moderation_heads="moderation/all-minilm-l6-v2@fp32-ddf7336dbb12",
    moderation_flags=(("harassment:flag", 3), ("illicit/violent:block", 1)),
    moderation_flags_by_key=(("", 1), ("0123456789ab", 3)),
)


def _wire(report: LoadReport) -> LoadReport:
    return load_report_from_pb(load_report_to_pb(report))


def test_a_report_keeps_its_heads_and_flags_through_the_wire_and_the_store() -> None:
    assert _wire(REPORT) == REPORT
    assert report_from_json("a", REPORT_FIELDS, report_to_json(REPORT)) == REPORT


@pytest.mark.parametrize(
    "report",
    [
        LoadReport(moderation_heads="x" * 129),
        LoadReport(moderation_flags=(("<script>:flag", 1),)),
        LoadReport(moderation_flags=(("harassment:allow", 1),)),
        LoadReport(moderation_flags=tuple((f"c{i:03d}:flag", 1) for i in range(65))),
        LoadReport(moderation_flags_by_key=(("k" * 65, 1),)),
        LoadReport(moderation_flags_by_key=tuple((f"k{i}", 1) for i in range(1026))),
    ],
)
def test_hostile_moderation_fields_are_refused(report: LoadReport) -> None:
    with pytest.raises(ProtocolError, match="moderation"):
        _wire(report)
