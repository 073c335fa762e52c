"""The change feed's reading side on a real SQLite store: a coordinator applies the others'
changes in order, never its own, once each; a handler that fails is counted and the feed
goes on; a change of a kind this version does not know is passed over; a feed started
late begins after what was already on record."""

from __future__ import annotations

from pathlib import Path

from coordinator.cluster.changes import KIND_AGENT, KIND_API_KEYS, ChangeFeed
from coordinator.store.changes import Change
from coordinator.store.sqlite import SQLiteFleetStore


async def test_a_feed_applies_the_others_changes_in_order_once(tmp_path: Path) -> None:
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        a, b = ChangeFeed(store, "a"), ChangeFeed(store, "b")
        await a.start()
        await b.start()
        seen: list[tuple[str, str, str]] = []

        async def record(change: Change) -> None:
            if change.detail == "boom":
                raise RuntimeError("a handler failed")
            seen.append((change.kind, change.subject, change.detail))

        b.on(KIND_API_KEYS, record)
        b.on(KIND_AGENT, record)
        a.on(KIND_AGENT, record)
        await a.publish(KIND_API_KEYS, "key_1", "minted")
        await a.publish(KIND_AGENT, "edge-1", "boom")
        await a.publish("from_a_newer_version", "x", "y")
        await a.publish(KIND_AGENT, "edge-1", "drain")
        await b.publish(KIND_AGENT, "edge-2", "resume")  # b's own
        assert await b.catch_up() == 4
        assert seen == [("api_keys", "key_1", "minted"), ("agent", "edge-1", "drain")]
        assert b.failed == {KIND_AGENT: 1}
        assert b.applied == {KIND_API_KEYS: 1, KIND_AGENT: 1}
        assert b.seq == await store.last_change_seq()
        assert await b.catch_up() == 0  # nothing twice
        assert b.json()["ok"] is True and b.json()["applied"] == 2
        seen.clear()
        assert await a.catch_up() == 1  # b's resume; a's own are not applied again
        assert seen == [("agent", "edge-2", "resume")]
        late = ChangeFeed(store, "c")
        late.on(KIND_AGENT, record)
        await late.start()
        assert await late.catch_up() == 0
    finally:
        await store.close()
