"""Enrollment of this agent with the coordinator, and the credentials it yields.

``Enroller.ensure()`` returns the agent's credentials: read from ``state_dir`` when
the agent enrolled before, else obtained by calling ``Enroll`` with the join token
and saved there. ``CoordinatorSession`` calls it before every session, so an agent
that starts while the coordinator is away enrolls once it is back.

The agent makes its own key (EC P-256, ``agent.key``, 0600) before it first calls
Enroll and sends a CSR: the private key never leaves the box. Because the key is saved
first, an agent that crashed after Enroll but before saving its answer enrolls again
with the same token and key and gets the same agent id (the coordinator does not count
a second use). Every file is written atomically (temporary file, fsync, rename, 0600).

Certificates are short-lived (the coordinator's ``agent_cert_days``, 7 by default):
``needs_renewal`` is true once two thirds of the lifetime have passed, and the session
then sends RenewCertificate. An agent whose certificate expired while it was offline
re-enrolls on the enroll port with its credential (``efa_<credential>``), without an
operator, as long as the coordinator still holds its record.

Where: ``coordinator.state_dir``; when not set and systemd gives a ``$STATE_DIRECTORY``
(``StateDirectory=`` in the unit), that directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.config import AgentConfig
from agent.errors import ConfigError, FatalError
from agent.sync.trust import pin_signing_key
from edgefleet.contract import Location
from edgefleet.files import write_private
from edgefleet.tls import write_atomically
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

STATE_FILE = "enrollment.json"
KEY_FILE = "agent.key"
# The certificate and the fleet CA, as files for the HTTPS API (agent/https.py).
CERT_FILE = "agent.crt"
CA_FILE = "ca.pem"
# EnrollRequest.join_token prefix for re-enrollment with the agent's own credential.
CREDENTIAL_PREFIX = "efa_"
# Renew once this fraction of the certificate's lifetime has passed.
RENEW_AT_FRACTION = 2 / 3
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
    """What enrollment gave this agent (the private key lives in its own file)."""

    agent_id: str
    site: str
    # Bearer credential sent in Hello.token.
    token: str = field(repr=False)
    ca_cert_pem: str = field(repr=False)
    client_cert_pem: str = field(repr=False)
    # The agent's private key (PEM), from agent.key; a legacy enrollment's key was
    # made by the coordinator.
    client_key_pem: str = field(repr=False)
    # What the operator fixed (announced in Hello as is); None / "": not fixed.
    location: Location | None = None
    http_url: str = ""

    def channel_credentials(self, ca_pem: bytes | None = None) -> grpc.ChannelCredentials:
        """Mutual-TLS channel credentials (trusting ``ca_pem`` or the enrollment's CA)."""
        return grpc.ssl_channel_credentials(
            root_certificates=ca_pem or self.ca_cert_pem.encode(),
            private_key=self.client_key_pem.encode(),
            certificate_chain=self.client_cert_pem.encode(),
        )

    def certificate_times(self) -> tuple[datetime, datetime] | None:
        """(not before, not after) of the client certificate; None when unreadable."""
        try:
            cert = x509.load_pem_x509_certificate(self.client_cert_pem.encode())
        except ValueError:
            return None
        return cert.not_valid_before_utc, cert.not_valid_after_utc

    def needs_renewal(self, now: datetime | None = None) -> bool:
        """True once two thirds of the certificate's lifetime have passed."""
        times = self.certificate_times()
        if times is None:
            return False
        start, end = times
        now = now or datetime.now(UTC)
        return now >= start + (end - start) * RENEW_AT_FRACTION

    def expired(self, now: datetime | None = None) -> bool:
        times = self.certificate_times()
        return times is not None and (now or datetime.now(UTC)) >= times[1]


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
        self._state_dir = state_dir.expanduser()
        self._state_file = self._state_dir / STATE_FILE
        self._key_file = self._state_dir / KEY_FILE
        self._requested_name = requested_name
        self._site = site
        self.tls = tls
        self._ca_pem = ca_pem
        self._timeout_s = timeout_s
        self._credentials: AgentCredentials | None = None
        self._lock = asyncio.Lock()

    @property
    def credentials(self) -> AgentCredentials | None:
        return self._credentials

    def load(self) -> AgentCredentials | None:
        """Credentials saved by an earlier enrollment, if any."""
        if self._credentials is None and self._state_file.exists():
            try:
                data: dict[str, Any] = json.loads(self._state_file.read_text(encoding="utf-8"))
                location = data.pop("location", None)
                if data.get("client_key_pem") is None or self._key_file.exists():
                    data["client_key_pem"] = self._key_file.read_text(encoding="ascii")
                self._credentials = AgentCredentials(
                    **data, location=None if location is None else Location(**location)
                )
            except (OSError, ValueError, TypeError) as exc:
                raise FatalError(f"cannot read enrollment state {self._state_file}: {exc}") from exc
            if not (self._state_dir / CERT_FILE).exists():  # state saved before these files
                try:
                    self._write_pems(self._credentials)
                except OSError as exc:
                    raise FatalError(f"cannot write {self._state_dir / CERT_FILE}: {exc}") from exc
        return self._credentials

    async def ensure(self) -> AgentCredentials:
        """Saved credentials, or enroll now; raises EnrollmentRefused/UnavailableError.

        With TLS, saved credentials whose certificate expired are renewed first by
        re-enrolling with the agent's credential.
        """
        async with self._lock:
            credentials = self.load()
            if credentials is not None:
                if self.tls and credentials.expired():
                    credentials = await self._reenroll(credentials)
                return credentials
            if not self._join_token:
                raise EnrollmentRefusedError(
                    "this agent is not enrolled and has no join token (coordinator.join_token)"
                )
            key_pem = self._own_key()
            credentials = await self._enroll(self._join_token, self._requested_name, key_pem)
            self._save(credentials)
            self._credentials = credentials
            logger.info(
                "enrolled with coordinator %s as agent %s (site %r)",
                self.target,
                credentials.agent_id,
                credentials.site,
            )
            return credentials

    async def refresh(self) -> AgentCredentials:
        """Re-enroll with the agent's credential to learn what the operator fixed since
        (``agents set``: site, location, URL); also renews the certificate."""
        async with self._lock:
            credentials = self.load()
            if credentials is None:
                raise EnrollmentRefusedError("refresh before enrollment")
            return await self._reenroll(credentials, why="the operator changed its record")

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Session channel credentials: mutual TLS when TLS is on, else None (plaintext)."""
        if not self.tls or self._credentials is None:
            return None
        return self._credentials.channel_credentials(self._ca_pem)

    def renewal_csr(self) -> str:
        """A CSR on the agent's key, for RenewCertificate."""
        credentials = self._credentials
        if credentials is None:
            raise FatalError("renewal before enrollment")
        return _csr(credentials.client_key_pem, credentials.agent_id)

    def save_certificate(self, cert_pem: str, ca_cert_pem: str) -> None:
        """Keep a renewed certificate (the next session uses it)."""
        credentials = self._credentials
        if credentials is None:
            return
        updated = replace(
            credentials,
            client_cert_pem=cert_pem,
            ca_cert_pem=ca_cert_pem or credentials.ca_cert_pem,
        )
        self._save(updated)
        self._credentials = updated
        times = updated.certificate_times()
        logger.info(
            "renewed the client certificate (valid until %s)",
            times[1].isoformat(timespec="seconds") if times else "?",
        )

    # --------------------------------------------------------------- helpers

    def _own_key(self) -> str:
        """The agent's private key, made and saved (0600) on first use."""
        try:
            return self._key_file.read_text(encoding="ascii")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise FatalError(f"cannot read the agent key {self._key_file}: {exc}") from exc
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")
        write_private(self._key_file, pem)
        return pem

    async def _reenroll(
        self, credentials: AgentCredentials, why: str = "its client certificate expired"
    ) -> AgentCredentials:
        logger.warning("agent %s re-enrolls with its credential: %s", credentials.agent_id, why)
        renewed = await self._enroll(
            CREDENTIAL_PREFIX + credentials.token,
            credentials.agent_id,
            credentials.client_key_pem,
        )
        renewed = replace(renewed, client_key_pem=credentials.client_key_pem)
        self._save(renewed)
        self._credentials = renewed
        return renewed

    async def _enroll(self, join_token: str, name: str, key_pem: str) -> AgentCredentials:
        request = pb.EnrollRequest(
            join_token=join_token,
            requested_name=name,
            site=self._site,
            csr_pem=_csr(key_pem, name or "edgefleet-agent"),
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
        if reply.model_signing_key:  # v1.3: the key every model manifest must verify with
            try:
                pin_signing_key(self._state_dir, reply.model_signing_key)
            except OSError as exc:
                raise FatalError(f"cannot save the model-signing key: {exc}") from exc
        return AgentCredentials(
            agent_id=reply.agent_id,
            site=reply.site or self._site,
            token=reply.credentials,
            ca_cert_pem=reply.ca_cert_pem,
            client_cert_pem=reply.client_cert_pem,
            client_key_pem=key_pem,
            location=(
                Location(reply.location.lat, reply.location.lon)
                if reply.HasField("location")
                else None
            ),
            http_url=reply.http_url,
        )

    def _save(self, credentials: AgentCredentials) -> None:
        data = asdict(credentials)
        del data["client_key_pem"]  # in agent.key
        if credentials.location is not None:
            data["location"] = {"lat": credentials.location.lat, "lon": credentials.location.lon}
        try:
            if not self._key_file.exists():
                write_private(self._key_file, credentials.client_key_pem)
            write_private(self._state_file, json.dumps(data))
            self._write_pems(credentials)
        except OSError as exc:
            raise FatalError(f"cannot save enrollment state {self._state_file}: {exc}") from exc

    def _write_pems(self, credentials: AgentCredentials) -> None:
        """``agent.key`` (0600, first), ``ca.pem`` and ``agent.crt`` in the state dir, each
        written atomically: what the HTTPS API serves (agent/https.py reads and reloads them)."""
        if not credentials.client_cert_pem:
            return
        if not self._key_file.exists():
            write_atomically(self._key_file, credentials.client_key_pem, private=True)
        if credentials.ca_cert_pem:
            write_atomically(self._state_dir / CA_FILE, credentials.ca_cert_pem)
        write_atomically(self._state_dir / CERT_FILE, credentials.client_cert_pem)


def _csr(key_pem: str, name: str) -> str:
    key = serialization.load_pem_private_key(key_pem.encode("ascii"), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise FatalError("the agent key is not an EC key")
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def state_dir_of(config: AgentConfig) -> Path:
    """``coordinator.state_dir``; when not set, systemd's ``$STATE_DIRECTORY`` if given."""
    c = config.coordinator
    systemd = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if "state_dir" not in c.model_fields_set and systemd:
        return Path(systemd)
    return Path(c.state_dir).expanduser()


def build_enroller(config: AgentConfig, agent_id: str) -> Enroller | None:
    """The agent's Enroller: when it has a join token or enrolled before; else None."""
    c = config.coordinator
    state_dir = state_dir_of(config)
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
