"""A key's moderation policy as the agent applies it: per direction, every category's action
and threshold, and what a verdict comes to under it.

A category the key says nothing about keeps the default (``block`` for sexual/minors,
``flag`` for the rest: :func:`edgefleet.key_policy.default_action`); an agent without keys
applies the defaults to every request. A rule's threshold replaces the classifier's own for
that category; sexual/minors is the classifier's rule (the sexual head's low threshold and a
minor cue) whatever the policy says, and is never ``off``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.moderation.classifier import Verdict
from edgefleet.contract import (
    KeyPolicy,
    ModerationAction,
    ModerationDirection,
    ModerationStreamMode,
)
from edgefleet.key_policy import default_action, usable_policy
from models.moderation_spec import CATEGORIES, MINORS

__all__ = ["DirectionPolicy", "Judgement", "ResolvedModeration", "resolve"]


@dataclass(frozen=True, slots=True)
class Judgement:
    """What one text comes to under a direction's policy: categories blocked, flagged."""

    blocked: tuple[str, ...] = ()
    flagged: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DirectionPolicy:
    # every category: (action, threshold; 0: the classifier's own)
    actions: Mapping[str, tuple[ModerationAction, float]]
    # the key itself asks to block a category here (a default block does not count):
    # without a classifier such a request fails closed (503 moderation_unavailable)
    explicit_block: bool

    @property
    def active(self) -> bool:
        """Any category is checked in this direction."""
        return any(action is not ModerationAction.OFF for action, _ in self.actions.values())

    def judge(self, verdict: Verdict) -> Judgement:
        blocked: list[str] = []
        flagged: list[str] = []
        for category in CATEGORIES:
            action, threshold = self.actions[category]
            if action is ModerationAction.OFF:
                continue
            if category == MINORS or threshold <= 0:
                hit = verdict.categories.get(category, False)
            else:
                hit = category in verdict.covered and verdict.scores.get(category, 0.0) >= threshold
            if hit:
                (blocked if action is ModerationAction.BLOCK else flagged).append(category)
        return Judgement(tuple(blocked), tuple(flagged))


@dataclass(frozen=True, slots=True)
class ResolvedModeration:
    input: DirectionPolicy
    output: DirectionPolicy
    stream_mode: ModerationStreamMode

    @property
    def explicit_block(self) -> bool:
        return self.input.explicit_block or self.output.explicit_block

    def tag(self) -> str:
        """The output policy in a few characters, for the response-cache key: an answer
        checked under one policy is never served under another."""
        return ",".join(f"{c}={a.value}@{t:g}" for c, (a, t) in sorted(self.output.actions.items()))


def _direction(policy: KeyPolicy, direction: ModerationDirection) -> DirectionPolicy:
    actions = {c: (default_action(c), 0.0) for c in CATEGORIES}
    explicit_block = False
    for rule in policy.moderation.rules:
        if rule.direction is not direction or rule.category not in actions:
            continue
        actions[rule.category] = (rule.action, rule.threshold)
        explicit_block |= rule.action is ModerationAction.BLOCK
    return DirectionPolicy(actions, explicit_block)


def resolve(policy: KeyPolicy | None) -> ResolvedModeration:
    """``policy`` (None: no keys, the defaults) for every category in both directions."""
    usable = usable_policy(policy or KeyPolicy())
    return ResolvedModeration(
        _direction(usable, ModerationDirection.INPUT),
        _direction(usable, ModerationDirection.OUTPUT),
        usable.moderation.stream_mode,
    )
