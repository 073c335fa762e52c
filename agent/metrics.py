"""Prometheus metrics of one agent, all named ``edgefleet_agent_*``.

Each app owns its registry, so tests can build fresh apps side by side.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.engine.interface import StepStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_TIME_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgefleet_agent_requests",
            "HTTP API requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_latency = Histogram(
            "edgefleet_agent_request_latency_seconds",
            "End-to-end latency of API requests",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "edgefleet_agent_time_to_first_token_seconds",
            "Time from request arrival to the first generated token",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "edgefleet_agent_time_per_output_token_seconds",
            "Time between generated tokens after the first",
            ["model"],
            buckets=_TOKEN_TIME_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "edgefleet_agent_prompt_tokens", "Prompt tokens processed", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "edgefleet_agent_generation_tokens", "Tokens generated", ["model"], registry=r
        )
        self.running = Gauge(
            "edgefleet_agent_running_sequences", "Sequences being generated", registry=r
        )
        self.waiting = Gauge(
            "edgefleet_agent_waiting_sequences", "Sequences waiting for the engine", registry=r
        )
        self.queue_wait = Histogram(
            "edgefleet_agent_queue_wait_seconds",
            "Time a sequence waited before the engine admitted it",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kv_cache_used_tokens = Gauge(
            "edgefleet_agent_kv_cache_used_tokens",
            "Key/value cache allocated, in tokens (slots padded to the longest sequence)",
            registry=r,
        )
        self.kv_cache_used_ratio = Gauge(
            "edgefleet_agent_kv_cache_used_ratio",
            "Key/value cache promised to admitted sequences (rows x the longest one's "
            "prompt + max_tokens) over the configured budget",
            registry=r,
        )
        self.kv_cache_bytes = Gauge(
            "edgefleet_agent_kv_cache_bytes",
            "Key/value memory held by the text engines, by part (slots: the running "
            "sequences' buffers, freed when idle; prefix: the prefix cache, kept while idle "
            "within engine.prefix_cache_bytes)",
            ["part"],
            registry=r,
        )
        self.model_resident_bytes = Gauge(
            "edgefleet_agent_model_resident_bytes",
            "Bytes a text model's weights hold while loaded (measured across its load and "
            "warm-up; 0 when not loaded)",
            ["model"],
            registry=r,
        )
        self.model_state = Gauge(
            "edgefleet_agent_model_state",
            "1 for the state each text model is in (available, loading, loaded, draining, failed)",
            ["model", "state"],
            registry=r,
        )
        self.memory_budget_bytes = Gauge(
            "edgefleet_agent_memory_budget_bytes",
            "The text models' memory budget (residency.budget_bytes) and what loaded models "
            "commit of it, by part",
            ["part"],
            registry=r,
        )
        self.model_loads = Counter(
            "edgefleet_agent_model_loads",
            "Text model loads by reason (start, pinned, request, command) and result",
            ["model", "reason", "result"],
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "edgefleet_agent_model_load_seconds",
            "Seconds a text model's load took (session, engine and warm-up)",
            ["model"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.model_load_wait = Histogram(
            "edgefleet_agent_model_load_wait_seconds",
            "Seconds a request waited for its model to load",
            ["model"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
            registry=r,
        )
        self.model_evictions = Counter(
            "edgefleet_agent_model_evictions",
            "Text models unloaded, by reason (keep_alive, room, command)",
            ["model", "reason"],
            registry=r,
        )
        self.model_reloads = Counter(
            "edgefleet_agent_model_reloads_after_eviction",
            "Loads within a minute of the same model's eviction (thrash)",
            ["model"],
            registry=r,
        )
        self.batch_size = Histogram(
            "edgefleet_agent_batch_size",
            "Sequences decoded together per engine step",
            buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
            registry=r,
        )
        self.speculative_proposed = Counter(
            "edgefleet_agent_speculative_proposed_tokens",
            "Tokens proposed by prompt lookup and verified (engine.speculative_tokens)",
            registry=r,
        )
        self.speculative_accepted = Counter(
            "edgefleet_agent_speculative_accepted_tokens",
            "Proposed tokens the model chose too, handed on without a step of their own "
            "(acceptance rate: accepted / proposed)",
            registry=r,
        )
        self.speculative_position_cost = Gauge(
            "edgefleet_agent_speculative_position_cost",
            "A proposed position's cost as a share of a one-position decode step, as the "
            "engine last measured it (the draft lengths follow it; the model that last "
            "decoded alone)",
            registry=r,
        )
        self.tokens_per_step = Histogram(
            "edgefleet_agent_decode_tokens_per_step",
            "Tokens a decode step handed on per sequence (1 without speculation)",
            buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8),
            registry=r,
        )
        self.step_seconds = Histogram(
            "edgefleet_agent_step_seconds",
            "Engine step time by part (ort: ONNX Runtime, sample: token choice, total)",
            ["part"],
            buckets=(0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
            registry=r,
        )
        self.rejections = Counter(
            "edgefleet_agent_rejections",
            "Requests refused by admission control, by reason",
            ["reason"],
            registry=r,
        )
        self.prefix_reused_tokens = Counter(
            "edgefleet_agent_prefix_reused_tokens",
            "Prompt tokens whose keys/values came from the prefix cache (not recomputed)",
            registry=r,
        )
        self.cache_hits = Counter(
            "edgefleet_agent_cache_hits", "Responses served from the response cache", registry=r
        )
        self.coordinator = Gauge(
            "edgefleet_agent_coordinator",
            "1 for the coordinator this agent's session is open with (the target as "
            "configured, with the address when a name stands for several); none while "
            "disconnected",
            ["target"],
            registry=r,
        )
        self.cache_misses = Counter(
            "edgefleet_agent_cache_misses",
            "Cacheable requests not found in the response cache",
            registry=r,
        )
        self.semantic_cache_lookups = Counter(
            "edgefleet_agent_semantic_cache_lookups",
            "Semantic cache lookups after an exact-cache miss, by outcome (hit; miss: nothing "
            "close enough; refused: close enough, but the lexical guard found a difference; "
            "ineligible: time-sensitive, too long or empty)",
            ["outcome"],
            registry=r,
        )
        self.semantic_cache_refusals = Counter(
            "edgefleet_agent_semantic_cache_refusals",
            "Semantic cache candidates refused by the lexical guard, by what differed "
            "(number, date, negation, antonym, entity, direction, url, code, swap, qualifier)",
            ["reason"],
            registry=r,
        )
        self.moderation_flagged = Counter(
            "edgefleet_agent_moderation_flagged",
            "Requests in which content moderation found a category, by stage (input, "
            "output), category and the key's action for it (block, flag)",
            ["stage", "category", "action"],
            registry=r,
        )
        self.moderation_check_seconds = Histogram(
            "edgefleet_agent_moderation_check_seconds",
            "Time one moderation check took (one input check, or one output window batch)",
            ["stage"],
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )

    def set_coordinator(self, target: str | None) -> None:
        """The session opened with ``target``; None: it ended."""
        self.coordinator.clear()
        if target is not None:
            self.coordinator.labels(target).set(1)

    # the engine's listener interface (agent.engine.interface.BatcherListener)

    def on_step(self, stats: StepStats) -> None:
        if stats.batch_size:
            self.batch_size.observe(stats.batch_size)
            self.tokens_per_step.observe(stats.decoded_tokens / stats.batch_size)
        if stats.proposed_tokens:
            self.speculative_proposed.inc(stats.proposed_tokens)
            self.speculative_accepted.inc(stats.accepted_tokens)
        if stats.position_cost:
            self.speculative_position_cost.set(stats.position_cost)
        self.step_seconds.labels("ort").observe(stats.ort_s)
        self.step_seconds.labels("sample").observe(stats.sample_s)
        self.step_seconds.labels("total").observe(stats.step_s)

    def on_admitted(self, queue_wait_s: float) -> None:
        self.queue_wait.observe(queue_wait_s)

    def on_rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def on_prefix_reused(self, tokens: int) -> None:
        self.prefix_reused_tokens.inc(tokens)

    # the residency's listener interface (agent.engine.residency.ResidencyListener)
    def on_load(self, model: str, reason: str, result: str, seconds: float) -> None:
        self.model_loads.labels(model, reason, result).inc()
        if result == "loaded":
            self.model_load_seconds.labels(model).observe(seconds)

    def on_load_wait(self, model: str, seconds: float) -> None:
        self.model_load_wait.labels(model).observe(seconds)

    def on_eviction(self, model: str, reason: str) -> None:
        self.model_evictions.labels(model, reason).inc()

    def on_reload_after_eviction(self, model: str) -> None:
        self.model_reloads.labels(model).inc()

    def set_residency(self, snapshot: list[dict[str, object]], budget: int, committed: int) -> None:
        self.memory_budget_bytes.labels("budget").set(budget)
        self.memory_budget_bytes.labels("committed").set(committed)
        states = ("available", "loading", "loaded", "draining", "failed")
        for slot in snapshot:
            model = str(slot["model"])
            resident = slot["resident_bytes"]
            self.model_resident_bytes.labels(model).set(resident if isinstance(resident, int)
                                                        else 0)  # fmt: skip
            for state in states:
                self.model_state.labels(model, state).set(1 if slot["state"] == state else 0)
