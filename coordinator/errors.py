"""Every exception the coordinator raises on purpose.

::

    CoordinatorError                 root: catch this to catch anything we raise
     ├── FatalError                  the process cannot go on; `python -m coordinator` exits
     │    ├── ConfigError            a setting is unknown, mistyped or out of range
     │    └── ServerStartError       a listener could not be opened (port in use, bad host)
     └── RecoverableError            one request or session fails; the process carries on
          ├── ProtocolError          an agent broke the Session protocol (wrong first message, ...)
          └── UnknownAgentError      a lookup named an agent the registry does not know

Errors from libraries (grpc, aiohttp, tomllib) are converted where they are
caught, with ``raise ... from exc``.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Root of every error the coordinator raises."""


class FatalError(CoordinatorError):
    """The coordinator process cannot continue."""


class ConfigError(FatalError):
    """The configuration is invalid; the message names the key and where it came from."""


class ServerStartError(FatalError):
    """A gRPC or HTTP listener could not be started."""


class RecoverableError(CoordinatorError):
    """One request or session failed; the coordinator keeps serving."""


class ProtocolError(RecoverableError):
    """An agent sent something the Session protocol does not allow."""


class UnknownAgentError(RecoverableError):
    """No agent with this id is known to the registry."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"unknown agent {agent_id!r}")
        self.agent_id = agent_id
