"""What a failed test's report shows of the servers it ran (tests/conftest.py): each
``ServiceProcess``'s Python tracebacks logged during the test, then its last log lines.

A 5xx seen by a test is then explained by the server's own traceback, in the failure.
"""

from __future__ import annotations

import re

from devtools.process import ServiceProcess

LAST_LINES = 20
MOST_BLOCKS = 5  # distinct tracebacks shown per process, the latest ones

_START = re.compile(r"^\s*[+|]?\s*(Exception Group )?Traceback \(most recent call last\):")
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]?\d*\s*")


def traceback_spans(lines: list[str]) -> list[tuple[int, int]]:
    """Where each traceback in ``lines`` is (with its chained causes): [start, end) line
    indices, led by the line that logged it (``logger.exception``'s message) if any."""
    spans: list[tuple[int, int]] = []
    begin: int | None = None  # the current block's first line
    end = 0  # and the end of what it holds so far (blank lines after it are not in it)
    group = False  # an exception group's traceback: every line of it is indented
    ended = False  # the block's exception line was seen: only a chained cause may follow
    for i, line in enumerate(lines):
        text = line.rstrip("\n")
        indented = text[:1].isspace()
        if begin is not None and (ended or (group and text and not indented)):
            if ended and not text.strip():
                continue
            if ended and text.strip() in _CHAINED:
                end, ended = i + 1, False
                continue
            spans.append((begin, end))
            begin, ended = None, False
        if begin is None:
            if start := _START.match(text):
                before = lines[i - 1] if i > 0 else ""
                led = bool(before.strip()) and not before[:1].isspace()
                begin, end = (i - 1 if led else i), i + 1
                group = start.group(1) is not None or indented
            continue
        end = i + 1
        if (start := _START.match(text)) and (start.group(1) is not None or indented):
            group = True  # a chained exception group
        # the exception line: the first one not indented (frames and code are)
        if not group and text and not indented and not _START.match(text):
            ended = True
    if begin is not None:
        spans.append((begin, end))
    return spans


def report_section(process: ServiceProcess, mark: int) -> tuple[str, str]:
    """(title, text) for a failed test's report: the tracebacks ``process`` logged after
    its ``lines_logged`` was ``mark``, and its last lines."""
    log = list(process.log.copy())  # copy(): atomic, the drain may append from a thread
    first = len(log) - min(max(process.lines_logged - mark, 0), len(log))  # the test's
    # the same traceback (but for its time) once, as last logged, with its count
    counts: dict[str, tuple[str, int]] = {}
    after = first  # the last lines shown start after the last traceback
    for begin, end in traceback_spans(log[first:]):
        block = "".join(log[first + begin : first + end])
        key = _TIMESTAMP.sub("", block)
        counts[key] = (block, counts.pop(key, ("", 0))[1] + 1)  # re-inserted: latest last
        after = first + end
    state = "running" if process.returncode is None else f"exited with {process.returncode}"
    title = (
        f"{process.module} (pid {process.pid}, {state}): "
        f"{sum(n for _, n in counts.values())} traceback(s) logged during the test"
    )
    parts = []
    for block, seen in list(counts.values())[-MOST_BLOCKS:]:
        parts.append(block + (f"(logged {seen} times)\n" if seen > 1 else ""))
    last = log[max(after, len(log) - LAST_LINES) :]
    which = "its last log lines" + (" after them" if counts else "")
    parts.append(f"... {which}:\n" + "".join(last))
    return title, "\n".join(parts)
