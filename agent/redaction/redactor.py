"""The redactor: finds personal data in text and in OpenAI request bodies, replaces it.

Built once per agent (``Redactor.from_config(cfg.redaction)``) and shared by every request;
it holds no per-request state (that is the :class:`Vault`), so it is thread-safe.
"""

from __future__ import annotations

import bisect
import copy
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from agent.redaction.detectors import (
    ADDRESS,
    ENTITY_TYPES,
    PERSON,
    Span,
    find_cards,
    find_emails,
    find_ibans,
    find_ips,
    find_phones,
    find_secrets,
    find_ssns,
)
from agent.redaction.modes import RedactionBlocked, RedactionMode, parse_mode
from agent.redaction.names import find_addresses, find_persons, warm_up
from agent.redaction.prefilter import marks
from agent.redaction.prefilter import warm_up as warm_up_marks
from agent.redaction.vault import PLACEHOLDER, Vault

if TYPE_CHECKING:
    from agent.config import RedactionConfig

_DETECTORS: dict[str, Callable[[str, frozenset[str] | None], Iterable[Span]]] = {
    "SECRET": find_secrets,
    "EMAIL": find_emails,
    "IBAN": find_ibans,
    "CREDIT_CARD": find_cards,
    "US_SSN": find_ssns,
    "IP_ADDRESS": find_ips,
    "PHONE": find_phones,
    ADDRESS: find_addresses,
    PERSON: find_persons,
}
_RANK = {t: i for i, t in enumerate(ENTITY_TYPES)}


class TokenCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...


class RedactionUninspectable(Exception):
    """The body holds token ids of a model whose tokenizer the redactor was not given, so
    what they say cannot be checked: the request must not leave the site."""

    code = "redaction_uninspectable"

    def __init__(self, field: str, model: str) -> None:
        self.field = field
        super().__init__(
            f"{field} holds token ids of model {model!r}, whose tokenizer this agent does not "
            "have, so they cannot be checked for personal data: the request was not sent"
        )


def resolve(spans: Iterable[Span]) -> list[Span]:
    """Non-overlapping spans, by type precedence (structured types first) then length."""
    starts: list[int] = []  # the chosen spans, kept sorted by start (they never overlap)
    chosen: list[Span] = []
    for s in sorted(spans, key=lambda s: (_RANK[s.type], s.start - s.end, s.start)):
        if s.end <= s.start:
            continue
        k = bisect.bisect_right(starts, s.start)
        if k > 0 and chosen[k - 1].end > s.start:
            continue  # overlaps the chosen span starting at or before it
        if k < len(chosen) and chosen[k].start < s.end:
            continue  # overlaps the next chosen span
        starts.insert(k, s.start)
        chosen.insert(k, s)
    return chosen


class Redactor:
    def __init__(
        self,
        *,
        types: Iterable[str] = ENTITY_TYPES,
        default_mode: RedactionMode = RedactionMode.REDACT_RESTORE,
        models: dict[str, RedactionMode] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.types = tuple(t for t in ENTITY_TYPES if t in set(types))
        self._detectors = [_DETECTORS[t] for t in self.types]
        if PERSON in self.types or ADDRESS in self.types:
            warm_up()  # the gazetteer and street patterns, once, before the first request
        warm_up_marks()  # the prefilter's RE2 set, once
        self.default_mode = parse_mode(default_mode)
        self.models = {k: parse_mode(v) for k, v in (models or {}).items()}
        self._tokenizers: dict[str, TokenCodec] = {}
        self._totals: dict[str, int] = {}
        self._blocked = 0
        self._lock = threading.Lock()
        self._counter: Counter | None = None
        self._blocked_counter: Counter | None = None
        if registry is not None:
            self._counter = Counter(
                "edgefleet_agent_redactions",
                "Values replaced by placeholders before a request left the site, by type",
                ["type"],
                registry=registry,
            )
            self._blocked_counter = Counter(
                "edgefleet_agent_redaction_blocked_requests",
                "Requests refused by the block redaction mode (nothing sent)",
                registry=registry,
            )

    @classmethod
    def from_config(
        cls, cfg: RedactionConfig, *, registry: CollectorRegistry | None = None
    ) -> Redactor:
        return cls(
            types=cfg.types,
            default_mode=cfg.default_mode,
            models=dict(cfg.models),
            registry=registry,
        )

    # ---------------------------------------------------------------- policy, tokenizers

    def policy(self, model: str) -> RedactionMode:
        """The configured mode of a model (``redaction.models.<name>``, else the default)."""
        return self.models.get(model, self.default_mode)

    def set_tokenizer(self, model: str, codec: TokenCodec) -> None:
        """Lets ``redact_request`` read (and rewrite) token ids of ``model``."""
        self._tokenizers[model] = codec

    # ----------------------------------------------------------------------- text

    def detect(self, text: str) -> list[Span]:
        """Where the personal data in ``text`` is (placeholders already there are not)."""
        if not text:
            return []
        spans: list[Span] = []
        found = marks(text)  # what the text holds, one pass: detectors skip what it lacks
        for detect in self._detectors:
            spans.extend(detect(text, found))
        if "<" in text and spans:
            held = [(m.start(), m.end()) for m in PLACEHOLDER.finditer(text)]
            spans = [s for s in spans if all(s.end <= a or s.start >= b for a, b in held)]
        return resolve(spans)

    def redact(self, text: str, vault: Vault) -> str:
        if "<" in text:
            vault.reserve(text)  # placeholder-shaped text the user wrote is never reused
        spans = self.detect(text)
        if not spans:
            return text
        out: list[str] = []
        pos = 0
        for s in spans:
            out.append(text[pos : s.start])
            out.append(vault.placeholder_for(s.type, text[s.start : s.end]))
            pos = s.end
        out.append(text[pos:])
        return "".join(out)

    # ---------------------------------------------------------------------- bodies

    def redact_request(
        self, body: dict[str, Any], vault: Vault, mode: RedactionMode
    ) -> dict[str, Any]:
        """A new request body with every text that would leave the site redacted.

        Chat: each message's ``content`` (a string, or the ``text`` of its content parts),
        ``name``, ``tool_calls[].function.arguments`` (the strings inside the JSON, which
        stays valid JSON) and legacy ``function_call.arguments``; completions: ``prompt``
        (a string, strings, or token ids) and ``suffix``; both: ``stop``, ``user``,
        ``metadata`` values and the continuation's ``continue_token_ids`` (decoded with the
        model's tokenizer, re-encoded only when something was replaced; ids of a model
        without a tokenizer raise :class:`RedactionUninspectable`). ``block`` raises
        :class:`RedactionBlocked` naming the types found; ``off`` returns ``body`` itself.
        """
        mode = parse_mode(mode)
        if mode is RedactionMode.OFF:
            return body
        if not isinstance(body, dict):
            raise TypeError("a request body is a JSON object")
        out: dict[str, Any] = _copy_json(body)
        model = out["model"] if isinstance(out.get("model"), str) else ""
        work = vault if mode is not RedactionMode.BLOCK else Vault()

        def text(value: object) -> object:
            return self.redact(value, work) if isinstance(value, str) else value

        messages = out.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                if isinstance(msg, dict):
                    self._redact_message(msg, work)
        if "prompt" in out:
            out["prompt"] = self._redact_prompt(out["prompt"], work, model)
        for key in ("suffix", "user"):
            if key in out:
                out[key] = text(out[key])
        stop = out.get("stop")
        if isinstance(stop, list):
            out["stop"] = [text(s) for s in stop]
        elif isinstance(stop, str):
            out["stop"] = text(stop)
        meta = out.get("metadata")
        if isinstance(meta, dict):
            out["metadata"] = {k: text(v) for k, v in meta.items()}
        ids = out.get("continue_token_ids")
        if ids is not None:
            out["continue_token_ids"] = self._redact_ids(ids, work, model, "continue_token_ids")
        if mode is RedactionMode.BLOCK:
            found = work.counts
            if found:
                with self._lock:
                    self._blocked += 1
                if self._blocked_counter is not None:
                    self._blocked_counter.inc()
                raise RedactionBlocked(sorted(found))
        return out

    def _redact_message(self, msg: dict[str, Any], vault: Vault) -> None:
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = self.redact(content, vault)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    for key in ("text", "refusal"):
                        if isinstance(part.get(key), str):
                            part[key] = self.redact(part[key], vault)
        for key in ("name", "refusal", "reasoning_content"):
            if isinstance(msg.get(key), str):
                msg[key] = self.redact(msg[key], vault)
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    fn["arguments"] = self._redact_json_text(fn["arguments"], vault)
        fc = msg.get("function_call")
        if isinstance(fc, dict) and isinstance(fc.get("arguments"), str):
            fc["arguments"] = self._redact_json_text(fc["arguments"], vault)

    def _redact_json_text(self, raw: str, vault: Vault) -> str:
        """Tool-call arguments: the strings inside the JSON (keys too), or the raw text."""
        try:
            parsed = json.loads(raw)
        except ValueError:
            return self.redact(raw, vault)
        changed = False

        def walk(v: object) -> object:
            nonlocal changed
            if isinstance(v, str):
                r = self.redact(v, vault)
                changed = changed or r != v
                return r
            if isinstance(v, list):
                return [walk(x) for x in v]
            if isinstance(v, dict):
                return {walk(k): walk(x) for k, x in v.items()}
            return v

        result = walk(parsed)
        return json.dumps(result, ensure_ascii=False) if changed else raw

    def _redact_prompt(self, prompt: object, vault: Vault, model: str) -> object:
        if isinstance(prompt, str):
            return self.redact(prompt, vault)
        if not isinstance(prompt, list) or not prompt:
            return prompt
        if all(isinstance(p, int) for p in prompt):
            return self._redact_ids(prompt, vault, model, "prompt")
        # strings, lists of ids, or (an invalid body, but never sent unchecked) a mixture
        out: list[object] = []
        for p in prompt:
            if isinstance(p, str):
                out.append(self.redact(p, vault))
            elif isinstance(p, list):
                out.append(self._redact_ids(p, vault, model, "prompt"))
            elif isinstance(p, int):
                out.append(self._redact_ids([p], vault, model, "prompt")[0])  # type: ignore[index]
            else:
                out.append(p)
        return out

    def _redact_ids(self, ids: object, vault: Vault, model: str, field: str) -> object:
        if not isinstance(ids, list) or not ids:
            return ids
        codec = self._tokenizers.get(model)
        if codec is None:
            raise RedactionUninspectable(field, model)
        decoded = codec.decode([int(i) for i in ids])
        redacted = self.redact(decoded, vault)
        return ids if redacted == decoded else codec.encode(redacted)

    # --------------------------------------------------------------------- accounting

    def account(self, vault: Vault) -> None:
        """Adds one request's counts to the metrics and the load report's totals."""
        counts = vault.counts
        if not counts:
            return
        with self._lock:
            for t, n in counts.items():
                self._totals[t] = self._totals.get(t, 0) + n
        if self._counter is not None:
            for t, n in counts.items():
                self._counter.labels(type=t).inc(n)

    def totals(self) -> dict[str, int]:
        """Redactions by type since the agent started (LoadReport.redactions)."""
        with self._lock:
            return dict(self._totals)


_JSON_LEAVES = (str, int, float, bool, type(None))


def _copy_json(value: Any) -> Any:
    """A copy of a parsed JSON value: its dicts and lists new, its leaves (immutable)
    shared. A fraction of ``copy.deepcopy``'s cost (no memo, no dispatch), which was the
    largest single item of redacting a request; anything that is not JSON-shaped is
    deep-copied as before."""
    kind = type(value)
    if kind is dict:
        return {k: _copy_json(v) for k, v in value.items()}
    if kind is list:
        return [_copy_json(v) for v in value]
    if kind in _JSON_LEAVES:
        return value
    return copy.deepcopy(value)
