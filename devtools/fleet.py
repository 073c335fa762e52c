"""Coordinator and agent processes, as started by the demo, the e2e tests and benchmarks."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from devtools.process import ProcessStartError, ServiceProcess, get_json, wait_until

_COORDINATOR_READY = re.compile(
    r"coordinator ready: grpc=(?P<grpc>\S+):(?P<gport>\d+) http=(?P<http>\S+)"
    r"(?: enroll=(?P<enroll>\S+))?"
)
ADMIN_TOKEN_ENV = "EDGEFLEET_COORDINATOR_ADMIN_TOKEN"
_AGENT_READY = re.compile(r"edgefleet agent (?P<id>\S+) ready: (?P<url>\S+)")


class CoordinatorProcess(ServiceProcess):
    """A coordinator with a fresh bootstrap admin token (``admin_token``, given in its
    environment, never a flag); ``get_json`` and ``admin_headers`` present it.

    ``tls=True``: as a coordinator reachable beyond loopback runs (on loopback ``auto`` is
    off): TLS on gRPC (mutual TLS on sessions, a separate enrollment port), HTTPS on the
    HTTP API (certificate from its own CA), enrollment required. ``http_context()`` trusts
    its CA. ``coordinator_id``: the id it runs as (``coordinator_id`` setting), kept in
    ``.coordinator_id`` for tests that tell several apart."""

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
        tls: bool = False,
        enroll_port: int = 0,
        coordinator_id: str = "",
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
            # a restart passes every port it had (a fresh ephemeral enrollment port could
            # take the HTTP port the last process just freed)
            *(["--tls", "on", "--enroll-port", str(enroll_port), "--http-tls", "on",
               "--set", "require_enrollment=on"] if tls else []),
            *(["--set", f"coordinator_id={coordinator_id}"] if coordinator_id else []),
            *extra_args,
        ]  # fmt: skip
        self.tls = tls
        # the id it was started with ("": its own default, the host name)
        self.coordinator_id = coordinator_id
        self.admin_token = (env or {}).get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(32)
        env = {**(env or {}), ADMIN_TOKEN_ENV: self.admin_token}
        super().__init__(
            "coordinator", args, _COORDINATOR_READY, env=env, startup_timeout_s=startup_timeout_s
        )
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.grpc_target = ""
        self.enroll_target = ""
        self.enroll_port = enroll_port
        self.http_url = ""

    def on_ready(self, match: re.Match[str]) -> None:
        self.grpc_port = int(match["gport"])
        self.grpc_target = f"{match['grpc']}:{self.grpc_port}"
        self.enroll_target = match["enroll"] or self.grpc_target
        self.enroll_port = int(self.enroll_target.rsplit(":", 1)[1])
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

    def http_context(self) -> ssl.SSLContext | bool:
        """How to reach the HTTP API: trusting this coordinator's CA when it serves HTTPS."""
        return self.ca_context() if self.http_url.startswith("https:") else True

    async def get_json(self, path: str) -> Any:
        return await get_json(
            self.http_url + path, headers=self.admin_headers, ssl=self.http_context()
        )

    def mint_join_token(
        self,
        site: str = "",
        lat: float | None = None,
        lon: float | None = None,
        uses: int = 1,
        http_url: str = "",
    ) -> str:
        """A join token made with the admin CLI on this coordinator's database (the
        operator fixes the site and, with lat/lon, the place of the agents using it; with
        ``http_url``, the agent's URL, which its HTTPS certificate then names)."""
        args = [sys.executable, "-m", "coordinator", "tokens", "create", "--expires-in", "1h",
                "--data-dir", str(self.data_dir), "--uses", str(uses)]  # fmt: skip
        if site:
            args += ["--site", site]
        if lat is not None and lon is not None:
            args += ["--lat", str(lat), "--lon", str(lon)]
        if http_url:
            args += ["--http-url", http_url]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ProcessStartError(f"could not mint a join token: {done.stderr.strip()}")
        return done.stdout.strip()

    @property
    def ca_file(self) -> Path:
        """The fleet CA (``<data_dir>/ca/ca.pem``): what clients trust agents' HTTPS with."""
        return self.data_dir / "ca" / "ca.pem"

    def ca_context(self) -> ssl.SSLContext:
        """A client context that trusts the fleet CA (for HTTPS agents)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def mint_api_key(self, name: str = "test", **fields: Any) -> str:
        """``POST /v1/admin/keys`` with the admin token (``fields``: the key's scopes, e.g.
        ``allow_cloud=True``); the secret is in this answer only."""
        async with (
            aiohttp.ClientSession(headers=self.admin_headers) as http,
            http.post(
                self.http_url + "/v1/admin/keys", json={"name": name, **fields},
                raise_for_status=True, ssl=self.http_context(),
            ) as response,
        ):  # fmt: skip
            body = await response.json()
        return str(body["secret"])

    async def api_key_for(
        self, agents: Iterable[AgentProcess], name: str = "test", timeout_s: float = 30.0,
        **fields: Any,
    ) -> str:  # fmt: skip
        """A new API key, once every one of ``agents`` accepts it (the keys section reached
        them)."""
        key = await self.mint_api_key(name, **fields)
        await wait_key_accepted(agents, key, timeout_s=timeout_s)
        return key

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
        insecure_no_auth: bool = False,
        cpus: set[int] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``join_token`` and ``state_dir`` reach the agent through its environment (a
        token on the command line would show in /proc/PID/cmdline). The agent runs as
        shipped: with a coordinator it requires API keys (the coordinator's keys section;
        ``CoordinatorProcess.api_key_for`` mints one and waits until agents accept it).
        ``insecure_no_auth=True`` is the insecure mode, for tests of that mode only.
        ``ssl_context``: how clients reach an HTTPS agent (``url`` is then https)."""
        env = dict(env or {})
        if join_token:
            env["EDGEFLEET_AGENT_COORDINATOR__JOIN_TOKEN"] = join_token
        # Without a state_dir each AgentProcess gets a fresh one (kept across its restarts,
        # removed with the object): the default (~/.local/state/edgefleet/agent) would carry
        # credentials, last-known keys and pinned signing keys from one test (or run, or
        # user) to the next.
        if state_dir is None and not any("coordinator.state_dir" in a for a in extra_args):
            state_dir = tempfile.mkdtemp(prefix="edgefleet-agent-")
            weakref.finalize(self, shutil.rmtree, state_dir, True)
        if state_dir is not None:
            env.setdefault("EDGEFLEET_AGENT_COORDINATOR__STATE_DIR", str(state_dir))
        args = ["--port", str(port), "--models-dir", models_dir, "--site", site]
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
        self.ssl_context = ssl_context

    def on_ready(self, match: re.Match[str]) -> None:
        self.agent_id = match["id"]
        self.url = match["url"]

    def headers(self, api_key: str) -> dict[str, str]:
        """The request headers that present ``api_key`` (none for "")."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def accepts_key(self, api_key: str) -> bool:
        """True once this agent accepts ``api_key`` (``GET /v1/models`` needs a key; an
        empty ``api_key`` sends no Authorization header)."""
        try:
            async with (
                aiohttp.ClientSession(
                    headers=self.headers(api_key), timeout=aiohttp.ClientTimeout(total=5)
                ) as http,
                http.get(self.url + "/v1/models", ssl=self.ssl_context or True) as response,
            ):
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


async def wait_key_accepted(
    agents: Iterable[AgentProcess], api_key: str, timeout_s: float = 30.0
) -> None:
    """Until every agent accepts ``api_key`` (a key minted on the coordinator reaches the
    agents in their next desired state)."""
    agents = list(agents)

    async def everywhere() -> bool:
        return all(await asyncio.gather(*(a.accepts_key(api_key) for a in agents)))

    await wait_until(everywhere, timeout_s=timeout_s, interval_s=0.1,
                     message="the API key to reach the agents")  # fmt: skip


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for an agent whose URL is fixed before it starts,
    as enrollment with a URL needs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def enrolled_agent(
    coordinator: CoordinatorProcess,
    *,
    agent_id: str,
    site: str,
    state_dir: str | Path,
    lat: float | None = None,
    lon: float | None = None,
    extra_args: Sequence[str] = (),
    **kwargs: Any,
) -> AgentProcess:
    """An agent as a site beyond loopback runs it: enrolled with its own join token (site,
    place and URL fixed by the operator), serving HTTPS with the certificate enrollment
    gave it (``server.tls = on``), mutual TLS to a coordinator started with ``--tls on``,
    API keys required. Clients trust it through the fleet CA (``ssl_context``)."""
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    token = coordinator.mint_join_token(site, lat, lon, http_url=url)
    return AgentProcess(
        port=port,
        coordinator=coordinator.grpc_target,
        agent_id=agent_id,
        site=site,
        lat=lat,
        lon=lon,
        join_token=token,
        state_dir=state_dir,
        extra_args=[
            "--set", "server.tls=on",
            "--set", "coordinator.tls=true",
            "--set", f"coordinator.enroll_target={coordinator.enroll_target}",
            "--set", f"coordinator.ca_file={coordinator.ca_file}",
            *extra_args,
        ],
        ssl_context=coordinator.ca_context(),
        **kwargs,
    )  # fmt: skip
