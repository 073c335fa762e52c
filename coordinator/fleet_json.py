"""AgentHello to and from JSON, for storing it."""

from __future__ import annotations

import json
from typing import Any

from coordinator.fleet import AgentHello, Hardware, LoadedModel, Location


def hello_to_json(hello: AgentHello) -> str:
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
                "accelerators": list(hello.hardware.accelerators),
                "execution_providers": list(hello.hardware.execution_providers),
            },
            "models": [[m.name, m.version, m.task, m.variant] for m in hello.models],
        },
        separators=(",", ":"),
    )


def hello_from_json(text: str) -> AgentHello:
    data: dict[str, Any] = json.loads(text)
    hw = data["hardware"]
    location = data["location"]
    return AgentHello(
        agent_id=data["agent_id"],
        site=data["site"],
        http_url=data["http_url"],
        agent_version=data["agent_version"],
        location=None if location is None else Location(lat=location[0], lon=location[1]),
        hardware=Hardware(
            cpu_count=hw["cpu_count"],
            memory_bytes=hw["memory_bytes"],
            accelerators=tuple(hw["accelerators"]),
            execution_providers=tuple(hw["execution_providers"]),
        ),
        models=tuple(LoadedModel(*m) for m in data["models"]),
    )
