"""Enrollment of this agent with the coordinator, and the credentials it yields.

``Enroller.ensure()`` returns the agent's credentials: read from ``state_dir`` when
the agent enrolled before, else obtained by calling ``Enroll`` with the join token
and saved there (0600). ``CoordinatorSession`` calls it before every session, so an
agent that starts while the coordinator is away enrolls once it is back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent.config import AgentConfig
from agent.errors import ConfigError, FatalError
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

STATE_FILE = "enrollment.json"
_REFUSALS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


class EnrollmentRefusedError(FatalError):
    """The coordinator refused the join token; retrying will not help."""


class EnrollmentUnavailableError(Exception):
    """The coordinator could not be reached to enroll; try again later."""


@dataclass(frozen=True, slots=True)
class AgentCredentials:
    """What enrollment gave this agent."""

    agent_id: str
    site: str
    # Bearer credential sent in Hello.token.
    token: str = field(repr=False)
    ca_cert_pem: str = field(repr=False)
    client_cert_pem: str = field(repr=False)
    client_key_pem: str = field(repr=False)

    def channel_credentials(self, ca_pem: bytes | None = None) -> grpc.ChannelCredentials:
        """Mutual-TLS channel credentials (trusting ``ca_pem`` or the enrollment's CA)."""
        return grpc.ssl_channel_credentials(
            root_certificates=ca_pem or self.ca_cert_pem.encode(),
            private_key=self.client_key_pem.encode(),
            certificate_chain=self.client_cert_pem.encode(),
        )


class Enroller:
    """Loads or obtains this agent's credentials."""

    def __init__(
        self,
        target: str,
        join_token: str,
        *,
        state_dir: Path,
        requested_name: str = "",
        site: str = "",
        tls: bool = False,
        ca_pem: bytes | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.target = target
        self._join_token = join_token
        self._state_file = state_dir.expanduser() / STATE_FILE
        self._requested_name = requested_name
        self._site = site
        self.tls = tls
        self._ca_pem = ca_pem
        self._timeout_s = timeout_s
        self._credentials: AgentCredentials | None = None
        self._lock = asyncio.Lock()

    def load(self) -> AgentCredentials | None:
        """Credentials saved by an earlier enrollment, if any."""
        if self._credentials is None and self._state_file.exists():
            try:
                data: dict[str, Any] = json.loads(self._state_file.read_text(encoding="utf-8"))
                self._credentials = AgentCredentials(**data)
            except (OSError, ValueError, TypeError) as exc:
                raise FatalError(f"cannot read enrollment state {self._state_file}: {exc}") from exc
        return self._credentials

    async def ensure(self) -> AgentCredentials:
        """Saved credentials, or enroll now; raises EnrollmentRefused/UnavailableError."""
        async with self._lock:
            credentials = self.load()
            if credentials is not None:
                return credentials
            if not self._join_token:
                raise EnrollmentRefusedError(
                    "this agent is not enrolled and has no join token (coordinator.join_token)"
                )
            credentials = await self._enroll()
            self._save(credentials)
            self._credentials = credentials
            logger.info(
                "enrolled with coordinator %s as agent %s (site %r)",
                self.target,
                credentials.agent_id,
                credentials.site,
            )
            return credentials

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Session channel credentials: mutual TLS when TLS is on, else None (plaintext)."""
        if not self.tls or self._credentials is None:
            return None
        return self._credentials.channel_credentials(self._ca_pem)

    async def _enroll(self) -> AgentCredentials:
        request = pb.EnrollRequest(
            join_token=self._join_token, requested_name=self._requested_name, site=self._site
        )
        if self.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=self._ca_pem)
            channel = grpc.aio.secure_channel(self.target, creds)
        else:
            channel = grpc.aio.insecure_channel(self.target)
        try:
            async with channel:
                reply = await pb_grpc.CoordinatorStub(channel).Enroll(
                    request, timeout=self._timeout_s
                )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _REFUSALS:
                raise EnrollmentRefusedError(
                    f"coordinator {self.target} refused enrollment: {exc.code().name}: "
                    f"{exc.details()}"
                ) from exc
            raise EnrollmentUnavailableError(
                f"cannot enroll with {self.target}: {exc.code().name}: {exc.details()}"
            ) from exc
        return AgentCredentials(
            agent_id=reply.agent_id,
            site=self._site,
            token=reply.credentials,
            ca_cert_pem=reply.ca_cert_pem,
            client_cert_pem=reply.client_cert_pem,
            client_key_pem=reply.client_key_pem,
        )

    def _save(self, credentials: AgentCredentials) -> None:
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(asdict(credentials), handle)
        except OSError as exc:
            raise FatalError(f"cannot save enrollment state {self._state_file}: {exc}") from exc


def build_enroller(config: AgentConfig, agent_id: str) -> Enroller | None:
    """The agent's Enroller: when it has a join token or enrolled before; else None."""
    c = config.coordinator
    state_dir = Path(c.state_dir).expanduser()
    if not c.join_token and not (state_dir / STATE_FILE).exists():
        return None
    ca_pem = None
    if c.ca_file:
        try:
            ca_pem = Path(c.ca_file).expanduser().read_bytes()
        except OSError as exc:
            raise ConfigError(f"coordinator.ca_file {c.ca_file}: {exc.strerror}") from exc
    return Enroller(
        c.enrollment_target,  # with TLS, the coordinator's enroll port, not the session's
        c.join_token,
        state_dir=state_dir,
        requested_name=agent_id,
        site=config.identity.site,
        tls=c.tls,
        ca_pem=ca_pem,
    )
