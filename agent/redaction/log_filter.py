"""A logging filter that redacts what the agent writes to its logs.

Installed on the handlers (a filter on a logger does not see records that propagate from
its children). Each record's message is formatted, redacted with a vault of its own (the
placeholders say what kind of value was there; the values are not kept) and put back with
no arguments; an exception's traceback text is redacted the same way.

Addresses that name the agent's own infrastructure are kept: loopback and unspecified
addresses (``127.0.0.1``, ``::1``, ``0.0.0.0``) identify no one, and the hosts the operator
configured (``keep``: the agent's listen host and public URL host, the coordinator's) are
configuration, not personal data; a start-up error that said ``cannot listen on
<IP_ADDRESS_1>`` would only hide what the operator must fix. Every other address is
redacted.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from agent.redaction.redactor import Redactor
from agent.redaction.vault import Vault


def _infrastructure(value: str, keep: frozenset[str]) -> bool:
    if value in keep:
        return True
    try:
        address = ipaddress.ip_address(value.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


class _LogVault(Vault):
    """A vault for one log record that leaves infrastructure addresses as they are."""

    def __init__(self, keep: frozenset[str]) -> None:
        super().__init__()
        self._keep = keep

    def placeholder_for(self, type_: str, value: str) -> str:
        if type_ == "IP_ADDRESS" and _infrastructure(value, self._keep):
            return value
        return super().placeholder_for(type_, value)


class RedactingFilter(logging.Filter):
    def __init__(self, redactor: Redactor, keep: Iterable[str] = ()) -> None:
        super().__init__()
        self.redactor = redactor
        self.keep = frozenset(k for k in keep if k)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as it would
            return True
        try:
            redacted = self.redactor.redact(message, _LogVault(self.keep))
            if redacted != message or record.args:
                record.msg, record.args = redacted, None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = self.redactor.redact(record.exc_text, _LogVault(self.keep))
            if record.stack_info:
                record.stack_info = self.redactor.redact(record.stack_info, _LogVault(self.keep))
        except Exception as exc:  # never let an unchecked value through
            record.msg = f"(log record withheld: redaction failed with {type(exc).__name__})"
            record.args = record.exc_info = record.exc_text = record.stack_info = None
        return True


def install_log_filter(
    redactor: Redactor, logger: logging.Logger | None = None, keep: Iterable[str] = ()
) -> RedactingFilter:
    """Adds one :class:`RedactingFilter` to every handler of ``logger`` (the root by default);
    ``keep``: configured infrastructure hosts left as they are."""
    target = logger if logger is not None else logging.getLogger()
    filt = RedactingFilter(redactor, keep)
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(filt)
    return filt
