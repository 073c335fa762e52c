"""How loaded and how healthy this agent is: the load reports it sends to the coordinator.

Each field is the one fleet.proto defines: the engine's running and waiting sequences
(each counted once), tokens/s over the last interval, KV cache use, available memory,
request counters, whether the agent is draining or unhealthy, and what each API key used
since the previous report (requests, prompt and completion tokens, rejections), what
each overflow target served for it (summed from the request records, with cost), the
redactions by type, the semantic cache's lookups by outcome; with model sync, the model
inventory and what each model version served (TTFT histogram).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import Counter

from agent.agent_state import AgentState
from agent.auth.keys import KeyTable
from agent.metrics import AgentMetrics
from agent.model_registry import ModelRegistry
from agent.sync.stats import ModelStatsCollector
from edgefleet.contract import LoadReport, ModelInventory, OverflowUsage

#: the moderation heads scoring now ("" none), flags by category:action and by key
ModerationReport = tuple[str, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]


def _free_memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class LoadSampler:
    """Turns the agent's metrics into load reports (tokens/s over the last interval)."""

    def __init__(
        self,
        registry: ModelRegistry,
        metrics: AgentMetrics,
        state: AgentState | None = None,
        keys: KeyTable | None = None,
        redactions: Callable[[], Mapping[str, int]] | None = None,
        overflow_usage: Callable[[], tuple[OverflowUsage, ...]] | None = None,
        *,
        inventory: Callable[[], tuple[ModelInventory, ...]] | None = None,
        model_stats: ModelStatsCollector | None = None,
        moderation: Callable[[], ModerationReport] | None = None,
    ) -> None:
        self._registry = registry
        self._redactions = redactions
        self._keys = keys
        self._overflow_usage = overflow_usage
        self._metrics = metrics
        self._state = state
        self._inventory = inventory
        self._model_stats = model_stats
        self._moderation = moderation
        self._last_time = time.monotonic()
        self._last_tokens = self._tokens()

    def _tokens(self) -> float:
        return sum(value for _, value in _totals(self._metrics.generation_tokens))

    def __call__(self) -> LoadReport:
        now = time.monotonic()
        tokens = self._tokens()
        rate = (tokens - self._last_tokens) / max(now - self._last_time, 1e-6)
        self._last_time, self._last_tokens = now, tokens
        load = self._registry.load()
        requests = failed = 0.0
        for labels, value in _totals(self._metrics.requests):
            requests += value
            if _is_server_error(labels["status"]):
                failed += value
        state = self._state
        residency = self._registry.residency
        heads, flags, flags_by_key = (
            ("", (), ()) if self._moderation is None else self._moderation()
        )
        return LoadReport(
            running_sequences=load.running,
            waiting_sequences=load.waiting,
            tokens_per_second=rate,
            kv_cache_used_fraction=load.kv_used_fraction,
            kv_cache_used_tokens=load.kv_used_tokens,
            free_memory_bytes=_free_memory_bytes(),
            requests_total=int(requests),
            requests_failed_total=int(failed),
            draining=state is not None and state.draining,
            unhealthy_reason="" if state is None else state.unhealthy_reason,
            key_usage=() if self._keys is None else self._keys.take_usage(),
            redactions=()
            if self._redactions is None
            else tuple(sorted(self._redactions().items())),
            overflow_usage=() if self._overflow_usage is None else self._overflow_usage(),
            inventory=() if self._inventory is None else self._inventory(),
            model_stats=() if self._model_stats is None else self._model_stats.take(),
            cold_models=() if residency is None else residency.cold(),
            memory_budget_bytes=0 if residency is None else residency.config.budget_bytes,
            memory_committed_bytes=0 if residency is None else residency.committed_bytes(),
            moderation_heads=heads,
            moderation_flags=flags,
            moderation_flags_by_key=flags_by_key,
            semantic_cache_lookups=tuple(
                sorted(
                    (labels["outcome"], int(value))
                    for labels, value in _totals(self._metrics.semantic_cache_lookups)
                )
            ),
        )


def _is_server_error(status: str) -> bool:
    """A 5xx status code label (compared as a number: "99" is not above "500")."""
    return status.isdigit() and 500 <= int(status) <= 599


def _totals(counter: Counter) -> Iterator[tuple[dict[str, str], float]]:
    """A counter's ``_total`` samples (not its ``_created`` ones), with their labels."""
    for family in counter.collect():
        total = f"{family.name}_total"
        for sample in family.samples:
            if sample.name == total:
                yield sample.labels, sample.value
