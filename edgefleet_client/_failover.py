"""An httpx2 transport that sends each request to the best agent and fails over.

A request goes to the first candidate; on a connection error, or a 429/503 answer,
it is sent again to the next one. A non-streamed response is read whole before it is
returned, so a failure mid-body fails over too. A streamed (``text/event-stream``)
response is returned once its first chunk arrived: failures before the first token
fail over; a streamed chat or text completion that breaks later resumes on the next agent
serving the same model version (see :mod:`edgefleet_client._resume`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx2

from edgefleet_client._exceptions import no_agent_error
from edgefleet_client._models import Agent, StreamSegment
from edgefleet_client._resume import SEGMENTS, ResumingStream, StreamBroken, resumable_body

RETRY_STATUSES = frozenset({429, 503})
# headers that carry the caller's credentials, sent with the resume's version probe too
_CREDENTIAL_HEADERS = frozenset({b"authorization"})


class _PrefixedStream(httpx2.SyncByteStream):
    """The first chunk (already read), then the rest of the original stream."""

    def __init__(self, first: bytes, rest: Iterator[bytes], response: httpx2.Response) -> None:
        self._first = first
        self._rest = rest
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        if self._first:
            yield self._first
        yield from self._rest

    def close(self) -> None:
        self._response.close()


def _is_sse(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def _first_chunk(response: httpx2.Response) -> tuple[bytes, Iterator[bytes]]:
    chunks = response.iter_raw()
    first = b""
    while not first:
        try:
            first = next(chunks)
        except StopIteration:
            break
    return first, chunks


class Fleet(Protocol):
    """What the transport asks of the fleet (``FleetClient`` is one): the agents to try,
    best first, and what happened with each."""

    model: str

    @property
    def agents(self) -> list[Agent]: ...

    def candidates(self) -> list[Agent]: ...

    def mark_failed(self, agent: Agent, why: str) -> None: ...

    def mark_ok(self, agent: Agent) -> None: ...


class FailoverTransport(httpx2.BaseTransport):
    def __init__(self, fleet: Fleet, inner: httpx2.BaseTransport | None = None) -> None:
        self._fleet = fleet
        self._inner = inner or httpx2.HTTPTransport()

    def _attempt(self, request: httpx2.Request, agent: Agent, body: bytes) -> httpx2.Request:
        target = urlsplit(agent.url)
        url = request.url.copy_with(scheme=target.scheme, host=target.hostname, port=target.port)
        headers = [
            (k, v) for k, v in request.headers.raw if k.lower() not in (b"host", b"content-length")
        ]
        return httpx2.Request(
            request.method, url, headers=headers, content=body, extensions=request.extensions
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        resumable = resumable_body(request, body)
        if resumable is not None and not resumable.get("return_token_ids"):
            # ask for token ids, so that a stream broken later can be resumed by ids
            resumable["return_token_ids"] = True
            body = json.dumps(resumable).encode()
        failures: list[str] = []
        candidates = self._fleet.candidates()
        for position, agent in enumerate(candidates):
            last = position == len(candidates) - 1
            try:
                response = self._inner.handle_request(self._attempt(request, agent, body))
            except httpx2.TransportError as exc:
                self._fleet.mark_failed(agent, f"{type(exc).__name__}: {exc}")
                failures.append(f"{agent.agent_id}: {type(exc).__name__}")
                continue
            if response.status_code in RETRY_STATUSES and not last:
                response.close()
                self._fleet.mark_failed(agent, f"HTTP {response.status_code}")
                failures.append(f"{agent.agent_id}: HTTP {response.status_code}")
                continue
            try:
                if not _is_sse(response):
                    ready = self._whole(response)
                else:
                    first, rest = _first_chunk(response)
                    ready = self._streamed(request, resumable, agent, response, first, rest)
            except httpx2.TransportError as exc:
                response.close()
                self._fleet.mark_failed(agent, f"{type(exc).__name__} before the first token")
                failures.append(f"{agent.agent_id}: {type(exc).__name__}")
                continue
            if response.status_code not in RETRY_STATUSES:
                self._fleet.mark_ok(agent)
            return ready
        raise httpx2.ConnectError(str(no_agent_error(self._fleet.model, failures)), request=request)

    @staticmethod
    def _whole(response: httpx2.Response) -> httpx2.Response:
        """Read a whole body, so failures mid-body happen here."""
        content = b"".join(response.iter_raw())
        response.close()
        return httpx2.Response(
            response.status_code, headers=response.headers, content=content,
            extensions=response.extensions,
        )  # fmt: skip

    def _streamed(
        self,
        request: httpx2.Request,
        resumable: dict[str, Any] | None,
        agent: Agent,
        response: httpx2.Response,
        first: bytes,
        rest: Iterator[bytes],
    ) -> httpx2.Response:
        if resumable is None or response.status_code != 200:
            stream: httpx2.SyncByteStream = _PrefixedStream(first, rest, response)
            return httpx2.Response(
                response.status_code, headers=response.headers, stream=stream,
                extensions=response.extensions,
            )  # fmt: skip
        segments: list[StreamSegment] = []

        def open_continuation(
            body: dict[str, Any], version: str, skip: set[str]
        ) -> tuple[Agent, httpx2.Response]:
            return self._continue(request, body, version, skip)

        resuming = ResumingStream(
            resumable, agent, response, first, rest, open_continuation, segments
        )
        return httpx2.Response(
            response.status_code, headers=response.headers, stream=resuming,
            extensions={**response.extensions, SEGMENTS: segments},
        )  # fmt: skip

    def _continue(
        self, request: httpx2.Request, body: dict[str, Any], version: str, skip: set[str]
    ) -> tuple[Agent, httpx2.Response]:
        """Send a continuation to the next agent serving ``version`` of the model."""
        for broken in skip:
            for agent in self._fleet.agents:
                if agent.agent_id == broken:
                    self._fleet.mark_failed(agent, "stream broke mid-way")
        content = json.dumps(body).encode()
        tried: list[str] = []
        for agent in self._fleet.candidates():
            if agent.agent_id in skip:
                continue
            if version and self._version_of(request, agent, str(body.get("model", ""))) != version:
                tried.append(f"{agent.agent_id}: other version")
                continue
            try:
                response = self._inner.handle_request(self._attempt(request, agent, content))
            except httpx2.TransportError as exc:
                self._fleet.mark_failed(agent, f"{type(exc).__name__}: {exc}")
                tried.append(f"{agent.agent_id}: {type(exc).__name__}")
                continue
            if response.status_code != 200 or not _is_sse(response):
                response.read()
                response.close()
                tried.append(f"{agent.agent_id}: HTTP {response.status_code}")
                continue
            return agent, response
        raise StreamBroken(
            f"no other agent can resume {body.get('model')!r} version {version!r}: "
            + ("; ".join(tried) or "none known")
        )

    def _version_of(self, request: httpx2.Request, agent: Agent, model: str) -> str | None:
        """The version of ``model`` that ``agent`` serves (``GET /v1/models``), or None.

        Asked with the request's own credentials (``Authorization``): agents
        require API keys by default, and without them every probe read 401, "no version"."""
        url = httpx2.URL(agent.url.rstrip("/") + "/v1/models")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in _CREDENTIAL_HEADERS]
        probe = httpx2.Request("GET", url, headers=headers, extensions=request.extensions)
        try:
            response = self._inner.handle_request(probe)
            raw = response.read()
            response.close()
            if response.status_code != 200:
                return None
            cards = json.loads(raw).get("data", [])
        except (httpx2.TransportError, ValueError, AttributeError):
            return None
        for card in cards:
            if isinstance(card, dict) and card.get("id") == model:
                version = card.get("version")
                return str(version) if version is not None else None
        return None

    def close(self) -> None:
        self._inner.close()
