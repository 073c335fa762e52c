"""LAN discovery: advertise this agent with zeroconf as ``_edgefleet._tcp``.

TXT records (all text): ``id`` agent id, ``url`` HTTP base URL, ``site``, ``models``
(comma-separated model names), ``load`` (queue depth + waiting sequences) and
``state`` ("ok" or "draining"), both refreshed while advertising, ``v`` (TXT format
version, "1"). ``edgefleet_client`` reads them and skips draining agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

logger = logging.getLogger(__name__)

SERVICE_TYPE = "_edgefleet._tcp.local."
TXT_VERSION = "1"


def txt_record(
    agent_id: str, url: str, site: str, models: Sequence[str], load: int, status: str = "ok"
) -> dict[str, str]:
    return {
        "v": TXT_VERSION,
        "id": agent_id,
        "url": url,
        "site": site,
        "models": ",".join(models),
        "load": str(load),
        "state": status,
    }


def _instance_label(agent_id: str) -> str:
    # DNS labels are at most 63 bytes; dots would split the instance name.
    return agent_id.replace(".", "-")[:63]


class MdnsAdvertiser:
    """Registers the agent's service; ``refresh_s`` re-publishes TXT when the load changes."""

    def __init__(
        self,
        agent_id: str,
        http_url: str,
        *,
        site: str,
        models: Sequence[str],
        load: Callable[[], int],
        status: Callable[[], str] = lambda: "ok",
        interfaces: Sequence[str] = (),
        refresh_s: float = 5.0,
    ) -> None:
        parts = urlsplit(http_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"cannot advertise {http_url!r}: it needs an explicit host and port")
        self._agent_id = agent_id
        self._url = http_url
        self._host = parts.hostname
        self._port = parts.port
        self._site = site
        self._models = tuple(models)
        self._load = load
        self._status = status
        self._interfaces = list(interfaces)
        self._refresh_s = refresh_s
        self._zeroconf: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None
        self._task: asyncio.Task[None] | None = None
        self._addresses: list[bytes] = []  # resolved once, in start()
        self._last_load = -1
        self._last_status = ""

    @property
    def service_name(self) -> str:
        return f"{_instance_label(self._agent_id)}.{SERVICE_TYPE}"

    def _resolve_addresses(self) -> list[bytes]:
        try:
            address = ipaddress.ip_address(self._host)
        except ValueError:
            infos = socket.getaddrinfo(self._host, self._port, socket.AF_INET)
            return [socket.inet_aton(str(info[4][0])) for info in infos[:1]]
        if address.is_unspecified:
            # Listening on every address: advertise the host name's address.
            return [socket.inet_aton(socket.gethostbyname(socket.gethostname()))]
        return [address.packed]

    def _info_now(self, load: int, status: str) -> AsyncServiceInfo:
        self._last_load = load
        self._last_status = status
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self.service_name,
            port=self._port,
            properties=txt_record(
                self._agent_id,
                self._url,
                self._site,
                self._models,
                load,
                status,
            ),
            server=f"{_instance_label(self._agent_id)}.local.",
            addresses=self._addresses,
        )

    def _safe_load(self) -> int:
        try:
            return int(self._load())
        except Exception:
            logger.exception("load provider failed; advertising load 0")
            return 0

    async def start(self) -> None:
        # getaddrinfo blocks: once, off the event loop, not on every refresh
        self._addresses = await asyncio.to_thread(self._resolve_addresses)
        interfaces = self._interfaces or InterfaceChoice.All
        self._zeroconf = AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
        self._info = self._info_now(self._safe_load(), self._status())
        await self._zeroconf.async_register_service(self._info, allow_name_change=True)
        logger.info("advertising %s on mDNS as %s", self._url, self._info.name)
        self._task = asyncio.create_task(self._refresh(), name="mdns-refresh")

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            if self._zeroconf is None:
                continue
            load, status = self._safe_load(), self._status()
            if load == self._last_load and status == self._last_status:
                continue
            info = self._info_now(load, status)
            if self._info is not None:
                info.name = self._info.name  # keep a name changed on conflict
            self._info = info
            await self._zeroconf.async_update_service(info)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._zeroconf is not None:
            if self._info is not None:
                await self._zeroconf.async_unregister_service(self._info)
            await self._zeroconf.async_close()
            self._zeroconf = None
