"""API keys at the coordinator: minted once, stored as digests, pushed to connected agents
(revocation within one report interval), budgets split and rebalanced from usage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.auth.keys import KeyTable
from agent.auth.startup import KeysApplier
from agent.control import CoordinatorSession
from agent.errors import InvalidApiKeyError
from coordinator.__main__ import main as coordinator_main
from coordinator.access.api_keys import FLOOR
from coordinator.api.app_keys import CONFIG_KEY, KEY_DISTRIBUTOR_KEY
from coordinator.identity.join_tokens import sha256_hex
from coordinator.store.interface import ApiKeyRecord
from devtools.process import wait_until
from edgefleet.contract import Hello, KeysSection, KeyUsage, LoadedModel, LoadReport
from tests.coordinator.coordinator_testing import (
    ADMIN_HEADERS,
    TEST_ADMIN_TOKEN,
    Coordinator,
    MakeCoordinator,
)
from tests.coordinator.store_backends import on_both_stores

pytestmark = pytest.mark.timeout(60)
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores


async def admin(c: Coordinator, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.request(method, c.http_url + path, json=body) as response,
    ):
        return response.status, await response.json()


def accepts(table: KeyTable, secret: str) -> bool:
    try:
        table.authenticate(f"Bearer {secret}")
    except InvalidApiKeyError:
        return False
    return True


class Agent:
    """A real agent session (gRPC) applying the keys section to a KeyTable, as the agent does."""

    def __init__(self, c: Coordinator, agent_id: str, state_dir: Path) -> None:
        self.table = KeyTable(enabled=True)
        self.usage: list[KeyUsage] = []
        hello = Hello(agent_id=agent_id, site="lab", models=(LoadedModel("m", "v1"),))
        self.session = CoordinatorSession(
            c.grpc_target,
            lambda: hello,
            self._report,
            on_desired_state=KeysApplier(self.table, state_dir / "api_keys.json"),
            initial_backoff_s=0.05,
        )

    def _report(self) -> LoadReport:
        usage, self.usage = tuple(self.usage), []
        return LoadReport(key_usage=usage)

    async def __aenter__(self) -> Agent:
        await self.session.start()
        await wait_until(lambda: self.session.connected, message="session")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.stop()


@pytest.fixture
async def coordinator(make_coordinator: MakeCoordinator) -> AsyncIterator[Coordinator]:
    yield await make_coordinator(report_interval_ms=1000)


async def test_mint_list_show_revoke_and_only_the_digest_is_stored(
    coordinator: Coordinator,
) -> None:
    status, minted = await admin(coordinator, "POST", "/v1/admin/keys", {
        "name": "kiosk", "models": ["m@v1"], "max_priority": "low",
        "requests_per_minute": 60, "tokens_per_minute": 6000, "expires_in_s": 3600,
    })  # fmt: skip
    assert status == 201, minted
    secret, key_id = minted["secret"], minted["key_id"]
    assert secret.startswith(f"ef-{key_id}-")
    assert len(secret.removeprefix(f"ef-{key_id}-")) == 43  # 256 bits, urlsafe base64
    assert minted["state"] == "active" and minted["models"] == ["m@v1"]
    status, listed = await admin(coordinator, "GET", "/v1/admin/keys")
    assert [k["key_id"] for k in listed["data"]] == [key_id]
    assert all("secret" not in k and "secret_sha256" not in k for k in listed["data"])
    status, shown = await admin(coordinator, "GET", f"/v1/admin/keys/{key_id}")
    assert status == 200 and shown["name"] == "kiosk"
    status, revoked = await admin(coordinator, "DELETE", f"/v1/admin/keys/{key_id}")
    assert status == 200 and revoked["state"] == "revoked"
    status, missing = await admin(coordinator, "DELETE", "/v1/admin/keys/nope")
    assert status == 404 and missing["error"]["code"] == "api_key_not_found"
    status, _ = await admin(coordinator, "POST", "/v1/admin/keys", {"max_priority": "urgent"})
    assert status == 400
    # an expiry past what a date can hold was a 500 (found by schemathesis)
    status, body = await admin(coordinator, "POST", "/v1/admin/keys", {"expires_in_s": 6 * 10**13})
    assert status == 400 and body["error"]["param"] == "expires_in_s"


# The body schemathesis sent when POST /v1/admin/keys answered 500 (its output hid
# max_tokens_per_request, as a field named like a credential): 2**32 is the first cap the
# wire's uint32 cannot carry, inside the schema then (integer, minimum 0).
FUZZED_KEY = {
    "allow_cloud": False, "expires_in_s": None, "requests_per_minute": 6.938208639158883e307,
    "max_tokens_per_request": 2**32,
}  # fmt: skip


async def test_a_cap_beyond_the_wire_is_a_400_and_connected_agents_keep_their_session(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        session = (await coordinator.get_json("/v1/agents/edge-1"))["session_id"]
        # was: stored, then a 500 from converting the keys section for the agent, and
        # every later session of every agent ended at its first message
        status, body = await admin(coordinator, "POST", "/v1/admin/keys", FUZZED_KEY)
        assert status == 400, body
        assert body["error"]["code"] == "invalid_parameter"
        assert body["error"]["param"] == "max_tokens_per_request"
        _, listed = await admin(coordinator, "GET", "/v1/admin/keys")
        assert listed["data"] == []  # nothing stored
        largest = FUZZED_KEY | {"max_tokens_per_request": 2**32 - 1}
        status, key = await admin(coordinator, "POST", "/v1/admin/keys", largest)
        assert status == 201, key
        await wait_until(lambda: accepts(agent.table, key["secret"]), message="key pushed")
        grant = agent.table.authenticate(f"Bearer {key['secret']}")
        assert grant.key.max_tokens_per_request == 2**32 - 1
        assert grant.key.requests_per_minute == 6.938208639158883e307  # one agent: all of it
        assert (await coordinator.get_json("/v1/agents/edge-1"))["session_id"] == session


async def test_a_stored_cap_beyond_the_wire_reaches_agents_as_the_largest_it_carries(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    """A key stored before the cap was checked (an older coordinator, or its CLI) does not
    end every agent's session: it is sent with the largest cap the wire carries."""
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        _, honest = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "honest"})
        await wait_until(lambda: accepts(agent.table, honest["secret"]), message="key pushed")
        secret = "ef-0ld0ld0ld0ld-" + "x" * 43
        # the CLI's own connection, beside the coordinator's (SQLite or PostgreSQL)
        store = coordinator.app[CONFIG_KEY].store_location().open_store()
        await store.open()
        try:
            await store.add_api_key(ApiKeyRecord(
                key_id="0ld0ld0ld0ld", secret_sha256=sha256_hex(secret),
                created_at=datetime.now(UTC), max_tokens_per_request=2**40,
            ))  # fmt: skip
        finally:
            await store.close()
        # the periodic refresh reads it from the database and pushes it
        await wait_until(lambda: accepts(agent.table, secret), timeout_s=5, message="old key")
        grant = agent.table.authenticate(f"Bearer {secret}")
        assert grant.key.max_tokens_per_request == 2**32 - 1
        assert agent.session.connected and accepts(agent.table, honest["secret"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"requests_per_minute": NaN}', "body"),  # Python's json reads NaN; JSON has none
        ('{"tokens_per_minute": Infinity}', "body"),
        ('{"requests_per_minute": 1e400}', "body"),  # valid JSON, beyond a double: inf
        ('{"max_tokens_per_request": -Infinity}', "body"),
        (f'{{"requests_per_minute": {10**400}}}', "requests_per_minute"),
        ('{"max_tokens_per_request": 1e300}', "max_tokens_per_request"),
        ('{"max_tokens_per_request": 2.5}', "max_tokens_per_request"),
        ('{"max_tokens_per_request": -1}', "max_tokens_per_request"),
        ('{"expires_in_s": 1e300}', "expires_in_s"),
        ('{"max_keep_alive_s": NaN}', "body"),
        ('{"max_keep_alive_s": "30m"}', "max_keep_alive_s"),  # seconds, as expires_in_s
        ('{"max_keep_alive_s": -1}', "max_keep_alive_s"),  # pinning is may_pin_models
        ('{"max_keep_alive_s": 604801}', "max_keep_alive_s"),  # over a week
        ('{"max_keep_alive_s": 1e300}', "max_keep_alive_s"),
        ('{"max_keep_alive_s": true}', "max_keep_alive_s"),
        ('{"may_pin_models": "yes"}', "may_pin_models"),
        ('{"may_pin_models": 1}', "may_pin_models"),
    ],
)
async def test_numbers_a_key_cannot_have_are_a_400(
    coordinator: Coordinator, body: str, param: str
) -> None:
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.post(coordinator.http_url + "/v1/admin/keys", data=body,
                  headers={"Content-Type": "application/json"}) as response,
    ):  # fmt: skip
        answer = await response.json()
    assert response.status == 400, answer
    assert answer["error"]["code"] == "invalid_parameter"
    assert answer["error"]["param"] == param, answer
    _, listed = await admin(coordinator, "GET", "/v1/admin/keys")
    assert listed["data"] == []


async def test_a_keys_keep_alive_cap_and_pin_right_are_shown_and_reach_its_agents(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    """Issue 26: minted with a keep-alive cap and the pin right, a key shows both (mint,
    list, show) and connected agents get both in their keys section; a key minted without
    them has the agent's own cap (0) and no pin right."""
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        status, pinning = await admin(coordinator, "POST", "/v1/admin/keys", {
            "name": "ops", "max_keep_alive_s": 90.5, "may_pin_models": True,
        })  # fmt: skip
        assert status == 201, pinning
        assert (pinning["max_keep_alive_s"], pinning["may_pin_models"]) == (90.5, True)
        _, plain = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "app"})
        assert (plain["max_keep_alive_s"], plain["may_pin_models"]) == (0.0, False)
        _, listed = await admin(coordinator, "GET", "/v1/admin/keys")
        assert {k["name"]: (k["max_keep_alive_s"], k["may_pin_models"])
                for k in listed["data"]} == {"ops": (90.5, True), "app": (0.0, False)}  # fmt: skip
        _, shown = await admin(coordinator, "GET", f"/v1/admin/keys/{pinning['key_id']}")
        assert (shown["max_keep_alive_s"], shown["may_pin_models"]) == (90.5, True)
        await wait_until(lambda: accepts(agent.table, plain["secret"]), message="keys pushed")
        key = agent.table.authenticate(f"Bearer {pinning['secret']}").key
        assert (key.max_keep_alive_s, key.may_pin_models) == (90.5, True)
        key = agent.table.authenticate(f"Bearer {plain['secret']}").key
        assert (key.max_keep_alive_s, key.may_pin_models) == (0.0, False)

        # the CLI over the admin API says the same
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "coordinator", "keys", "mint", "--name", "kiosk",
             "--max-keep-alive", "30m", "--may-pin-models", "--json",
             "--url", coordinator.http_url],
            env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": TEST_ADMIN_TOKEN},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        minted = json.loads(done.stdout)
        assert (minted["max_keep_alive_s"], minted["may_pin_models"]) == (1800.0, True)
        await wait_until(lambda: accepts(agent.table, minted["secret"]), message="CLI's key")
        key = agent.table.authenticate(f"Bearer {minted['secret']}").key
        assert (key.max_keep_alive_s, key.may_pin_models) == (1800.0, True)


async def test_a_keys_keep_alive_cap_and_pin_right_change_and_reach_its_agents_at_once(
    coordinator: Coordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATCH /v1/admin/keys/{id} changes the two fields (absent ones stay), pushed to
    connected agents at once; anything else, or a wrong value, is a 400 that changes
    nothing; the CLI's 'keys set' does the same on the database."""
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        _, key = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "app"})
        path = f"/v1/admin/keys/{key['key_id']}"
        await wait_until(lambda: accepts(agent.table, key["secret"]), message="key pushed")

        def pushed() -> tuple[float, bool]:
            held = agent.table.authenticate(f"Bearer {key['secret']}").key
            return held.max_keep_alive_s, held.may_pin_models

        status, changed = await admin(coordinator, "PATCH", path, {"may_pin_models": True})
        assert status == 200, changed
        assert (changed["max_keep_alive_s"], changed["may_pin_models"]) == (0.0, True)
        assert changed["agents_updated"] == 1
        await wait_until(lambda: pushed() == (0.0, True), timeout_s=2, message="pin right")
        status, changed = await admin(coordinator, "PATCH", path, {"max_keep_alive_s": 120})
        assert (changed["max_keep_alive_s"], changed["may_pin_models"]) == (120.0, True)
        await wait_until(lambda: pushed() == (120.0, True), timeout_s=2, message="new cap")
        for body, param in (
            ({"max_keep_alive_s": -1}, "max_keep_alive_s"),
            ({"max_keep_alive_s": "2h"}, "max_keep_alive_s"),
            ({"may_pin_models": None}, "may_pin_models"),
            ({"max_priority": "high"}, "max_priority"),  # other scopes: mint a new key
        ):
            status, refused = await admin(coordinator, "PATCH", path, body)
            assert status == 400 and refused["error"]["param"] == param, refused
        status, missing = await admin(coordinator, "PATCH", "/v1/admin/keys/nope", {})
        assert status == 404 and missing["error"]["code"] == "api_key_not_found"
        _, shown = await admin(coordinator, "GET", path)
        assert (shown["max_keep_alive_s"], shown["may_pin_models"], shown["max_priority"]) == (
            120.0, True, "normal"
        )  # fmt: skip

        # the CLI on the database; the periodic refresh pushes it
        if store_url := coordinator.app[CONFIG_KEY].store_url:
            monkeypatch.setenv("EDGEFLEET_COORDINATOR_STORE_URL", store_url)
        data_dir = str(coordinator.app[CONFIG_KEY].data_dir)
        done = await asyncio.to_thread(
            coordinator_main,
            ["keys", "set", key["key_id"], "--no-may-pin-models", "--max-keep-alive", "0",
             "--data-dir", data_dir, "--json"],
        )  # fmt: skip
        assert done == 0
        await wait_until(lambda: pushed() == (0.0, False), timeout_s=5, message="CLI change")


@pytest.mark.parametrize("cap", ["nan", "inf", "5x", "-1m", "8d", "never"])
def test_cli_refuses_a_keep_alive_cap_it_cannot_carry(
    tmp_path: Path, cap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    with pytest.raises(SystemExit) as exited:
        coordinator_main(["keys", "mint", "--data-dir", data, "--max-keep-alive", cap])
    assert exited.value.code == 2
    assert "--max-keep-alive" in capsys.readouterr().err


def test_cli_mints_into_the_database_and_never_stores_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    assert coordinator_main(["keys", "mint", "--data-dir", data, "--name", "app",
                             "--max-priority", "high", "--expires-in", "30d"]) == 0  # fmt: skip
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("ef-")
    for path in (tmp_path / "data").iterdir():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert coordinator_main(["keys", "list", "--data-dir", data, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["data"]
    assert [(k["max_priority"], k["max_keep_alive_s"], k["may_pin_models"]) for k in listed] == [
        ("high", 0.0, False)
    ]
    assert coordinator_main(["keys", "mint", "--data-dir", data, "--name", "ops",
                             "--max-keep-alive", "2h", "--may-pin-models"]) == 0  # fmt: skip
    capsys.readouterr()
    assert coordinator_main(["keys", "list", "--data-dir", data, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["data"]
    assert [(k["max_keep_alive_s"], k["may_pin_models"]) for k in listed] == [
        (0.0, False), (7200.0, True)
    ]  # fmt: skip
    key_id = secret.split("-")[1]
    assert coordinator_main(["keys", "revoke", key_id, "--data-dir", data]) == 0


async def test_revocation_reaches_a_connected_agent_within_one_report_interval(
    coordinator: Coordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interval_s = 1.0
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        _, honest = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "honest"})
        _, doomed = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "doomed"})
        await wait_until(lambda: accepts(agent.table, doomed["secret"]), message="key pushed")
        started = time.monotonic()
        await admin(coordinator, "DELETE", f"/v1/admin/keys/{doomed['key_id']}")
        await wait_until(lambda: not accepts(agent.table, doomed["secret"]), timeout_s=5)
        by_api = time.monotonic() - started
        assert accepts(agent.table, honest["secret"])  # the other key keeps working

        # Revoked straight in the database (the CLI without --url): the coordinator's
        # periodic refresh pushes it. The CLI finds the database as the coordinator does.
        if store_url := coordinator.app[CONFIG_KEY].store_url:
            monkeypatch.setenv("EDGEFLEET_COORDINATOR_STORE_URL", store_url)
        _, by_db = await admin(coordinator, "POST", "/v1/admin/keys", {"name": "db"})
        await wait_until(lambda: accepts(agent.table, by_db["secret"]))
        started = time.monotonic()
        await asyncio.to_thread(
            coordinator_main,
            ["keys", "revoke", by_db["key_id"], "--data-dir",
             str(coordinator.app[CONFIG_KEY].data_dir)],
        )  # fmt: skip
        await wait_until(lambda: not accepts(agent.table, by_db["secret"]), timeout_s=5)
        by_cli = time.monotonic() - started
        assert accepts(agent.table, honest["secret"])
    print(f"revocation reached the agent: {by_api * 1000:.0f} ms (admin API), "
          f"{by_cli * 1000:.0f} ms (CLI, database); reports every {interval_s:g} s")  # fmt: skip
    assert by_api < interval_s
    assert by_cli < interval_s + 0.5  # one tick, plus the CLI's own start


async def test_expiry_is_pushed_and_checked_locally(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with Agent(coordinator, "edge-1", tmp_path / "a1") as agent:
        _, key = await admin(coordinator, "POST", "/v1/admin/keys", {"expires_in_s": 2})
        await wait_until(lambda: accepts(agent.table, key["secret"]))
        await wait_until(lambda: not accepts(agent.table, key["secret"]), timeout_s=5)


async def test_budgets_are_split_then_follow_usage(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    distributor = coordinator.app[KEY_DISTRIBUTOR_KEY]
    async with (
        Agent(coordinator, "edge-1", tmp_path / "a1") as busy,
        Agent(coordinator, "edge-2", tmp_path / "a2") as idle,
    ):
        _, key = await admin(coordinator, "POST", "/v1/admin/keys",
                             {"requests_per_minute": 60, "tokens_per_minute": 6000})  # fmt: skip
        key_id = key["key_id"]
        await wait_until(lambda: len(distributor.shares_of(key_id)) == 2)
        assert distributor.shares_of(key_id) == {
            "edge-1": (30.0, 3000.0),
            "edge-2": (30.0, 3000.0),
        }

        async def report_busy() -> None:
            while True:
                busy.usage.append(KeyUsage(key_id, requests=10, prompt_tokens=500))
                await asyncio.sleep(0.5)

        feeder = asyncio.create_task(report_busy())
        try:
            await wait_until(lambda: distributor.shares_of(key_id)["edge-1"][0] > 45, timeout_s=15)
        finally:
            feeder.cancel()
        shares = distributor.shares_of(key_id)
        assert sum(r for r, _ in shares.values()) == pytest.approx(60)
        assert sum(t for _, t in shares.values()) == pytest.approx(6000)
        assert shares["edge-2"][0] >= 60 * FLOOR / 2 - 1e-9  # the floor
        await wait_until(lambda: idle.table._by_id[key_id].key.requests_per_minute < 15)
        _, shown = await admin(coordinator, "GET", f"/v1/admin/keys/{key_id}")
        assert shown["agent_shares"]["edge-1"]["requests_per_minute"] > 45
    await wait_until(lambda: distributor._unsaved == {}, timeout_s=3)
    _, shown = await admin(coordinator, "GET", f"/v1/admin/keys/{key_id}")
    assert shown["usage"]["requests"] >= 10 and shown["usage"]["prompt_tokens"] >= 500


async def test_keys_generation_outlives_a_coordinator_restart(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    """An agent that stays up across a coordinator restart holds keys generation G; the new
    coordinator's first keys section must be newer than G, or a revocation made after the
    restart would be ignored (generations come from a counter in the store, not one that
    starts at 1)."""
    data = str(tmp_path / "data")
    first = await make_coordinator(report_interval_ms=1000, data_dir=data)
    agent = Agent(first, "edge-1", tmp_path / "a1")
    async with agent:
        _, key = await admin(first, "POST", "/v1/admin/keys", {"name": "k"})
        await wait_until(lambda: accepts(agent.table, key["secret"]))
    held = agent.table.generation
    second = await make_coordinator(report_interval_ms=1000, data_dir=data)
    _, revoked = await admin(second, "DELETE", f"/v1/admin/keys/{key['key_id']}")
    assert revoked["state"] == "revoked"
    agent.session = CoordinatorSession(
        second.grpc_target,
        lambda: Hello(agent_id="edge-1", site="lab", models=(LoadedModel("m", "v1"),)),
        LoadReport,
        on_desired_state=KeysApplier(agent.table, tmp_path / "a1" / "api_keys.json"),
    )
    agent.session.desired_state = agent.session.desired_state.with_section(
        KeysSection(held, agent.table._sources["coordinator"])
    )  # the session of an agent that stayed up holds generation `held`
    async with agent:
        await wait_until(lambda: not accepts(agent.table, key["secret"]), timeout_s=5)
    assert agent.table.generation > held


async def test_a_rebalance_alone_re_sends_a_bounded_share_of_the_fleet_largest_moves_first(
    tmp_path: Path,
) -> None:
    """With usage that keeps shifting, a tick re-sends at most RESHARE_MAX_FRACTION of the
    agents (at least RESHARE_MIN_AGENTS), not every agent whose share moved; a key change
    still reaches every agent at once."""
    from coordinator.access.api_keys import RESHARE_MIN_AGENTS, ApiKeys, KeyDistributor
    from coordinator.store.sqlite import SQLiteFleetStore

    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        keys = ApiKeys(store)
        minted = await keys.mint(name="busy", requests_per_minute=60_000.0)
        sections: dict[str, KeysSection] = {}
        pushes: list[str] = []

        def push(agent_id: str, section: KeysSection) -> None:  # type: ignore[misc]
            sections[agent_id] = section
            pushes.append(agent_id)

        agents = [f"edge-{i:03d}" for i in range(200)]
        distributor = KeyDistributor(
            keys,
            set_section=push,
            current_section=sections.get,  # type: ignore[arg-type]
        )
        distributor.bind(push, lambda: agents)  # type: ignore[arg-type]
        await distributor.load()
        for agent in agents:
            distributor.on_connect(agent)
        assert len(pushes) == len(agents)  # everyone gets the key
        key_id = minted.record.key_id
        for round_ in range(3):
            pushes.clear()
            # every agent's demand changes, a few a lot (agent 7 most of all)
            for i, agent in enumerate(agents):
                heavy = 500 if i == 7 else (50 if i % 40 == 0 else 1 + (i + round_) % 3)
                distributor.record_usage(agent, [KeyUsage(key_id, requests=heavy)])
            await distributor.tick(2.0)
            assert 0 < len(pushes) <= RESHARE_MIN_AGENTS, len(pushes)
            if round_ == 0:
                assert "edge-007" in pushes  # the largest move goes first
        pushes.clear()
        await keys.revoke(key_id)
        await distributor.refresh(force=True)
        assert sorted(pushes) == agents  # a revocation is never capped
        assert all(not sections[a].keys for a in agents)
    finally:
        await store.close()
