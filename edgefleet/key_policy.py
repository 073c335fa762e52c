"""A key's policy (:class:`edgefleet.contract.KeyPolicy`) as JSON: the one form the admin
API, the coordinator's store, the agent's keys file and the CLIs read and write.

::

    {"moderation": {"input":  {"harassment": "block", "violence": {"action": "flag",
                                                                   "threshold": 0.6}},
                    "output": {"hate": "off"},
                    "stream_mode": "buffered"},
     "semantic_cache": true}

``semantic_cache`` (default false): the key's deterministic requests may be answered from
the semantic cache (agent/semantic_cache.py).

A category without a rule keeps the default: ``block`` for sexual/minors, ``flag`` for the
rest (what an agent without keys does). sexual/minors cannot be turned ``off``. Anything
else (an unknown key, category, direction, action or mode, a wrong type, a threshold
outside (0, 1]) is a :class:`KeyPolicyError` naming the field at fault.
"""

from __future__ import annotations

import math
from typing import Any

from edgefleet.contract import (
    KeyPolicy,
    ModerationAction,
    ModerationDirection,
    ModerationPolicy,
    ModerationRule,
    ModerationStreamMode,
)
from models.moderation_spec import CATEGORIES, MINORS

__all__ = [
    "DEFAULT_KEY_POLICY",
    "KeyPolicyError",
    "blocks_a_category",
    "default_action",
    "key_policy_from_json",
    "key_policy_to_json",
    "parse_moderation_rule",
    "policy_with_rules",
    "usable_policy",
]

DEFAULT_KEY_POLICY = KeyPolicy()
#: longest policy JSON text a store or keys file holds (a full policy is ~2 kB)
MAX_POLICY_CHARS = 16_384


class KeyPolicyError(ValueError):
    """A policy that cannot be used; ``field`` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def default_action(category: str) -> ModerationAction:
    """What a key that says nothing does with ``category`` (either direction)."""
    return ModerationAction.BLOCK if category == MINORS else ModerationAction.FLAG


def _rule(where: str, category: str, direction: ModerationDirection, value: Any) -> ModerationRule:
    if category not in CATEGORIES:
        raise KeyPolicyError(
            where, f"{where}: unknown category {category!r} (one of {', '.join(CATEGORIES)})"
        )
    threshold: Any = 0.0
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"action", "threshold"})
        if unknown:
            raise KeyPolicyError(f"{where}.{unknown[0]}", f"{where}: unknown field {unknown[0]!r}")
        threshold = value.get("threshold", 0.0)
        value = value.get("action")
    actions = ", ".join(a.value for a in ModerationAction)
    if not isinstance(value, str) or value not in ModerationAction.__members__.values():
        raise KeyPolicyError(where, f"{where}: action must be one of {actions}")
    action = ModerationAction(value)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not (threshold == 0 or 0 < threshold <= 1)  # NaN and inf too
    ):
        raise KeyPolicyError(
            f"{where}.threshold",
            f"{where}.threshold must be a score in (0, 1] (0 or absent: the classifier's own)",
        )
    if category == MINORS and action is ModerationAction.OFF:
        raise KeyPolicyError(where, f"{where}: sexual/minors cannot be turned off")
    return ModerationRule(category, direction, action, float(threshold))


def key_policy_from_json(data: Any, field: str = "policy") -> KeyPolicy:
    """The policy ``data`` (parsed JSON; None: the default) says, or KeyPolicyError."""
    if data is None:
        return DEFAULT_KEY_POLICY
    if not isinstance(data, dict):
        raise KeyPolicyError(field, f"{field} must be an object")
    unknown = sorted(set(data) - {"moderation", "semantic_cache"})
    if unknown:
        raise KeyPolicyError(f"{field}.{unknown[0]}", f"{field}: unknown field {unknown[0]!r}")
    semantic = data.get("semantic_cache", False)
    if not isinstance(semantic, bool):
        raise KeyPolicyError(
            f"{field}.semantic_cache", f"{field}.semantic_cache must be true or false"
        )
    moderation = data.get("moderation")
    if moderation is None:
        return KeyPolicy(semantic_cache=True) if semantic else DEFAULT_KEY_POLICY
    where = f"{field}.moderation"
    if not isinstance(moderation, dict):
        raise KeyPolicyError(where, f"{where} must be an object")
    unknown = sorted(set(moderation) - {"input", "output", "stream_mode"})
    if unknown:
        raise KeyPolicyError(f"{where}.{unknown[0]}", f"{where}: unknown field {unknown[0]!r}")
    rules: list[ModerationRule] = []
    for direction in ModerationDirection:
        by_category = moderation.get(direction.value, {})
        here = f"{where}.{direction.value}"
        if not isinstance(by_category, dict):
            raise KeyPolicyError(here, f"{here} must be an object of category: action")
        for category, value in by_category.items():
            rules.append(_rule(f"{here}.{category}", category, direction, value))
    mode = moderation.get("stream_mode", ModerationStreamMode.BUFFERED.value)
    if not isinstance(mode, str) or mode not in ModerationStreamMode.__members__.values():
        raise KeyPolicyError(
            f"{where}.stream_mode",
            f"{where}.stream_mode must be one of "
            f"{', '.join(m.value for m in ModerationStreamMode)}",
        )
    return KeyPolicy(ModerationPolicy(tuple(rules), ModerationStreamMode(mode)), semantic)


def usable_policy(policy: KeyPolicy) -> KeyPolicy:
    """``policy`` without the rules :func:`key_policy_from_json` would refuse (a newer
    coordinator's category, a threshold out of range, sexual/minors off): those
    categories keep their defaults."""
    kept = []
    for rule in policy.moderation.rules:
        try:
            kept.append(
                _rule(
                    "rule",
                    rule.category,
                    rule.direction,
                    {"action": rule.action.value, "threshold": rule.threshold},
                )
            )
        except KeyPolicyError:
            continue
    if len(kept) == len(policy.moderation.rules):
        return policy
    return KeyPolicy(
        ModerationPolicy(tuple(kept), policy.moderation.stream_mode), policy.semantic_cache
    )


def blocks_a_category(policy: KeyPolicy) -> bool:
    """``policy`` blocks some category by a rule of its own: what an agent without a
    moderation classifier refuses (503 moderation_unavailable), so the coordinator routes
    such a key only to agents that enforce it. The defaults (block sexual/minors, flag
    the rest) do not count: they fail open."""
    return any(
        rule.action is ModerationAction.BLOCK for rule in usable_policy(policy).moderation.rules
    )


def key_policy_to_json(policy: KeyPolicy) -> dict[str, Any]:
    """``policy`` in the form :func:`key_policy_from_json` reads (rules without a threshold
    as a bare action)."""
    moderation: dict[str, Any] = {d.value: {} for d in ModerationDirection}
    for rule in policy.moderation.rules:
        value: Any = rule.action.value
        if rule.threshold and math.isfinite(rule.threshold):
            value = {"action": rule.action.value, "threshold": rule.threshold}
        moderation[rule.direction.value][rule.category] = value
    moderation["stream_mode"] = policy.moderation.stream_mode.value
    out: dict[str, Any] = {"moderation": moderation}
    if policy.semantic_cache:
        out["semantic_cache"] = True
    return out


def parse_moderation_rule(text: str) -> tuple[str, str, Any]:
    """A CLI rule ``DIRECTION:CATEGORY=ACTION[@THRESHOLD]`` (e.g. ``input:harassment=block``,
    ``output:violence=flag@0.6``) as (direction, category, JSON value); KeyPolicyError when
    it is not of that shape (the values are checked by :func:`key_policy_from_json`)."""
    head, eq, action = text.partition("=")
    direction, colon, category = head.partition(":")
    if not eq or not colon or not direction or not category or not action:
        raise KeyPolicyError(
            "moderation", f"{text!r}: write DIRECTION:CATEGORY=ACTION[@THRESHOLD], e.g. "
            "input:harassment=block or output:violence=flag@0.6"
        )  # fmt: skip
    action, at, raw = action.partition("@")
    if not at:
        return direction, category, action
    try:
        threshold = float(raw)
    except ValueError:
        raise KeyPolicyError(
            "moderation", f"{text!r}: the threshold {raw!r} is no number"
        ) from None
    return direction, category, {"action": action, "threshold": threshold}


def policy_with_rules(
    base: KeyPolicy, rules: list[str], stream_mode: str | None = None
) -> dict[str, Any]:
    """``base`` as JSON with CLI ``rules`` (and a stream mode) laid over it."""
    data = key_policy_to_json(base)
    moderation = data["moderation"]
    for text in rules:
        direction, category, value = parse_moderation_rule(text)
        if direction not in moderation or direction == "stream_mode":
            raise KeyPolicyError(
                "moderation", f"{text!r}: the direction is input or output, not {direction!r}"
            )
        moderation[direction][category] = value
    if stream_mode is not None:
        moderation["stream_mode"] = stream_mode
    return data
