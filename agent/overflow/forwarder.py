"""Sends a request the agent cannot take to its overflow targets, and brings the answer
back.

Order: peers at the same site with room (most free slots first), then pools, then
providers, each kind in the configured order; only targets that serve the model, speak
the endpoint, whose breaker is not open, and (for pools and providers) only when the
request may leave the site. Constrained requests only go to targets that enforce
constraints (:func:`agent.overflow.policy.requires_constraints`, the hook the
constrained-decoding work refines).

Per target: retries with exponential backoff on retryable errors only (connection
failures, timeouts, 408/409/425/429/5xx/529), a different endpoint of a pool when one has
room; a 400/404/413/422 is the request's fault and goes back to the client as it is.
Timeouts: connect, first token (also the longest gap between two streamed events) and
total.

Streams: chunks are held back until the first token, so a failure before it fails over
to the next target unseen. After it, the stream resumes on the next target that can
continue it (edgefleet peers by token ids, targets with ``supports_continuation`` by
assistant prefill); with none, it ends with the stream error event
(``agent.api.http_io.stream_error_event``), never silently.

Redaction: before anything goes to a pool or provider, the body is redacted once per
request (``Redactor.redact_request`` in the request's effective mode) and the answer
restored (``Vault.restore`` / ``stream_restorer``) in redact-and-restore mode. Peers are at
the site: they get the body as it is.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from agent.errors import AgentError, InvalidOutputError, InvalidRequestError
from agent.overflow.adapters import (
    ADAPTERS,
    Adapter,
    Continuation,
    UpstreamError,
    sse_events,
    status_error,
)
from agent.overflow.policy import constraint_of, requires_constraints
from agent.overflow.targets import CredentialError, Target, TargetSet, leaves_site, read_credential
from agent.redaction import (
    InvalidRedactionMode,
    RedactionBlocked,
    RedactionMode,
    Redactor,
    StreamRestorer,
    Vault,
    effective_mode,
    requested_mode,
)
from agent.structured.spec import ConstraintSpec, validate_constrained_output
from agent.structured.tool_calls import call_text
from edgefleet.contract import OverflowApi, OverflowKind
from edgefleet.tls import agent_server_name

log = logging.getLogger(__name__)

KIND_ORDER = {OverflowKind.PEER: 0, OverflowKind.GPU_POOL: 1, OverflowKind.HOSTED_PROVIDER: 2}


class OverflowFailedError(AgentError):
    """Every overflow target that could take the request failed it."""

    status = 502
    error_type = "server_error"
    code = "overflow_failed"


class RedactionBlockedError(InvalidRequestError):
    """Block mode found personal data: nothing was sent (400, the types in the message)."""

    code = "redaction_blocked"

    def __init__(self, exc: RedactionBlocked) -> None:
        super().__init__(str(exc), param="messages")
        self.types = list(exc.types)


@dataclass(frozen=True)
class ForwardSettings:
    max_retries: int = 2
    backoff_s: float = 0.1
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 30.0
    total_timeout_s: float = 300.0


@dataclass
class Leg:
    """One target's part in a forwarded request (a record's ``overflow`` entry)."""

    target: str
    kind: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ok: bool = False
    prompt_price_per_1k: float = 0.0
    completion_price_per_1k: float = 0.0


@dataclass
class OverflowRequest:
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]
    model: str
    may_leave_site: bool
    authorization: str | None = None  # the client's, passed on to peers only
    reason: str = ""
    legs: list[Leg] = field(default_factory=list)
    served_by: str = ""
    first_token_at: float | None = None
    # redaction, worked out on the first target beyond the site
    _redacted: dict[str, Any] | None = None
    _vault: Vault | None = None
    _mode: RedactionMode | None = None

    @functools.cached_property
    def constraint(self) -> ConstraintSpec | None:
        """The body's output constraint, parsed once per request (agent/structured)."""
        return constraint_of(self.body)

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))


class Forwarder:
    def __init__(
        self,
        targets: TargetSet,
        redactor: Redactor,
        settings: ForwardSettings | None = None,
        *,
        site: str = "",
        self_id: Callable[[], str] = lambda: "",
        peer_ssl: ssl.SSLContext | Callable[[], ssl.SSLContext | None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.targets = targets
        self.redactor = redactor
        self.settings = settings or ForwardSettings()
        self.site = site
        self._self_id = self_id
        # mutual TLS to https peers, or what gives it as each forward starts
        # (agent/enrolled_tls.py: an agent may enroll, and renew, after it started)
        self.peer_ssl = peer_ssl
        self._rng = rng
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[ForwardSettings, int, int, int], aiohttp.ClientTimeout] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
                auto_decompress=True,
            )
        return self._session

    # ------------------------------------------------------------------ selection

    def candidates(self, req: OverflowRequest) -> list[Target]:
        constrained = requires_constraints(req.body, req.constraint)
        me = self._self_id()
        chosen = []
        for target in self.targets:
            spec = target.spec
            if spec.kind is OverflowKind.UNSPECIFIED:
                continue
            if spec.kind is OverflowKind.PEER:
                if spec.name == me or spec.free_slots == 0:
                    continue
                if self.site and spec.site and spec.site != self.site:
                    continue
            elif not req.may_leave_site:
                continue
            if not target.serves(req.model) or not ADAPTERS[target.api].supports(req.endpoint):
                continue
            if constrained and not spec.supports_constraints:
                continue
            chosen.append(target)
        # stable: the configured order within a kind; peers by free slots
        chosen.sort(
            key=lambda t: (
                KIND_ORDER.get(t.spec.kind, 9),
                -t.spec.free_slots if t.spec.kind is OverflowKind.PEER else 0,
            )
        )
        return chosen

    # ------------------------------------------------------------------ bodies

    def _redaction(self, req: OverflowRequest) -> tuple[dict[str, Any], Vault | None]:
        """The body as it may leave the site, and the vault to restore the answer with
        (None: nothing to restore)."""
        if req._redacted is None:
            try:
                mode = effective_mode(self.redactor.policy(req.model), requested_mode(req.body))
            except InvalidRedactionMode as exc:
                raise InvalidRequestError(str(exc), param="edgefleet.redaction") from None
            vault = Vault()
            try:
                req._redacted = self.redactor.redact_request(req.body, vault, mode)
            except RedactionBlocked as exc:
                raise RedactionBlockedError(exc) from None
            req._vault, req._mode = vault, mode
            # Once per request (the redacted body is kept for every target and retry): the
            # metrics and LoadReport.redactions count what was redacted before it left.
            self.redactor.account(vault)
        restore = req._mode is RedactionMode.REDACT_RESTORE
        return req._redacted, (req._vault if restore else None)

    def _prepare(
        self, target: Target, req: OverflowRequest, continuation: Continuation | None
    ) -> tuple[Adapter, dict[str, Any], dict[str, str], Vault | None]:
        adapter = ADAPTERS[target.api]
        if leaves_site(target.spec):
            body, vault = self._redaction(req)
        else:
            body, vault = req.body, None
        try:
            credential = read_credential(target.spec)
        except CredentialError as exc:
            raise UpstreamError(str(exc), retryable=False) from None
        headers = adapter.headers(credential)
        if target.api is OverflowApi.EDGEFLEET and req.authorization and not credential:
            headers["Authorization"] = req.authorization
        out = adapter.request_body(body, req.endpoint, target.model_name(req.model), continuation)
        return adapter, out, headers, vault

    def _timeout(self, target: Target) -> aiohttp.ClientTimeout:
        s = self.settings
        spec = target.spec
        key = (s, spec.total_timeout_ms, spec.connect_timeout_ms, spec.first_token_timeout_ms)
        timeout = self._timeouts.get(key)
        if timeout is None:  # one per distinct setting, not one per request
            if len(self._timeouts) > 256:
                self._timeouts.clear()
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(
                total=(spec.total_timeout_ms / 1000) or s.total_timeout_s,
                connect=(spec.connect_timeout_ms / 1000) or s.connect_timeout_s,
                sock_read=(spec.first_token_timeout_ms / 1000) or s.first_token_timeout_s,
            )
        return timeout

    def _post_kwargs(self, target: Target, url: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"timeout": self._timeout(target)}
        if target.spec.kind is OverflowKind.PEER and urlsplit(url).scheme == "https":
            peer_ssl = self.peer_ssl() if callable(self.peer_ssl) else self.peer_ssl
            if peer_ssl is not None:
                kwargs["ssl"] = peer_ssl
                kwargs["server_hostname"] = agent_server_name(target.name)
        return kwargs

    def _attempts(self, target: Target) -> Iterator[tuple[int, str]]:
        """(attempt number, endpoint URL) for each try at ``target``: a different endpoint
        of a pool each time while one is left, none while its breaker is open. The caller
        backs off (:meth:`_backoff`) before every retry. A plain generator: an async one
        left early (every success) had its close scheduled as a task by the event loop."""
        used: list[str] = []
        for attempt in range(self.settings.max_retries + 1):
            endpoint = target.pick_endpoint(used, self._rng)
            if endpoint is None or not target.breaker.allow():
                return
            used.append(endpoint.url)
            yield attempt, endpoint.url

    async def _backoff(self, attempt: int) -> None:
        delay = self.settings.backoff_s * (2 ** (attempt - 1)) * (0.5 + self._rng())
        await asyncio.sleep(delay)

    def _leg(self, req: OverflowRequest, target: Target) -> Leg:
        spec = target.spec
        leg = Leg(
            spec.name,
            spec.kind.value,
            prompt_price_per_1k=spec.prompt_price_per_1k,
            completion_price_per_1k=spec.completion_price_per_1k,
        )
        req.legs.append(leg)
        return leg

    # ------------------------------------------------------------------ whole answers

    async def complete(self, req: OverflowRequest, fallback: AgentError) -> dict[str, Any]:
        """The answer of the first target that gives one; ``fallback`` when none could be
        tried, :class:`OverflowFailedError` when all that were tried failed."""
        tried: list[str] = []
        untranslatable: UpstreamError | None = None
        constraint = req.constraint
        invalid_output = ""
        for target in self.candidates(req):
            leg = self._leg(req, target)
            skipped = False
            for attempt, url in self._attempts(target):
                if attempt:
                    await self._backoff(attempt)
                try:
                    adapter, body, headers, vault = self._prepare(target, req, None)
                    answer = await self._call(target, url, adapter, body, headers, req)
                except UpstreamError as exc:
                    if exc.untranslatable:
                        target.breaker.release()
                        untranslatable, skipped = exc, True
                        break  # not this target's format: the next may take it
                    if exc.client_fault:
                        target.breaker.release()
                        raise _client_error(exc) from None
                    target.breaker.failure()
                    log.warning("%s (attempt %d)", exc.message, attempt + 1)
                    if not exc.retryable:
                        break
                    continue
                except AgentError:
                    target.breaker.release()
                    raise
                answer = _answer_for_client(answer, req, vault)  # restored
                problem = _constraint_problem(answer, constraint, req.endpoint)
                if problem:  # the target ignored the constraint: not returned, next target
                    target.breaker.failure()
                    log.warning(
                        "overflow target %s answered outside the request's constraint: %s",
                        target.name,
                        problem,
                    )
                    invalid_output = problem
                    break
                target.breaker.success()
                usage = _obj(answer.get("usage"))
                leg.prompt_tokens = _int(usage.get("prompt_tokens"))
                leg.completion_tokens = _int(usage.get("completion_tokens"))
                leg.ok = True
                req.served_by = target.name
                return answer
            if skipped:
                req.legs.remove(leg)
                continue
            tried.append(target.name)
        if not tried:
            if untranslatable is not None:
                raise _client_error(untranslatable) from None
            raise fallback
        if invalid_output:
            raise InvalidOutputError(
                f"the overflow target's answer does not satisfy the request's constraint "
                f"({invalid_output}); it was not returned"
            )
        raise OverflowFailedError(
            f"the agent could not take the request ({req.reason}) and every overflow target "
            f"tried failed: {', '.join(tried)}"
        )

    async def _call(
        self,
        target: Target,
        url: str,
        adapter: Adapter,
        body: dict[str, Any],
        headers: dict[str, str],
        req: OverflowRequest,
    ) -> dict[str, Any]:
        full = url.rstrip("/") + adapter.path(req.endpoint)
        target.in_flight[url] = target.in_flight.get(url, 0) + 1
        try:
            async with self._client().post(
                full, json=body, headers=headers, **self._post_kwargs(target, url)
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise status_error(target.name, resp.status, raw)
                try:
                    data = json.loads(raw)  # the body read above, decoded once
                except ValueError:
                    raise UpstreamError(
                        f"overflow target {target.name} answered with a body that is not JSON",
                        retryable=True,
                    ) from None
                return adapter.response(data, req.endpoint, target.name)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(target, exc) from None
        finally:
            target.in_flight[url] -= 1

    # ------------------------------------------------------------------ streams

    async def stream(
        self, req: OverflowRequest, fallback: AgentError
    ) -> AsyncIterator[dict[str, Any]]:
        """OpenAI chunks for the client. Raises before its first chunk like
        :meth:`complete`; after it, an error is for the stream error event."""
        state = _StreamState()
        tried: list[str] = []
        untranslatable: UpstreamError | None = None
        constraint = req.constraint
        delivered: list[str] = []  # what the client got, restored
        for target in self.candidates(req):
            if state.started and not _can_continue(target, state):
                continue
            leg = self._leg(req, target)
            skipped = False
            for attempt, url in self._attempts(target):
                if attempt:
                    await self._backoff(attempt)
                continuation = state.continuation() if state.started else None
                try:
                    adapter, body, headers, vault = self._prepare(target, req, continuation)
                    # a prefill without its trailing white space (Anthropic refuses it)
                    # comes back with it: drop it once
                    trim = 0
                    if continuation is not None and target.api is OverflowApi.ANTHROPIC:
                        trim = len(continuation.text) - len(continuation.text.rstrip())
                    async for chunk in self._stream_one(
                        target, url, adapter, body, headers, req, state, vault, leg, trim
                    ):
                        delivered.append(_chunk_text(chunk))
                        yield chunk
                except UpstreamError as exc:
                    if exc.untranslatable:
                        target.breaker.release()
                        untranslatable, skipped = exc, True
                        break  # not this target's format: the next may take it
                    if exc.client_fault and not state.started:
                        target.breaker.release()
                        raise _client_error(exc) from None
                    target.breaker.failure()
                    log.warning("%s (attempt %d)", exc.message, attempt + 1)
                    state.last_error = exc
                    if not exc.retryable or (state.started and not _can_continue(target, state)):
                        break
                    continue
                except BaseException:
                    target.breaker.release()  # the client left, or a refusal of ours
                    raise
                if constraint is not None and constraint.kind in ("json_object", "json_schema"):
                    # Validated before the stream ends: an answer outside the constraint
                    # ends with the stream error event, never a clean end.
                    validate_constrained_output(constraint, "".join(delivered))
                target.breaker.success()
                leg.ok = True
                return
            if skipped:
                req.legs.remove(leg)
                continue
            tried.append(target.name)
        if state.started:
            raise OverflowFailedError(
                "the stream broke and no overflow target could continue it "
                f"(tried: {', '.join(tried)})"
            )
        if not tried:
            if untranslatable is not None:
                raise _client_error(untranslatable) from None
            raise fallback
        raise OverflowFailedError(
            f"the agent could not take the request ({req.reason}) and every overflow target "
            f"tried failed: {', '.join(tried)}"
        )

    async def _stream_one(
        self,
        target: Target,
        url: str,
        adapter: Adapter,
        body: dict[str, Any],
        headers: dict[str, str],
        req: OverflowRequest,
        state: _StreamState,
        vault: Vault | None,
        leg: Leg,
        trim: int = 0,
    ) -> AsyncIterator[dict[str, Any]]:
        full = url.rstrip("/") + adapter.path(req.endpoint)
        if vault is not None and state.restorer is None:
            state.restorer = vault.stream_restorer()
        # one restorer for the whole stream: a placeholder cut by a broken stream and
        # finished by the next target is still restored
        restorer = state.restorer
        held: list[dict[str, Any]] = []  # chunks before the first token: sent with it
        want_ids = bool(req.body.get("return_token_ids"))
        target.in_flight[url] = target.in_flight.get(url, 0) + 1
        try:
            async with self._client().post(
                full, json=body, headers=headers, **self._post_kwargs(target, url)
            ) as resp:
                if resp.status != 200:
                    raise status_error(target.name, resp.status, await resp.read())
                async for chunk in adapter.chunks(sse_events(_lines(resp.content)), target.name):
                    chunk["model"] = req.model
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        leg.prompt_tokens = _int(usage.get("prompt_tokens"))
                        leg.completion_tokens = _int(usage.get("completion_tokens"))
                    choices = chunk.get("choices") or []
                    if not choices:
                        if usage is not None and req.include_usage:
                            yield {**chunk, "usage": usage}
                        continue
                    choice = choices[0]
                    text = _choice_text(choice, req.endpoint)
                    if trim and text:
                        kept = text.lstrip()
                        text = text[min(len(text) - len(kept), trim) :]
                        _set_choice_text(choice, req.endpoint, text)
                        trim = 0
                    ids = (
                        choice.get("token_ids") if isinstance(choice.get("token_ids"), list) else []
                    )
                    finish = choice.get("finish_reason")
                    if not want_ids:
                        choice.pop("token_ids", None)
                    chunk.pop("usage", None)
                    if not text and not ids and finish is None:
                        if not state.started:
                            held.append(chunk)  # the role chunk
                        continue
                    if text or ids:
                        state.delivered(text, ids)
                        if usage is None:
                            leg.completion_tokens += max(1, len(ids))
                    if restorer is not None:
                        shown = restorer.feed(text) + (restorer.flush() if finish else "")
                        _set_choice_text(choice, req.endpoint, shown)
                    if not state.started:
                        state.started = True
                        req.served_by = target.name
                        req.first_token_at = time.perf_counter()
                        for early in held:
                            yield early
                    elif req.served_by != target.name:
                        req.served_by = target.name  # continued here
                    yield chunk
                    if finish is not None:
                        state.finished = True
                if not state.finished:
                    raise UpstreamError(
                        f"overflow target {target.name} ended its stream without a finish reason",
                        retryable=True,
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(target, exc) from None
        finally:
            target.in_flight[url] -= 1


@dataclass
class _StreamState:
    started: bool = False
    finished: bool = False
    text: str = ""  # as the targets sent it (redacted)
    token_ids: list[int] | None = field(default_factory=list)
    completion_tokens: int = 0
    last_error: UpstreamError | None = None
    restorer: StreamRestorer | None = None

    def delivered(self, text: str, ids: list[int]) -> None:
        self.text += text
        self.completion_tokens += max(1, len(ids))
        if self.token_ids is not None:
            if ids:
                self.token_ids.extend(int(i) for i in ids)
            elif text:
                self.token_ids = None  # a target without ids: continue by text only

    def continuation(self) -> Continuation:
        return Continuation(self.text, self.token_ids or None, self.completion_tokens)


def _can_continue(target: Target, state: _StreamState) -> bool:
    """Can ``target`` continue what was delivered? Peers by ids (the same model's), or by
    assistant prefill; others only by prefill, and only when they say they support it."""
    if not target.spec.supports_continuation and target.api is not OverflowApi.EDGEFLEET:
        return False
    if target.api is OverflowApi.EDGEFLEET:
        return bool(state.token_ids) or target.spec.supports_continuation
    return True


def _choice_text(choice: dict[str, Any], endpoint: str) -> str:
    if endpoint == "chat":
        delta = _obj(choice.get("delta"))
        content = delta.get("content")
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _set_choice_text(choice: dict[str, Any], endpoint: str, text: str) -> None:
    if endpoint == "chat":
        choice.setdefault("delta", {})["content"] = text
    else:
        choice["text"] = text


def _constraint_problem(
    answer: dict[str, Any], constraint: ConstraintSpec | None, endpoint: str
) -> str:
    """Why ``answer`` does not satisfy ``constraint`` ("" when it does, or there is none):
    the first choice's text, or its tool call written as the model writes one."""
    if constraint is None:
        return ""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    if endpoint == "completions":
        text = choice.get("text")
    else:
        message = _obj(choice.get("message"))
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            function = _obj(_obj(calls[0]).get("function"))
            name, arguments = function.get("name"), function.get("arguments")
            if not isinstance(name, str) or not isinstance(arguments, str):
                return "a tool call without a name or arguments"
            text = call_text(name, arguments)
        else:
            text = message.get("content")
    if not isinstance(text, str):
        return "no text in the answer"
    try:
        validate_constrained_output(constraint, text)
    except InvalidOutputError as exc:
        return str(exc)
    return ""


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    first = choices[0]
    text = first.get("text")
    if isinstance(text, str):
        return text
    content = _obj(first.get("delta")).get("content")
    return content if isinstance(content, str) else ""


def _answer_for_client(
    answer: dict[str, Any], req: OverflowRequest, vault: Vault | None
) -> dict[str, Any]:
    answer["model"] = req.model
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if not req.body.get("return_token_ids"):
            choice.pop("token_ids", None)
        if vault is None:
            continue
        message = choice.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            message["content"] = vault.restore(message["content"])
        if isinstance(choice.get("text"), str):
            choice["text"] = vault.restore(choice["text"])
    return answer


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    async for line in content:
        yield line


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _transport_error(target: Target, exc: BaseException) -> UpstreamError:
    what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
    return UpstreamError(f"overflow target {target.name}: request {what}", retryable=True)


def _client_error(exc: UpstreamError) -> AgentError:
    error = InvalidRequestError(exc.message)
    error.status = exc.status or 400
    error.code = exc.error_type or "upstream_refused"
    return error
