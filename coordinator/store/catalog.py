"""Published model versions as stored (tables ``model_versions`` and ``model_files``): the
signed manifests and the files each lists. The blobs themselves are files under the data
directory (coordinator/catalog/catalog.py), not rows. Table ``model_holders``: which
coordinators sharing the database hold every blob of a version (coordinator/catalog/
replication.py writes it; a row goes with its version)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """One published model version."""

    name: str
    version: str
    # "text-generation" or "feature-extraction" (from the manifest).
    task: str
    # The signed manifest bytes and their ed25519 signature.
    manifest: bytes = field(repr=False)
    signature: bytes = field(repr=False)
    # Hex sha256 of ``manifest``: the version's identity on the wire (ModelTarget.sha256).
    sha256: str
    # The files' total size.
    size_bytes: int
    # The build's accuracy gate passed (or the build recorded none).
    gate_passed: bool
    deprecated: bool
    published_at: datetime

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def files(self) -> list[dict[str, Any]]:
        """The manifest's file entries (path, sha256, size)."""
        entries: list[dict[str, Any]] = json.loads(self.manifest)["files"]
        return entries

    def json(self, *, with_manifest: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "object": "model_version",
            "name": self.name,
            "version": self.version,
            "ref": self.ref,
            "task": self.task,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "gate_passed": self.gate_passed,
            "deprecated": self.deprecated,
            "published_at": self.published_at.astimezone(UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
        }
        if with_manifest:
            data["files"] = self.files()
            data["manifest_b64"] = base64.b64encode(self.manifest).decode("ascii")
            data["signature_b64"] = base64.b64encode(self.signature).decode("ascii")
        return data


class CatalogTable(Protocol):
    async def add_model_version(self, version: CatalogVersion) -> None:
        """Store a version and the files its manifest lists, in one transaction."""
        ...

    async def list_model_versions(self) -> list[CatalogVersion]:
        """Every version, by name, then oldest first."""
        ...

    async def set_model_deprecated(self, name: str, version: str, deprecated: bool) -> bool:
        """False when there is no such version."""
        ...

    async def delete_model_version(self, name: str, version: str) -> list[str]:
        """Remove a version, its file rows and its holder rows; the sha256 of each file no
        other version lists any more (its blob can go)."""
        ...

    async def set_model_holder(
        self, name: str, version: str, coordinator_id: str, holds: bool
    ) -> bool:
        """Record that ``coordinator_id`` holds every blob of the version (``holds``), or
        no longer does. False (nothing recorded) when there is no such version: a holder
        row never outlives its version."""
        ...

    async def list_model_holders(self) -> dict[tuple[str, str], list[str]]:
        """(name, version) -> the coordinators recorded as holding it, sorted."""
        ...
