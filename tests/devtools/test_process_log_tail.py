"""devtools.process.ServiceProcess: a block that fails shows the process's last stderr lines.

A benchmark that lost its coordinator ("Cannot connect to host") printed nothing of the
coordinator's own log: the reason stayed inside the terminated process.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import pytest

from devtools.process import ServiceProcess

_MODULE = textwrap.dedent(
    """
    import sys, time
    for i in range(60):
        print(f"line {i}", file=sys.stderr)
    print("ready now", file=sys.stderr, flush=True)
    print("the reason it broke", file=sys.stderr, flush=True)
    time.sleep(60)
    """
)


def _process(tmp_path: Path) -> ServiceProcess:
    (tmp_path / "talker.py").write_text(_MODULE)
    return ServiceProcess("talker", [], re.compile("ready now"), cwd=tmp_path)


async def test_a_failing_block_prints_the_tail_of_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConnectionError):
        async with _process(tmp_path) as process:
            while "the reason it broke\n" not in process.log:
                await asyncio.sleep(0.05)
            raise ConnectionError("Cannot connect to host")
    err = capsys.readouterr().err
    assert "--- last 40 stderr lines of talker" in err
    assert "the reason it broke" in err
    assert "line 59" in err and "line 22\n" in err  # the last 40 lines, in order
    assert "line 21\n" not in err
    assert err.index("line 59") < err.index("ready now") < err.index("the reason it broke")


async def test_a_block_that_ends_well_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with _process(tmp_path):
        pass
    assert "stderr lines" not in capsys.readouterr().err
