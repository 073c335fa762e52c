"""Helpers shared by the structured-output tests."""

from __future__ import annotations

import json
from typing import Any


async def sse_events(resp: Any) -> list[Any]:
    """The JSON events of a finished SSE response (``[DONE]`` checked and dropped)."""
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = (await resp.read()).decode()
    events = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]
