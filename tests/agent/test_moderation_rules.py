"""The moderation verdict: thresholds per category, uncovered categories, and the
sexual/minors rule (no head, no data: the sexual head's score, injected here, and a minor
cue), which no threshold or coverage setting turns off."""

from __future__ import annotations

import pytest

from agent.api.protocol import MODERATION_MAX_CHARS, MODERATION_MAX_INPUTS, ModerationRequest
from agent.api.serving_moderations import _texts
from agent.errors import InvalidRequestError
from agent.moderation import verdict
from models.moderation_spec import CATEGORIES, MINORS, OPENAI_CATEGORIES, PROMPT_INJECTION

COVERED = frozenset({"harassment", "sexual", "violence", PROMPT_INJECTION})
THRESHOLDS = {c: 0.7 for c in CATEGORIES}
LOW = 0.3  # the sexual head's low threshold for sexual/minors


def judge(text: str, **scores: float) -> tuple[bool, dict[str, bool], dict[str, float]]:
    v = verdict(scores, THRESHOLDS, COVERED, text, LOW)
    assert list(v.categories) == list(CATEGORIES) == list(v.scores)
    return v.flagged, dict(v.categories), dict(v.scores)


def test_a_category_is_flagged_at_its_threshold() -> None:
    flagged, cats, scores = judge("some text", violence=0.7, harassment=0.69)
    assert flagged and cats["violence"] and not cats["harassment"]
    assert scores["violence"] == pytest.approx(0.7)


def test_an_uncovered_category_is_never_flagged_and_scores_zero() -> None:
    flagged, cats, scores = judge("some text", hate=0.99)
    assert not flagged and not cats["hate"] and scores["hate"] == 0.0


@pytest.mark.parametrize("text", ["a story about a 15 year old", "teen", "with a child"])
def test_sexual_minors_when_the_sexual_score_is_low_but_a_minor_is_named(text: str) -> None:
    flagged, cats, scores = judge(text, sexual=0.35)  # under sexual's own 0.7
    assert flagged and cats[MINORS] and not cats["sexual"]
    assert scores[MINORS] == pytest.approx(0.35)


def test_no_sexual_minors_without_a_minor_cue_or_under_the_low_threshold() -> None:
    assert judge("two adults, 30 and 32", sexual=0.95)[1][MINORS] is False
    assert judge("two adults, 30 and 32", sexual=0.95)[2][MINORS] == 0.0
    assert judge("my 15 year old asked about the solar system", sexual=0.05)[0] is False


def test_the_sexual_minors_rule_cannot_be_turned_off_by_thresholds_or_coverage() -> None:
    thresholds = {c: 1.0 for c in CATEGORIES}  # every head "off" by threshold
    v = verdict({"sexual": 0.4}, thresholds, frozenset({"sexual"}), "a 12-year-old", LOW)
    assert v.flagged and v.categories[MINORS]
    v = verdict({"sexual": 0.4}, thresholds, frozenset(), "a 12-year-old", LOW)
    assert v.flagged and v.categories[MINORS] and MINORS in v.covered


def test_every_openai_category_is_named_and_prompt_injection_beside_them() -> None:
    assert CATEGORIES[: len(OPENAI_CATEGORIES)] == OPENAI_CATEGORIES
    assert len(OPENAI_CATEGORIES) == 13 and CATEGORIES[-1] == PROMPT_INJECTION


def test_request_texts_are_bounded_and_the_one_at_fault_is_named() -> None:
    assert _texts(ModerationRequest(input="hi")) == ["hi"]
    with pytest.raises(InvalidRequestError) as empty:
        _texts(ModerationRequest(input=[]))
    assert empty.value.param == "input"
    with pytest.raises(InvalidRequestError) as many:
        _texts(ModerationRequest(input=["x"] * (MODERATION_MAX_INPUTS + 1)))
    assert str(MODERATION_MAX_INPUTS) in many.value.message
    with pytest.raises(InvalidRequestError) as long:
        _texts(ModerationRequest(input=["ok", "x" * (MODERATION_MAX_CHARS + 1)]))
    assert long.value.param == "input[1]"
