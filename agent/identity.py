"""Who this agent is: the identity it announces in Hello (id, site, place, hardware, models)."""

from __future__ import annotations

import os
import socket
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

import onnxruntime as ort

from agent.config import AgentConfig
from agent.coordinator_session import AgentIdentity, HardwareInfo, ModelInfo
from agent.model_registry import ModelRegistry


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
) -> AgentIdentity:
    models = [
        ModelInfo(m.model_id, m.version, "text-generation", m.version.split("-")[0])
        for m in registry.text_models.values()
    ] + [
        ModelInfo(e.model_id, e.version, "feature-extraction", e.version.split("-")[0])
        for e in registry.embedding_models.values()
    ]
    return AgentIdentity(
        agent_id=agent_id,
        site=config.identity.site,
        http_url=public_url,
        lat=config.identity.latitude or 0.0,  # unknown place: 0.0 until the wire says unknown
        lon=config.identity.longitude or 0.0,
        version=agent_version(),
        hardware=HardwareInfo(
            cpu_count=os.cpu_count() or 0,
            memory_bytes=_memory_bytes(),
            execution_providers=tuple(ort.get_available_providers()),
        ),
        models=models,
    )
