"""Content safety in the request path: the input check before the response cache and any
overflow, and the output check on what the engine generates.

:class:`ModerationGate` (one per agent) turns a request's key policy into a
:class:`RequestModeration`, or refuses the request with 503 ``moderation_unavailable``
when the key asks to block a category and this agent has no classifier (fail closed); a
policy that only flags passes unchecked then (fail open), and so do the defaults (block
sexual/minors, flag the rest) on an agent without the embedding model, so an upgrade
changes no answer there.

Output is checked in windows of at most :data:`STEP_TOKENS` generated tokens (the
model's tokens), closed early at a sentence's end: the heads score sentences and short
prompts well, and one bad sentence inside a long harmless passage scores far lower (the
passage dilutes it). Each window is scored alone and after the window before it, so a
phrase cut by a window's start is whole in one of them; a window with no letter or digit is
not scored, and a fragment of fewer than FRAGMENT_WORDS words only after the window before
(see :func:`_scored`). A whole (not streamed)
completion is cut at the start of its first blocked window, ``finish_reason:
"content_filter"``. A stream in ``buffered`` mode holds each window back until it has
passed, so the client never receives a blocked window; on a hit the generation is closed
(its engine slot freed) and the stream ends with ``content_filter``. In ``unbuffered``
mode text goes out at once and windows are checked behind it: a hit ends the stream, but
what was sent cannot be recalled. The classifier runs its windows through the embedding
model's batcher, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import suppress
from typing import Any

from agent.engine.interface import GenerationOutput
from agent.errors import ContentFilterError, ModerationUnavailableError
from agent.metrics import AgentMetrics
from agent.moderation.classifier import ModerationClassifier, has_words
from agent.moderation.loader import ClassifierSource, fixed_classifier
from agent.moderation.policy import DirectionPolicy, Judgement, ResolvedModeration, resolve
from edgefleet.contract import KeyPolicy, ModerationStreamMode

__all__ = ["STEP_TOKENS", "FlagTally", "ModerationGate", "RequestModeration"]

log = logging.getLogger(__name__)

#: most generated tokens in one checked window (released when streamed, cut when whole)
STEP_TOKENS = 32
#: fewest tokens in a window a sentence's end closes
MIN_TOKENS = 4
#: a window of fewer words is scored only joined to the window before it (when there is one)
FRAGMENT_WORDS = 3
#: what ends a sentence (and a window, past MIN_TOKENS)
SENTENCE_ENDS = frozenset(".!?;\n\u3002\uff01\uff1f")  # and the CJK full stop, !, ?
#: an overflow answer's "tokens": words with the space after them
_WORDS = re.compile(r"\S+\s*|\s+")
#: policies resolved and kept (keys are few; each resolution is ~30 dict entries)
_RESOLVED_MAX = 1024


class FlagTally:
    """Requests flagged or blocked since start: per ``category:action`` (a request counts
    once per pair) and per API key id ("" without one; at most :data:`MAX_KEYS` keys, later
    ones not counted). Counts only, for the load report."""

    MAX_KEYS = 1024

    def __init__(self) -> None:
        self.by_flag: dict[str, int] = {}
        self.by_key: dict[str, int] = {}

    def request(self, key_id: str) -> None:
        if key_id in self.by_key or len(self.by_key) < self.MAX_KEYS:
            self.by_key[key_id] = self.by_key.get(key_id, 0) + 1

    def flag(self, category: str, action: str) -> None:
        name = f"{category}:{action}"
        self.by_flag[name] = self.by_flag.get(name, 0) + 1


class ModerationGate:
    """The agent's classifier (looked up per request from ``source``: the heads of the
    embedding model version served now; None: unavailable, and why) and what each policy
    comes to."""

    def __init__(self, source: ClassifierSource, metrics: AgentMetrics) -> None:
        self._source = source
        self.metrics = metrics
        self.tally = FlagTally()
        self._resolved: dict[KeyPolicy | None, ResolvedModeration] = {}

    def report(self) -> tuple[str, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
        """For the load report: the heads scoring now (``name@version``; "" none), and the
        flag counts by ``category:action`` and by key (sorted pairs)."""
        classifier = self._source()[0]
        heads = "" if classifier is None else f"{classifier.name}@{classifier.version}"
        return (
            heads,
            tuple(sorted(self.tally.by_flag.items())),
            tuple(sorted(self.tally.by_key.items())),
        )

    @property
    def classifier(self) -> ModerationClassifier | None:
        return self._source()[0]

    @classifier.setter
    def classifier(self, classifier: ModerationClassifier | None) -> None:
        """Always this classifier from now on (tests inject scores this way)."""
        self._source = fixed_classifier(classifier)

    def _resolve(self, policy: KeyPolicy | None) -> ResolvedModeration:
        found = self._resolved.get(policy)
        if found is None:
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            found = self._resolved[policy] = resolve(policy)
        return found

    def for_request(
        self, policy: KeyPolicy | None, key_id: str | None = None
    ) -> RequestModeration | None:
        """The request's checks (None: nothing to check, or no classifier and nothing the
        key blocks); ModerationUnavailableError when the key blocks a category and no
        classifier can tell."""
        resolved = self._resolve(policy)
        classifier, unavailable = self._source()
        if classifier is None:
            if resolved.explicit_block:
                raise ModerationUnavailableError(
                    "this API key's moderation policy blocks categories, and moderation is "
                    f"unavailable on this agent: {unavailable}"
                )
            return None
        if not resolved.input.active and not resolved.output.active:
            return None
        return RequestModeration(classifier, self.metrics, resolved, self.tally, key_id or "")


class RequestModeration:
    """One request's checks, and what they found (categories only, never the text)."""

    def __init__(
        self,
        classifier: ModerationClassifier,
        metrics: AgentMetrics,
        policy: ResolvedModeration,
        tally: FlagTally | None = None,
        key_id: str = "",
    ) -> None:
        self._classifier = classifier
        self._metrics = metrics
        self.policy = policy
        self._tally = tally
        self._key_id = key_id
        # (stage, category, action) found so far, each once
        self.found: list[tuple[str, str, str]] = []

    @property
    def checks_output(self) -> bool:
        return self.policy.output.active

    @property
    def output_flagged(self) -> bool:
        return any(stage == "output" for stage, _, _ in self.found)

    def cache_tag(self) -> str:
        """What the response-cache key must carry: the heads' version and output policy."""
        return f"{self._classifier.version}|{self.policy.tag()}"

    def flagged_header(self) -> str | None:
        """``X-Edgefleet-Moderation`` value (``flagged=harassment,violence``), or None."""
        flagged = sorted({c for _, c, a in self.found if a == "flag"})
        return f"flagged={','.join(flagged)}" if flagged else None

    def record(self) -> list[str]:
        """For the request's record: ``stage:category:action``, never any text."""
        return [f"{s}:{c}:{a}" for s, c, a in self.found]

    def _note(self, stage: str, judgement: Judgement) -> None:
        for action, categories in (("block", judgement.blocked), ("flag", judgement.flagged)):
            for category in categories:
                entry = (stage, category, action)
                if entry not in self.found:
                    if self._tally is not None:
                        if not self.found:
                            self._tally.request(self._key_id)
                        if not any(c == category and a == action for _, c, a in self.found):
                            self._tally.flag(category, action)
                    self.found.append(entry)
                    self._metrics.moderation_flagged.labels(stage, category, action).inc()

    async def _judge(
        self, stage: str, direction: DirectionPolicy, texts: Sequence[str]
    ) -> list[Judgement]:
        started = time.perf_counter()
        try:
            verdicts = await self._classifier.classify(texts)
        except ModerationUnavailableError:
            if direction.explicit_block:
                raise  # fail closed
            log.warning("moderation %s check skipped: the classifier is unavailable", stage)
            return [Judgement() for _ in texts]
        finally:
            self._metrics.moderation_check_seconds.labels(stage).observe(
                time.perf_counter() - started
            )
        return [direction.judge(v) for v in verdicts]

    async def check_input(self, texts: Sequence[tuple[str, str]]) -> None:
        """Check (param, text) pairs; ContentFilterError (400 content_filter) naming the
        categories and the first part at fault when the policy blocks one."""
        direction = self.policy.input
        texts = [(p, t) for p, t in texts if t]
        if not direction.active or not texts:
            return
        judgements = await self._judge("input", direction, [t for _, t in texts])
        blocked: list[str] = []
        param = None
        for (where, _), judgement in zip(texts, judgements, strict=True):
            self._note("input", judgement)
            if judgement.blocked and param is None:
                param = where
            blocked.extend(c for c in judgement.blocked if c not in blocked)
        if blocked:
            raise ContentFilterError(
                f"the input was flagged by content moderation in {', '.join(blocked)}, which "
                f"this API key's policy blocks ({param})",
                param=param,
            )

    async def _window(self, window: str, before: str) -> Judgement:
        """One output window, scored alone and after the window before it (a phrase cut
        by the window's start is whole there); blocked or flagged when either is."""
        texts = _scored(window, before)
        if not texts:
            return Judgement()
        judgements = await self._judge("output", self.policy.output, texts)
        judgement = Judgement(
            tuple(dict.fromkeys(c for j in judgements for c in j.blocked)),
            tuple(dict.fromkeys(c for j in judgements for c in j.flagged)),
        )
        self._note("output", judgement)
        return judgement

    async def check_text(self, text: str) -> tuple[str, bool]:
        """An answer that did not come from this agent's engine (an overflow target's),
        checked as a whole completion, its words counted as tokens: (what is kept, cut)."""
        words = [w for w in _WORDS.findall(text)]

        async def outputs() -> AsyncIterator[GenerationOutput]:
            for i, word in enumerate(words):
                yield GenerationOutput(word, (i,), "stop" if i == len(words) - 1 else None, 0, i)

        kept = [o async for o in self._whole(outputs())]
        cut = bool(kept) and kept[-1].finish_reason == "content_filter"
        return "".join(o.text for o in kept), cut

    async def screen_chunks(
        self, chunks: AsyncIterator[dict[str, Any]], text_of: Callable[[dict[str, Any]], str]
    ) -> AsyncIterator[dict[str, Any]]:
        """An overflow target's stream (OpenAI chunks), held back and checked window by
        window as a buffered stream is (``unbuffered`` keys too: a target's text is
        checked before it is sent); on a blocked window a last chunk with
        ``finish_reason: "content_filter"`` ends it and the target's stream is closed."""
        before = ""
        pending: list[dict[str, Any]] = []
        window = ""
        counted = 0
        try:
            async for chunk in chunks:
                pending.append(chunk)
                piece = text_of(chunk)
                window += piece
                counted += len(_WORDS.findall(piece))
                choices = chunk.get("choices") or []
                finished = any(c.get("finish_reason") for c in choices if isinstance(c, dict))
                ends = any(c in piece for c in SENTENCE_ENDS) and counted >= MIN_TOKENS
                if not (finished or counted >= STEP_TOKENS or ends):
                    continue
                if window and (await self._window(window, before)).blocked:
                    yield _cut_chunk(chunk)
                    return
                for held in pending:
                    yield held
                before, window, pending, counted = window or before, "", [], 0
            for held in pending:  # a stream that ended without a finish reason
                yield held
        finally:
            await _close(chunks)

    def screen(
        self, outputs: AsyncIterator[GenerationOutput], *, streamed: bool
    ) -> AsyncIterator[GenerationOutput]:
        """``outputs`` with the output check applied (see the module's docstring)."""
        if not streamed:
            return self._whole(outputs)
        if self.policy.stream_mode is ModerationStreamMode.UNBUFFERED:
            return self._unbuffered(outputs)
        return self._buffered(outputs)

    async def _whole(
        self, outputs: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[GenerationOutput]:
        """Every window scored in one call once the generation is done; cut at the first
        blocked one."""
        collected = [o async for o in outputs]
        windows: list[list[GenerationOutput]] = [[]]
        counted = 0
        for output in collected:
            windows[-1].append(output)
            counted += _tokens(output)
            if _closes(counted, output):
                windows.append([])
                counted = 0
        windows = [w for w in windows if w]
        texts = ["".join(o.text for o in w) for w in windows]
        pairs = [
            (i, scored)
            for i, text in enumerate(texts)
            for scored in _scored(text, texts[i - 1] if i else "")
        ]
        judgements = (
            await self._judge("output", self.policy.output, [t for _, t in pairs]) if pairs else []
        )
        blocked_at = len(windows)
        for (i, _), judgement in zip(pairs, judgements, strict=True):
            self._note("output", judgement)
            if judgement.blocked:
                blocked_at = min(blocked_at, i)
        for window in windows[:blocked_at]:
            for output in window:
                yield output
        if blocked_at < len(windows):
            yield _cut(collected[-1])

    async def _buffered(
        self, outputs: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[GenerationOutput]:
        before = ""
        pending: list[GenerationOutput] = []
        counted = 0
        try:
            async for output in outputs:
                pending.append(output)
                counted += _tokens(output)
                if not _closes(counted, output):
                    continue
                window = "".join(o.text for o in pending)
                if window and (await self._window(window, before)).blocked:
                    yield _cut(output)
                    return  # the finally closes the generation: its slot is freed now
                for held in pending:
                    yield held
                before = window or before
                pending, counted = [], 0
        finally:
            await _close(outputs)

    async def _unbuffered(
        self, outputs: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[GenerationOutput]:
        checks: deque[asyncio.Task[Judgement]] = deque()
        before = window = ""
        counted = 0

        def hit() -> bool:
            while checks and checks[0].done():
                if checks.popleft().result().blocked:
                    return True
            return False

        try:
            async for output in outputs:
                if output.finish_reason is not None:
                    window += output.text
                    if window:
                        checks.append(asyncio.create_task(self._window(window, before)))
                    await asyncio.gather(*checks)  # the rest, before the stream ends
                    yield _cut(output) if hit() else output
                    return
                if hit():
                    yield _cut(output)
                    return
                yield output
                window += output.text
                counted += _tokens(output)
                if _closes(counted, output) and window:
                    checks.append(asyncio.create_task(self._window(window, before)))
                    before, window, counted = window, "", 0
        finally:
            for task in checks:
                task.cancel()
            await _close(outputs)


def _scored(window: str, before: str) -> list[str]:
    """What of one output window is scored. Nothing when it holds no letter or digit: a
    generation often ends with an output whose text is empty or a newline, and the heads
    score an empty text 0.8 harassment (every answer that stopped by itself was flagged).
    Only joined to the window before when it is a fragment of fewer than FRAGMENT_WORDS
    words (what a generation cut at max_tokens leaves): alone, 'The' scores 0.87 and
    'It is.' 0.71 harassment, and a fragment of a phrase is whole in the joined text.
    Otherwise alone and joined to the window before (a phrase cut by its start)."""
    if not has_words(window):
        return []
    if not before:
        return [window]
    if len(window.split()) < FRAGMENT_WORDS:
        return [before + window]
    return [window, before + window]


def _tokens(output: GenerationOutput) -> int:
    return len(output.token_ids) or (1 if output.text else 0)


def _closes(counted: int, output: GenerationOutput) -> bool:
    """A window ends at the generation's end, at STEP_TOKENS, or at a sentence's end once
    it holds MIN_TOKENS: the heads were trained on sentences and short prompts, and a bad
    sentence scored inside a long harmless passage is diluted below its threshold."""
    if output.finish_reason is not None or counted >= STEP_TOKENS:
        return True
    return counted >= MIN_TOKENS and any(c in output.text for c in SENTENCE_ENDS)


def _cut_chunk(last: dict[str, Any]) -> dict[str, Any]:
    """The chunk that ends a cut overflow stream: ``last``'s ids, no text, content_filter."""
    chunk = {k: v for k, v in last.items() if k not in ("choices", "usage")}
    choices = last.get("choices") or [{"index": 0}]
    chunk["choices"] = [
        {"index": c.get("index", 0) if isinstance(c, dict) else 0, "delta": {},
         "finish_reason": "content_filter"}
        for c in choices[:1]
    ]  # fmt: skip
    if "text" in (choices[0] if isinstance(choices[0], dict) else {}):
        chunk["choices"] = [{"index": 0, "text": "", "finish_reason": "content_filter"}]
    return chunk


def _cut(last: GenerationOutput) -> GenerationOutput:
    """The output that ends a cut generation: no text, ``content_filter``, its counts."""
    return GenerationOutput(
        text="",
        token_ids=(),
        finish_reason="content_filter",
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
    )


async def _close(outputs: AsyncIterator[Any]) -> None:
    close = getattr(outputs, "aclose", None)
    if close is not None:
        with suppress(Exception):
            await close()
