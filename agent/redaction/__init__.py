"""Personal data redaction at the edge (see docs/operators/redaction.md).

Nothing that leaves the site (overflow requests, their continuations and tool-call
arguments, and the agent's logs) carries the personal values found here: they become typed
placeholders (``<EMAIL_1>``) held in a per-request :class:`Vault`, restored in what the user
receives, streamed chunks included.
"""

from agent.redaction.detectors import ENTITY_TYPES, Span
from agent.redaction.log_filter import RedactingFilter, install_log_filter
from agent.redaction.modes import (
    InvalidRedactionMode,
    RedactionBlocked,
    RedactionMode,
    effective_mode,
    requested_mode,
)
from agent.redaction.redactor import RedactionUninspectable, Redactor, TokenCodec
from agent.redaction.vault import StreamRestorer, Vault

__all__ = [
    "ENTITY_TYPES",
    "InvalidRedactionMode",
    "RedactingFilter",
    "RedactionBlocked",
    "RedactionMode",
    "RedactionUninspectable",
    "Redactor",
    "Span",
    "StreamRestorer",
    "TokenCodec",
    "Vault",
    "effective_mode",
    "install_log_filter",
    "requested_mode",
]
