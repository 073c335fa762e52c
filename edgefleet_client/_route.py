"""Asking the coordinator where to go: ``GET /v1/route`` (standard library only).

With several coordinators serving one fleet, a lookup that cannot reach one, or gets a
5xx from it, asks the next; any other answer (an agent list, or a 4xx that every
coordinator would give alike) is final.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edgefleet_client._exceptions import DiscoveryError
from edgefleet_client._models import Agent
from edgefleet_client._trust import _is_loopback


def coordinator_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """The coordinator URLs in ``urls``: one, several comma-separated, or a sequence."""
    items = urls.split(",") if isinstance(urls, str) else urls
    return tuple(u.strip() for u in items if u.strip())


class _Unavailable(DiscoveryError):
    """This coordinator could not answer (unreachable, or 5xx): another one may."""


def route_lookup(
    coordinator_url: str | Sequence[str],
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
    api_key: str = "",
) -> list[Agent]:
    """The coordinator's ranked agents for ``model`` (best first); raises DiscoveryError.

    ``coordinator_url``: one URL, several comma-separated, or a sequence of them: each is
    asked in turn until one answers (an unreachable one or a 5xx moves on to the next).
    ``api_key``: the fleet API key the client sends to agents (sent to a coordinator over
    HTTPS or on loopback only); with it, a key whose policy blocks a moderation category is
    routed only to agents that enforce it."""
    return route_lookup_first(
        coordinator_urls(coordinator_url),
        model,
        site=site,
        lat=lat,
        lon=lon,
        rtt_ms=rtt_ms,
        exclude=exclude,
        limit=limit,
        timeout_s=timeout_s,
        ssl_context=ssl_context,
        api_key=api_key,
    )[1]


def route_lookup_first(
    urls: Sequence[str],
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
    api_key: str = "",
) -> tuple[str, list[Agent]]:
    """(the URL that answered, its agents): ``urls`` asked in order until one answers."""
    if not urls:
        raise DiscoveryError("no coordinator URL given")
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
    query = urllib.parse.urlencode(params)
    failures: list[str] = []
    for url in urls:
        try:
            return url, _lookup(url, query, timeout_s, ssl_context, api_key)
        except _Unavailable as exc:
            failures.append(str(exc))
    raise DiscoveryError("; ".join(failures))


def _lookup(
    coordinator_url: str,
    query: str,
    timeout_s: float,
    ssl_context: ssl.SSLContext | None,
    api_key: str = "",
) -> list[Agent]:
    url = coordinator_url.rstrip("/") + "/v1/route?" + query
    # the key travels only where it cannot be read on the way: HTTPS, or loopback
    split = urllib.parse.urlsplit(coordinator_url)
    private = split.scheme == "https" or _is_loopback(split.hostname or "")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key and private else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=ssl_context) as response:
            body: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:
        failed = _Unavailable if exc.code >= 500 else DiscoveryError
        raise failed(f"route lookup at {coordinator_url} failed: {exc.code}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _Unavailable(f"cannot reach the coordinator at {coordinator_url}: {exc}") from exc
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
