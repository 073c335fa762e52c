"""``python -m agent`` as a real process: start-up failures are one line and a non-zero exit,
and with TLS on the default enrollment target reaches the coordinator's enrollment port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import REPO_ROOT, ProcessStartError, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

TINY = "tiny-llama"


async def failed_start(agent: AgentProcess) -> tuple[int | None, str]:
    """Start ``agent``, which must exit before it is ready: (exit code, its stderr)."""
    with pytest.raises(ProcessStartError):
        await agent.start()
    return agent.returncode, "".join(agent.log)


def assert_one_clear_line(log: str, message: str) -> None:
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if message in line]
    assert len(lines) == 1, log
    assert " ERROR agent: " in lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield int(listener.getsockname()[1])


async def test_busy_port_is_one_line_and_exit_1(tiny_artifacts: Path, busy_port: int) -> None:
    agent = AgentProcess(port=busy_port, models_dir=str(tiny_artifacts), serve=[TINY])
    code, log = await failed_start(agent)
    assert code == 1
    assert_one_clear_line(
        log,
        f"cannot listen for HTTP on 127.0.0.1:{busy_port} (server.host, server.port): "
        "Address already in use",
    )
    assert "model tiny-llama" not in log  # refused before the models load


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("missing", "models.dir {dir} does not exist"),
        ("file", "models.dir {dir} is not a directory"),
        ("unlistable", "models.dir {dir} cannot be read: Permission denied"),
        ("unreadable files", "cannot load the models in models.dir {dir}: [Errno 13] Permission"),
    ],
)
async def test_bad_models_dir_is_one_line_and_exit_1(
    tmp_path: Path, tiny_artifacts: Path, layout: str, message: str
) -> None:
    models = tmp_path / "models"
    if layout == "file":
        models.write_text("not a directory")
    elif layout == "unlistable":
        models.mkdir(mode=0)
    elif layout == "unreadable files":
        shutil.copytree(tiny_artifacts / TINY, models / TINY)
        for path in (models / TINY).iterdir():
            if path.name != "manifest.json":
                path.chmod(0)
    agent = AgentProcess(
        models_dir=str(models), serve=[TINY], executable=_without_root_file_access(tmp_path)
    )
    try:
        code, log = await failed_start(agent)
    finally:
        _make_removable(models)
    assert code == 1
    assert_one_clear_line(log, message.format(dir=models))


async def test_tls_enrollment_default_target_is_the_enrollment_port(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    # Before: the default enroll target was the session port, which is mutual TLS, so a new
    # agent's enrollment failed there and was retried forever.
    data = tmp_path / "coordinator"
    grpc_port = _free_port_pair()
    async with CoordinatorProcess(
        grpc_port=grpc_port, report_interval_ms=200, data_dir=data, extra_args=["--tls", "on"]
    ) as coordinator:
        assert coordinator.enroll_target == f"127.0.0.1:{grpc_port + 1}"
        token = _cli("tokens", "create", "--data-dir", str(data), "--uses", "1")["token"]
        link = {"tls": "true", "join_token": token, "ca_file": str(data / "ca" / "ca.pem")}
        link["state_dir"] = str(tmp_path / "agent-state")
        agent = AgentProcess(
            models_dir=str(tiny_artifacts), serve=[TINY], coordinator=coordinator.grpc_target,
            agent_id="edge-tls",
            extra_args=[a for k, v in link.items() for a in ("--set", f"coordinator.{k}={v}")],
        )  # fmt: skip
        async with agent:

            async def enrolled_and_connected() -> bool:
                view = next(
                    (a for a in await coordinator.agents() if a["agent_id"] == "edge-tls"), None
                )
                return view is not None and view["enrolled"] and view["status"] == "connected"

            await wait_until(enrolled_and_connected, timeout_s=30, message="agent enrolled")


def _free_port_pair() -> int:
    """A port P such that P and P + 1 are free on loopback now."""
    for _ in range(100):
        with socket.create_server(("127.0.0.1", 0)) as first:
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            try:
                socket.create_server(("127.0.0.1", port + 1)).close()
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports")


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *args, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def _without_root_file_access(tmp_path: Path) -> str:
    """This interpreter; as root, run without the capabilities that bypass file modes."""
    if os.geteuid() != 0:
        return sys.executable
    wrapper = tmp_path / "python-without-dac"
    wrapper.write_text(
        "#!/bin/sh\nexec setpriv --bounding-set -dac_override,-dac_read_search "
        f'{sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def _make_removable(path: Path) -> None:
    if path.is_dir():
        path.chmod(stat.S_IRWXU)
        for node in path.rglob("*"):
            node.chmod(node.stat().st_mode | stat.S_IRWXU)
