"""Issue 28: a standalone agent's keys file carries each key's policy ('agent keys add
--moderation'), a malformed policy is one clear error naming the key and field, and a
coordinator's section with rules this agent cannot read is saved without them (the agent
still starts on it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.__main__ import main as agent_main
from agent.auth.key_files import read_keys, write_keys
from agent.errors import ConfigError
from edgefleet.contract import (
    ApiKey,
    KeyPolicy,
    KeysSection,
    ModerationAction,
    ModerationDirection,
    ModerationPolicy,
    ModerationRule,
    ModerationStreamMode,
)


def test_keys_file_carries_the_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent-keys.json"
    assert agent_main(["keys", "add", "--file", str(path), "--name", "kiosk",
                       "--moderation", "input:harassment=block",
                       "--moderation", "output:violence=off@0.5",
                       "--moderation-stream", "unbuffered"]) == 0  # fmt: skip
    assert agent_main(["keys", "add", "--file", str(path), "--name", "app"]) == 0
    capsys.readouterr()
    kiosk, app = read_keys(path).keys
    assert kiosk.policy.moderation.rules == (
        ModerationRule("harassment", ModerationDirection.INPUT, ModerationAction.BLOCK),
        ModerationRule("violence", ModerationDirection.OUTPUT, ModerationAction.OFF, 0.5),
    )
    assert kiosk.policy.moderation.stream_mode is ModerationStreamMode.UNBUFFERED
    assert app.policy == KeyPolicy()
    stored = json.loads(path.read_text())["keys"]
    assert stored[0]["policy"]["moderation"]["input"] == {"harassment": "block"}
    for bad in ("input:harass=block", "input:sexual/minors=off", "hate=block", "input:hate=x"):
        with pytest.raises(SystemExit):
            agent_main(["keys", "add", "--file", str(path), "--moderation", bad])
        assert "--moderation" in capsys.readouterr().err
    assert len(read_keys(path).keys) == 2  # nothing added


def test_keys_file_carries_the_semantic_cache_opt_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent-keys.json"
    assert agent_main(["keys", "add", "--file", str(path), "--semantic-cache",
                       "--moderation", "input:harassment=block"]) == 0  # fmt: skip
    assert agent_main(["keys", "add", "--file", str(path)]) == 0
    capsys.readouterr()
    faq, plain = read_keys(path).keys
    assert faq.policy.semantic_cache and not plain.policy.semantic_cache
    assert faq.policy.moderation.rules  # the other rules kept
    assert json.loads(path.read_text())["keys"][0]["policy"]["semantic_cache"] is True


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("block", "policy must be an object"),
        ({"moderation": {"input": {"harass": "block"}}}, "unknown category 'harass'"),
        ({"moderation": {"input": {"hate": "deny"}}}, "action must be one of"),
        ({"moderation": {"stream_mode": 3}}, "stream_mode must be one of"),
    ],
)
def test_a_keys_file_with_a_bad_policy_is_one_clear_error(
    tmp_path: Path, policy: object, says: str
) -> None:
    path = tmp_path / "bad.json"
    key = {"key_id": "k1", "secret_sha256": "ab" * 32, "policy": policy}
    path.write_text(json.dumps({"version": 1, "keys": [key]}))
    with pytest.raises(ConfigError, match=says) as refused:
        read_keys(path)
    assert "key k1" in str(refused.value)


def test_a_saved_section_drops_rules_this_agent_cannot_read(tmp_path: Path) -> None:
    newer = KeyPolicy(
        ModerationPolicy(
            (
                ModerationRule("weapons", ModerationDirection.INPUT, ModerationAction.BLOCK),
                ModerationRule("hate", ModerationDirection.INPUT, ModerationAction.BLOCK),
            )
        )
    )
    path = tmp_path / "api_keys.json"
    write_keys(path, KeysSection(3, (ApiKey("k1", b"\x01" * 32, policy=newer),)))
    (key,) = read_keys(path).keys
    assert [r.category for r in key.policy.moderation.rules] == ["hate"]
