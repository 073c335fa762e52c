"""The content-safety classifier: heads on the agent's own MiniLM vectors, worst window wins.

A text is cut into windows (:func:`models.moderation_spec.token_windows`), the windows are
embedded by the served embedding model the heads were trained on (its batcher runs them off
the event loop), the heads (``heads.onnx``: one logistic regression per category) score
each window, and a text takes each category's worst window. ``sexual/minors`` is a rule
(:func:`verdict`), never a head.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.engine.interface import EmbeddingModel
from agent.engine.ort_session import SessionConfig, create_session
from agent.engine.text_codec import load_tokenizer
from agent.errors import InvalidRequestError, ModelLoadError, ModerationUnavailableError
from models.errors import ModelsError
from models.manifest import MANIFEST_FILENAME, ModelManifest, load_manifest, verify_files
from models.moderation_spec import (
    CATEGORIES,
    HEADS_FILE,
    METADATA_KEY,
    MINORS,
    SEXUAL,
    minor_cues,
    token_windows,
)

__all__ = [
    "HEADS_SUBDIR",
    "ModerationClassifier",
    "ModerationHeads",
    "Verdict",
    "embedded_text",
    "heads_dir_for",
    "verdict",
]

log = logging.getLogger(__name__)

#: heads for embedding model NAME live in <models.dir>/moderation/NAME (the build's target
#: directory, out of the agent's model list)
HEADS_SUBDIR = "moderation"
#: windows one request may ask for (the embedding queue holds 4,096 inputs by default)
MAX_WINDOWS_PER_REQUEST = 1024
#: windows one request puts in the embedding model's queue at a time: another request's
#: check waits behind at most this many of them, not all 1,024
EMBED_CHUNK_WINDOWS = 64


#: texts of one window whose vectors one request keeps (the semantic cache reuses the last
#: user message's: agent/semantic_responder.py)
_KEPT_PER_REQUEST = 64
# (embedding model, its version, text) -> the vector of the text's only window, for the
# request (the asyncio task) whose checks computed it
_EMBEDDED: ContextVar[dict[tuple[str, str, str], list[float]] | None] = ContextVar(
    "moderation_embedded", default=None
)


def embedded_text(text: str, model_id: str, version: str) -> list[float] | None:
    """The vector this request's content check computed for ``text`` with that embedding
    model version, when the text was one window (``[CLS] text [SEP]``: what the model
    embeds for it alone); else None."""
    kept = _EMBEDDED.get()
    return None if kept is None else kept.get((model_id, version, text))


def heads_dir_for(models_dir: Path, embedding_model: str) -> Path:
    return models_dir / HEADS_SUBDIR / embedding_model


@dataclass(frozen=True)
class Verdict:
    """One text's result: per category a decision and a score (0..1)."""

    flagged: bool
    categories: Mapping[str, bool]
    scores: Mapping[str, float]
    covered: frozenset[str]  # the categories this classifier decides (others: False, 0.0)
    minor_cue: bool = field(default=False)  # the text names a minor (never the words)


def verdict(
    scores: Mapping[str, float],
    thresholds: Mapping[str, float],
    covered: frozenset[str],
    text: str,
    sexual_minors_threshold: float,
) -> Verdict:
    """Decide one text from its heads' scores.

    ``sexual/minors`` has no head and no data: it is flagged when the sexual head scores at
    least ``sexual_minors_threshold`` (lower than sexual's own threshold) and the text names
    a minor (an age under 18, child or teen words). No policy turns this rule off.
    """
    decided: dict[str, bool] = {}
    out: dict[str, float] = {}
    for category in CATEGORIES:
        score = float(scores.get(category, 0.0)) if category in covered else 0.0
        out[category] = score
        decided[category] = category in covered and score >= thresholds.get(category, 1.0)
    cue = bool(minor_cues(text))
    sexual = float(scores.get(SEXUAL, 0.0))
    out[MINORS] = sexual if cue else 0.0
    decided[MINORS] = cue and sexual >= sexual_minors_threshold
    return Verdict(
        flagged=any(decided.values()),
        categories=decided,
        scores=out,
        covered=covered | {MINORS},
        minor_cue=cue,
    )


class ModerationHeads:
    """A heads artifact: the graph, its categories and thresholds, the tokenizer."""

    def __init__(self, directory: Path, *, verify: bool = True) -> None:
        try:
            self.manifest: ModelManifest = load_manifest(directory / MANIFEST_FILENAME)
            if verify:
                verify_files(self.manifest, directory)
        except ModelsError as exc:
            raise ModelLoadError(f"moderation heads {directory} are unusable: {exc}") from exc
        self.directory = directory
        self.session = create_session(
            directory / HEADS_FILE, SessionConfig(intra_op_threads=1, execution_provider="cpu")
        )
        raw = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        try:
            meta: dict[str, Any] = json.loads(raw or "")
            self.categories: tuple[str, ...] = tuple(meta["categories"])
            self.covered = frozenset(meta["covered"])
            self.thresholds: dict[str, float] = {k: float(v) for k, v in meta["thresholds"].items()}
            self.sexual_minors_threshold = float(meta["sexual_minors_sexual_threshold"])
            self.window_tokens = int(meta["window_tokens"])
            self.window_stride = int(meta["window_stride"])
            self.embedding_model: str = meta["embedding_model"]["name"]
            self.embedding_version: str = meta["embedding_model"]["version"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(
                f"{directory / HEADS_FILE}: no usable {METADATA_KEY} metadata: {exc}"
            ) from exc
        if set(self.categories) != set(CATEGORIES):
            raise ModelLoadError(
                f"{directory}: heads for categories {self.categories}, this agent knows "
                f"{CATEGORIES}"
            )
        self.tokenizer = load_tokenizer(directory / self.manifest.tokenizer.file)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        cls_id = self.tokenizer.token_to_id("[CLS]")
        sep_id = self.tokenizer.token_to_id("[SEP]")
        if cls_id is None or sep_id is None:
            raise ModelLoadError(f"{directory}: the tokenizer has no [CLS] or [SEP] token")
        self.cls_id, self.sep_id = int(cls_id), int(sep_id)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        """The heads' version (sha256 of heads.onnx, whose metadata holds the thresholds)."""
        return self.manifest.version

    def windows(self, texts: Sequence[str]) -> list[list[list[int]]]:
        """Each text's windows (token ids with [CLS] and [SEP])."""
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [
            token_windows(
                e.ids, self.cls_id, self.sep_id, window=self.window_tokens,
                stride=self.window_stride,
            )
            for e in encoded
        ]  # fmt: skip

    def score(self, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Scores (windows x categories, in ``self.categories`` order)."""
        out: npt.NDArray[np.float32] = self.session.run(
            ["scores"], {"embedding": vectors.astype(np.float32, copy=False)}
        )[0]
        return out


class ModerationClassifier:
    """Scores texts with ``heads`` on the vectors of the embedding model ``lookup`` gives
    (looked up per call: a hot-swapped model is picked up, a closed one never used)."""

    def __init__(
        self, heads: ModerationHeads, lookup: Callable[[str], EmbeddingModel | None]
    ) -> None:
        self.heads = heads
        self._lookup = lookup

    @property
    def name(self) -> str:
        return self.heads.name

    @property
    def version(self) -> str:
        return self.heads.version

    @property
    def covered(self) -> frozenset[str]:
        return self.heads.covered | {MINORS}

    def unavailable_reason(self) -> str | None:
        """Why the heads cannot score now (their embedding model gone or another version),
        else None."""
        model = self._lookup(self.heads.embedding_model)
        if model is None:
            return f"the embedding model {self.heads.embedding_model} is not served"
        if model.version != self.heads.embedding_version:
            return (
                f"the heads {self.version} were trained on {self.heads.embedding_model} "
                f"version {self.heads.embedding_version}; this agent serves {model.version} "
                "(rebuild them: python -m models build)"
            )
        return None

    def _embedder(self) -> EmbeddingModel:
        reason = self.unavailable_reason()
        model = self._lookup(self.heads.embedding_model)
        if reason is not None or model is None:
            raise ModerationUnavailableError(f"moderation is unavailable: {reason}")
        return model

    async def classify(self, texts: Sequence[str]) -> list[Verdict]:
        """One verdict per text. A text with no letter or digit (empty, spaces, new lines,
        punctuation) is clean without being scored: the heads give such a text nonsense
        scores (0.8 harassment for the empty text). Tokenizing and scoring run in threads;
        the embedding model's batcher runs the windows on its own worker."""
        self._embedder()  # fail before tokenizing, whatever the texts
        worded = [i for i, text in enumerate(texts) if has_words(text)]
        if len(worded) < len(texts):
            scored = iter(await self.classify([texts[i] for i in worded]) if worded else [])
            chosen = set(worded)
            return [
                next(scored) if i in chosen else self._clean(text) for i, text in enumerate(texts)
            ]
        per_text = await asyncio.to_thread(self.heads.windows, texts)
        total = sum(len(w) for w in per_text)
        if total > MAX_WINDOWS_PER_REQUEST:
            raise InvalidRequestError(
                f"input is {total} windows of {self.heads.window_tokens} tokens; one request "
                f"may have at most {MAX_WINDOWS_PER_REQUEST} (send fewer or shorter texts)",
                param="input",
            )
        flat = [w for windows in per_text for w in windows]
        model = self._embedder()
        vectors: list[list[float]] = []
        for start in range(0, len(flat), EMBED_CHUNK_WINDOWS):  # others' checks interleave
            vectors += (await model.embed(flat[start : start + EMBED_CHUNK_WINDOWS])).vectors
        _keep(model, texts, per_text, vectors)
        return await asyncio.to_thread(self._verdicts, texts, per_text, vectors)

    def _clean(self, text: str) -> Verdict:
        return verdict(
            {}, self.heads.thresholds, self.heads.covered, text, self.heads.sexual_minors_threshold
        )

    def _verdicts(
        self,
        texts: Sequence[str],
        per_text: Sequence[Sequence[Sequence[int]]],
        vectors: list[list[float]],
    ) -> list[Verdict]:
        scores = self.heads.score(np.asarray(vectors, dtype=np.float32))
        verdicts = []
        start = 0
        for text, windows in zip(texts, per_text, strict=True):
            worst = scores[start : start + len(windows)].max(axis=0)
            start += len(windows)
            by_name = {c: float(s) for c, s in zip(self.heads.categories, worst, strict=True)}
            verdicts.append(
                verdict(
                    by_name,
                    self.heads.thresholds,
                    self.heads.covered,
                    text,
                    self.heads.sexual_minors_threshold,
                )
            )
        return verdicts


def has_words(text: str) -> bool:
    """Whether ``text`` holds a letter or a digit: what the heads can judge at all."""
    return any(ch.isalnum() for ch in text)


def _keep(
    model: EmbeddingModel,
    texts: Sequence[str],
    per_text: Sequence[Sequence[Sequence[int]]],
    vectors: list[list[float]],
) -> None:
    kept = _EMBEDDED.get()
    if kept is None:
        kept = {}
        _EMBEDDED.set(kept)
    start = 0
    for text, windows in zip(texts, per_text, strict=True):
        if len(windows) == 1 and len(kept) < _KEPT_PER_REQUEST:
            kept[(model.model_id, model.version, text)] = vectors[start]
        start += len(windows)
