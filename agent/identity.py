"""Who this agent is: the identity it announces in Hello (id, site, place, hardware, models)."""

from __future__ import annotations

import os
import socket
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

import onnxruntime as ort

from agent.config import AgentConfig
from agent.model_registry import ModelRegistry
from edgefleet.contract import Hardware, Hello, LoadedModel, Location


def agent_version() -> str:
    try:
        return package_version("edgefleet")
    except PackageNotFoundError:
        return "0+unknown"


def default_agent_id(port: int) -> str:
    return f"{socket.gethostname()}-{port}"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def build_identity(
    config: AgentConfig, registry: ModelRegistry, agent_id: str, public_url: str
) -> Hello:
    """The Hello this agent sends; its place only when both coordinates are configured."""
    models = [
        LoadedModel(m.model_id, m.version, "text-generation", m.version.split("-")[0])
        for m in registry.text_models.values()
    ] + [
        LoadedModel(e.model_id, e.version, "feature-extraction", e.version.split("-")[0])
        for e in registry.embedding_models.values()
    ]
    lat, lon = config.identity.latitude, config.identity.longitude
    return Hello(
        agent_id=agent_id,
        site=config.identity.site,
        http_url=public_url,
        location=None if lat is None or lon is None else Location(lat=lat, lon=lon),
        agent_version=agent_version(),
        hardware=Hardware(
            cpu_count=os.cpu_count() or 0,
            memory_bytes=_memory_bytes(),
            execution_providers=tuple(ort.get_available_providers()),
        ),
        models=tuple(models),
    )
