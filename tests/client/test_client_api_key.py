"""FleetClient presents the fleet API key: to the OpenAI SDK and on its own HTTP client."""

from __future__ import annotations

import pytest

from edgefleet_client import FleetClient


def test_api_key_is_sent_by_the_sdk_and_the_http_client() -> None:
    fleet = FleetClient("m", coordinator_url="http://127.0.0.1:9", api_key="ef-abc-secret")
    with fleet.openai() as client:
        assert client.api_key == "ef-abc-secret"
    with fleet.http_client() as http:
        assert http.headers["Authorization"] == "Bearer ef-abc-secret"


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_API_KEY", "ef-env-secret")
    fleet = FleetClient("m", coordinator_url="http://127.0.0.1:9")
    assert fleet.api_key == "ef-env-secret"
    with fleet.openai() as client:
        assert client.api_key == "ef-env-secret"
    monkeypatch.delenv("EDGEFLEET_API_KEY")
    with FleetClient("m").http_client() as http:
        assert "Authorization" not in http.headers
