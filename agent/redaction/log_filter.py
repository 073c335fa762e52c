"""A logging filter that redacts what the agent writes to its logs.

Installed on the handlers (a filter on a logger does not see records that propagate from
its children). Each record's message is formatted, redacted with a vault of its own (the
placeholders say what kind of value was there; the values are not kept) and put back with
no arguments; an exception's traceback text is redacted the same way.
"""

from __future__ import annotations

import logging

from agent.redaction.redactor import Redactor
from agent.redaction.vault import Vault


class RedactingFilter(logging.Filter):
    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as it would
            return True
        try:
            redacted = self.redactor.redact(message, Vault())
            if redacted != message or record.args:
                record.msg, record.args = redacted, None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = self.redactor.redact(record.exc_text, Vault())
            if record.stack_info:
                record.stack_info = self.redactor.redact(record.stack_info, Vault())
        except Exception as exc:  # never let an unchecked value through
            record.msg = f"(log record withheld: redaction failed with {type(exc).__name__})"
            record.args = record.exc_info = record.exc_text = record.stack_info = None
        return True


def install_log_filter(redactor: Redactor, logger: logging.Logger | None = None) -> RedactingFilter:
    """Adds one :class:`RedactingFilter` to every handler of ``logger`` (the root by default)."""
    target = logger if logger is not None else logging.getLogger()
    filt = RedactingFilter(redactor)
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(filt)
    return filt
