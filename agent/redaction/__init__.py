"""SHIM - DELETE AT MERGE. The redaction branch's ``agent/redaction`` package replaces
this whole file (take theirs in the add/add conflict).

A stand-in with exactly the signatures of /work/wt/REDACTION_API.md so the overflow path
can be built and tested before the real package lands: e-mail addresses, phone numbers
and IPv4 addresses only, by plain patterns. Never ship it.
"""

from __future__ import annotations

import copy
import re
import threading
from enum import StrEnum
from typing import Any

_PATTERNS = (
    ("EMAIL", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")),
    ("PHONE", re.compile(r"\+\d{1,3}[ \d-]{7,14}\d")),
    ("IP_ADDRESS", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")),
)
_PLACEHOLDER = re.compile(r"<([A-Z_]+)_(\d+)>")


class RedactionMode(StrEnum):
    REDACT_RESTORE = "redact_restore"
    REDACT_ONLY = "redact_only"
    BLOCK = "block"
    OFF = "off"


_STRICTNESS = {"off": 0, "redact_restore": 1, "redact_only": 2, "block": 3}


class InvalidRedactionMode(ValueError):
    param = "edgefleet.redaction"


class RedactionBlocked(Exception):
    code = "redaction_blocked"

    def __init__(self, types: list[str]) -> None:
        self.types = sorted(set(types))
        super().__init__(
            f"the request holds personal data of types {', '.join(self.types)} and this "
            "model's redaction policy is block: nothing was sent"
        )


def _parse(value: object) -> RedactionMode:
    try:
        return RedactionMode(str(value).strip().lower())
    except ValueError:
        raise InvalidRedactionMode(f"edgefleet.redaction: {value!r} is not a mode") from None


def effective_mode(policy: RedactionMode | str, requested: object = None) -> RedactionMode:
    pol = _parse(policy)
    if requested is None:
        return pol
    req = _parse(requested)
    return req if _STRICTNESS[req] > _STRICTNESS[pol] else pol


def requested_mode(body: object) -> object:
    ext = body.get("edgefleet") if isinstance(body, dict) else None
    return ext.get("redaction") if isinstance(ext, dict) else None


class Vault:
    def __init__(self) -> None:
        self._by_value: dict[tuple[str, str], str] = {}
        self._by_placeholder: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    def placeholder_for(self, type_: str, value: str) -> str:
        held = self._by_value.get((type_, value))
        if held is None:
            n = sum(1 for t, _ in self._by_value if t == type_) + 1
            held = f"<{type_}_{n}>"
            self._by_value[(type_, value)] = held
            self._by_placeholder[held] = value
        self.counts[type_] = self.counts.get(type_, 0) + 1
        return held

    def restore(self, text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: self._by_placeholder.get(m.group(0), m.group(0)), text)

    def stream_restorer(self) -> StreamRestorer:
        return StreamRestorer(self)


class StreamRestorer:
    def __init__(self, vault: Vault) -> None:
        self._vault = vault
        self._held = ""

    def feed(self, chunk: str) -> str:
        text = self._held + chunk
        cut = text.rfind("<")
        if cut != -1 and ">" not in text[cut:] and re.fullmatch(r"<[A-Z_0-9]*", text[cut:]):
            self._held, text = text[cut:], text[:cut]
        else:
            self._held = ""
        return self._vault.restore(text)

    def flush(self) -> str:
        text, self._held = self._held, ""
        return self._vault.restore(text)


class Redactor:
    def __init__(
        self,
        *,
        default_mode: RedactionMode = RedactionMode.REDACT_RESTORE,
        models: dict[str, RedactionMode] | None = None,
        registry: Any = None,
    ) -> None:
        self.default_mode = default_mode
        self.models = dict(models or {})
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Any, *, registry: Any = None) -> Redactor:
        return cls(default_mode=cfg.default_mode, models=dict(cfg.models), registry=registry)

    def policy(self, model: str) -> RedactionMode:
        return self.models.get(model, self.default_mode)

    def redact(self, text: str, vault: Vault) -> str:
        for type_, pattern in _PATTERNS:

            def swap(m: re.Match[str], t: str = type_) -> str:
                return vault.placeholder_for(t, m.group(0))

            text = pattern.sub(swap, text)
        return text

    def redact_request(
        self, body: dict[str, Any], vault: Vault, mode: RedactionMode
    ) -> dict[str, Any]:
        if mode is RedactionMode.OFF:
            return body
        out = copy.deepcopy(body)
        for message in out.get("messages") or []:
            if isinstance(message.get("content"), str):
                message["content"] = self.redact(message["content"], vault)
            elif isinstance(message.get("content"), list):
                for part in message["content"]:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part["text"] = self.redact(part["text"], vault)
        if isinstance(out.get("prompt"), str):
            out["prompt"] = self.redact(out["prompt"], vault)
        if mode is RedactionMode.BLOCK and vault.counts:
            raise RedactionBlocked(list(vault.counts))
        return out
