"""Stop strings over streamed text: text that could still become a stop is held back."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text deltas; get back what is safe to emit and whether a stop was hit.

    A stop string may span several tokens, so the tail of the text that is a prefix of a
    stop string is held until it either completes the stop (and is dropped) or cannot.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return delta
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        hold = self._longest_partial_stop(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """At the end of generation the held text was not a stop: release it."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_stop(self, text: str) -> int:
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
