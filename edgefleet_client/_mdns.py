"""Finding agents on the LAN by mDNS (``_edgefleet._tcp``), for when there is no coordinator."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from edgefleet_client._exceptions import DiscoveryError
from edgefleet_client._models import Agent

SERVICE_TYPE = "_edgefleet._tcp.local."


# How long the answers must have been quiet before a browse that found an agent returns:
# every responder answers a query within 20-120 ms (RFC 6762's random delay), so this
# collects a LAN's agents from one round of answers without waiting out the whole budget.
SETTLE_S = 0.3
RESOLVE_S = 1.0  # asking for the records of names whose answers lacked them, all together
MAX_NAMES = 256  # service names kept from one browse (the rest ignored)


def browse_mdns(
    *, timeout_s: float = 3.0, interfaces: Sequence[str] = (), model: str = "",
    settle_s: float = SETTLE_S,
) -> list[Agent]:  # fmt: skip
    """Agents that answered within ``timeout_s`` (serving ``model`` when given).

    Returns early, ``settle_s`` after the last new answer, once at least one agent (serving
    ``model``) was found; otherwise waits out ``timeout_s``.

    The queries ask for multicast answers (QM), not python-zeroconf's default of a unicast
    answer to the first one (QU): the kernel hands a unicast datagram to port 5353 to any one
    of the sockets bound to it on the querying host (the agent's own when it runs there,
    another client's, avahi-daemon's), so the first answer was lost or not by the luck of a
    hash, and the next query comes about a second later. Measured in a network namespace, a
    responder and 6 browses: with QU 1.4-1.5 s each, or 0.35-0.4 s once a third mDNS socket
    was opened; with QM 0.35-0.5 s either way (1.5 s right after the agent announced
    itself: a record multicast less than a second ago is answered a second later).
    """
    from zeroconf import (
        DNSQuestionType,
        InterfaceChoice,
        IPVersion,
        ServiceBrowser,
        ServiceInfo,
        ServiceListener,
        Zeroconf,
    )

    try:
        zc = Zeroconf(
            interfaces=list(interfaces) or InterfaceChoice.All, ip_version=IPVersion.V4Only
        )
    except OSError as exc:
        raise DiscoveryError(f"cannot start mDNS: {exc}") from exc
    names: set[str] = set()
    lock = threading.Lock()
    changed = threading.Event()

    class _Listener(ServiceListener):
        def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            with lock:
                if name not in names and len(names) >= MAX_NAMES:
                    return
                names.add(name)
            changed.set()

        def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            self.add_service(zc, type_, name)

        def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            with lock:
                names.discard(name)

    def resolve(name: str, wait_ms: int) -> Agent | None:
        """The agent behind ``name`` (None: not resolved, not serving ``model``, draining)."""
        info = ServiceInfo(SERVICE_TYPE, name)
        if not (info.load_from_cache(zc) or (wait_ms and info.request(zc, wait_ms))):
            return None
        txt = {k.decode(): (v or b"").decode(errors="replace") for k, v in info.properties.items()}
        addresses = info.parsed_addresses()
        url = txt.get("url") or (f"http://{addresses[0]}:{info.port}" if addresses else "")
        models = tuple(m for m in txt.get("models", "").split(",") if m)
        if not url or (model and model not in models) or txt.get("state") == "draining":
            return None
        load = txt.get("load", "")
        return Agent(
            agent_id=txt.get("id", name.split(".")[0]),
            url=url,
            site=txt.get("site", ""),
            models=models,
            load=int(load) if load.isdigit() else None,
            source="mdns",
        )

    agents: list[Agent] = []
    try:
        browser = ServiceBrowser(zc, SERVICE_TYPE, _Listener(), question_type=DNSQuestionType.QM)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            changed.clear()
            if changed.wait(min(left, settle_s)):
                continue  # a new answer: wait for the answers to settle
            with lock:
                seen = sorted(names)
            if any(resolve(name, 0) for name in seen):  # from the answers' records
                break
        browser.cancel()
        with lock:
            seen = sorted(names)
        # names whose records did not come with the answers are asked for, within one
        # second in all: a LAN full of bogus names must not stall discovery a second each
        resolving = time.monotonic() + RESOLVE_S
        for name in seen:
            wait_ms = max(0, int((resolving - time.monotonic()) * 1000))
            agent = resolve(name, wait_ms)
            if agent is not None:
                agents.append(agent)
    finally:
        zc.close()
    return agents
