"""The tracebacks a failed test's report shows from its servers' logs (tests/server_logs.py),
found in a real process's log: a chained exception, an exception group, log lines around."""

from __future__ import annotations

import subprocess
import sys

from tests.server_logs import traceback_spans

LOGS = r"""
import logging
logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level="INFO")
log = logging.getLogger("server")
log.info("serving")
try:
    try:
        int(float("inf"))
    except OverflowError as exc:
        raise ValueError("wrapped") from exc
except ValueError:
    log.exception("unhandled error serving POST /v1/admin/keys")
log.info("between")
try:
    raise ExceptionGroup("several", [KeyError("k")])
except ExceptionGroup:
    log.exception("a group")
log.info("after")
"""


def test_each_traceback_is_found_with_its_causes_and_the_line_that_logged_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOGS], capture_output=True, text=True, timeout=30, check=True
    )
    lines = done.stderr.splitlines(keepends=True)
    blocks = ["".join(lines[begin:end]) for begin, end in traceback_spans(lines)]
    assert len(blocks) == 2, blocks
    chained, group = blocks
    assert chained.splitlines()[0].endswith(
        "ERROR server: unhandled error serving POST /v1/admin/keys"
    )
    assert "OverflowError: cannot convert float infinity to integer" in chained
    assert "The above exception was the direct cause" in chained
    assert chained.rstrip().endswith("ValueError: wrapped")
    assert group.splitlines()[0].endswith("ERROR server: a group")
    assert "KeyError: 'k'" in group
    assert "between" not in chained + group and "after" not in group
