"""The signed model set an image or the offline bundle carries.

``--models DIR`` is one of two things:

- a **signed set** that ``python -m coordinator models export --out DIR`` wrote (from the
  operator's own coordinator: its signing key is the one the fleet's agents pin). It is
  baked as it is, after every manifest is checked against the set's ``signing-key.pub``
  and every blob against its sha256 (a broken set fails the build, not the site);
- **artifact directories** (``models/artifacts``, the models build's output; ``--serve``
  names them). The build publishes them to a throwaway coordinator catalog (the
  coordinator's own code: :class:`coordinator.catalog.catalog.ModelCatalog` on a temporary
  database and blob store) and exports its signed set with the code ``models export``
  runs (:func:`coordinator.catalog.catalog.write_signed_set`). The signing key is
  ``--signing-key FILE`` (the operator's ed25519 PEM; made there, 0600, if the file does
  not exist) or, by default, one kept in the build cache (``model-set-signing.pem``): the
  same key for every build on this machine, so an unchanged model set signs to the same
  bytes and the image stays cached.

Either way the result is a directory in the :mod:`edgefleet.model_signing` layout, cached
under ``~/.cache/edgefleet/images/model-sets/<key>``, and its public key is what the agent
trusts (``models.trusted_keys_file``) besides the one it pins when it enrolls.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from edge_images.cache import cache_lock, cache_root, digest_files, keep_recent, key_of
from edge_images.errors import ImageBuildError
from edgefleet.model_signing import (
    MANIFEST_FILE,
    PUBLIC_KEY_FILE,
    SIGNATURE_FILE,
    ManifestSignatureError,
    ManifestSigner,
    blob_path,
    decode_public_key,
    encode_public_key,
    verify_manifest,
)

DEFAULT_KEY_FILE = "model-set-signing.pem"
KEEP_SETS = 4


def is_signed_set(path: Path) -> bool:
    return (path / PUBLIC_KEY_FILE).is_file() and (path / "manifests").is_dir()


def check_signed_set(root: Path) -> list[str]:
    """Every manifest of the set verifies with its ``signing-key.pub`` and every file the
    manifests list is in ``blobs/`` with its sha256; returns the ``name@version`` refs.
    ImageBuildError otherwise."""
    import json

    try:
        key = decode_public_key((root / PUBLIC_KEY_FILE).read_text("ascii"))
    except (OSError, ManifestSignatureError) as exc:
        raise ImageBuildError(f"model set {root}: {PUBLIC_KEY_FILE}: {exc}") from exc
    refs: list[str] = []
    checked: set[str] = set()
    for vdir in sorted((root / "manifests").glob("*/*")):
        ref = f"{vdir.parent.name}@{vdir.name}"
        try:
            manifest = (vdir / MANIFEST_FILE).read_bytes()
            verify_manifest(key, manifest, (vdir / SIGNATURE_FILE).read_bytes())
            files = json.loads(manifest)["files"]
        except (OSError, ValueError, KeyError, ManifestSignatureError) as exc:
            raise ImageBuildError(f"model set {root}: {ref}: {exc}") from exc
        for entry in files:
            sha = str(entry["sha256"])
            if sha in checked:
                continue
            try:
                got = _sha256(blob_path(root, sha))
            except (OSError, ValueError) as exc:
                raise ImageBuildError(f"model set {root}: {ref}: {entry['path']}: {exc}") from exc
            if got != sha:
                raise ImageBuildError(
                    f"model set {root}: {ref}: {entry['path']} is {got}, its manifest says {sha}"
                )
            checked.add(sha)
        refs.append(ref)
    if not refs:
        raise ImageBuildError(f"model set {root}: no versions under manifests/")
    return refs


def set_digest(root: Path) -> str:
    """The set's identity for cache keys: its manifests, signatures and key (each blob is
    named by its sha256, and the manifests list those)."""
    blobs = sorted(p.name for p in (root / "blobs" / "sha256").iterdir())
    return key_of(digest_files([root / "manifests", root / PUBLIC_KEY_FILE], root=root), blobs)


def model_refs(root: Path) -> list[str]:
    return [f"{v.parent.name}@{v.name}" for v in sorted((root / "manifests").glob("*/*"))]


def signed_model_set(
    models: Path, serve: tuple[str, ...], *, signing_key: Path | None = None
) -> Path:
    """The signed set to bake for ``--models`` (see the module docstring)."""
    if is_signed_set(models):
        check_signed_set(models)
        return models
    dirs = [models / name for name in serve]
    missing = [str(d) for d in dirs if not (d / MANIFEST_FILE).is_file()]
    if missing:
        raise ImageBuildError(
            f"model set: no manifest.json in {', '.join(missing)} (run `make models`, or "
            "pass --models DIR holding the artifact directories or a signed set from "
            "`coordinator models export`, or --models none)"
        )
    key_file = signing_key or cache_root() / DEFAULT_KEY_FILE
    with cache_lock("model-set"):
        try:
            signer = ManifestSigner.load_or_create(key_file)
        except (OSError, ValueError, TypeError, ManifestSignatureError) as exc:
            raise ImageBuildError(f"model-signing key {key_file}: {exc}") from exc
        public = encode_public_key(signer.public_key)
        # the manifests list every file's sha256 (publish checks the files against them)
        manifests = [d / MANIFEST_FILE for d in dirs]
        key = key_of("model-set", digest_files(manifests, root=models), public, "v1")
        out = cache_root() / "model-sets" / key
        if not (out / PUBLIC_KEY_FILE).is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            _publish_and_export(dirs, signer, partial)
            os.replace(partial, out)
        keep_recent(out, "*", KEEP_SETS)  # the KEEP_SETS most recently used stay
        return out


def _publish_and_export(dirs: list[Path], signer: ManifestSigner, out: Path) -> None:
    """A throwaway coordinator catalog: publish each directory, export the signed set."""
    from coordinator.catalog.catalog import BlobStore, ModelCatalog, write_signed_set
    from coordinator.errors import ModelCatalogError
    from coordinator.store.catalog import CatalogVersion
    from coordinator.store.interface import FleetStore
    from coordinator.store.offline import run_offline

    with tempfile.TemporaryDirectory(prefix="model-set-", dir=cache_root()) as tmp:
        data = Path(tmp)
        blobs = BlobStore(data / "models")

        async def publish(store: FleetStore) -> list[CatalogVersion]:
            catalog = ModelCatalog(store, blobs, signer)
            return [(await catalog.publish_directory(d)).version for d in dirs]

        def fetch(sha256: str, destination: Path) -> None:
            try:
                os.link(blobs.path(sha256), destination)
            except OSError:
                shutil.copyfile(blobs.path(sha256), destination)

        try:
            versions = run_offline(data, publish)
            write_signed_set(out, versions, signer.public_key, fetch)
        except ModelCatalogError as exc:
            raise ImageBuildError(f"model set: {exc}") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
