"""A key's policy as JSON (edgefleet/key_policy.py): what the admin API, the stores, the
agent's keys file and both CLIs read. Defaults when it says nothing; every malformed part
refused with the field at fault named; rules a newer coordinator sends that this side
cannot read are dropped, not fatal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgefleet.contract import (
    KeyPolicy,
    ModerationAction,
    ModerationDirection,
    ModerationPolicy,
    ModerationRule,
    ModerationStreamMode,
)
from edgefleet.key_policy import (
    KeyPolicyError,
    default_action,
    key_policy_from_json,
    key_policy_to_json,
    policy_with_rules,
    usable_policy,
)
from models.moderation_spec import CATEGORIES, MINORS

FULL = {
    "moderation": {
        "input": {"harassment": "block", "hate": {"action": "flag", "threshold": 0.55}},
        "output": {"violence": "off", MINORS: "block"},
        "stream_mode": "unbuffered",
    }
}


def test_defaults_block_sexual_minors_and_flag_the_rest() -> None:
    assert key_policy_from_json(None) == KeyPolicy() == key_policy_from_json({})
    assert key_policy_from_json({"moderation": None}) == KeyPolicy()
    assert KeyPolicy().moderation.stream_mode is ModerationStreamMode.BUFFERED
    assert default_action(MINORS) is ModerationAction.BLOCK
    assert {default_action(c) for c in CATEGORIES if c != MINORS} == {ModerationAction.FLAG}


def test_a_policy_round_trips_through_json() -> None:
    policy = key_policy_from_json(FULL)
    assert policy.moderation.stream_mode is ModerationStreamMode.UNBUFFERED
    assert ModerationRule(
        "hate", ModerationDirection.INPUT, ModerationAction.FLAG, 0.55
    ) in policy.moderation.rules  # fmt: skip
    again = key_policy_from_json(json.loads(json.dumps(key_policy_to_json(policy))))
    assert again == policy


def test_the_semantic_cache_opt_in_round_trips_and_is_off_by_default() -> None:
    assert not key_policy_from_json(None).semantic_cache
    assert not key_policy_from_json(FULL).semantic_cache
    on = key_policy_from_json({"semantic_cache": True})
    assert on.semantic_cache and on.moderation == key_policy_from_json(None).moderation
    both = key_policy_from_json({**FULL, "semantic_cache": True})
    assert both.semantic_cache and both.moderation == key_policy_from_json(FULL).moderation
    for policy in (on, both):
        assert key_policy_from_json(json.loads(json.dumps(key_policy_to_json(policy)))) == policy


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "policy"),
        ("block", "policy"),
        ({"cache": {}}, "policy.cache"),
        ({"moderation": []}, "policy.moderation"),
        ({"moderation": {"inputs": {}}}, "policy.moderation.inputs"),
        ({"moderation": {"input": ["harassment"]}}, "policy.moderation.input"),
        ({"moderation": {"input": {"harrass": "block"}}}, "policy.moderation.input.harrass"),
        ({"moderation": {"input": {"hate": "deny"}}}, "policy.moderation.input.hate"),
        ({"moderation": {"input": {"hate": 1}}}, "policy.moderation.input.hate"),
        ({"moderation": {"input": {"hate": None}}}, "policy.moderation.input.hate"),
        ({"moderation": {"input": {"hate": {"threshold": 0.5}}}}, "policy.moderation.input.hate"),
        ({"moderation": {"input": {"hate": {"action": "flag", "threshold": 2}}}},
         "policy.moderation.input.hate.threshold"),
        ({"moderation": {"input": {"hate": {"action": "flag", "threshold": "high"}}}},
         "policy.moderation.input.hate.threshold"),
        ({"moderation": {"input": {"hate": {"action": "flag", "threshold": True}}}},
         "policy.moderation.input.hate.threshold"),
        ({"moderation": {"input": {"hate": {"action": "flag", "threshold": float("nan")}}}},
         "policy.moderation.input.hate.threshold"),
        ({"moderation": {"input": {"hate": {"action": "flag", "why": 1}}}},
         "policy.moderation.input.hate.why"),
        ({"moderation": {"output": {MINORS: "off"}}}, f"policy.moderation.output.{MINORS}"),
        ({"moderation": {"stream_mode": "async"}}, "policy.moderation.stream_mode"),
        ({"moderation": {"stream_mode": 1}}, "policy.moderation.stream_mode"),
        ({"semantic_cache": "yes"}, "policy.semantic_cache"),
        ({"semantic_cache": 1}, "policy.semantic_cache"),
        ({"moderation": {"input": {f"c{i}": "block" for i in range(10_000)}}},
         "policy.moderation.input.c0"),
    ],
)  # fmt: skip
def test_a_malformed_policy_names_the_field_at_fault(data: Any, field: str) -> None:
    with pytest.raises(KeyPolicyError) as refused:
        key_policy_from_json(data)
    assert refused.value.field == field


def test_cli_rules_lay_over_a_policy() -> None:
    base = key_policy_from_json(FULL)
    data = policy_with_rules(base, ["input:harassment=flag@0.8", "output:hate=block"], "buffered")
    policy = key_policy_from_json(data)
    rules = {
        (r.direction.value, r.category): (r.action, r.threshold) for r in policy.moderation.rules
    }
    assert rules[("input", "harassment")] == (ModerationAction.FLAG, 0.8)
    assert rules[("output", "hate")] == (ModerationAction.BLOCK, 0.0)
    assert rules[("output", "violence")] == (ModerationAction.OFF, 0.0)  # kept
    assert policy.moderation.stream_mode is ModerationStreamMode.BUFFERED
    for bad in ("harassment=block", "input:harassment", "sideways:hate=block",
                "input:hate=block@x", "stream_mode:x=block"):  # fmt: skip
        with pytest.raises(KeyPolicyError):
            key_policy_from_json(policy_with_rules(base, [bad]))


def test_rules_this_side_cannot_read_are_dropped_not_fatal() -> None:
    sent = KeyPolicy(
        ModerationPolicy(
            (
                ModerationRule("weapons/3d", ModerationDirection.INPUT, ModerationAction.BLOCK),
                ModerationRule(MINORS, ModerationDirection.OUTPUT, ModerationAction.OFF),
                ModerationRule("hate", ModerationDirection.INPUT, ModerationAction.FLAG, 7.0),
                ModerationRule("hate", ModerationDirection.OUTPUT, ModerationAction.BLOCK),
            ),
            ModerationStreamMode.UNBUFFERED,
        )
    )
    kept = usable_policy(sent)
    assert [r.category for r in kept.moderation.rules] == ["hate"]
    assert kept.moderation.stream_mode is ModerationStreamMode.UNBUFFERED
    assert key_policy_from_json(key_policy_to_json(kept)) == kept
