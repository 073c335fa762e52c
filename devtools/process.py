"""A real edgefleet process (``python -m MODULE ...``) on loopback, for tests and tools.

``python`` is this interpreter unless another one is given (e.g. a benchmark peer's own
virtual environment).

The child's stderr is read until it prints its ready line, then drained in the background
(its last lines stay in ``log`` for failure messages).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

REPO_ROOT = Path(__file__).resolve().parent.parent


class ProcessStartError(RuntimeError):
    """The child exited or stayed silent before printing its ready line."""


# The processes started here that still run, or exited since forget_exited() last ran:
# tests/conftest.py adds their tracebacks and last lines to a failed test's report.
_started: list[ServiceProcess] = []


def started_processes() -> list[ServiceProcess]:
    """The processes still running, and those that exited since ``forget_exited()``."""
    return list(_started)


def forget_exited() -> None:
    """Forget the processes that have exited (as each test starts)."""
    _started[:] = [p for p in _started if p.returncode is None]


# stderr lines shown when the block a process was started in fails
LOG_TAIL_LINES = 40


class ServiceProcess:
    def __init__(
        self,
        module: str,
        args: Sequence[str],
        ready: re.Pattern[str],
        *,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        executable: str | Path | None = None,
        cwd: str | Path | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self.module = module
        # The CPUs the child (and every thread it starts) may run on; None: any.
        self.cpus = cpus
        # Where the child runs (and so which tree ``-m MODULE`` imports): the repository
        # unless told otherwise (e.g. an older release unpacked elsewhere).
        self.cwd = Path(cwd) if cwd is not None else REPO_ROOT
        self.executable = str(executable) if executable is not None else sys.executable
        self.args = list(args)
        self._ready = ready
        self._env = env
        self._startup_timeout_s = startup_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=500)  # last stderr lines
        self.lines_logged = 0  # lines ever put in ``log`` (which of them are new since a count)

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.module} not started")
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    def on_ready(self, match: re.Match[str]) -> None:
        """Read addresses out of the ready line (subclasses)."""

    def _pin(self) -> None:
        """In the child before exec: its CPUs, inherited by every thread it starts."""
        assert self.cpus is not None
        os.sched_setaffinity(0, self.cpus)

    async def start(self) -> None:
        env = {**os.environ, **(self._env or {}), "PYTHONUNBUFFERED": "1"}
        self._process = await asyncio.create_subprocess_exec(
            self.executable, "-m", self.module, *self.args,
            cwd=self.cwd, env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=None if self.cpus is None else self._pin,
        )  # fmt: skip
        _started.append(self)
        stderr = self._process.stderr
        if stderr is None:
            raise ProcessStartError("no stderr pipe")
        try:
            async with asyncio.timeout(self._startup_timeout_s):
                while True:
                    line = (await stderr.readline()).decode(errors="replace")
                    if not line:
                        await self._process.wait()
                        raise ProcessStartError(
                            f"{self.module} exited with {self._process.returncode} before "
                            "ready:\n" + "".join(self.log)
                        )
                    self.log.append(line)
                    self.lines_logged += 1
                    if match := self._ready.search(line):
                        break
        except TimeoutError:
            await self.kill()
            raise ProcessStartError(
                f"{self.module} not ready in {self._startup_timeout_s:g} s:\n" + "".join(self.log)
            ) from None
        self.on_ready(match)
        self._drain = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        while line := await self._process.stderr.readline():
            self.log.append(line.decode(errors="replace"))
            self.lines_logged += 1

    async def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        return await self.signal_and_wait(signal.SIGTERM, timeout_s)

    async def kill(self) -> int:
        """SIGKILL and wait."""
        return await self.signal_and_wait(signal.SIGKILL, 10.0)

    async def signal_and_wait(self, signum: int, timeout_s: float) -> int:
        process = self._process
        if process is None:
            raise RuntimeError(f"{self.module} not started")
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
            try:
                await asyncio.wait_for(process.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._drain is not None:
            await self._drain
            self._drain = None
        assert process.returncode is not None
        return process.returncode

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            code = await self.terminate()
            if exc is not None:
                # what the process said last, beside the error that ended the block: a
                # benchmark or test that fails talking to it then shows why
                print(self.log_tail(code), file=sys.stderr, flush=True)

    def log_tail(self, code: int | None = None, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines the process wrote to stderr, under a header."""
        tail = list(self.log)[-lines:]
        pid = self._process.pid if self._process is not None else "-"
        return (
            f"--- last {len(tail)} stderr lines of {self.module} (pid {pid}, exit {code}) ---\n"
            + "".join(tail)
        )


async def get_json(url: str, *, headers: dict[str, str] | None = None, ssl: Any = True) -> Any:
    """GET ``url`` as JSON (``ssl``: an ``ssl.SSLContext`` for a private CA's HTTPS)."""
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(url, raise_for_status=True, ssl=ssl) as response,
    ):
        return await response.json()


async def wait_until(
    condition: Callable[[], Awaitable[bool] | bool],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    message: str = "condition",
) -> None:
    """Poll ``condition`` until it is true; raise TimeoutError naming ``message``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {message}")
        await asyncio.sleep(interval_s)
