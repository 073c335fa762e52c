"""Signed model manifests and the on-disk layout of a signed model set.

The coordinator signs each published version's manifest (the models build's
``manifest.json`` bytes, which list every file with its size and sha256) with an ed25519
key it keeps; agents pin the public key (from enrollment, or from configuration for
standalone and air-gapped agents) and load nothing whose manifest does not verify. The
signature covers the exact bytes, so the manifest is stored and sent as bytes, never
re-serialized.

A signed model set (what ``coordinator models export`` writes, and what an agent's model
store holds) is laid out as::

    ROOT/blobs/sha256/<hex>                          every file, content-addressed
    ROOT/manifests/<name>/<version>/manifest.json    the signed bytes
    ROOT/manifests/<name>/<version>/manifest.sig     the raw 64-byte signature
    ROOT/signing-key.pub                             (exports) base64 of the raw public key

Names and versions are checked against :data:`NAME_PATTERN` before they become paths.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from edgefleet.files import write_private

#: Model names and versions: what may become one path component.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
PUBLIC_KEY_FILE = "signing-key.pub"


class ManifestSignatureError(ValueError):
    """A manifest whose signature is missing, malformed or not by the pinned key."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a safe model name or version, else ValueError naming ``kind``."""
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{kind} {value[:80]!r} is not allowed: use 1-128 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return value


def check_sha256(value: str) -> str:
    if not SHA256_PATTERN.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a lowercase hex sha256")
    return value


class ManifestSigner:
    """The coordinator's signing key, kept in one 0600 PEM file."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    @classmethod
    def load_or_create(cls, path: Path) -> ManifestSigner:
        if path.exists():
            key = load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ManifestSignatureError(f"{path} does not hold an ed25519 private key")
            return cls(key)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        write_private(path, pem.decode("ascii"))
        return cls(key)

    @property
    def public_key(self) -> bytes:
        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def sign(self, manifest: bytes) -> bytes:
        return self._key.sign(manifest)

    def derive_secret(self, label: bytes) -> bytes:
        """A secret of its own for ``label`` (HMAC-SHA256 keyed by the private key):
        whoever holds this key (every coordinator of a fleet) derives the same one, and
        nothing derived reveals the key or signs anything."""
        raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return hmac.new(raw, b"edgefleet derived secret\0" + label, hashlib.sha256).digest()


def verify_manifest(public_key: bytes, manifest: bytes, signature: bytes) -> None:
    """Raise :class:`ManifestSignatureError` unless ``signature`` is ``public_key``'s
    signature of exactly ``manifest``."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ManifestSignatureError("no valid model-signing public key is configured")
    if len(signature) != SIGNATURE_BYTES:
        raise ManifestSignatureError("the manifest has no valid signature")
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, manifest)
    except InvalidSignature as exc:
        raise ManifestSignatureError(
            "the manifest's signature does not verify with the pinned model-signing key"
        ) from exc


def encode_public_key(public_key: bytes) -> str:
    return base64.b64encode(public_key).decode("ascii")


def decode_public_key(text: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError as exc:
        raise ManifestSignatureError("a model-signing public key must be base64") from exc
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ManifestSignatureError(
            f"a model-signing public key is {PUBLIC_KEY_BYTES} bytes; got {len(raw)}"
        )
    return raw


def blob_path(root: Path, sha256: str) -> Path:
    return root / "blobs" / "sha256" / check_sha256(sha256)


def manifest_dir(root: Path, name: str, version: str) -> Path:
    return root / "manifests" / check_name("model name", name) / check_name("version", version)
