"""benchmarks/tool_calls' scoring of LangChain answers, its figures and targets, and the
fixed prompts it reads (no model: answers are built as LangChain builds them from the
OpenAI wire format)."""

from __future__ import annotations

import json
import typing
from typing import Any

from langchain_core.messages import AIMessage

from benchmarks.tool_calls import (
    PROMPTS_FILE,
    ToolRequest,
    figures_and_targets,
    load_prompts,
    score_tool_answer,
)

PROMPTS = load_prompts()
PARAMETERS = PROMPTS.parameters


def answer(*calls: tuple[str, str], content: str = "") -> AIMessage:
    """An AIMessage as LangChain makes it from a reply's ``message.tool_calls`` (name, raw
    arguments text as the server sent it)."""
    wire = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)
    ]
    return AIMessage(content=content, additional_kwargs={"tool_calls": wire} if wire else {})


def score(expected: str | None, message: AIMessage) -> str:
    content = message.content if isinstance(message.content, str) else ""
    return score_tool_answer(
        expected, message.tool_calls, message.invalid_tool_calls, PARAMETERS, content
    )


def test_a_valid_call_to_the_needed_tool_is_right() -> None:
    assert score("get_weather", answer(("get_weather", '{"city":"Lisbon"}'))) == "right_tool"
    call = ("convert_currency", '{"amount":45.5,"from_currency":"EUR","to_currency":"MXN"}')
    assert score("convert_currency", answer(call)) == "right_tool"


def test_text_instead_of_a_call_is_no_call() -> None:
    assert score("get_weather", answer(content="It is sunny in Lisbon.")) == "no_call"


def test_a_valid_call_to_another_tool_is_the_wrong_tool() -> None:
    assert score("get_weather", answer(("get_order_status", '{"order_id":"A-1"}'))) == (
        "wrong_tool"
    )
    # two calls, one of them to another tool
    both = answer(("get_weather", '{"city":"Oslo"}'), ("get_order_status", '{"order_id":"1"}'))
    assert score("get_weather", both) == "wrong_tool"


def test_unparseable_unknown_or_schema_breaking_calls_are_malformed() -> None:
    cut = answer(("get_weather", '{"city":"Lis'))  # cut by the token limit
    assert cut.invalid_tool_calls and score("get_weather", cut) == "malformed"
    assert score("get_weather", answer(("get_forecast", '{"city":"Lisbon"}'))) == "malformed"
    missing = answer(("get_weather", '{"unit":"celsius"}'))  # no city: required
    assert score("get_weather", missing) == "malformed"
    extra = answer(("get_weather", '{"city":"Lisbon","country":"PT"}'))  # additionalProperties
    assert score("get_weather", extra) == "malformed"
    lowercase = answer(
        ("convert_currency", '{"amount":1,"from_currency":"usd","to_currency":"EUR"}')
    )
    assert score("convert_currency", lowercase) == "malformed"


def test_any_call_on_a_no_tool_prompt_counts_as_called() -> None:
    assert score(None, answer(content="Ottawa.")) == "no_call"
    assert score(None, answer(("get_weather", '{"city":"Ottawa"}'))) == "called"
    assert score(None, answer(("get_weather", '{"city":'))) == "called"  # malformed too


# how the agent returns a call cut by max_tokens: the text so far, no tool_calls
CUT_CALL = '<tool_call>{"name":"create_ticket","arguments":{"title":"Bug Report - [bug_id] -'


def test_a_call_cut_by_the_token_limit_is_an_attempted_call() -> None:
    assert score("create_ticket", answer(content=CUT_CALL)) == "malformed"
    assert score(None, answer(content=CUT_CALL)) == "called"
    # text that merely mentions the format later on is an answer
    assert score(None, answer(content="Reply with <tool_call> to call.")) == "no_call"


def rows(outcomes: list[str], tool: str = "get_weather") -> list[dict[str, Any]]:
    return [{"tool": tool, "outcome": o, "latency_s": 0.5 + i} for i, o in enumerate(outcomes)]


def test_figures_and_targets_at_and_past_the_thresholds() -> None:
    tool_rows = rows(["right_tool"] * 24 + ["no_call"] * 3 + ["wrong_tool", "malformed", "error"])
    no_tool = [{"kind": "near_miss", "outcome": "called", "latency_s": 1.0}] * 3 + [
        {"kind": "question", "outcome": "no_call", "latency_s": 1.0}
    ] * 27
    structured = [{"parsed": True, "latency_s": 0.2}] * 60
    figures, targets = figures_and_targets(tool_rows, no_tool, structured)
    assert figures["tool_prompts"]["outcomes"] == {
        "right_tool": 24, "no_call": 3, "wrong_tool": 1, "malformed": 1, "error": 1,
    }  # fmt: skip
    assert figures["tool_prompts"]["by_tool"] == {"get_weather": {"prompts": 30, "right_tool": 24}}
    assert figures["tool_prompts"]["latency"]["max_s"] == 29.5
    assert figures["no_tool_prompts"]["called_by_kind"] == {"near_miss": 3}
    # 24/30 = 0.8 and 3/30 = 0.1: both targets exactly met
    assert targets["tool_prompts_right_tool_share"] == {
        "value": 0.8, "target": ">= 0.8", "met": True,
    }  # fmt: skip
    assert targets["no_tool_prompts_called_share"] == {
        "value": 0.1, "target": "<= 0.1", "met": True,
    }  # fmt: skip
    assert targets["structured_output_parsed"]["met"] is True
    # one fewer right, one more call, one parse failure: all three missed
    tool_rows[0]["outcome"] = "no_call"
    no_tool = [*no_tool[:3], {"kind": "question", "outcome": "called", "latency_s": 1.0},
               *no_tool[4:]]  # fmt: skip
    structured = [{"parsed": False, "latency_s": 4.0}, *structured[1:]]
    _, targets = figures_and_targets(tool_rows, no_tool, structured)
    assert {name: t["met"] for name, t in targets.items()} == {
        "tool_prompts_right_tool_share": False,
        "no_tool_prompts_called_share": False,
        "structured_output_parsed": False,
    }
    assert targets["structured_output_parsed"]["value"] == 59
    json.dumps(targets)  # the results file takes them as they are


def test_no_answers_meet_no_target() -> None:
    _, targets = figures_and_targets([], [], [])
    assert targets["tool_prompts_right_tool_share"]["met"] is False
    assert targets["structured_output_parsed"]["met"] is False


def test_the_fixed_prompts_are_thirty_and_thirty_over_the_offered_tools() -> None:
    assert len(PROMPTS.tool_prompts) == 30 and len(PROMPTS.no_tool_prompts) == 30
    needed = {tool for _, tool in PROMPTS.tool_prompts}
    assert needed == set(PROMPTS.tool_names)  # every tool is needed by some prompt
    texts = [p for p, _ in PROMPTS.tool_prompts + PROMPTS.no_tool_prompts]
    assert len(set(texts)) == 60
    assert "before" in " ".join(json.loads(PROMPTS_FILE.read_text())["about"])
    # the structured schema's intents are exactly the tools offered
    intent = ToolRequest.model_fields["intent"].annotation
    assert set(typing.get_args(intent)) == set(PROMPTS.tool_names)
