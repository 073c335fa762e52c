"""An httpx2 transport that sends each request to the best agent and fails over.

A request goes to the first candidate; on a connection error, or a 429/503 answer,
it is sent again to the next one. A non-streamed response is read whole before it is
returned, so a failure mid-body fails over too. A streamed (``text/event-stream``)
response is returned once its first chunk arrived: failures before the first token
fail over, later ones reach the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx2

from edgefleet_client._client import no_agent_error

if TYPE_CHECKING:
    from edgefleet_client._client import FleetClient

RETRY_STATUSES = frozenset({429, 503})


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


class FailoverTransport(httpx2.BaseTransport):
    def __init__(self, fleet: FleetClient, inner: httpx2.BaseTransport | None = None) -> None:
        self._fleet = fleet
        self._inner = inner or httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        failures: list[str] = []
        candidates = self._fleet.candidates()
        for position, agent in enumerate(candidates):
            last = position == len(candidates) - 1
            target = urlsplit(agent.url)
            url = request.url.copy_with(
                scheme=target.scheme, host=target.hostname, port=target.port
            )
            headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
            attempt = httpx2.Request(
                request.method, url, headers=headers, content=body,
                extensions=request.extensions,
            )  # fmt: skip
            try:
                response = self._inner.handle_request(attempt)
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
                ready = self._first_part(response)
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
    def _first_part(response: httpx2.Response) -> httpx2.Response:
        """Read a whole body, or a stream's first chunk, so failures happen here."""
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            content = b"".join(response.iter_raw())
            response.close()
            return httpx2.Response(
                response.status_code, headers=response.headers, content=content,
                extensions=response.extensions,
            )  # fmt: skip
        chunks = response.iter_raw()
        first = b""
        while not first:
            try:
                first = next(chunks)
            except StopIteration:
                break
        return httpx2.Response(
            response.status_code, headers=response.headers,
            stream=_PrefixedStream(first, chunks, response), extensions=response.extensions,
        )  # fmt: skip

    def close(self) -> None:
        self._inner.close()
