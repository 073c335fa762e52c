"""Run a real ``python -m coordinator`` process on loopback, for tests and tools.

::

    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        session = CoordinatorSession(coordinator.grpc_target, ...)
        agents = await coordinator.get_json("/v1/agents")
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
from typing import Any

import aiohttp

from coordinator.errors import ServerStartError

_READY = re.compile(r"coordinator ready: grpc=(?P<grpc>\S+):(?P<gport>\d+) http=(?P<http>\S+)")
_REPO_ROOT = Path(__file__).resolve().parent.parent


class CoordinatorProcess:
    """A coordinator child process; ports 0 mean "any free port" (read back once ready)."""

    def __init__(
        self,
        *,
        grpc_port: int = 0,
        http_port: int = 0,
        report_interval_ms: int = 2000,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 20.0,
    ) -> None:
        self.grpc_port = grpc_port
        self.http_port = http_port
        self._args = [
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--report-interval-ms",
            str(report_interval_ms),
            *extra_args,
        ]
        self._env = env
        self._startup_timeout_s = startup_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        #: The child's last log lines (stderr).
        self.log: collections.deque[str] = collections.deque(maxlen=500)
        self.grpc_target = ""
        self.http_url = ""

    @property
    def pid(self) -> int:
        return self._started().pid

    def _started(self) -> asyncio.subprocess.Process:
        if self._process is None:
            raise RuntimeError("CoordinatorProcess is not started")
        return self._process

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    async def start(self) -> None:
        env = {**os.environ, **(self._env or {}), "PYTHONUNBUFFERED": "1"}
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coordinator",
            *self._args,
            cwd=_REPO_ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        stderr = self._process.stderr
        if stderr is None:  # cannot happen with stderr=PIPE; keeps the type checker honest
            raise RuntimeError("no stderr pipe")
        try:
            async with asyncio.timeout(self._startup_timeout_s):
                while True:
                    line = (await stderr.readline()).decode(errors="replace")
                    if not line:
                        await self._process.wait()
                        raise ServerStartError(
                            f"coordinator exited with {self._process.returncode} before ready:\n"
                            + "".join(self.log)
                        )
                    self.log.append(line)
                    if match := _READY.search(line):
                        break
        except TimeoutError:
            await self.kill()
            raise ServerStartError("coordinator not ready in time:\n" + "".join(self.log)) from None
        self.grpc_port = int(match["gport"])
        self.grpc_target = f"{match['grpc']}:{self.grpc_port}"
        self.http_url = match["http"]
        self.http_port = int(self.http_url.rsplit(":", 1)[1])
        self._drain = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        stderr = self._started().stderr
        while stderr is not None and (line := await stderr.readline()):
            self.log.append(line.decode(errors="replace"))

    async def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        return await self._signal_and_wait(signal.SIGTERM, timeout_s)

    async def kill(self) -> int:
        """SIGKILL and wait."""
        return await self._signal_and_wait(signal.SIGKILL, 10.0)

    async def _signal_and_wait(self, signum: int, timeout_s: float) -> int:
        process = self._started()
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
        return await process.wait()

    async def get_json(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession() as http,
            http.get(self.http_url + path, raise_for_status=True) as response,
        ):
            return await response.json()

    async def __aenter__(self) -> CoordinatorProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            await self.terminate()


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
