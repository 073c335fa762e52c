"""What the agent tells the coordinator: who it is (Hello) and how loaded it is."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

import onnxruntime as ort
from prometheus_client import Counter

from agent.config import AgentConfig
from agent.coordinator_session import AgentIdentity, HardwareInfo, LoadSnapshot, ModelInfo
from agent.metrics import AgentMetrics
from agent.model_registry import ModelRegistry
from agent.state import AgentState


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


def _free_memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
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
        lat=config.identity.latitude,
        lon=config.identity.longitude,
        version=agent_version(),
        hardware=HardwareInfo(
            cpu_count=os.cpu_count() or 0,
            memory_bytes=_memory_bytes(),
            execution_providers=tuple(ort.get_available_providers()),
        ),
        models=models,
    )


class LoadSampler:
    """Turns the agent's metrics into load reports (tokens/s over the last interval)."""

    def __init__(
        self, registry: ModelRegistry, metrics: AgentMetrics, state: AgentState | None = None
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._state = state
        self._last_time = time.monotonic()
        self._last_tokens = self._tokens()

    def _tokens(self) -> float:
        return sum(value for _, value in _totals(self._metrics.generation_tokens))

    def __call__(self) -> LoadSnapshot:
        now = time.monotonic()
        tokens = self._tokens()
        rate = (tokens - self._last_tokens) / max(now - self._last_time, 1e-6)
        self._last_time, self._last_tokens = now, tokens
        load = self._registry.load()
        requests = failed = 0.0
        for labels, value in _totals(self._metrics.requests):
            requests += value
            if labels["status"] >= "500":
                failed += value
        return LoadSnapshot(
            queue_depth=load.waiting,
            running_sequences=load.running,
            waiting_sequences=load.waiting,
            tokens_per_second=rate,
            kv_cache_used_fraction=load.kv_used_fraction,
            kv_cache_used_tokens=load.kv_used_tokens,
            free_memory_bytes=_free_memory_bytes(),
            requests_total=int(requests),
            requests_failed_total=int(failed),
            draining=self._state is not None and self._state.draining,
        )


def _totals(counter: Counter) -> Iterator[tuple[dict[str, str], float]]:
    """A counter's ``_total`` samples (not its ``_created`` ones), with their labels."""
    for family in counter.collect():
        total = f"{family.name}_total"
        for sample in family.samples:
            if sample.name == total:
                yield sample.labels, sample.value
