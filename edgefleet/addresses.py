"""Host addresses, the same rule on both planes."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost`` (any case), 127.0.0.0/8 or ::1 (brackets allowed): a bind address or a
    peer."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False
