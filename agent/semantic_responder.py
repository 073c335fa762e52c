"""The semantic cache in the request path: embed the last user message, look it up in its
context, and keep finished answers (agent/semantic_cache.py holds the entries).

Only for what the API key's policy opts in to (``KeyPolicy.semantic_cache``) and only when
the served embedding model's exact version has a calibrated threshold
(``agent/semantic_cache_thresholds.json``): another version's cosines differ, so without
one nothing is answered by meaning. The embedding model is looked up per call (a hot swap
replaces it; its version is part of every context). An embedding that fails (queue full,
engine restarting) makes the lookup a plain miss: the cache never fails a request. When
content safety's input check embedded the last user message already (one window, the same
model version), that vector is used, not computed again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import AgentError
from agent.metrics import AgentMetrics
from agent.model_registry import ModelRegistry
from agent.moderation.classifier import embedded_text
from agent.response_cache import CachedGeneration
from agent.semantic_cache import (
    THRESHOLDS_FILE,
    SemanticCache,
    SemanticLookup,
    Vector,
    calibrated_misspelt_threshold,
    calibrated_threshold,
    semantic_context,
)

__all__ = ["EMBEDDER", "SemanticProbe", "SemanticResponder"]

log = logging.getLogger(__name__)

#: the embedding model the semantic cache reads (the one content safety reads too)
EMBEDDER = "all-minilm-l6-v2"


@dataclass(frozen=True)
class SemanticProbe:
    """Where a request's answer goes in the semantic cache once it is finished."""

    context: bytes = field(repr=False)
    prompt: str = field(repr=False)  # the last user message
    vector: Vector = field(repr=False)


class SemanticResponder:
    def __init__(
        self,
        cache: SemanticCache,
        registry: ModelRegistry,
        metrics: AgentMetrics,
        *,
        embedder: str = EMBEDDER,
        thresholds: Path = THRESHOLDS_FILE,
    ) -> None:
        self.cache = cache
        self._registry = registry
        self._metrics = metrics
        self._embedder = embedder
        self._thresholds = thresholds
        self._threshold_of: dict[str, float | None] = {}  # per embedding model version
        self._misspelt_of: dict[str, float | None] = {}

    def _threshold(self, version: str) -> float | None:
        if version not in self._threshold_of:
            found = calibrated_threshold(self._embedder, version, self._thresholds)
            if found is None:
                log.warning(
                    "semantic cache off: no calibrated threshold for %s %s in %s",
                    self._embedder,
                    version,
                    self._thresholds,
                )
            self._threshold_of[version] = found
            self._misspelt_of[version] = calibrated_misspelt_threshold(
                self._embedder, version, self._thresholds
            )
        return self._threshold_of[version]

    async def lookup(
        self,
        *,
        api_key_id: str,
        model_id: str,
        model_version: str,
        endpoint: str,
        fields: Mapping[str, Any],
        earlier: Sequence[Any],
        prompt: str,
        moderation_version: str,
    ) -> tuple[SemanticProbe | None, SemanticLookup]:
        """The lookup's outcome, and where the finished answer goes (None: nowhere)."""
        why = self.cache.ineligible(prompt)
        embedder = self._registry.embedding_models.get(self._embedder)
        threshold = None if embedder is None else self._threshold(embedder.version)
        if why or embedder is None or threshold is None:
            found = SemanticLookup("ineligible", reason=why or "no_calibrated_embedder")
            self._metrics.semantic_cache_lookups.labels(found.outcome).inc()
            return None, found
        # content safety's input check embedded the message already (when it was one
        # window, with this very model version): the same vector, not computed twice
        known = embedded_text(prompt, embedder.model_id, embedder.version)
        try:
            if known is None:
                # on the request's critical path: no waiting for other inputs to batch with
                embedded = await embedder.embed([prompt], wait_for_company=False)
                known = embedded.vectors[0]
            vector = np.asarray(known, dtype=np.float32)
        except AgentError as exc:
            log.info("semantic cache skipped: the embedding failed: %s", exc.message)
            found = SemanticLookup("ineligible", reason="embedding_failed")
            self._metrics.semantic_cache_lookups.labels(found.outcome).inc()
            return None, found
        context = semantic_context(
            api_key_id=api_key_id,
            model_id=model_id,
            model_version=model_version,
            endpoint=endpoint,
            fields=fields,
            earlier=earlier,
            embedder_version=embedder.version,
            moderation_version=moderation_version,
        )
        found = self.cache.lookup(
            context, prompt, vector, threshold, self._misspelt_of.get(embedder.version)
        )
        self._metrics.semantic_cache_lookups.labels(found.outcome).inc()
        if found.outcome == "refused":
            self._metrics.semantic_cache_refusals.labels(found.reason).inc()
        return SemanticProbe(context, prompt, vector), found

    def store(self, probe: SemanticProbe, generation: CachedGeneration) -> None:
        self.cache.put(probe.context, probe.prompt, probe.vector, generation)
