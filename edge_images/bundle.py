"""The offline bundle: one tarball for x86-64 Linux with CPython 3.11 (Debian 12's
python3): the wheelhouse, the signed model set (optional; :mod:`edge_images.model_set`),
the config, the systemd unit and ``install.sh``, which installs into a fresh virtual
environment with ``pip --no-index``."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from edge_images.cache import Timer, cache_lock, cache_root, digest_files, keep_recent, key_of
from edge_images.images import DEFAULT_MODELS, DEFAULT_SERVE, HERE, _models_input, copy_tree_linked
from edge_images.model_set import set_digest
from edge_images.wheelhouse import build_wheelhouse

BUNDLE_FILES = {  # name in the bundle: source in edge_images/
    "install.sh": "install.sh",
    "agent.toml": "agent.bundle.toml",
    "edgefleet-agent.service": "edgefleet-agent.service",
}
KEEP_BUNDLES = 3  # each is ~300 MB and every commit makes a new key


@dataclass(frozen=True)
class Bundle:
    path: Path  # edgefleet-bundle-<key>.tar (top directory edgefleet-bundle/)
    size_bytes: int
    built_s: float | None  # None: reused from the cache


def build_bundle(
    *,
    models: Path | None = DEFAULT_MODELS,
    serve: tuple[str, ...] = DEFAULT_SERVE,
    signing_key: Path | None = None,
) -> Bundle:
    """Build (or reuse) the bundle. Uncompressed: the ONNX weights, most of its size, do not
    compress, and an uncompressed tar extracts at disk speed on a small box."""
    with cache_lock("build-bundle"):
        return _build_bundle(models, serve, signing_key)


def _build_bundle(models: Path | None, serve: tuple[str, ...], signing_key: Path | None) -> Bundle:
    house = build_wheelhouse()
    model_set = _models_input(models, serve, signing_key)
    files = [HERE / src for src in BUNDLE_FILES.values()]
    key = key_of(
        "bundle", house.key,
        set_digest(model_set) if model_set else "no-models",
        digest_files(files, root=HERE), "v2",
    )  # fmt: skip
    final = cache_root() / f"edgefleet-bundle-{key}.tar"
    if final.exists():
        keep_recent(final, "edgefleet-bundle-" + "[0-9a-f]" * 16 + ".tar", KEEP_BUNDLES)
        return Bundle(final, final.stat().st_size, None)
    timer = Timer()
    stage = cache_root() / f"bundle-stage-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    top = stage / "edgefleet-bundle"
    try:
        top.mkdir(parents=True)
        copy_tree_linked(house.path, top / "wheelhouse")
        if model_set is not None:
            copy_tree_linked(model_set, top / "models")
        for name, src in BUNDLE_FILES.items():
            shutil.copy2(HERE / src, top / name)
        (top / "PYTHON_ABI").write_text(f"cp{sys.version_info.major}{sys.version_info.minor}\n")
        (top / "MACHINE").write_text(platform.machine() + "\n")
        tmp = final.with_name(final.name + ".partial")
        with tarfile.open(tmp, "w") as tar:
            tar.add(top, arcname="edgefleet-bundle")
        tmp.rename(final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    keep_recent(final, "edgefleet-bundle-" + "[0-9a-f]" * 16 + ".tar", KEEP_BUNDLES)
    return Bundle(final, final.stat().st_size, timer.s)
