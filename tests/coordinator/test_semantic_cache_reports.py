"""What agents report about the semantic cache (LoadReport.semantic_cache_lookups, contract
v1.3, additive) reaches the coordinator checked, and survives the store's saved last
report."""

from __future__ import annotations

import pytest

from coordinator.errors import ProtocolError
from coordinator.rpc.convert import load_report_from_pb
from coordinator.store.report_json import REPORT_FIELDS, report_from_json, report_to_json
from edgefleet.contract import LoadReport
from edgefleet.contract_pb import load_report_to_pb

REPORT = LoadReport(
    semantic_cache_lookups=(("hit", 3), ("ineligible", 1), ("miss", 7), ("refused", 2))
)


def _wire(report: LoadReport) -> LoadReport:
    return load_report_from_pb(load_report_to_pb(report))


def test_a_report_keeps_its_semantic_cache_lookups_through_the_wire_and_the_store() -> None:
    assert _wire(REPORT) == REPORT
    assert report_from_json("a", REPORT_FIELDS, report_to_json(REPORT)) == REPORT


@pytest.mark.parametrize("outcome", ["<script>", "hit " * 20, "served"])
def test_an_unknown_outcome_is_refused(outcome: str) -> None:
    with pytest.raises(ProtocolError, match="semantic_cache_lookups"):
        _wire(LoadReport(semantic_cache_lookups=((outcome, 1),)))
