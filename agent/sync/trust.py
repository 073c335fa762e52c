"""Which model-signing keys this agent trusts, and the check every manifest passes.

Keys, in order: the key pinned at enrollment (``EnrollResponse.model_signing_key``, saved
as ``model-signing-key.pub`` in the state dir), else the one the first Welcome named
(an agent that never enrolled pins it on first use, and keeps it: a later Welcome with
another key does not replace it), plus every key in ``models.trusted_keys`` (base64) and
in ``models.trusted_keys_file`` (for standalone and air-gapped agents; a signed set's
``signing-key.pub``). With no key at all, only ``models.allow_unsigned`` lets unsigned
manifests load; a signed manifest still has to verify with some trusted key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from agent.errors import ManifestTrustError
from edgefleet.files import write_private
from edgefleet.model_signing import (
    ManifestSignatureError,
    decode_public_key,
    encode_public_key,
    verify_manifest,
)

log = logging.getLogger(__name__)

PINNED_KEY_FILE = "model-signing-key.pub"


def pin_signing_key(state_dir: Path, key: bytes, *, replace: bool = True) -> bool:
    """Save ``key`` as this agent's pinned model-signing key (0600, atomic). With
    ``replace=False`` an existing pin is kept. Returns whether the file was written."""
    path = state_dir / PINNED_KEY_FILE
    if not key or (not replace and path.exists()):
        return False
    write_private(path, encode_public_key(key) + "\n")
    return True


class TrustedKeys:
    def __init__(
        self,
        state_dir: Path | None,
        configured: Sequence[str] = (),
        key_files: Sequence[Path] = (),
        *,
        allow_unsigned: bool = False,
    ) -> None:
        self._state_dir = state_dir
        self.allow_unsigned = allow_unsigned
        self._configured: list[bytes] = []
        try:
            self._configured = [decode_public_key(k) for k in configured]
            for path in key_files:
                self._configured.append(decode_public_key(path.read_text("ascii")))
        except (ManifestSignatureError, OSError) as exc:
            raise ManifestTrustError(f"models.trusted_keys: {exc}") from exc

    def pinned(self) -> bytes | None:
        if self._state_dir is None:
            return None
        try:
            return decode_public_key((self._state_dir / PINNED_KEY_FILE).read_text("ascii"))
        except FileNotFoundError:
            return None
        except (ManifestSignatureError, OSError) as exc:
            log.error("the pinned model-signing key is unreadable: %s", exc)
            return None

    def keys(self) -> list[bytes]:
        pinned = self.pinned()
        return ([pinned] if pinned else []) + self._configured

    def welcome_key(self, key: bytes) -> None:
        """The coordinator's key from Welcome: pinned when none is (trust on first use)."""
        if self._state_dir is None or not key:
            return
        if pin_signing_key(self._state_dir, key, replace=False):
            log.info("pinned the coordinator's model-signing key from Welcome")
        elif (pinned := self.pinned()) is not None and pinned != key:
            log.warning("the coordinator's model-signing key differs from the pinned one; "
                        "manifests signed with it will be refused")  # fmt: skip

    def check(self, manifest: bytes, signature: bytes) -> None:
        """Raise ManifestTrustError unless ``manifest`` may be loaded."""
        keys = self.keys()
        if not signature:
            if self.allow_unsigned:
                return
            raise ManifestTrustError(
                "the manifest is unsigned and models.allow_unsigned is off"
                if not keys
                else "the manifest is unsigned; this agent only loads signed manifests"
            )
        if not keys:
            raise ManifestTrustError(
                "the manifest is signed but no model-signing key is pinned or configured "
                "(models.trusted_keys)"
            )
        last: Exception | None = None
        for key in keys:
            try:
                verify_manifest(key, manifest, signature)
                return
            except ManifestSignatureError as exc:
                last = exc
        raise ManifestTrustError(str(last)) from last
