"""The client presents its API key on route lookups (so a key whose policy blocks a
moderation category is routed only to agents that enforce it), and only where the key
cannot be read on the way: an HTTPS coordinator, or one on loopback."""

from __future__ import annotations

import io
import json
import urllib.request
from typing import Any

import pytest

from edgefleet_client._route import route_lookup

SECRET = "ef-0123456789ab-secret"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[urllib.request.Request]:
    seen: list[urllib.request.Request] = []

    def urlopen(request: urllib.request.Request, **_: Any) -> io.BytesIO:
        seen.append(request)
        return io.BytesIO(json.dumps({"agents": []}).encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return seen


@pytest.mark.parametrize(
    ("url", "carries"),
    [
        ("http://127.0.0.1:8080", True),
        ("http://localhost:8080", True),
        ("https://coordinator.example:8443", True),
        ("http://10.0.0.7:8080", False),  # plain HTTP across a network: never the key
    ],
)
def test_the_key_goes_to_the_coordinator_only_over_https_or_loopback(
    sent: list[urllib.request.Request], url: str, carries: bool
) -> None:
    route_lookup(url, "m", api_key=SECRET)
    (request,) = sent
    assert request.get_header("Authorization") == (f"Bearer {SECRET}" if carries else None)
    assert "/v1/route?model=m" in request.full_url


def test_without_a_key_the_lookup_says_nothing(sent: list[urllib.request.Request]) -> None:
    route_lookup("http://127.0.0.1:8080", "m")
    assert sent[0].get_header("Authorization") is None
