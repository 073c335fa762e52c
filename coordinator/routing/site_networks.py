"""Which site a client IP address belongs to (config ``site_networks = "CIDR=site,..."``)."""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_site_networks(text: str) -> tuple[tuple[Network, str], ...]:
    """Parse ``"10.1.0.0/16=berlin, 10.2.0.0/16=munich"``; raises ValueError naming the entry."""
    entries: list[tuple[Network, str]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        cidr, sep, site = item.partition("=")
        if not sep or not site.strip():
            raise ValueError(f"entry {item!r} must look like CIDR=site")
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError as exc:
            raise ValueError(f"entry {item!r}: {exc}") from None
        clash = next((s for n, s in entries if n == network and s != site.strip()), None)
        if clash is not None:
            raise ValueError(f"entry {item!r}: {network} is already given to site {clash!r}")
        entries.append((network, site.strip()))
    # Most specific network first.
    entries.sort(key=lambda e: -e[0].prefixlen)
    return tuple(entries)


def site_of(ip: str, networks: tuple[tuple[Network, str], ...]) -> str:
    """The site whose network contains ``ip``; "" when none does or ``ip`` is not an address.

    An IPv4 client seen through a dual-stack socket (``::ffff:10.1.2.3``) is matched
    as its IPv4 address.
    """
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip)
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for network, site in networks:
        if address.version == network.version and address in network:
            return site
    return ""
