"""Find and load the moderation heads that fit a served embedding model, once at start."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.errors import AgentError
from agent.model_registry import ModelRegistry
from agent.moderation.classifier import ModerationClassifier, ModerationHeads, heads_dir_for
from models.manifest import MANIFEST_FILENAME

__all__ = ["load_moderation"]

log = logging.getLogger(__name__)


def load_moderation(
    models_dir: Path, registry: ModelRegistry, *, verify: bool = True
) -> tuple[ModerationClassifier | None, str]:
    """The classifier for the first served embedding model that has heads under
    ``models_dir/moderation/<name>``, or None and why not (said once, at start: checks
    that need it then fail closed with 503 moderation_unavailable)."""
    served = sorted(registry.embedding_models)
    if not served:
        reason = "no embedding model is served (moderation reads all-minilm-l6-v2's vectors)"
        log.warning("moderation unavailable: %s", reason)
        return None, reason
    tried = []
    for name in served:
        directory = heads_dir_for(models_dir, name)
        if not (directory / MANIFEST_FILENAME).is_file():
            tried.append(str(directory))
            continue
        try:
            heads = ModerationHeads(directory, verify=verify)
        except AgentError as exc:
            log.error("moderation unavailable: %s", exc.message)
            return None, exc.message
        # looked up per call: a hot swap replaces the registry's dict
        classifier = ModerationClassifier(heads, lambda m: registry.embedding_models.get(m))
        why_not = classifier.unavailable_reason()
        if why_not is not None:
            log.error("moderation unavailable: %s", why_not)
            return None, why_not
        log.info(
            "moderation: heads %s version %s on %s (covers %s)",
            heads.name,
            heads.version,
            name,
            ", ".join(sorted(classifier.covered)),
        )
        return classifier, ""
    reason = (
        f"no moderation heads for {', '.join(served)} (looked in {', '.join(tried)}; "
        "build them with python -m models build)"
    )
    log.warning("moderation unavailable: %s", reason)
    return None, reason
