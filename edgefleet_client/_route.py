"""Asking the coordinator where to go: ``GET /v1/route`` (standard library only)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from edgefleet_client._exceptions import DiscoveryError
from edgefleet_client._models import Agent


def route_lookup(
    coordinator_url: str,
    model: str,
    *,
    site: str = "",
    lat: float | None = None,
    lon: float | None = None,
    rtt_ms: Mapping[str, float] | None = None,
    exclude: Iterable[str] = (),
    limit: int = 0,
    timeout_s: float = 5.0,
    ssl_context: ssl.SSLContext | None = None,
) -> list[Agent]:
    """The coordinator's ranked agents for ``model`` (best first); raises DiscoveryError."""
    params: list[tuple[str, str]] = [("model", model)]
    if site:
        params.append(("site", site))
    if lat is not None and lon is not None:
        params += [("lat", repr(lat)), ("lon", repr(lon))]
    if rtt_ms:
        params.append(("rtt", ",".join(f"{a}:{ms:.3f}" for a, ms in rtt_ms.items())))
    excluded = ",".join(exclude)
    if excluded:
        params.append(("exclude", excluded))
    if limit:
        params.append(("limit", str(limit)))
    url = coordinator_url.rstrip("/") + "/v1/route?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=ssl_context) as response:
            body: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:
        raise DiscoveryError(f"route lookup at {coordinator_url} failed: {exc.code}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DiscoveryError(f"cannot reach the coordinator at {coordinator_url}: {exc}") from exc
    return [
        Agent(
            agent_id=a["agent_id"],
            url=a["http_url"],
            site=a.get("site", ""),
            score=a.get("score"),
            score_parts=dict(a.get("score_parts", {})),
        )
        for a in body.get("agents", [])
    ]
