"""Content safety: the moderation classifier (heads on MiniLM vectors) and its loading."""

from agent.moderation.classifier import (
    ModerationClassifier,
    ModerationHeads,
    Verdict,
    heads_dir_for,
    verdict,
)
from agent.moderation.loader import load_moderation

__all__ = [
    "ModerationClassifier",
    "ModerationHeads",
    "Verdict",
    "heads_dir_for",
    "load_moderation",
    "verdict",
]
