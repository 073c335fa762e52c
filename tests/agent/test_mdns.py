"""mDNS discovery, inside a private network namespace with multicast on its loopback only."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from agent.mdns import SERVICE_TYPE, MdnsAdvertiser, txt_record
from tests.netns import needs_netns, run_scenario

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def test_txt_record_carries_id_models_load_and_state() -> None:
    txt = txt_record("edge-1", "http://10.0.0.7:8000", "shop-7", ["a", "b"], 3)
    assert txt == {
        "v": "1", "id": "edge-1", "url": "http://10.0.0.7:8000", "site": "shop-7",
        "models": "a,b", "load": "3", "state": "ok",
    }  # fmt: skip
    draining = txt_record("edge-1", "http://10.0.0.7:8000", "shop-7", ["a"], 0, "draining")
    assert draining["state"] == "draining"
    assert SERVICE_TYPE == "_edgefleet._tcp.local."


async def test_refresh_republishes_changed_load_and_state_without_resolving_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load, status = [0], ["ok"]
    adv = MdnsAdvertiser(
        "edge-1", "http://10.0.0.7:8000", site="s", models=["a"],
        load=lambda: load[0], status=lambda: status[0], refresh_s=0.01,
    )  # fmt: skip
    published: list[dict[bytes, bytes | None]] = []

    class Zeroconf:
        async def async_update_service(self, info: object) -> None:
            published.append(info.properties)  # type: ignore[attr-defined]

    def no_lookups(*args: object) -> None:
        raise AssertionError("address looked up again on refresh")

    adv._addresses = [bytes([10, 0, 0, 7])]
    adv._zeroconf = Zeroconf()  # type: ignore[assignment]
    adv._info = adv._info_now(0, "ok")
    monkeypatch.setattr(adv, "_resolve_addresses", no_lookups)
    task = asyncio.create_task(adv._refresh())
    try:
        await asyncio.sleep(0.05)
        assert published == []  # nothing changed: nothing re-published
        load[0], status[0] = 3, "draining"
        async with asyncio.timeout(2):
            while not published:
                await asyncio.sleep(0.01)
        assert published[-1][b"load"] == b"3" and published[-1][b"state"] == b"draining"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.slow
@needs_netns
def test_agent_is_discovered_on_mdns_in_a_private_namespace(tiny_artifacts: Path) -> None:
    """A standalone agent (no coordinator, API keys from its keys file, HTTPS with a
    certificate from the site's CA, which the client trusts) is found on mDNS,
    with another mDNS socket open on the client's host, and serves the client that found
    it, with its key."""
    result = run_scenario(
        "ip link set lo up && ip link set lo multicast on",
        "tests/agent/mdns_scenario.py", str(tiny_artifacts), timeout_s=90,
    )  # fmt: skip
    assert result["found"] == [
        {
            "id": "edge-lan", "url": result["agent_url"], "site": "shop-7",
            "models": ["tiny-llama"], "load": 0, "source": "mdns",
        }
    ]  # fmt: skip
    # it returned once the answers settled, not at the end of its 20-s budget, and the 40
    # names that never resolve cost it at most a second together, not a second each
    assert result["browse_s"] < 10, result["browse_s"]
    assert result["missing"] == 0
    assert result["agent_url"].startswith("https://")  # as shipped: HTTPS, the site's CA
    assert result["base_url"] == result["agent_url"] + "/v1"
    # keys on (the agent's keys file): the client's key is served, no key is refused
    assert result["reply_model"].startswith("tiny-llama") and result["reply_choices"] == 1
    assert result["without_key"] == 401
