"""Tools described by the model's own chat template when it reads ``tools`` (Qwen2.5's
does), as ``transformers``, vLLM and llama.cpp render them; the generic system block for a
template that does not (SmolLM2's)."""

from __future__ import annotations

import json
from pathlib import Path

from agent.api.protocol import ChatMessageIn
from agent.api.serving_structured import chat_messages, tools_for_template
from agent.engine.text_codec import TextCodec
from agent.structured import parse_constraint

# the shape of Qwen2.5's template: tools listed with ``tojson`` in the system turn, a tool
# result wrapped in <tool_response> by the template
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "{% endif %}{{ '\\n<tools>' }}{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}"
    "</tool_response>\n{% elif not (tools and m.role == 'system') %}<|{{ m.role }}|>"
    "{{ m.content }}\n{% endif %}{% endfor %}<|assistant|>"
)
PLAIN_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now> & later",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "at": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _codec(tiny_artifacts: Path, template: str) -> TextCodec:
    return TextCodec(
        tiny_artifacts / "tiny-llama" / "tokenizer.json",
        chat_template=template,
        add_special_tokens=False,
    )


def _conversation() -> list[ChatMessageIn]:
    return [
        ChatMessageIn.model_validate(m)
        for m in [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"},
        ]
    ]


def test_a_template_that_reads_tools_describes_them_itself(tiny_artifacts: Path) -> None:
    codec = _codec(tiny_artifacts, TOOLS_TEMPLATE)
    assert codec.renders_tools
    spec = parse_constraint(response_format=None, tools=[WEATHER], tool_choice=None, functions=None)
    messages = chat_messages(_conversation(), spec, template_tools=True)
    tools = tools_for_template(spec)
    assert tools == [WEATHER]
    prompt = codec.apply_chat_template(messages, tools)

    # the template's own listing, keys in the order given and nothing HTML-escaped (jinja2's
    # own tojson would sort them and write "<" as \u003c)
    listed = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert listed == json.dumps(WEATHER, ensure_ascii=False)
    assert "Be brief." in prompt
    assert "You can call functions" not in prompt  # no second, generic description
    # the result wrapped once, by the template; the past call written as the model writes it
    assert "<tool_response>4 C, rain</tool_response>" in prompt
    assert '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>' in prompt


def test_a_template_that_does_not_gets_the_generic_block(tiny_artifacts: Path) -> None:
    codec = _codec(tiny_artifacts, PLAIN_TEMPLATE)
    assert not codec.renders_tools
    spec = parse_constraint(response_format=None, tools=[WEATHER], tool_choice=None, functions=None)
    prompt = codec.apply_chat_template(chat_messages(_conversation(), spec))
    assert prompt.startswith("<|system|>Be brief.\n\nYou can call functions.")
    assert '"name":"get_weather"' in prompt
    assert '<tool_response>{"tool_call_id": "call_1", "content": "4 C, rain"}' in prompt


def test_no_tools_offered_renders_no_tools(tiny_artifacts: Path) -> None:
    codec = _codec(tiny_artifacts, TOOLS_TEMPLATE)
    assert tools_for_template(None) is None
    prompt = codec.apply_chat_template(
        chat_messages([ChatMessageIn.model_validate({"role": "user", "content": "hi"})], None)
    )
    assert prompt == "<|user|>hi\n<|assistant|>"
