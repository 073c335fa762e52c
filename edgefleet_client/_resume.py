"""Streams that survive an agent's death: resume a broken SSE completion on another agent.

A streamed ``/v1/chat/completions`` or ``/v1/completions`` request is sent with the agent
API's ``return_token_ids`` extension, so every chunk names the token ids it delivers. When
the stream breaks after some of them (the connection drops, the body ends without
``[DONE]``, or the agent ends it with an ``engine_error``/``internal_error``/``overloaded``
error event), the same request goes to the next agent serving the same model version (its
``/v1/models`` ``version`` equals the chunks' ``system_fingerprint``), with the ids already
delivered as ``continue_token_ids`` and ``max_tokens`` reduced by their number. The caller
reads one uninterrupted stream: the resumed segment's role chunk is dropped, its chunks keep
the first segment's ``id``, and its usage is reported as if nothing had happened.

Which agent served which part is recorded in :class:`~edgefleet_client.StreamSegment` s,
reachable as ``response.extensions["edgefleet_segments"]`` (with the ``openai`` SDK:
``stream.response.extensions["edgefleet_segments"]``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx2

from edgefleet_client._models import Agent, StreamSegment

logger = logging.getLogger(__name__)

RESUMABLE_PATHS = ("/v1/chat/completions", "/v1/completions")
# codes of error events after which another agent may well succeed
RESUMABLE_ERROR_CODES = frozenset(
    {"engine_error", "engine_restarted", "engine_unavailable", "internal_error", "overloaded"}
)
SEGMENTS = "edgefleet_segments"  # response extension: list[StreamSegment]


class StreamBroken(Exception):
    """Why a segment ended before the completion did (internal)."""


def resumable_body(request: httpx2.Request, body: bytes) -> dict[str, Any] | None:
    """The JSON body of a streamed completion request, or None when it is something else."""
    if request.method != "POST" or not request.url.path.endswith(RESUMABLE_PATHS):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("stream") is not True:
        return None
    return data


# Opens a continuation: (body, agents to skip) -> (agent, response), or raises StreamBroken.
Opener = Callable[[dict[str, Any], str, set[str]], tuple[Agent, httpx2.Response]]


class ResumingStream(httpx2.SyncByteStream):
    """The SSE bytes of one completion, across as many agents as it takes."""

    def __init__(
        self,
        body: dict[str, Any],
        agent: Agent,
        response: httpx2.Response,
        first: bytes,
        rest: Iterator[bytes],
        opener: Opener,
        segments: list[StreamSegment],
        max_resumes: int = 3,
    ) -> None:
        self._body = body
        self._chat = "messages" in body
        self._opener = opener
        self._response = response
        self._chunks: Iterator[bytes] = self._prefixed(first, rest)
        self._max_resumes = max_resumes
        self.segments = segments
        self.segments.append(StreamSegment(agent.agent_id, agent.url, first_token=0))
        self.delivered: list[int] = list(body.get("continue_token_ids") or [])
        self._caller_continued = len(self.delivered)
        self._id: str | None = None
        self._version: str | None = None
        self._finished = False  # a finish_reason was delivered
        self._done = False  # [DONE] was delivered
        # every token max_tokens allows was delivered before the break, not the finish: the
        # resumed segment generates one more (max_tokens is at least 1) only for its finish
        # and usage; its token is dropped, the finish is "length"
        self._spent = False
        self._spent_dropped = 0  # tokens such a segment generated, not passed on

    @staticmethod
    def _prefixed(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
        if first:
            yield first
        yield from rest

    def __iter__(self) -> Iterator[bytes]:
        resumes = 0
        while True:
            try:
                yield from self._segment()
                if self._done:
                    return
                raise StreamBroken("the stream ended before [DONE]")
            except (httpx2.TransportError, StreamBroken) as exc:
                self._response.close()
                if self._finished:  # only [DONE] (or the usage chunk) was missing
                    self._done = True
                    yield b"data: [DONE]\n\n"
                    return
                if resumes >= self._max_resumes:
                    raise httpx2.ReadError(f"stream broke {resumes + 1} times: {exc}") from exc
                resumes += 1
                try:
                    self._resume(f"{type(exc).__name__}: {exc}")
                except StreamBroken as failed:
                    raise httpx2.ReadError(f"{exc}; {failed}") from failed

    def _segment(self) -> Iterator[bytes]:
        buffer = b""
        for raw in self._chunks:
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                out = self._event(event)
                if out is not None:
                    yield out + b"\n\n"
                if self._done:
                    return

    def _event(self, event: bytes) -> bytes | None:
        """What to pass on of one event (None: drop it); raises StreamBroken to resume."""
        lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return event
        payload = b"\n".join(line[5:].strip() for line in lines)
        if payload == b"[DONE]":
            self._done = True
            return event
        try:
            data = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(data, dict):
            return event
        error = data.get("error")
        if isinstance(error, dict):
            if error.get("code") in RESUMABLE_ERROR_CODES:
                raise StreamBroken(f"agent ended the stream with {error.get('code')}")
            return event
        resumed = len(self.segments) > 1
        if resumed and self._spent:
            return self._spent_event(data)
        if self._id is None:
            self._id = data.get("id")
            self._version = data.get("system_fingerprint")
        choices = data.get("choices") or []
        ids: list[int] = []
        for choice in choices:
            ids += choice.get("token_ids") or []
            if choice.get("finish_reason"):
                self._finished = True
        if resumed and self._chat and choices and not ids and not self._finished:
            delta = choices[0].get("delta") or {}
            if delta.get("role") and not delta.get("content"):
                return None  # the resumed segment's role chunk: the caller had one
        self.delivered += ids
        self.segments[-1].tokens += len(ids)
        if not resumed:
            return event
        data["id"] = self._id
        self._as_one_completion(data.get("usage"))
        return b"data: " + json.dumps(data, separators=(",", ":")).encode()

    def _as_one_completion(self, usage: object, dropped: int = 0) -> bool:
        """Rewrite a resumed segment's usage (if ``usage`` is one) as that of one
        uninterrupted completion: the tokens it took as continuation were completion
        tokens, and ``dropped`` tokens it generated never reached the caller."""
        if not isinstance(usage, dict):
            return False
        moved = self.segments[-1].first_token - self._caller_continued
        usage["prompt_tokens"] = usage.get("prompt_tokens", 0) - moved
        usage["completion_tokens"] = usage.get("completion_tokens", 0) + moved - dropped
        if dropped and "total_tokens" in usage:
            usage["total_tokens"] -= dropped
        return True

    def _spent_event(self, data: dict[str, Any]) -> bytes | None:
        """An event of a segment resumed only for its finish (see ``_spent``): its token is
        not the caller's (the first segment delivered all max_tokens allowed)."""
        data["id"] = self._id
        dropped = 0
        finished = False
        for choice in data.get("choices") or []:
            dropped += len(choice.pop("token_ids", None) or [])
            choice.pop("logprobs", None)
            if isinstance(choice.get("delta"), dict):
                choice["delta"] = {}
            if "text" in choice:
                choice["text"] = ""
            if choice.get("finish_reason"):
                choice["finish_reason"] = "length"
                finished = True
        self._spent_dropped += dropped
        if not self._as_one_completion(data.get("usage"), self._spent_dropped) and not finished:
            return None  # the role chunk, the dropped token's chunk
        if finished:
            self._finished = True
        return b"data: " + json.dumps(data, separators=(",", ":")).encode()

    def _resume(self, why: str) -> None:
        broken = self.segments[-1]
        k = len(self.delivered)
        logger.warning(
            "stream broke on agent %s after %d tokens (%s); resuming elsewhere",
            broken.agent_id, k, why,
        )  # fmt: skip
        body = dict(self._body)
        body["return_token_ids"] = True
        if k:
            body["continue_token_ids"] = list(self.delivered)
        done_here = k - self._caller_continued
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                if body[key] - done_here < 1:
                    self._spent = True
                body[key] = max(1, body[key] - done_here)
        skip = {s.agent_id for s in self.segments if s.agent_id == broken.agent_id}
        agent, response = self._opener(body, self._version or "", skip)
        self._response = response
        self._chunks = response.iter_raw()
        self.segments.append(StreamSegment(agent.agent_id, agent.url, first_token=k))

    def close(self) -> None:
        self._response.close()
