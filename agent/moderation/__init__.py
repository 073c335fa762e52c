"""Content safety: the moderation classifier (heads on MiniLM vectors) and its loading."""

from agent.moderation.classifier import (
    ModerationClassifier,
    ModerationHeads,
    Verdict,
    heads_dir_for,
    verdict,
)
from agent.moderation.loader import ClassifierSource, ModerationShelf, fixed_classifier

__all__ = [
    "ClassifierSource",
    "ModerationClassifier",
    "ModerationHeads",
    "ModerationShelf",
    "Verdict",
    "fixed_classifier",
    "heads_dir_for",
    "verdict",
]
