"""redact_request over every field the forwarding path sends, the modes, config, metrics."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.config import load_config
from agent.errors import ConfigError
from agent.redaction import (
    InvalidRedactionMode,
    RedactionBlocked,
    RedactionMode,
    RedactionUninspectable,
    Redactor,
    Vault,
    effective_mode,
    install_log_filter,
    requested_mode,
)
from edgefleet.contract import LoadReport
from edgefleet.contract_pb import load_report_from_pb, load_report_to_pb

EMAIL, CARD, IP = "jane.doe@example.com", "4111 1111 1111 1111", "203.0.113.9"
SECRETS = (EMAIL, "4111", IP, "Jane Doe", "+44 20 7946 0958", "sk-live-")


class ByteCodec:
    """A real, reversible tokenizer: one id per UTF-8 byte."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode()


def chat_body() -> dict[str, Any]:
    return {
        "model": "m",
        "stream": True,
        "user": EMAIL,
        "stop": ["Jane Doe said", "\n\n"],
        "metadata": {"ticket": f"from {EMAIL}"},
        "messages": [
            {"role": "system", "content": "You help Jane Doe."},
            {"role": "user", "name": "Jane Doe", "content": f"My card is {CARD}, mail {EMAIL}"},
            {"role": "user", "content": [{"type": "text", "text": f"host {IP}"},
                                         {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {
                    "name": "send_mail",
                    "arguments": json.dumps({"to": EMAIL, "cc": ["+44 20 7946 0958"], "n": 3}),
                }}]},
            {"role": "tool", "tool_call_id": "c1",
             "content": f"sent to {EMAIL} with key sk-live-Ab3dEf9hIjK1mNoPqRsT"},
        ],
        "edgefleet": {"redaction": "redact_restore"},
    }  # fmt: skip


def test_chat_body_every_field_redacted_and_restorable() -> None:
    body = chat_body()
    before = copy.deepcopy(body)
    vault = Vault()
    out = Redactor().redact_request(body, vault, RedactionMode.REDACT_RESTORE)
    assert body == before  # the caller's body is untouched
    sent = json.dumps(out)
    for value in SECRETS:
        assert value not in sent, value
    msgs = out["messages"]
    assert msgs[1]["name"] == "<PERSON_1>"
    assert msgs[2]["content"][0]["text"] == "host <IP_ADDRESS_1>"
    assert msgs[2]["content"][1] == before["messages"][2]["content"][1]
    args = json.loads(msgs[3]["tool_calls"][0]["function"]["arguments"])  # still JSON
    assert args == {"to": "<EMAIL_1>", "cc": ["<PHONE_1>"], "n": 3}
    assert out["user"] == "<EMAIL_1>" and out["stop"][0] == "<PERSON_1> said"
    assert out["metadata"]["ticket"] == "from <EMAIL_1>"
    assert vault.restore(msgs[4]["content"]) == before["messages"][4]["content"]
    counts = vault.counts
    assert set(counts) == {"EMAIL", "PERSON", "CREDIT_CARD", "IP_ADDRESS", "PHONE", "SECRET"}
    assert counts["EMAIL"] == 5  # user, metadata, message, tool call, tool result


def test_completions_prompt_suffix_and_token_ids() -> None:
    r = Redactor()
    vault = Vault()
    out = r.redact_request(
        {"model": "m", "prompt": [f"to {EMAIL}", "plain"], "suffix": f"cc {IP}"},
        vault,
        RedactionMode.REDACT_ONLY,
    )
    assert out["prompt"] == ["to <EMAIL_1>", "plain"] and out["suffix"] == "cc <IP_ADDRESS_1>"
    codec = ByteCodec()
    body = {"model": "m", "prompt": codec.encode(f"write to {EMAIL}"),
            "continue_token_ids": codec.encode(f"Sure, {EMAIL} is")}  # fmt: skip
    with pytest.raises(RedactionUninspectable, match=r"continue_token_ids|prompt"):
        r.redact_request(body, Vault(), RedactionMode.REDACT_RESTORE)
    r.set_tokenizer("m", codec)
    vault = Vault()
    out = r.redact_request(body, vault, RedactionMode.REDACT_RESTORE)
    assert codec.decode(out["prompt"]) == "write to <EMAIL_1>"
    assert codec.decode(out["continue_token_ids"]) == "Sure, <EMAIL_1> is"
    clean = {"model": "m", "prompt": "hi", "continue_token_ids": codec.encode("Hello there")}
    assert r.redact_request(clean, Vault(), RedactionMode.REDACT_RESTORE)[
        "continue_token_ids"
    ] == codec.encode("Hello there")  # nothing found: the very same ids


def test_block_refuses_naming_the_types_and_off_sends_as_is() -> None:
    r = Redactor(registry=CollectorRegistry())
    body = chat_body()
    vault = Vault()
    with pytest.raises(RedactionBlocked) as err:
        r.redact_request(body, vault, RedactionMode.BLOCK)
    assert err.value.types == ["CREDIT_CARD", "EMAIL", "IP_ADDRESS", "PERSON", "PHONE", "SECRET"]
    assert err.value.code == "redaction_blocked" and EMAIL not in str(err.value)
    assert vault.counts == {}  # nothing was redacted for sending
    clean = {"model": "m", "messages": [{"role": "user", "content": "what is 2+2?"}]}
    assert r.redact_request(clean, Vault(), RedactionMode.BLOCK) == clean
    assert r.redact_request(body, Vault(), RedactionMode.OFF) is body


@pytest.mark.parametrize(
    ("policy", "requested", "expected"),
    [
        ("redact_restore", None, "redact_restore"),
        ("redact_restore", "off", "redact_restore"),  # never widened
        ("redact_restore", "redact_only", "redact_only"),
        ("redact_restore", "block", "block"),
        ("redact_only", "redact_restore", "redact_only"),
        ("block", "off", "block"),
        ("block", "redact_restore", "block"),
        ("off", "off", "off"),
        ("off", "redact_restore", "redact_restore"),  # a request may ask for more care
        ("off", "BLOCK", "block"),
    ],
)
def test_effective_mode_narrows_never_widens(
    policy: str, requested: str | None, expected: str
) -> None:
    assert effective_mode(RedactionMode(policy), requested) is RedactionMode(expected)


@pytest.mark.parametrize("bad", ["none", 3, ["block"], ""])
def test_effective_mode_refuses_what_is_not_a_mode(bad: object) -> None:
    with pytest.raises(InvalidRedactionMode, match="must be one of redact_restore, redact_only"):
        effective_mode(RedactionMode.OFF, bad)


def test_requested_mode_reads_the_extension() -> None:
    assert requested_mode({"edgefleet": {"redaction": "block"}}) == "block"
    assert requested_mode({"model": "m"}) is None
    with pytest.raises(InvalidRedactionMode):
        requested_mode({"edgefleet": "block"})


def test_config_section_and_per_model_policy() -> None:
    cfg = load_config(
        environ={"EDGEFLEET_AGENT_REDACTION__MODELS": "secret-model=block, open=off"},
        overrides={"redaction.default_mode": "redact_only", "redaction.types": "email,PERSON"},
    )
    r = Redactor.from_config(cfg.redaction)
    assert r.policy("secret-model") is RedactionMode.BLOCK and r.policy("open") is RedactionMode.OFF
    assert r.policy("other") is RedactionMode.REDACT_ONLY
    assert r.types == ("EMAIL", "PERSON")
    assert load_config().redaction.default_mode is RedactionMode.REDACT_RESTORE
    for bad in ({"redaction.default_mode": "later"}, {"redaction.types": "EMAIL,NAME"},
                {"redaction.models": "just-a-name"}):  # fmt: skip
        with pytest.raises(ConfigError, match="redaction"):
            load_config(overrides=bad)


def test_metrics_and_load_report_carry_counts_never_values() -> None:
    registry = CollectorRegistry()
    r = Redactor(registry=registry)
    for _ in range(2):
        vault = Vault()
        r.redact_request(chat_body(), vault, RedactionMode.REDACT_RESTORE)
        r.account(vault)
    exposed = generate_latest(registry).decode()
    assert 'edgefleet_agent_redactions_total{type="EMAIL"} 10.0' in exposed
    assert EMAIL not in exposed and "Jane" not in exposed
    report = LoadReport(redactions=tuple(sorted(r.totals().items())))
    back = load_report_from_pb(load_report_to_pb(report))
    assert dict(back.redactions)["EMAIL"] == 10 and dict(back.redactions)["PERSON"] == 6


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.redaction.logs")
    handler_records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            handler_records.append(self.format(record))

    keep = Keep()
    logger.addHandler(keep)
    logger.propagate = False
    try:
        install_log_filter(Redactor(), logger)
        logger.warning("upstream refused %s from %s", EMAIL, IP)
        try:
            raise ValueError(f"bad card {CARD}")
        except ValueError:
            logger.exception("failed for Jane Doe")
    finally:
        logger.removeHandler(keep)
    joined = "\n".join(handler_records)
    assert "upstream refused <EMAIL_1> from <IP_ADDRESS_1>" in joined
    assert "failed for <PERSON_1>" in joined and "bad card <CREDIT_CARD_1>" in joined
    for value in (EMAIL, IP, "4111", "Jane Doe"):
        assert value not in joined


def test_log_records_keep_the_agents_own_infrastructure_addresses() -> None:
    """``cannot listen on <IP_ADDRESS_1>`` would hide what the operator must fix: loopback,
    unspecified and configured hosts stay; a client's address is still redacted."""
    logger = logging.getLogger("test.redaction.infra")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        install_log_filter(Redactor(), logger, keep=["10.1.2.3", ""])
        logger.error("cannot listen on %s:%d or %s or %s", "127.0.0.1", 8000, "0.0.0.0", "::1")
        logger.warning("coordinator 10.1.2.3:50051 unreachable; client %s refused", IP)
    finally:
        logger.removeHandler(handler)
    assert lines[0].endswith("cannot listen on 127.0.0.1:8000 or 0.0.0.0 or ::1")
    assert "coordinator 10.1.2.3:50051 unreachable" in lines[1] and IP not in lines[1]
    assert "<IP_ADDRESS_1>" in lines[1]


def test_malformed_bodies_are_not_a_crash() -> None:
    r = Redactor()
    odd: dict[str, Any] = {
        "model": 7,
        "messages": [None, 3, {"content": 5}, {"content": [None, {"text": 9}, "x"]},
                     {"role": "assistant", "tool_calls": [None, {"function": "f"},
                      {"function": {"arguments": "{not json " + EMAIL}}]}],
        "prompt": ["a", f"to {EMAIL}", {"x": 1}],
        "stop": 4,
        "metadata": ["x"],
    }  # fmt: skip
    out = r.redact_request(odd, Vault(), RedactionMode.REDACT_RESTORE)
    args = out["messages"][4]["tool_calls"][2]["function"]["arguments"]
    assert args == "{not json <EMAIL_1>"  # not JSON: redacted as text
    assert out["messages"][:4] == odd["messages"][:4]
    assert out["prompt"] == ["a", "to <EMAIL_1>", {"x": 1}]
    with pytest.raises(RedactionUninspectable):  # ids among strings: still never unchecked
        r.redact_request({"model": "m", "prompt": ["a", 5]}, Vault(), RedactionMode.BLOCK)
    with pytest.raises(TypeError):
        r.redact_request([], Vault(), RedactionMode.BLOCK)  # type: ignore[arg-type]


def test_the_load_sampler_reports_the_redactors_totals() -> None:
    from agent.load_sampler import LoadSampler
    from agent.metrics import AgentMetrics
    from agent.model_registry import ModelRegistry

    metrics = AgentMetrics()
    r = Redactor(registry=metrics.registry)
    sampler = LoadSampler(ModelRegistry({}, {}), metrics, redactions=r.totals)
    assert sampler().redactions == ()
    vault = Vault()
    r.redact_request(chat_body(), vault, RedactionMode.REDACT_RESTORE)
    r.account(vault)
    report = sampler()
    assert dict(report.redactions) == vault.counts
    assert [t for t, _ in report.redactions] == sorted(vault.counts)


def test_a_failing_redaction_withholds_the_log_record() -> None:
    class Broken(Redactor):
        def redact(self, text: str, vault: Vault) -> str:
            raise RuntimeError(text)

    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "user %s", (EMAIL,), None)
    from agent.redaction import RedactingFilter

    assert RedactingFilter(Broken()).filter(record)
    assert record.getMessage() == "(log record withheld: redaction failed with RuntimeError)"


def test_the_coordinator_takes_redaction_counts_and_refuses_hostile_maps() -> None:
    from coordinator.errors import ProtocolError
    from coordinator.rpc.convert import load_report_from_pb as coordinator_reads

    good = load_report_to_pb(LoadReport(redactions=(("EMAIL", 2), ("US_SSN", 1))))
    assert coordinator_reads(good).redactions == (("EMAIL", 2), ("US_SSN", 1))
    for bad in ({"<script>": 1}, {"x" * 40: 1}, {f"T{i}": 1 for i in range(33)}):
        message = load_report_to_pb(LoadReport())
        message.redactions.update(bad)
        with pytest.raises(ProtocolError, match=r"LoadReport\.redactions"):
            coordinator_reads(message)
