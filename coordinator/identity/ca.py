"""The coordinator's own certificate authority (made with ``cryptography``).

On first start the coordinator creates an EC P-256 CA under ``<data_dir>/ca/`` and
keeps it; every start it issues itself a fresh server certificate, and enrollment
issues each agent a client certificate whose common name is the agent id (and a URI
SAN ``edgefleet://agent/<id>``).

Agents of contract v1.2 send a CSR: the coordinator signs the agent's own public key
(``issue_client(agent_id, csr_pem=...)``) and never sees its private key. Only an agent
that sends no CSR (older than v1.2, "legacy") gets a key made here.

Lifetimes: the CA 10 years; server certificates 365 days (a fresh one every start);
agent certificates ``agent_cert_days`` (coordinator config, default 7 days), renewed
over the session once two thirds of the lifetime have passed.

The CA is two files, ``ca.pem`` and ``ca.key``: with neither, a new CA is made; with
both, they are loaded; with only one, the coordinator refuses to start (a new CA would
silently replace the one every enrolled agent trusts).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from coordinator.errors import CertificateError, CertificateRequestError
from edgefleet.tls import AGENT_URI_PREFIX, agent_server_name

logger = logging.getLogger(__name__)

CA_COMMON_NAME = "edgefleet coordinator CA"
CA_VALID_DAYS = 3650
SERVER_VALID_DAYS = 365
CLIENT_VALID_DAYS = 7.0


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: str
    key_pem: str = field(repr=False)
    # Hex serial number.
    serial: str
    not_after: dt.datetime


class CertificateAuthority:
    """Signs server and agent certificates with the coordinator's CA key."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self._cert = cert
        self._key = key
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    @classmethod
    def load_or_create(cls, directory: Path) -> CertificateAuthority:
        """Load the CA from ``directory`` (``ca.pem`` + ``ca.key``), creating it on first use."""
        cert_path, key_path = directory / "ca.pem", directory / "ca.key"
        if cert_path.exists() != key_path.exists():
            present, missing = (
                (cert_path, key_path) if cert_path.exists() else (key_path, cert_path)
            )
            raise CertificateError(
                f"the coordinator CA is incomplete: {present} exists but {missing} is missing; "
                "restore both files (python -m coordinator restore) or remove both to make a "
                "new CA (every enrolled agent must then enroll again)"
            )
        try:
            if cert_path.exists() and key_path.exists():
                cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
                if not isinstance(key, ec.EllipticCurvePrivateKey):
                    raise CertificateError(f"{key_path} is not an EC private key")
                return cls(cert, key)
            directory.mkdir(parents=True, exist_ok=True)
            authority = cls._create()
            _write_private(key_path, authority._key_pem())
            cert_path.write_text(authority.cert_pem, encoding="ascii")
        except (OSError, ValueError) as exc:
            raise CertificateError(f"cannot load or create the CA in {directory}: {exc}") from exc
        logger.info("created coordinator CA in %s", directory)
        return authority

    @classmethod
    def _create(cls) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue_server(self, names: Sequence[str]) -> IssuedCertificate:
        """A server certificate valid for every host name or IP address in ``names``."""
        sans = _general_names(names)
        return self._issue("edgefleet coordinator", sans, [ExtendedKeyUsageOID.SERVER_AUTH])

    def issue_client(
        self,
        agent_id: str,
        *,
        csr_pem: str = "",
        days: float = CLIENT_VALID_DAYS,
        server_names: Sequence[str] | None = None,
    ) -> IssuedCertificate:
        """A client certificate naming ``agent_id`` (common name and a URI SAN).

        With ``csr_pem`` the certificate is for the CSR's public key and ``key_pem`` is
        empty; without, a key is made here (legacy agents only). With ``server_names``
        (the host of the agent's URL fixed at enrollment, IP or DNS) the certificate is
        also a TLS server certificate: for its HTTPS API (SAN = those names) and for peers
        that dial it by identity (SAN = ``agent_server_name(agent_id)``).
        """
        sans: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(f"{AGENT_URI_PREFIX}{agent_id}")
        ]
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server_names is not None:
            sans += _general_names([*server_names, agent_server_name(agent_id)])
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        public_key = public_key_of_csr(csr_pem) if csr_pem else None
        return self._issue(agent_id, sans, usages, days=days, public_key=public_key)

    def _issue(
        self,
        common_name: str,
        sans: list[x509.GeneralName],
        usages: Sequence[x509.ObjectIdentifier],
        *,
        days: float = SERVER_VALID_DAYS,
        public_key: CertificatePublicKey | None = None,
    ) -> IssuedCertificate:
        key = None
        if public_key is None:
            key = ec.generate_private_key(ec.SECP256R1())
            public_key = key.public_key()
        now = _now()
        not_after = now + dt.timedelta(days=days)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return IssuedCertificate(
            cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
            key_pem="" if key is None else _key_pem(key),
            serial=format(cert.serial_number, "x"),
            not_after=not_after,
        )

    def _key_pem(self) -> str:
        return _key_pem(self._key)


CertificatePublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def public_key_of_csr(csr_pem: str) -> CertificatePublicKey:
    """The public key of a PEM CSR whose signature checks; raises CertificateRequestError."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise CertificateRequestError(f"the CSR is not a PEM PKCS#10 request: {exc}") from exc
    if not csr.is_signature_valid:
        raise CertificateRequestError("the CSR's signature does not check")
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
            raise CertificateRequestError(f"CSR key curve {key.curve.name} is not P-256/P-384")
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise CertificateRequestError("the CSR's key must be EC P-256/P-384 or Ed25519")


def public_key_sha256(key: CertificatePublicKey) -> str:
    """sha256 (hex) of the key's DER SubjectPublicKeyInfo."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def certificate_serial(cert_pem: str | bytes) -> str:
    """Hex serial of a PEM certificate (as IssuedCertificate.serial)."""
    data = cert_pem.encode("ascii") if isinstance(cert_pem, str) else cert_pem
    return format(x509.load_pem_x509_certificate(data).serial_number, "x")


def _general_names(names: Sequence[str]) -> list[x509.GeneralName]:
    """IP address or DNS name SANs for ``names`` (empty ones and repeats dropped)."""
    sans: list[x509.GeneralName] = []
    for name in dict.fromkeys(n.strip("[]") for n in names if n):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    return sans


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(text)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
