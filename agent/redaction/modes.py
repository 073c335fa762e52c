"""Redaction modes, the narrowing rule and the block-mode refusal."""

from __future__ import annotations

from enum import StrEnum


class RedactionMode(StrEnum):
    REDACT_RESTORE = "redact_restore"  # placeholders out, originals back in the response
    REDACT_ONLY = "redact_only"  # placeholders out, and the response keeps them
    BLOCK = "block"  # nothing leaves when anything is found (400 naming the types)
    OFF = "off"  # sent as it is


# From the least to the most strict: a request may move right, never left.
_STRICTNESS = {
    RedactionMode.OFF: 0,
    RedactionMode.REDACT_RESTORE: 1,
    RedactionMode.REDACT_ONLY: 2,
    RedactionMode.BLOCK: 3,
}
MODES = tuple(m.value for m in RedactionMode)


class InvalidRedactionMode(ValueError):
    """The request named a mode that does not exist (the API answers 400 with it)."""

    param = "edgefleet.redaction"

    def __init__(self, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        super().__init__(f"edgefleet.redaction must be one of {', '.join(MODES)}; got {shown}")


class RedactionBlocked(Exception):
    """Block mode found personal data: nothing is sent. ``types``: the types found, sorted."""

    code = "redaction_blocked"

    def __init__(self, types: list[str]) -> None:
        self.types = sorted(set(types))
        super().__init__(
            "the request holds personal data of types "
            f"{', '.join(self.types)} and this model's redaction policy is block: nothing "
            "was sent"
        )


def parse_mode(value: object) -> RedactionMode:
    if isinstance(value, RedactionMode):
        return value
    if not isinstance(value, str):
        raise InvalidRedactionMode(value)
    try:
        return RedactionMode(value.strip().lower())
    except ValueError:
        raise InvalidRedactionMode(value) from None


def effective_mode(policy: RedactionMode | str, requested: object = None) -> RedactionMode:
    """The mode for one request: the policy, narrowed (never widened) by the request.

    ``requested`` is the body's ``edgefleet.redaction`` (None when absent). A request may
    ask for stricter handling than the policy (redact_restore -> redact_only -> block), and
    asking for something laxer (``off`` under a redacting policy) keeps the policy. A value
    that is not a mode raises :class:`InvalidRedactionMode`.
    """
    pol = parse_mode(policy)
    if requested is None:
        return pol
    req = parse_mode(requested)
    return req if _STRICTNESS[req] > _STRICTNESS[pol] else pol


def requested_mode(body: object) -> object:
    """The body's ``edgefleet.redaction`` (None when absent); a malformed extension raises."""
    if not isinstance(body, dict):
        return None
    ext = body.get("edgefleet")
    if ext is None:
        return None
    if not isinstance(ext, dict):
        raise InvalidRedactionMode(ext)
    return ext.get("redaction")
