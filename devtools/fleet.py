"""Coordinator and agent processes, as started by the demo, the e2e tests and benchmarks."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from devtools.process import ProcessStartError, ServiceProcess, get_json

_COORDINATOR_READY = re.compile(
    r"coordinator ready: grpc=(?P<grpc>\S+):(?P<gport>\d+) http=(?P<http>\S+)"
    r"(?: enroll=(?P<enroll>\S+))?"
)
ADMIN_TOKEN_ENV = "EDGEFLEET_COORDINATOR_ADMIN_TOKEN"
_AGENT_READY = re.compile(r"edgefleet agent (?P<id>\S+) ready: (?P<url>\S+)")


class CoordinatorProcess(ServiceProcess):
    """A coordinator with a fresh bootstrap admin token (``admin_token``, given in its
    environment, never a flag); ``get_json`` and ``admin_headers`` present it."""

    def __init__(
        self,
        *,
        grpc_port: int = 0,
        http_port: int = 0,
        report_interval_ms: int = 2000,
        data_dir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        # Without a data_dir each process gets a fresh one, removed when it exits.
        self._own_data_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="edgefleet-coordinator-"))
            if data_dir is None
            else Path(data_dir)
        )
        args = [
            "--grpc-port", str(grpc_port),
            "--http-port", str(http_port),
            "--report-interval-ms", str(report_interval_ms),
            "--data-dir", str(self.data_dir),
            *extra_args,
        ]  # fmt: skip
        self.admin_token = (env or {}).get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(32)
        env = {**(env or {}), ADMIN_TOKEN_ENV: self.admin_token}
        super().__init__(
            "coordinator", args, _COORDINATOR_READY, env=env, startup_timeout_s=startup_timeout_s
        )
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.grpc_target = ""
        self.enroll_target = ""
        self.http_url = ""

    def on_ready(self, match: re.Match[str]) -> None:
        self.grpc_port = int(match["gport"])
        self.grpc_target = f"{match['grpc']}:{self.grpc_port}"
        self.enroll_target = match["enroll"] or self.grpc_target
        self.http_url = match["http"]
        self.http_port = int(self.http_url.rsplit(":", 1)[1])

    async def signal_and_wait(self, signum: int, timeout_s: float) -> int:
        code = await super().signal_and_wait(signum, timeout_s)
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return code

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    async def get_json(self, path: str) -> Any:
        return await get_json(self.http_url + path, headers=self.admin_headers)

    def mint_join_token(
        self, site: str = "", lat: float | None = None, lon: float | None = None, uses: int = 1
    ) -> str:
        """A join token made with the admin CLI on this coordinator's database (the
        operator fixes the site and, with lat/lon, the place of the agents using it)."""
        args = [sys.executable, "-m", "coordinator", "tokens", "create", "--expires-in", "1h",
                "--data-dir", str(self.data_dir), "--uses", str(uses)]  # fmt: skip
        if site:
            args += ["--site", site]
        if lat is not None and lon is not None:
            args += ["--lat", str(lat), "--lon", str(lon)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ProcessStartError(f"could not mint a join token: {done.stderr.strip()}")
        return done.stdout.strip()

    async def agents(self) -> list[dict[str, Any]]:
        """The coordinator's fleet view (``GET /v1/agents``, every page)."""
        agents: list[dict[str, Any]] = []
        path = "/v1/agents?limit=1000"
        while True:
            body = await self.get_json(path)
            agents += body["data"]
            if not body.get("has_more"):
                return agents
            path = f"/v1/agents?limit=1000&after={quote(body['last_id'])}"


class AgentProcess(ServiceProcess):
    def __init__(
        self,
        *,
        port: int = 0,
        models_dir: str = "models/artifacts",
        serve: Sequence[str] = (),
        coordinator: str = "",
        agent_id: str = "",
        site: str = "default",
        lat: float | None = None,
        lon: float | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 120.0,
        executable: str | Path | None = None,
        cwd: str | Path | None = None,
        join_token: str = "",
        state_dir: str | Path | None = None,
        insecure_no_auth: bool | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        """``join_token`` and ``state_dir`` reach the agent through its environment (a
        token on the command line would show in /proc/PID/cmdline). ``insecure_no_auth``
        None: on when a coordinator is given (which turns API keys on) and ``extra_args``
        set no ``auth.`` key, so tests that send no key keep working (not for another
        checkout's agent, ``executable``/``cwd``, which may predate the flag). The demo
        passes ``insecure_no_auth=False``: its agents require API keys."""
        env = dict(env or {})
        if join_token:
            env["EDGEFLEET_AGENT_COORDINATOR__JOIN_TOKEN"] = join_token
        if state_dir is not None:
            env["EDGEFLEET_AGENT_COORDINATOR__STATE_DIR"] = str(state_dir)
        args = ["--port", str(port), "--models-dir", models_dir, "--site", site]
        if insecure_no_auth is None:
            insecure_no_auth = (
                bool(coordinator)
                and executable is None
                and cwd is None
                and not any("auth." in a for a in extra_args)
            )
        if insecure_no_auth:
            args.append("--insecure-no-auth")
        if lat is not None and lon is not None:  # else the agent's place is unknown
            args += ["--lat", str(lat), "--lon", str(lon)]
        for name in serve:
            args += ["--serve", name]
        if coordinator:
            args += ["--coordinator", coordinator]
        if agent_id:
            args += ["--agent-id", agent_id]
        super().__init__(
            "agent", [*args, *extra_args], _AGENT_READY, env=env,
            startup_timeout_s=startup_timeout_s, executable=executable, cwd=cwd, cpus=cpus,
        )  # fmt: skip
        self.agent_id = agent_id
        self.url = ""

    def on_ready(self, match: re.Match[str]) -> None:
        self.agent_id = match["id"]
        self.url = match["url"]
