"""The moderation classifier's contract, shared by its build and the agent that runs it.

Heads (one logistic regression per category) sit on the agent's own MiniLM sentence
embeddings. A text is cut into windows of at most :data:`WINDOW_TOKENS` tokens (special
tokens included), each window is embedded and scored, and the text scores its worst
window: a long text does not dilute one bad passage. The build and the agent cut windows
with :func:`token_windows`, so the vectors the heads were trained on are the vectors they
score.

``sexual/minors`` has no training data, ever: it is a rule (:func:`minor_cues`), flagged
when the sexual head scores above a low threshold and a text names a minor.

This module imports only the standard library: the agent imports it at run time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = [
    "BUNDLED_HEADS_DIR",
    "BUNDLED_HEADS_KEY",
    "CATEGORIES",
    "HEADS_FILE",
    "METADATA_KEY",
    "MINORS",
    "OPENAI_CATEGORIES",
    "PROMPT_INJECTION",
    "SEXUAL",
    "WINDOW_STRIDE",
    "WINDOW_TOKENS",
    "minor_cues",
    "token_windows",
]

# OpenAI's moderation categories (omni-moderation), in the order its API lists them
OPENAI_CATEGORIES: Final = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
PROMPT_INJECTION: Final = "prompt_injection"
SEXUAL: Final = "sexual"
MINORS: Final = "sexual/minors"
#: every category a result names: OpenAI's, then ours
CATEGORIES: Final = (*OPENAI_CATEGORIES, PROMPT_INJECTION)

#: tokens per window, [CLS] and [SEP] included
WINDOW_TOKENS: Final = 128
#: tokens between window starts: windows overlap by WINDOW_TOKENS - 2 - WINDOW_STRIDE, so
#: a phrase cut by one window's end is whole in the next
WINDOW_STRIDE: Final = 96

#: the heads' graph in the artifact, and the key of its metadata (categories, thresholds)
HEADS_FILE: Final = "heads.onnx"
#: the heads travel inside the embedding model's artifact, in this directory (its files
#: listed in that model's manifest, so syncing the model brings them): the heads' own
#: manifest.json, heads.onnx and the tokenizer
BUNDLED_HEADS_DIR: Final = "moderation"
#: the embedding model's manifest names its heads here (name, version, manifest path)
BUNDLED_HEADS_KEY: Final = "moderation_heads"
METADATA_KEY: Final = "edgefleet.moderation"


def token_windows(
    ids: Sequence[int], cls_id: int, sep_id: int, *, window: int = WINDOW_TOKENS,
    stride: int = WINDOW_STRIDE,
) -> list[list[int]]:  # fmt: skip
    """``ids`` (a text's tokens without special tokens) as ``[CLS] ... [SEP]`` windows of at
    most ``window`` tokens, starting every ``stride`` tokens; the last window ends at the
    text's end. An empty text is one window ``[CLS] [SEP]``."""
    body = window - 2
    if body < 1 or not 1 <= stride <= body:
        raise ValueError(f"window {window} and stride {stride}: need 1 <= stride <= window - 2")
    tokens = list(ids)
    if len(tokens) <= body:
        return [[cls_id, *tokens, sep_id]]
    starts = list(range(0, len(tokens) - body, stride))
    starts.append(len(tokens) - body)  # the last window ends at the text's end
    return [[cls_id, *tokens[s : s + body], sep_id] for s in dict.fromkeys(starts)]


# A minor named in a text: an age under 18, or a word for a child or a teenager.
_WORDS = (
    r"child|children|childs?|kid|kids|kiddie|minor|minors|underage|under-age|under age|"
    r"teen|teens|teenage|teenager|teenagers|teenaged|preteen|preteens|pre-teen|pre-teens|tween|tweens|"
    r"adolescent|adolescents|toddler|toddlers|infant|infants|juvenile|juveniles|"
    r"schoolgirl|schoolgirls|schoolboy|schoolboys|jailbait|loli|lolita|shota|pedo|"
    r"paedo|pedophile|paedophile|pedophilia|paedophilia|"
    r"little (?:girl|boy|girls|boys)|young (?:girl|boy|girls|boys)|"
    r"(?:elementary|primary|middle|junior high) school(?:er|ers)?|"
    r"(?:1st|2nd|3rd|[4-8]th|first|second|third|fourth|fifth|sixth|seventh|eighth) grade(?:r|rs)?"
)
_AGE = r"(?:[1-9]|1[0-7])"
_MINOR_RE: Final = re.compile(
    rf"\b(?:{_WORDS})\b"
    rf"|\b{_AGE}\s*-?\s*(?:years?|yrs?)\s*-?\s*olds?\b"
    rf"|\b{_AGE}\s*(?:yo|y/o|y\.o\.)(?!\w)"
    rf"|\b(?:aged?|age of|age)\s*{_AGE}\b"
    rf"|\b(?:under|below)\s*(?:the\s+age\s+of\s*)?(?:1[0-8])\b",
    re.IGNORECASE,
)


def minor_cues(text: str) -> list[str]:
    """The phrases of ``text`` that name a minor (an age under 18, child or teen words),
    lower-cased, in order; empty when there are none."""
    return [m.group(0).lower() for m in _MINOR_RE.finditer(text)]
