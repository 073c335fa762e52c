"""Issue 28: an API key's policy at the coordinator: minted and changed through the admin
API and the CLI, shown, validated (a 400 naming the field, nothing changed), and pushed
to connected agents, which keep it in their last-known keys file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.auth.key_files import read_keys
from coordinator.__main__ import main as coordinator_main
from devtools.process import wait_until
from edgefleet.contract import KeyPolicy, ModerationAction, ModerationStreamMode
from edgefleet.key_policy import key_policy_from_json
from tests.coordinator.coordinator_testing import TEST_ADMIN_TOKEN, Coordinator, MakeCoordinator
from tests.coordinator.store_backends import on_both_stores
from tests.coordinator.test_coordinator_api_keys import Agent, accepts, admin

pytestmark = pytest.mark.timeout(60)
pytest_generate_tests = on_both_stores

STRICT = {
    "moderation": {
        "input": {"harassment": "block", "hate": {"action": "block", "threshold": 0.4}},
        "output": {"violence": "off"},
        "stream_mode": "unbuffered",
    }
}


@pytest.fixture
async def coordinator(make_coordinator: MakeCoordinator) -> AsyncIterator[Coordinator]:
    yield await make_coordinator(report_interval_ms=1000)


def actions(policy: KeyPolicy) -> dict[tuple[str, str], ModerationAction]:
    return {(r.direction.value, r.category): r.action for r in policy.moderation.rules}


async def test_a_keys_policy_is_minted_shown_changed_and_reaches_its_agents(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        status, strict = await admin(
            coordinator, "POST", "/v1/admin/keys", {"name": "kiosk", "policy": STRICT}
        )
        assert status == 201, strict
        assert key_policy_from_json(strict["policy"]) == key_policy_from_json(STRICT)
        _, plain = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "app"})
        assert key_policy_from_json(plain["policy"]) == KeyPolicy()
        _, shown = await admin(coordinator, "GET", f"/v1/admin/keys/{strict['key_id']}")
        assert shown["policy"] == strict["policy"]
        await wait_until(lambda: accepts(agent.table, strict["secret"]), message="keys pushed")
        held = agent.table.authenticate(f"Bearer {strict['secret']}").key
        assert held.policy == key_policy_from_json(STRICT)
        assert agent.table.authenticate(f"Bearer {plain['secret']}").key.policy == KeyPolicy()
        saved = {k.key_id: k for k in read_keys(tmp_path / "a1" / "api_keys.json").keys}
        assert saved[strict["key_id"]].policy == held.policy

        # PATCH replaces the whole policy, pushed at once
        path = f"/v1/admin/keys/{plain['key_id']}"
        change = {"policy": {"moderation": {"output": {"hate": "block"}}}}
        status, changed = await admin(coordinator, "PATCH", path, change)
        assert status == 200 and changed["agents_updated"] == 1, changed

        def pushed() -> KeyPolicy:
            return agent.table.authenticate(f"Bearer {plain['secret']}").key.policy

        await wait_until(lambda: actions(pushed()) == {("output", "hate"): ModerationAction.BLOCK},
                         timeout_s=2, message="policy change")  # fmt: skip

        # the CLI over the admin API lays rules over the key's policy
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "coordinator", "keys", "set", plain["key_id"],
             "--moderation", "input:harassment=block@0.7", "--moderation-stream", "unbuffered",
             "--json", "--url", coordinator.http_url],
            env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": TEST_ADMIN_TOKEN},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        policy = key_policy_from_json(json.loads(done.stdout)["policy"])
        assert actions(policy) == {
            ("output", "hate"): ModerationAction.BLOCK,
            ("input", "harassment"): ModerationAction.BLOCK,
        }
        assert policy.moderation.stream_mode is ModerationStreamMode.UNBUFFERED
        await wait_until(lambda: pushed() == policy, timeout_s=2, message="CLI's change")


@pytest.mark.parametrize(
    ("policy", "param"),
    [
        ("block", "policy"),
        ({"moderation": {"input": {"harass": "block"}}}, "policy.moderation.input.harass"),
        ({"moderation": {"input": {"hate": "deny"}}}, "policy.moderation.input.hate"),
        ({"moderation": {"input": {"hate": 3}}}, "policy.moderation.input.hate"),
        ({"moderation": {"output": {"sexual/minors": "off"}}},
         "policy.moderation.output.sexual/minors"),
        ({"moderation": {"input": {"hate": {"action": "flag", "threshold": -1}}}},
         "policy.moderation.input.hate.threshold"),
        ({"moderation": {"stream_mode": "async"}}, "policy.moderation.stream_mode"),
        ({"moderation": {"input": {f"x{i}": "off" for i in range(5000)}}},
         "policy.moderation.input.x0"),
        ({"semantic_cache": "yes"}, "policy.semantic_cache"),
        ({"cache": {}}, "policy.cache"),
    ],
)  # fmt: skip
async def test_a_malformed_policy_is_a_400_naming_the_field_and_changes_nothing(
    coordinator: Coordinator, policy: Any, param: str
) -> None:
    status, refused = await admin(coordinator, "POST", "/v1/admin/keys", {"policy": policy})
    assert status == 400 and refused["error"]["param"] == param, refused
    _, listed = await admin(coordinator, "GET", "/v1/admin/keys")
    assert listed["data"] == []
    _, key = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "app"})
    path = f"/v1/admin/keys/{key['key_id']}"
    status, refused = await admin(coordinator, "PATCH", path, {"policy": policy})
    assert status == 400 and refused["error"]["param"] == param, refused
    _, shown = await admin(coordinator, "GET", path)
    assert key_policy_from_json(shown["policy"]) == KeyPolicy()


@pytest.mark.parametrize(
    "rule", ["hate=block", "input:hate", "input:harass=block", "input:hate=deny",
             "output:sexual/minors=off", "input:hate=flag@2", "input:hate=flag@x"],
)  # fmt: skip
def test_cli_refuses_a_rule_it_cannot_carry(
    tmp_path: Path, rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    with pytest.raises(SystemExit) as exited:
        coordinator_main(["keys", "mint", "--data-dir", data, "--moderation", rule])
    assert exited.value.code == 2
    assert "--moderation" in capsys.readouterr().err


def test_cli_mints_a_policy_into_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    rules = ["--moderation", "input:harassment=block", "--moderation", "output:violence=flag@0.6"]
    assert coordinator_main(["keys", "mint", "--data-dir", data, "--json", *rules]) == 0
    minted = json.loads(capsys.readouterr().out)
    assert minted["policy"]["moderation"]["input"] == {"harassment": "block"}
    assert minted["policy"]["moderation"]["output"] == {
        "violence": {"action": "flag", "threshold": 0.6}
    }
    assert coordinator_main(["keys", "set", minted["key_id"], "--data-dir", data,
                             "--moderation", "input:harassment=off", "--json"]) == 0  # fmt: skip
    changed = json.loads(capsys.readouterr().out)["policy"]["moderation"]
    assert changed["input"] == {"harassment": "off"} and "violence" in changed["output"]
    assert coordinator_main(["keys", "set", minted["key_id"], "--data-dir", data,
                             "--semantic-cache", "on", "--json"]) == 0  # fmt: skip
    policy = json.loads(capsys.readouterr().out)["policy"]
    assert policy["semantic_cache"] is True and policy["moderation"]["input"] == {
        "harassment": "off"
    }
    assert coordinator_main(["keys", "set", minted["key_id"], "--data-dir", data,
                             "--semantic-cache", "off", "--json"]) == 0  # fmt: skip
    assert "semantic_cache" not in json.loads(capsys.readouterr().out)["policy"]
