"""Signed model versions and a blob origin for model-sync tests.

:func:`signed_version` turns a built artifact directory into what the coordinator sends
(a ModelTarget: manifest bytes, ed25519 signature, sha256), optionally as another version
(the manifest's ``version`` rewritten, and optionally one file changed, as a new build
would). :class:`BlobOrigin` is a small real HTTP server for ``/sha256/{hex}`` with
``Range``, ``If-Range`` and strong ETags (what the coordinator's blob server speaks),
which counts the bytes it sends and can be told to serve wrong bytes or to be slow.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from edgefleet.contract import ModelsSection, ModelTarget, Residency
from edgefleet.model_signing import ManifestSigner

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class SignedVersion:
    name: str
    version: str
    manifest: bytes
    signature: bytes
    files: dict[str, Path]  # sha256 -> where its bytes are
    sizes: dict[str, int]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.manifest).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def target(
        self,
        artifact_url: str,
        peers: tuple[str, ...] = (),
        signature: bytes | None = None,
        residency: Residency = Residency.ON_DEMAND,
    ) -> ModelTarget:
        return ModelTarget(
            name=self.name,
            version=self.version,
            artifact_url=artifact_url,
            sha256=self.sha256,
            manifest=self.manifest,
            signature=self.signature if signature is None else signature,
            peer_urls=peers,
            residency=residency,
        )

    def section(self, generation: int, artifact_url: str, **kwargs: object) -> ModelsSection:
        return ModelsSection(generation, (self.target(artifact_url, **kwargs),))  # type: ignore[arg-type]


def signed_version(
    artifact: Path,
    signer: ManifestSigner,
    *,
    version: str | None = None,
    changed_file: tuple[str, Path] | None = None,
) -> SignedVersion:
    """``artifact`` as a signed version; ``version`` rewrites its version; ``changed_file``
    (path in the artifact, a scratch dir) writes a changed copy of that file there."""
    data = json.loads((artifact / "manifest.json").read_text())
    files = {e["sha256"]: artifact / e["path"] for e in data["files"]}
    if changed_file is not None:
        rel, scratch = changed_file
        scratch.mkdir(parents=True, exist_ok=True)
        new = scratch / f"{version}-{Path(rel).name}"
        shutil.copyfile(artifact / rel, new)
        with open(new, "ab") as fh:
            fh.write(f"\n{version}\n".encode())
        raw = new.read_bytes()
        for entry in data["files"]:
            if entry["path"] == rel:
                files.pop(entry["sha256"], None)
                entry["sha256"] = hashlib.sha256(raw).hexdigest()
                entry["size"] = len(raw)
                files[entry["sha256"]] = new
    if version is not None:
        data["version"] = version
    manifest = json.dumps(data, indent=2).encode()
    sizes = {e["sha256"]: e["size"] for e in data["files"]}
    return SignedVersion(
        data["name"], data["version"], manifest, signer.sign(manifest), files, sizes
    )


@dataclass
class BlobOrigin:
    """An HTTP blob server: ``{url}/sha256/{hex}`` for the blobs it was given."""

    blobs: dict[str, Path] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)  # serve these with a flipped byte
    bytes_sent: int = 0
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (hex, Range)
    chunk_delay_s: float = 0.0
    url: str = ""
    _runner: web.AppRunner | None = None

    def add(self, version: SignedVersion) -> None:
        self.blobs.update(version.files)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        import asyncio

        hex_ = request.match_info["hex"]
        self.requests.append((hex_, request.headers.get("Range")))
        path = self.blobs.get(hex_)
        if path is None:
            return web.json_response({"error": {"message": "no such blob"}}, status=404)
        data = path.read_bytes()
        if hex_ in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        etag = f'"{hex_}"'
        start, status = 0, 200
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        wanted = request.headers.get("Range")
        if wanted and request.headers.get("If-Range", etag) == etag:
            match = _RANGE.match(wanted)
            if match is None or int(match.group(1)) >= len(data):
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            start, status = int(match.group(1)), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(data) - start
        await response.prepare(request)
        view = memoryview(data)[start:]
        step = 1 << 18
        for offset in range(0, len(view), step):
            chunk = view[offset : offset + step]
            await response.write(bytes(chunk))
            self.bytes_sent += len(chunk)
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        await response.write_eof()
        return response

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/blobs/sha256/{hex}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1/blobs"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
