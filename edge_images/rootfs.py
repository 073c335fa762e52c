"""The images' root filesystem: Debian bookworm from Debian's own packages (``mmdebstrap``),
as a tarball cached under a key of its package list."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from edge_images.arch import DEFAULT_ARCH, check_emulation, key_parts, name_suffix
from edge_images.cache import Timer, cache_lock, cache_root, key_of, publish, run

log = logging.getLogger(__name__)

SUITE = "bookworm"
VARIANT = "apt"  # Essential packages plus apt and dpkg (so `dpkg -l` works in the image)
# What the agent and the coordinator need from Debian: Python 3.11 with venv (pip comes
# from the wheelhouse's ensurepip bundled in python3-venv), CA certificates, passwd
# (useradd for the non-root user). Everything else comes from the wheelhouse.
PACKAGES: tuple[str, ...] = ("python3", "python3-venv", "ca-certificates", "passwd")


@dataclass(frozen=True)
class RootFs:
    tarball: Path
    key: str
    built_s: float | None  # None: reused from the cache


def rootfs_key(packages: tuple[str, ...] = PACKAGES, arch: str = DEFAULT_ARCH) -> str:
    return key_of("rootfs", SUITE, VARIANT, sorted(packages), "v1", *key_parts(arch))


def rootfs_path(packages: tuple[str, ...] = PACKAGES, arch: str = DEFAULT_ARCH) -> Path:
    """Where the tarball for ``packages`` on ``arch`` is cached."""
    key = rootfs_key(packages, arch)
    return cache_root() / f"rootfs-{SUITE}{name_suffix(arch)}-{key}.tar"


def build_rootfs(packages: tuple[str, ...] = PACKAGES, arch: str = DEFAULT_ARCH) -> RootFs:
    """The cached tarball for ``packages`` on ``arch``, made with mmdebstrap on first use
    (a foreign ``arch`` runs its maintainer scripts under qemu-user emulation)."""
    with cache_lock("rootfs"):
        return _build_rootfs(packages, arch)


def _build_rootfs(packages: tuple[str, ...], arch: str) -> RootFs:
    key = rootfs_key(packages, arch)
    final = rootfs_path(packages, arch)
    if final.exists():
        return RootFs(final, key, None)
    check_emulation(arch)
    timer = Timer()
    tmp = final.with_suffix(".tar.partial")
    log.info("rootfs: mmdebstrap %s %s (%s) -> %s", SUITE, arch, ",".join(packages), final)
    run(
        "rootfs (mmdebstrap)",
        [
            "mmdebstrap",
            f"--architectures={arch}",
            f"--variant={VARIANT}",
            "--include=" + ",".join(packages),
            # no docs, man pages or apt lists in the image
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*.bin",
            "--format=tar",
            SUITE,
            str(tmp),
        ],
        timeout_s=1200,
    )
    publish(tmp, final)
    log.info("rootfs: built in %.1f s", timer.s)
    return RootFs(final, key, timer.s)
