"""Finding agents on the LAN by mDNS (``_edgefleet._tcp``), for when there is no coordinator."""

from __future__ import annotations

import time
from collections.abc import Sequence

from edgefleet_client._exceptions import DiscoveryError
from edgefleet_client._models import Agent

SERVICE_TYPE = "_edgefleet._tcp.local."


def browse_mdns(
    *, timeout_s: float = 2.0, interfaces: Sequence[str] = (), model: str = ""
) -> list[Agent]:
    """Agents that answered within ``timeout_s`` (serving ``model`` when given)."""
    from zeroconf import (
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

    class _Listener(ServiceListener):
        def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.add(name)

        def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.add(name)

        def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.discard(name)

    agents: list[Agent] = []
    try:
        browser = ServiceBrowser(zc, SERVICE_TYPE, _Listener())
        time.sleep(timeout_s)
        browser.cancel()
        for name in sorted(names):
            info = ServiceInfo(SERVICE_TYPE, name)
            if not info.request(zc, 1000):
                continue
            txt = {
                k.decode(): (v or b"").decode(errors="replace") for k, v in info.properties.items()
            }
            addresses = info.parsed_addresses()
            url = txt.get("url") or (f"http://{addresses[0]}:{info.port}" if addresses else "")
            if not url:
                continue
            models = tuple(m for m in txt.get("models", "").split(",") if m)
            if model and model not in models:
                continue
            if txt.get("state") == "draining":
                continue
            load = txt.get("load", "")
            agents.append(
                Agent(
                    agent_id=txt.get("id", name.split(".")[0]),
                    url=url,
                    site=txt.get("site", ""),
                    models=models,
                    load=int(load) if load.isdigit() else None,
                    source="mdns",
                )
            )
    finally:
        zc.close()
    return agents
