"""Hello to and from JSON, for storing it."""

from __future__ import annotations

import json
from typing import Any

from edgefleet.contract import Hardware, Hello, LoadedModel, Location


def hello_to_json(hello: Hello) -> str:
    """JSON of a Hello, without its token."""
    return json.dumps(
        {
            "agent_id": hello.agent_id,
            "site": hello.site,
            "http_url": hello.http_url,
            "agent_version": hello.agent_version,
            "location": None
            if hello.location is None
            else [hello.location.lat, hello.location.lon],
            "hardware": {
                "cpu_count": hello.hardware.cpu_count,
                "memory_bytes": hello.hardware.memory_bytes,
                "execution_providers": list(hello.hardware.execution_providers),
            },
            "models": [[m.name, m.version, m.task, m.variant] for m in hello.models],
            "contract_minor": hello.contract_minor,
        },
        separators=(",", ":"),
    )


def hello_from_json(text: str) -> Hello:
    """The Hello stored by ``hello_to_json`` (or by the code before contract versions)."""
    data: dict[str, Any] = json.loads(text)
    hw = data["hardware"]
    location = data["location"]
    return Hello(
        agent_id=data["agent_id"],
        site=data["site"],
        http_url=data["http_url"],
        agent_version=data["agent_version"],
        location=None if location is None else Location(lat=location[0], lon=location[1]),
        hardware=Hardware(
            cpu_count=hw["cpu_count"],
            memory_bytes=hw["memory_bytes"],
            execution_providers=tuple(hw["execution_providers"]),
        ),
        models=tuple(LoadedModel(*m) for m in data["models"]),
        # Stored before contract versions: the agent spoke minor 0.
        contract_minor=data.get("contract_minor", 0),
    )
