"""A flood of large /v1/moderations requests must not hold up the content checks of honest
chat requests, which share the embedding model's batcher.

Measured on a real agent (tiny-llama + MiniLM with its heads, keys on, shared 2-core box):
one request of 32 texts of 300 random words (about 1,000 windows) took 20 s; with four of
them in flight, a one-line chat request from a key whose input check runs took 75 s,
queued behind every window of every request. The classifier now puts a request's windows
in the queue 64 at a time (another check goes in between), and the endpoint classifies
one request at a time with at most 8 waiting (429 overloaded beyond)."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence

import pytest

from agent.api.protocol import ModerationRequest
from agent.api.serving_moderations import MAX_WAITING, ModerationService
from agent.engine.interface import EmbeddingResult
from agent.errors import OverloadedError
from agent.moderation import ModerationClassifier, Verdict
from agent.moderation import classifier as classifier_module
from agent.moderation.classifier import EMBED_CHUNK_WINDOWS, ModerationHeads
from agent.moderation.loader import fixed_classifier
from tests.conftest import ARTIFACTS

HEADS_DIR = ARTIFACTS / "all-minilm-l6-v2" / "moderation"


class QueueEmbedder:
    """MiniLM's batcher in miniature: one worker, first come first served, a millisecond a
    window; it records which caller's windows ran in which order."""

    model_id = "all-minilm-l6-v2"

    def __init__(self, version: str) -> None:
        self.version = version
        self.calls: list[tuple[str, int]] = []  # (the calling task's name, windows)
        self._worker = asyncio.Lock()

    async def embed(
        self, inputs: Sequence[str | Sequence[int]], *, wait_for_company: bool = True
    ) -> EmbeddingResult:
        task = asyncio.current_task()
        caller = "" if task is None else task.get_name()
        async with self._worker:
            self.calls.append((caller, len(inputs)))
            await asyncio.sleep(0.001 * len(inputs))
        return EmbeddingResult([_vector(w) for w in inputs], 0)


def _vector(window: object) -> list[float]:
    """A fixed unit vector per window (so chunked and whole runs can be compared)."""
    digest = hashlib.sha256(repr(window).encode()).digest() * 12
    raw = [b - 127.5 for b in digest[:384]]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


@pytest.fixture(scope="module")
def heads() -> ModerationHeads:
    if not HEADS_DIR.is_dir():  # built by python -m models build (the real_artifacts flow)
        from tests.e2e.moderation_helpers import built_minilm_with_heads

        built_minilm_with_heads()
    return ModerationHeads(HEADS_DIR)


def _texts(n: int, words: int) -> list[str]:
    return [" ".join(f"w{i}x{j}q" for j in range(words)) for i in range(n)]


def _flat(v: Verdict) -> tuple[bool, tuple[tuple[str, float], ...]]:
    return v.flagged, tuple(sorted(v.scores.items()))


async def test_a_big_request_is_embedded_a_chunk_at_a_time_with_the_same_verdicts(
    heads: ModerationHeads, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = QueueEmbedder(heads.embedding_version)
    classifier = ModerationClassifier(heads, lambda name: embedder)  # type: ignore[arg-type,return-value]
    texts = _texts(16, 300)
    chunked = await classifier.classify(texts)
    sizes = [n for _, n in embedder.calls]
    assert sum(sizes) > 192 and max(sizes) <= EMBED_CHUNK_WINDOWS <= 64
    monkeypatch.setattr(classifier_module, "EMBED_CHUNK_WINDOWS", 10**6)
    embedder.calls.clear()
    whole = await classifier.classify(texts)
    assert len(embedder.calls) == 1
    assert [_flat(v) for v in chunked] == [_flat(v) for v in whole]


async def test_an_honest_check_goes_in_between_a_big_requests_chunks(
    heads: ModerationHeads,
) -> None:
    embedder = QueueEmbedder(heads.embedding_version)
    classifier = ModerationClassifier(heads, lambda name: embedder)  # type: ignore[arg-type,return-value]
    big = asyncio.create_task(classifier.classify(_texts(32, 450)), name="big")
    while not embedder.calls:  # the big request is being embedded
        await asyncio.sleep(0.001)
    honest = asyncio.create_task(
        classifier.classify(["hello there, what are your opening hours?"]), name="honest"
    )
    await honest
    await big
    order = [caller for caller, _ in embedder.calls]
    before = sum(n for caller, n in embedder.calls[: order.index("honest")])
    total = sum(n for caller, n in embedder.calls if caller == "big")
    assert total > 512
    # the honest check waited behind the chunk running and at most one more (64 each)
    assert before <= 128, (before, total)


class HeldClassifier:
    name = "held"
    version = "1"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0
        self.most = 0

    async def classify(self, texts: Sequence[str]) -> list[Verdict]:
        self.running += 1
        self.most = max(self.most, self.running)
        await self.release.wait()
        self.running -= 1
        return [classifier_module.verdict({}, {}, frozenset(), t, 0.3) for t in texts]


async def test_one_request_classifies_at_a_time_and_a_flood_beyond_the_queue_is_429() -> None:
    held = HeldClassifier()
    service = ModerationService(fixed_classifier(held))  # type: ignore[arg-type]
    request = ModerationRequest(input=["a text"])
    running = [asyncio.ensure_future(service.create(request)) for _ in range(1 + MAX_WAITING)]
    await asyncio.sleep(0.05)
    assert held.running == 1
    with pytest.raises(OverloadedError):
        await service.create(request)
    running[-1].cancel()  # a waiter that goes away frees its place
    await asyncio.sleep(0)
    extra = asyncio.ensure_future(service.create(request))
    await asyncio.sleep(0.05)
    assert not extra.done()
    held.release.set()
    done = await asyncio.gather(*running[:-1], extra)
    assert held.most == 1 and all(len(r.results) == 1 for r in done)
