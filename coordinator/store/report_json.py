"""A load report as the store keeps it in ``agent_last_state`` (both backends): its values
as a JSON list, the field names once per row, so that a version with renamed or added
fields loses only those fields."""

from __future__ import annotations

import json
import logging

from edgefleet.contract import (
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    SectionGenerations,
    SelfCheckResult,
)

logger = logging.getLogger(__name__)

REPORT_FIELDS = ",".join(LoadReport._fields)
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def report_to_json(report: LoadReport | None) -> str | None:
    """The report's values as a JSON list, in ``REPORT_FIELDS`` order (the row keeps
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


def report_from_json(agent_id: str, names: str | None, text: str | None) -> LoadReport | None:
    if text is None or not names:
        return None
    try:
        stored = dict(zip(names.split(","), json.loads(text), strict=True))
        fields = {name: stored[name] for name in LoadReport._fields if name in stored}
        if "applied" in fields:  # nested tuples, saved as JSON lists
            fields["applied"] = SectionGenerations(*fields["applied"])
        fields.pop("key_usage", None)  # not state: see report_to_json
        fields.pop("model_stats", None)
        if "inventory" in fields:
            fields["inventory"] = tuple(_inventory(item) for item in fields["inventory"])
        fields.pop("overflow_usage", None)
        if "redactions" in fields:  # (type, count) pairs, saved as JSON lists
            fields["redactions"] = tuple((str(t), int(n)) for t, n in fields["redactions"])
        if "cold_models" in fields:  # (model, load seconds) pairs, saved as JSON lists
            fields["cold_models"] = tuple((str(m), float(s)) for m, s in fields["cold_models"])
        for name in (  # (name, count) pairs
            "moderation_flags",
            "moderation_flags_by_key",
            "semantic_cache_lookups",
        ):
            if name in fields:
                fields[name] = tuple((str(k), int(n)) for k, n in fields[name])
        return LoadReport(**fields)
    except (TypeError, ValueError) as exc:
        logger.info("ignoring the saved load report of agent %s: %s", agent_id, exc)
        return None
