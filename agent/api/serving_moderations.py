"""``/v1/moderations``: OpenAI's moderation request and response, scored at the edge."""

from __future__ import annotations

import asyncio
import uuid

from agent.api.protocol import (
    MODERATION_MAX_CHARS,
    MODERATION_MAX_INPUTS,
    ModerationRequest,
    ModerationResponse,
    ModerationResult,
)
from agent.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    ModerationUnavailableError,
    OverloadedError,
)
from agent.moderation import ClassifierSource, ModerationClassifier
from models.moderation_spec import CATEGORIES

#: model names a client may send: OpenAI's (mapped to this agent's classifier) or ours
OPENAI_MODERATION_MODELS = frozenset(
    {"omni-moderation-latest", "omni-moderation-2024-09-26", "text-moderation-latest",
     "text-moderation-stable", "text-moderation-007"}
)  # fmt: skip


#: requests waiting for the endpoint (one classifies at a time); more are 429 overloaded
MAX_WAITING = 8


class ModerationService:
    """``/v1/moderations`` with the classifier ``source`` gives per request (the heads of
    the embedding model version served now).

    One request classifies at a time (the classifier embeds its windows a chunk at a
    time, agent/moderation/classifier.py) and at most :data:`MAX_WAITING` wait (429
    beyond): a flood of large moderation requests queued all their windows at once in the
    batcher the input and output checks of every chat request use, which then waited
    behind all of them."""

    def __init__(self, source: ClassifierSource) -> None:
        self._source = source
        self._busy = asyncio.Semaphore(1)
        self._waiting = 0

    @property
    def classifier(self) -> ModerationClassifier | None:
        return self._source()[0]

    async def create(self, req: ModerationRequest) -> ModerationResponse:
        classifier, unavailable = self._source()
        if classifier is None:
            raise ModerationUnavailableError(f"moderation is unavailable: {unavailable}")
        if req.model is not None and not self._known(req.model, classifier):
            raise ModelNotFoundError(
                f"model {req.model!r} is not a moderation model here; send "
                f"{classifier.name!r} or one of OpenAI's names "
                f"({', '.join(sorted(OPENAI_MODERATION_MODELS))}), or leave it out",
                param="model",
            )
        texts = _texts(req)
        if self._waiting >= MAX_WAITING:
            raise OverloadedError(
                f"/v1/moderations is busy ({MAX_WAITING} requests waiting); retry shortly",
                reason="queue_full",
            )
        self._waiting += 1
        entered = False
        try:
            async with self._busy:
                self._waiting -= 1
                entered = True
                verdicts = await classifier.classify(texts)
        finally:
            if not entered:  # cancelled while waiting
                self._waiting -= 1
        results = [
            ModerationResult(
                flagged=v.flagged,
                categories={c: v.categories[c] for c in CATEGORIES},
                category_scores={c: round(v.scores[c], 6) for c in CATEGORIES},
                category_applied_input_types={
                    c: ["text"] if c in v.covered else [] for c in CATEGORIES
                },
            )
            for v in verdicts
        ]
        return ModerationResponse(
            id=f"modr-{uuid.uuid4().hex}",
            model=f"{classifier.name}@{classifier.version}",
            results=results,
        )

    @staticmethod
    def _known(model: str, classifier: ModerationClassifier) -> bool:
        name, at, version = model.partition("@")
        if model in OPENAI_MODERATION_MODELS:
            return True
        return name == classifier.name and (not at or version == classifier.version)


def _texts(req: ModerationRequest) -> list[str]:
    """The request's texts, refused with the field named when too many or too long."""
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if not texts:
        raise InvalidRequestError("input is an empty list; send 1 or more texts", param="input")
    if len(texts) > MODERATION_MAX_INPUTS:
        raise InvalidRequestError(
            f"input has {len(texts)} texts; one request may have at most {MODERATION_MAX_INPUTS}",
            param="input",
        )
    for i, text in enumerate(texts):
        if len(text) > MODERATION_MAX_CHARS:
            where = "input" if isinstance(req.input, str) else f"input[{i}]"
            raise InvalidRequestError(
                f"{where} has {len(text)} characters; at most {MODERATION_MAX_CHARS} per text",
                param=where,
            )
    return texts
