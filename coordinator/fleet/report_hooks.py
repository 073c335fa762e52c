"""One hook point for what agents report: every accepted LoadReport is handed to each
registered callable (the rollouts' collector of per-interval model stats, the model
assignments' peer bookkeeping). A hook is called on the event loop, once per report,
right after the registry stored it: it must be quick and must not block. A failing hook
is logged (once per hook and error text) and the others still run; the session carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgefleet.contract import LoadReport

logger = logging.getLogger(__name__)

ReportHook = Callable[[str, LoadReport], None]


class ReportHooks:
    def __init__(self) -> None:
        self._hooks: list[ReportHook] = []
        self._logged: set[tuple[int, str]] = set()

    def add(self, hook: ReportHook) -> None:
        """Call ``hook(agent_id, report)`` for every accepted report from now on."""
        self._hooks.append(hook)

    def remove(self, hook: ReportHook) -> None:
        self._hooks.remove(hook)

    def __len__(self) -> int:
        return len(self._hooks)

    def __call__(self, agent_id: str, report: LoadReport) -> None:
        for hook in self._hooks:
            try:
                hook(agent_id, report)
            except Exception as exc:  # one bad hook must not end the agent's session
                key = (id(hook), f"{type(exc).__name__}: {exc}")
                if key not in self._logged:
                    if len(self._logged) >= 1000:  # bounded: error texts may vary
                        self._logged.clear()
                    self._logged.add(key)
                    logger.error("report hook %r failed: %s", hook, key[1], exc_info=exc)
