"""Manifest signatures: only the pinned key's signature of the exact bytes verifies."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from edgefleet.model_signing import (
    ManifestSignatureError,
    ManifestSigner,
    blob_path,
    check_name,
    decode_public_key,
    encode_public_key,
    manifest_dir,
    verify_manifest,
)

MANIFEST = b'{"name": "m", "version": "v1", "files": []}'


def test_a_signature_verifies_only_for_its_bytes_and_its_key(tmp_path: Path) -> None:
    signer = ManifestSigner.load_or_create(tmp_path / "signing.pem")
    signature = signer.sign(MANIFEST)
    verify_manifest(signer.public_key, MANIFEST, signature)
    with pytest.raises(ManifestSignatureError, match="does not verify"):
        verify_manifest(signer.public_key, MANIFEST.replace(b"v1", b"v2"), signature)
    other = ManifestSigner.load_or_create(tmp_path / "other.pem")
    with pytest.raises(ManifestSignatureError, match="does not verify"):
        verify_manifest(other.public_key, MANIFEST, signature)
    with pytest.raises(ManifestSignatureError, match="no valid signature"):
        verify_manifest(signer.public_key, MANIFEST, b"")
    with pytest.raises(ManifestSignatureError, match="public key"):
        verify_manifest(b"", MANIFEST, signature)


def test_the_key_file_is_private_and_reloads_as_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "signing.pem"
    first = ManifestSigner.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ManifestSigner.load_or_create(path).public_key == first.public_key
    assert decode_public_key(encode_public_key(first.public_key)) == first.public_key
    with pytest.raises(ManifestSignatureError, match="32 bytes"):
        decode_public_key(encode_public_key(b"short"))


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x" * 129, "n\x00"])
def test_names_that_could_escape_the_store_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        check_name("model name", bad)
    with pytest.raises(ValueError):
        manifest_dir(Path("/store"), bad, "v1")


def test_blob_paths_take_only_a_lowercase_sha256() -> None:
    good = "ab" * 32
    assert blob_path(Path("/s"), good) == Path("/s/blobs/sha256") / good
    for bad in ("AB" * 32, "ab" * 31, "../" + "a" * 61):
        with pytest.raises(ValueError, match="sha256"):
            blob_path(Path("/s"), bad)
