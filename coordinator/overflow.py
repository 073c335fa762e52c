"""Where a client goes when no edge agent can take its request.

A placeholder policy for now: one statically configured target (config
``overflow_name`` / ``overflow_url``). The overflow issue replaces it with real
policy behind the same interface.
"""

from __future__ import annotations

from typing import Protocol

from edgefleet.contract import OverflowKind, OverflowTarget


class OverflowPolicy(Protocol):
    def target_for(self, model: str) -> OverflowTarget | None:
        """The target to name when no edge agent fits; None when there is none."""
        ...


class StaticOverflowPolicy:
    def __init__(self, name: str = "", url: str = "") -> None:
        self._target = (
            OverflowTarget(name=name or url, kind=OverflowKind.GPU_POOL, url=url) if url else None
        )

    def target_for(self, model: str) -> OverflowTarget | None:
        return self._target
