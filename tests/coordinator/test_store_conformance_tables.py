"""The fleet store's conformance suite, the other tables: API keys and their usage, the
audit log, the model catalog, rules and assignments, request records, rollouts, the
generation counter, last states, and the agent lifecycle (revoke, remove, reissue, fix).
Every test runs on both backends (tests/coordinator/store_backends.py); several race
writers on separate connections, as coordinators sharing one database would."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from coordinator.errors import StoreError
from coordinator.fleet.records import Liveness
from coordinator.store.interface import (
    AdminTokenRecord,
    AgentLastState,
    ApiKeyRecord,
    AssignmentRecord,
    CatalogVersion,
    FleetStore,
    JoinToken,
    RequestRecord,
    StoredAgent,
    StoredRollout,
)
from edgefleet.contract import Hello, KeyPolicy, KeyUsage, LoadReport, Location
from edgefleet.key_policy import key_policy_from_json
from tests.coordinator.store_backends import StoreFactory, backend, store, store_factory

__all__ = ["backend", "store", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def api_key(key_id: str, seconds: int = 0, **changes: object) -> ApiKeyRecord:
    fields: dict[str, object] = {
        "key_id": key_id,
        "secret_sha256": "ee" * 32,
        "created_at": NOW + timedelta(seconds=seconds),
        "name": f"app {key_id}",
        "models": ("llm-a", "llm-b@v2"),
        "allow_cloud": True,
        "max_priority": "high",
        "max_tokens_per_request": 512,
        "requests_per_minute": 60.0,
        "tokens_per_minute": 1000.5,
        "expires_at": NOW + timedelta(days=30),
    }
    fields.update(changes)
    return ApiKeyRecord(**fields)  # type: ignore[arg-type]


async def test_api_keys_revocation_and_usage_totals(store: FleetStore) -> None:
    # 2**40: SQLite's integers are 64-bit, so are the other backend's
    first = api_key("key_1")
    second = api_key("key_2", seconds=1, expires_at=None, models=(), max_tokens_per_request=2**40)
    await store.add_api_key(first)
    await store.add_api_key(second)
    assert await store.list_api_keys() == [first, second]
    await store.add_api_key_usage([("key_1", 2, 100, 40, 1), ("ghost", 5, 5, 5, 5)])
    await store.add_api_key_usage([("key_1", 1, 10, 4, 0), ("key_2", 7, 70, 28, 2)])
    keys = {k.key_id: k for k in await store.list_api_keys()}
    assert (keys["key_1"].requests, keys["key_1"].prompt_tokens,
            keys["key_1"].completion_tokens, keys["key_1"].rejected) == (3, 110, 44, 1)  # fmt: skip
    assert (keys["key_2"].requests, keys["key_2"].rejected) == (7, 2)
    assert await store.revoke_api_key("key_1", NOW) is True
    assert await store.revoke_api_key("key_1", NOW + timedelta(hours=1)) is True
    assert await store.revoke_api_key("ghost", NOW) is False
    (revoked,) = [k for k in await store.list_api_keys() if k.key_id == "key_1"]
    assert revoked.revoked_at == NOW and revoked.state(NOW) == "revoked"
    with pytest.raises(StoreError):
        await store.add_api_key(first)


async def test_api_keys_keep_their_keep_alive_cap_and_pin_right(store: FleetStore) -> None:
    """Issue 26: a key's keep-alive cap (seconds, fractions kept) and pin right round-trip;
    a key minted without them reads the defaults (the agent's own cap, no pin)."""
    pinning = api_key("key_pin", max_keep_alive_s=90.5, may_pin_models=True)
    capped = api_key("key_cap", seconds=1, max_keep_alive_s=60.0)
    plain = api_key("key_plain", seconds=2)
    for key in (pinning, capped, plain):
        await store.add_api_key(key)
    keys = {k.key_id: k for k in await store.list_api_keys()}
    assert (keys["key_pin"].max_keep_alive_s, keys["key_pin"].may_pin_models) == (90.5, True)
    assert (keys["key_cap"].max_keep_alive_s, keys["key_cap"].may_pin_models) == (60.0, False)
    assert (keys["key_plain"].max_keep_alive_s, keys["key_plain"].may_pin_models) == (0.0, False)
    assert isinstance(keys["key_pin"].may_pin_models, bool)
    assert list(keys.values()) == [pinning, capped, plain]
    # changed later: each field alone, or both; None keeps it; other keys untouched
    assert await store.set_api_key_keep_alive("key_plain", 30.0, None) is True
    assert await store.set_api_key_keep_alive("key_cap", None, True) is True
    assert await store.set_api_key_keep_alive("key_pin", 0.0, False) is True
    assert await store.set_api_key_keep_alive("ghost", 1.0, True) is False
    keys = {k.key_id: k for k in await store.list_api_keys()}
    assert {k: (v.max_keep_alive_s, v.may_pin_models) for k, v in keys.items()} == {
        "key_pin": (0.0, False), "key_cap": (60.0, True), "key_plain": (30.0, False)
    }  # fmt: skip
    assert keys["key_cap"] == replace(capped, may_pin_models=True)


async def test_api_keys_keep_their_policy(store: FleetStore) -> None:
    """Issue 28: a key's policy (moderation rules with thresholds, the stream mode)
    round-trips; a key without one reads the default; set_api_key_policy replaces one key's
    policy only."""
    policy = key_policy_from_json(
        {"moderation": {"input": {"harassment": "block", "hate": {"action": "flag",
         "threshold": 0.55}}, "output": {"violence": "off"}, "stream_mode": "unbuffered"}}
    )  # fmt: skip
    strict = api_key("key_strict", policy=policy)
    plain = api_key("key_plain", seconds=1)
    for key in (strict, plain):
        await store.add_api_key(key)
    keys = {k.key_id: k for k in await store.list_api_keys()}
    assert keys["key_strict"].policy == policy and keys["key_plain"].policy == KeyPolicy()
    assert list(keys.values()) == [strict, plain]
    assert await store.set_api_key_policy("key_plain", policy) is True
    assert await store.set_api_key_policy("key_strict", KeyPolicy()) is True
    assert await store.set_api_key_policy("ghost", policy) is False
    keys = {k.key_id: k for k in await store.list_api_keys()}
    assert (keys["key_plain"].policy, keys["key_strict"].policy) == (policy, KeyPolicy())


async def test_usage_added_by_several_writers_at_once_is_all_counted(
    store_factory: StoreFactory,
) -> None:
    """Coordinators sharing a database add usage to the same keys at once: no update is
    lost, and none waits on another in a cycle (a deadlock would be a StoreError)."""
    writers = [store_factory() for _ in range(4)]
    for opened in writers:
        await opened.open()
    try:
        for i in range(3):
            await writers[0].add_api_key(api_key(f"key_{i}", seconds=i))

        async def report(writer: FleetStore, n: int) -> None:
            for _ in range(10):
                order = [f"key_{(n + j) % 3}" for j in range(3)]  # each writer its own order
                await writer.add_api_key_usage([(k, 1, 10, 5, 0) for k in order])

        await asyncio.gather(*(report(w, n) for n, w in enumerate(writers)))
        totals = [(k.requests, k.prompt_tokens) for k in await writers[1].list_api_keys()]
        assert totals == [(40, 400)] * 3
    finally:
        for opened in writers:
            await opened.close()


async def test_admin_tokens(store: FleetStore) -> None:
    token = AdminTokenRecord("adm_1", "ops", "operator", "aa" * 32, NOW, created_by="adm_0")
    await store.add_admin_token(token)
    assert await store.get_admin_token("adm_1") == token
    assert await store.get_admin_token("nope") is None
    assert await store.revoke_admin_token("adm_1", NOW) is True
    assert await store.revoke_admin_token("adm_1", NOW + timedelta(days=1)) is True
    assert await store.revoke_admin_token("nope", NOW) is False
    (listed,) = await store.list_admin_tokens()
    assert listed.revoked_at == NOW
    with pytest.raises(StoreError):  # the role is checked by the schema
        await store.add_admin_token(AdminTokenRecord("adm_2", "x", "root", "bb" * 32, NOW))


async def test_audit_log_keeps_order_and_filters(store: FleetStore) -> None:
    for i in range(5):
        await store.append_audit(
            at=NOW + timedelta(minutes=i), actor_id="adm_1", actor_name="ops", role="admin",
            action=f"action-{i}", target="agent-1", peer="127.0.0.1", outcome="ok",
            status=200, detail=json.dumps({"i": i}),
        )  # fmt: skip
    entries = await store.audit_entries(since=None, after_seq=0, limit=100)
    assert [e.action for e in entries] == [f"action-{i}" for i in range(5)]
    assert [e.seq for e in entries] == sorted({e.seq for e in entries})
    assert entries[0].at == NOW.isoformat(timespec="microseconds")
    assert entries[0].json()["detail"] == '{"i": 0}'
    later = await store.audit_entries(since=NOW + timedelta(minutes=3), after_seq=0, limit=100)
    assert [e.action for e in later] == ["action-3", "action-4"]
    after = await store.audit_entries(since=None, after_seq=entries[1].seq, limit=2)
    assert [e.action for e in after] == ["action-2", "action-3"]


def catalog_version(
    name: str, version: str, files: dict[str, bytes], seconds: int = 0
) -> CatalogVersion:
    manifest = json.dumps({
        "name": name, "version": version,
        "files": [{"path": p, "sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                  for p, b in files.items()],
    }).encode()  # fmt: skip
    return CatalogVersion(
        name=name, version=version, task="text-generation", manifest=manifest,
        signature=b"\x00sig\xff", sha256=hashlib.sha256(manifest).hexdigest(),
        size_bytes=sum(len(b) for b in files.values()), gate_passed=True, deprecated=False,
        published_at=NOW + timedelta(seconds=seconds),
    )  # fmt: skip


async def test_catalog_versions_and_the_blobs_a_deletion_frees(store: FleetStore) -> None:
    v1 = catalog_version("llm-a", "v1", {"model.onnx": b"one", "tokenizer.json": b"tok"})
    v2 = catalog_version("llm-a", "v2", {"model.onnx": b"two", "tokenizer.json": b"tok"}, 1)
    other = catalog_version("emb", "v1", {"model.onnx": b"emb"}, 2)
    for version in (v2, other, v1):
        await store.add_model_version(version)
    assert await store.list_model_versions() == [other, v1, v2]  # by name, then oldest
    assert await store.set_model_deprecated("llm-a", "v1", True) is True
    assert await store.set_model_deprecated("llm-a", "v9", True) is False
    listed = {v.ref: v for v in await store.list_model_versions()}
    assert listed["llm-a@v1"].deprecated and listed["llm-a@v1"].manifest == v1.manifest
    # v1's model is its own; its tokenizer v2 still lists.
    assert await store.delete_model_version("llm-a", "v1") == [hashlib.sha256(b"one").hexdigest()]
    assert [v.ref for v in await store.list_model_versions()] == ["emb@v1", "llm-a@v2"]
    with pytest.raises(StoreError):
        await store.add_model_version(v2)


async def test_model_holders_go_with_their_version(store_factory: StoreFactory) -> None:
    """Which coordinators hold a version's blobs: recorded by each (on its own connection,
    as coordinators sharing the database do), forgotten one by one, never recorded for a
    version that is not (or no longer) published, and gone with the version."""
    first, second = store_factory(), store_factory()
    await first.open()
    await second.open()
    try:
        await _holders(first, second)
    finally:
        await first.close()
        await second.close()


async def _holders(first: FleetStore, second: FleetStore) -> None:
    v1 = catalog_version("llm-a", "v1", {"model.onnx": b"one"})
    v2 = catalog_version("llm-a", "v2", {"model.onnx": b"two"}, 1)
    for version in (v1, v2):
        await first.add_model_version(version)
    assert await first.list_model_holders() == {}
    assert await first.set_model_holder("llm-a", "v1", "coord-b", True) is True
    results = await asyncio.gather(
        first.set_model_holder("llm-a", "v1", "coord-a", True),
        second.set_model_holder("llm-a", "v1", "coord-c", True),
        second.set_model_holder("llm-a", "v2", "coord-c", True),
        second.set_model_holder("llm-a", "v1", "coord-b", True),  # again: one row
    )
    assert results == [True] * 4
    assert await second.list_model_holders() == {
        ("llm-a", "v1"): ["coord-a", "coord-b", "coord-c"], ("llm-a", "v2"): ["coord-c"],
    }  # fmt: skip
    assert await second.set_model_holder("llm-a", "v1", "coord-b", False) is True
    assert await first.set_model_holder("llm-a", "v9", "coord-a", True) is False
    assert await first.list_model_holders() == {
        ("llm-a", "v1"): ["coord-a", "coord-c"], ("llm-a", "v2"): ["coord-c"],
    }  # fmt: skip
    await first.delete_model_version("llm-a", "v1")
    assert await second.list_model_holders() == {("llm-a", "v2"): ["coord-c"]}
    assert await second.set_model_holder("llm-a", "v1", "coord-c", True) is False
    assert await first.list_model_holders() == {("llm-a", "v2"): ["coord-c"]}


async def test_rules_and_assignments(store: FleetStore) -> None:
    first = await store.set_model_rule("llm-a", '{"site":"berlin"}', "v1", "", NOW)
    second = await store.set_model_rule("llm-a", "{}", "v1", "ro_1", NOW)
    replaced = await store.set_model_rule("llm-a", '{"site":"berlin"}', "v2", "ro_2", NOW)
    assert first < second < replaced  # newer: larger
    rules = await store.list_model_rules()
    assert [(r.selector, r.version, r.rollout_id) for r in rules] == [
        ("{}", "v1", "ro_1"), ('{"site":"berlin"}', "v2", "ro_2"),
    ]  # fmt: skip
    assert rules[1].seq == replaced and rules[1].set_at == NOW
    await store.delete_model_rule("llm-a", "{}")
    assert [r.seq for r in await store.list_model_rules()] == [replaced]

    await store.set_model_assignments([
        AssignmentRecord("a1", "llm-a", "v1", "", NOW),
        AssignmentRecord("a2", "llm-a", "v1", "", NOW),
    ])  # fmt: skip
    await store.set_model_assignments([AssignmentRecord("a1", "llm-a", "v2", "ro_2", NOW)])
    got = sorted(await store.list_model_assignments(), key=lambda a: a.agent_id)
    assert [(a.agent_id, a.version, a.rollout_id) for a in got] == [
        ("a1", "v2", "ro_2"), ("a2", "v1", ""),
    ]  # fmt: skip
    await store.delete_model_assignments(["a1", "ghost"], "llm-a")
    assert [a.agent_id for a in await store.list_model_assignments()] == ["a2"]


async def test_racing_rule_replacements_leave_one_rule(store_factory: StoreFactory) -> None:
    writers = [store_factory() for _ in range(4)]
    for opened in writers:
        await opened.open()
    try:
        seqs = await asyncio.gather(*(
            w.set_model_rule("llm-a", "{}", f"v{i}", "", NOW) for i, w in enumerate(writers)
        ))  # fmt: skip
        rules = await writers[0].list_model_rules()
        assert len(rules) == 1 and rules[0].seq == max(seqs) and len(set(seqs)) == 4
    finally:
        for opened in writers:
            await opened.close()


def record(agent_id: str, seq: int, received_at: float, **changes: object) -> RequestRecord:
    fields: dict[str, object] = {
        "agent_id": agent_id, "seq": seq, "received_at": received_at, "at": received_at - 1,
        "key_id": "key_1", "model": "llm-a", "version": "v1", "prompt_tokens": 10,
        "completion_tokens": 20, "latency_ms": 12.5, "ttft_ms": 3.25, "served_by": agent_id,
        "endpoint": "/v1/chat/completions", "status": 200,
    }  # fmt: skip
    fields.update(changes)
    return RequestRecord(**fields)  # type: ignore[arg-type]


async def test_request_records_are_stored_once_listed_and_pruned(store: FleetStore) -> None:
    batch = [record("b", 1, 100.0), record("a", 2, 101.0, key_id=None, ttft_ms=None),
             record("a", 1, 102.0), record("a", 3, 103.0, dropped=7, status=0)]  # fmt: skip
    assert await store.add_request_records(batch) == 4
    assert await store.add_request_records([*batch[:2], record("c", 1, 99.0)]) == 1
    assert await store.add_request_records([]) == 0
    assert await store.count_request_records() == 5
    listed = await store.list_request_records(agent_id=None, after_seq=0, limit=10)
    assert [(r.agent_id, r.seq) for r in listed] == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 1),
        ("c", 1),
    ]
    assert listed[1] == batch[1] and listed[2] == batch[3]
    mine = await store.list_request_records(agent_id="a", after_seq=1, limit=1)
    assert [(r.agent_id, r.seq) for r in mine] == [("a", 2)]
    assert await store.prune_request_records(2) == 2  # received longest ago: c/1, b/1
    left = await store.list_request_records(agent_id=None, after_seq=0, limit=10)
    assert [(r.agent_id, r.seq) for r in left] == [("a", 1), ("a", 2), ("a", 3)]


async def test_rollouts(store: FleetStore) -> None:
    def rollout(rid: str, state: str, created: float) -> StoredRollout:
        body = {"id": rid, "stages": [{"percent": 10}, {"percent": 100}], "note": "ünïcode"}
        return StoredRollout(rid, "llm-a", "v2", state, created, created, body)

    await store.save_rollout(rollout("ro_1", "running", 1.0))
    await store.save_rollout(rollout("ro_2", "paused", 2.0))
    await store.save_rollout(rollout("ro_3", "done", 3.0))
    changed = StoredRollout("ro_1", "other", "v9", "done", 9.0, 5.0, {"x": 1})
    await store.save_rollout(changed)
    # state, update time and body replaced; model, version and creation kept
    assert await store.get_rollout("ro_1") == StoredRollout(
        "ro_1", "llm-a", "v2", "done", 1.0, 5.0, {"x": 1}
    )
    assert await store.get_rollout("nope") is None
    assert [r.rollout_id for r in await store.list_rollouts(states=[], limit=10)] == [
        "ro_3", "ro_2", "ro_1",
    ]  # fmt: skip
    done = await store.list_rollouts(states=["done", "paused"], limit=2)
    assert [r.rollout_id for r in done] == ["ro_3", "ro_2"]
    assert await store.count_rollouts_by_state() == {"done": 2, "paused": 1}


async def test_generations_only_go_up_also_with_racing_writers(
    store_factory: StoreFactory,
) -> None:
    writers = [store_factory() for _ in range(4)]
    for opened in writers:
        await opened.open()
    try:
        first = await writers[0].reserve_generations(10, 0)
        assert await writers[0].reserve_generations(10, 0) == first + 10
        far = first + 1_000_000
        assert await writers[1].reserve_generations(5, far) == far  # the clock is ahead
        assert await writers[2].reserve_generations(5, 0) == far + 5
        starts = await asyncio.gather(*(
            w.reserve_generations(100, 0) for w in writers for _ in range(5)
        ))  # fmt: skip
        blocks = sorted((s, s + 100) for s in starts)
        assert blocks[0][0] == far + 10
        assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))  # no overlap
    finally:
        for opened in writers:
            await opened.close()


async def test_last_states_round_trip(store: FleetStore) -> None:
    report = LoadReport(
        waiting_sequences=3,
        running_sequences=2,
        tokens_per_second=41.5,
        key_usage=(KeyUsage("key_1", 4, 100, 50, 1),),
        redactions=(("EMAIL", 2), ("PERSON", 1)),
    )
    states = [
        AgentLastState("b", Liveness.DOWN, NOW - timedelta(minutes=3), None),
        AgentLastState("a", Liveness.LIVE, NOW, report),
    ]
    await store.save_last_states(states, NOW + timedelta(seconds=1))
    await store.save_last_states([], NOW)
    saved = await store.list_last_states()
    assert [(s.agent_id, s.liveness, s.last_seen, s.report) for s in saved] == [
        ("a", Liveness.LIVE, NOW, report._replace(key_usage=())),
        ("b", Liveness.DOWN, NOW - timedelta(minutes=3), None),
    ]
    assert {s.saved_at for s in saved} == {NOW + timedelta(seconds=1)}
    newer = LoadReport(waiting_sequences=9, tokens_per_second=7.0)
    await store.save_last_states([AgentLastState("a", Liveness.SUSPECT, NOW, newer)], NOW)
    await store.save_last_states([AgentLastState("b", Liveness.LIVE, NOW, None)], NOW)
    assert [(s.agent_id, s.liveness, s.report) for s in await store.list_last_states()] == [
        ("a", Liveness.SUSPECT, newer), ("b", Liveness.LIVE, None),
    ]  # fmt: skip


def enrolled(agent_id: str, **changes: object) -> StoredAgent:
    fields: dict[str, object] = {
        "agent_id": agent_id, "enrolled_at": NOW, "token_id": "tok1",
        "credential_sha256": "cd" * 32, "cert_serial": f"serial-{agent_id}",
        "site": "berlin", "public_key_sha256": f"pk-{agent_id}",
        "cert_not_after": NOW + timedelta(days=7),
    }  # fmt: skip
    fields.update(changes)
    return StoredAgent(**fields)  # type: ignore[arg-type]


async def test_the_agent_lifecycle(store: FleetStore) -> None:
    await store.add_token(JoinToken("tok1", "ab" * 32, NOW, None, 5, site="berlin"))
    assert await store.enroll("tok1", NOW, enrolled("a1"))
    assert await store.enroll("tok1", NOW, enrolled("a2"))
    assert await store.agents_of_token("tok1") == ["a1", "a2"]
    found = await store.find_enrolled_key("tok1", "pk-a1")
    assert found is not None and found.agent_id == "a1"
    assert await store.find_enrolled_key("tok1", "pk-none") is None

    later = NOW + timedelta(days=6)
    assert await store.reissue("a1", credential_sha256=None, cert_serial="s2", cert_not_after=later)
    a1 = await store.get_agent("a1")
    assert a1 is not None and a1.cert_serial == "s2" and a1.cert_not_after == later
    assert a1.credential_sha256 == "cd" * 32 and a1.public_key_sha256 == "pk-a1"
    assert not await store.reissue("ghost", credential_sha256="x", cert_serial="s",
                                   cert_not_after=later)  # fmt: skip

    fixed = await store.set_fixed("a1", site="munich", location=Location(48.1, 11.6),
                                  http_url="https://a1.example:8000")  # fmt: skip
    assert fixed is not None and fixed.site == "munich" and fixed.location == Location(48.1, 11.6)
    kept = await store.set_fixed("a1", site=None, location=None, http_url=None)
    assert kept == fixed
    assert await store.set_fixed("ghost", site="x", location=None, http_url=None) is None
    assert "munich" in [s.name for s in await store.list_sites()]

    assert await store.revoke_agent("a1", NOW) is True
    assert await store.revoke_agent("ghost", NOW) is False
    a1 = await store.get_agent("a1")
    assert a1 is not None and a1.revoked and a1.credential_sha256 == ""
    assert await store.certificate_revoked("s2") and not await store.certificate_revoked("s9")
    assert not await store.reissue("a1", credential_sha256=None, cert_serial="s3",
                                   cert_not_after=later)  # fmt: skip

    await store.save_last_states([AgentLastState("a2", Liveness.LIVE, NOW)], NOW)
    assert await store.remove_agent("a2") is True
    assert await store.remove_agent("a2") is False
    assert await store.get_agent("a2") is None and await store.agent_removed("a2")
    assert [s.agent_id for s in await store.list_last_states()] == []
    # Enrolled again with a token: no longer a removed id.
    assert await store.enroll("tok1", NOW, enrolled("a2"))
    assert not await store.agent_removed("a2")


async def test_unenrolled_agents_are_deleted_with_their_state_and_sites(store: FleetStore) -> None:
    await store.add_token(JoinToken("tok1", "ab" * 32, NOW, None, 5, site="berlin"))
    assert await store.enroll("tok1", NOW, enrolled("kept", site="berlin"))
    hello = Hello(agent_id="drifter", site="nowhere", http_url="http://10.0.0.9:8000",
                  agent_version="1")  # fmt: skip
    await store.save_hello(hello, NOW)
    await store.save_hello(replace(hello, agent_id="kept", site="elsewhere"), NOW)
    assert await store.delete_unenrolled_agents(["drifter", "kept", "ghost"]) == 1
    assert await store.delete_unenrolled_agents([]) == 0
    assert [a.agent_id for a in await store.list_agents()] == ["kept"]
    assert [s.agent_id for s in await store.list_last_states()] == ["kept"]
    assert "nowhere" not in [s.name for s in await store.list_sites()]
