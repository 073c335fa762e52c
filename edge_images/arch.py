"""The images' CPU architectures: Debian's name for each, and what the build tools are told.

``amd64`` is the default and builds natively. ``arm64`` is built on an x86-64 machine with
Debian's qemu-user emulation (``qemu-user-static``, registered with binfmt_misc): mmdebstrap
runs the arm64 packages' maintainer scripts emulated, ``pip download`` fetches the aarch64
wheels for Debian 12's Python 3.11, and buildah runs the image's RUN steps emulated.

amd64's cache keys are the ones from before there was a choice of architecture (its cached
root filesystem, wheelhouse and images stay valid); every other architecture adds its name
to each key, so no cached build of one is ever taken for the other.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from edge_images.errors import ImageBuildError


@dataclass(frozen=True)
class Arch:
    debian: str  # dpkg's and the OCI config's name (amd64, arm64)
    machine: str  # uname -m, the wheels' platform tags, packaging markers (x86_64, aarch64)


ARCHES: dict[str, Arch] = {
    "amd64": Arch("amd64", "x86_64"),
    "arm64": Arch("arm64", "aarch64"),
}
DEFAULT_ARCH = "amd64"
# Debian 12's python3: the images' interpreter, for which cross-downloaded wheels are picked
DEBIAN_PYTHON = "3.11"
# manylinux wheels a glibc 2.36 system (bookworm) can load: manylinux_2_17 (= 2014) up to
# manylinux_2_36. Listed one by one: with --platform, pip takes exactly the tags it is given
# (llguidance 1.9.1 ships manylinux_2_31 only).
GLIBC_MINORS = range(17, 37)


def arch_of(name: str) -> Arch:
    """The architecture called ``name``; a clear error for any other name."""
    if not isinstance(name, str) or name not in ARCHES:
        raise ImageBuildError(
            f"unknown architecture {name!r}: one of {', '.join(ARCHES)} (Debian's names)"
        )
    return ARCHES[name]


def key_parts(name: str) -> tuple[str, ...]:
    """What ``name`` adds to a cache key: nothing for amd64 (see the module docstring)."""
    arch_of(name)
    return () if name == DEFAULT_ARCH else ("arch", name)


def name_suffix(name: str) -> str:
    """What ``name`` adds to image, tarball and archive names ("" for amd64)."""
    arch_of(name)
    return "" if name == DEFAULT_ARCH else f"-{name}"


def is_native(name: str) -> bool:
    return arch_of(name).machine == platform.machine()


def pip_platform_args(name: str) -> list[str]:
    """``pip download`` arguments for the wheels of ``name``: none when native (pip picks
    for the running interpreter, as before), else the manylinux tags, Python version,
    implementation and ABIs of Debian 12's Python on that architecture."""
    arch = arch_of(name)
    if is_native(name):
        return []
    args: list[str] = ["--platform", f"manylinux2014_{arch.machine}"]
    for minor in GLIBC_MINORS:
        args += ["--platform", f"manylinux_2_{minor}_{arch.machine}"]
    args += ["--python-version", DEBIAN_PYTHON, "--implementation", "cp"]
    abi = "cp" + DEBIAN_PYTHON.replace(".", "")
    for a in (abi, "abi3", "none"):
        args += ["--abi", a]
    return args


def marker_environment(name: str) -> dict[str, str]:
    """Overrides for evaluating requirement markers for ``name`` (a dependency marked
    ``platform_machine == "x86_64"`` is not one of arm64's)."""
    arch = arch_of(name)
    return {"platform_machine": arch.machine}


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def check_emulation(name: str) -> None:
    """For a foreign ``name``: qemu-user must be registered with binfmt_misc (else every
    emulated step fails with 'Exec format error' deep inside a tool)."""
    arch = arch_of(name)
    if is_native(name):
        return
    entry = BINFMT / f"qemu-{arch.machine}"
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        raise ImageBuildError(
            f"{name} images need qemu-user emulation: {entry} is not registered and enabled "
            f"(`sh devtools/system_deps.sh {name}` installs qemu-user-static and "
            "binfmt-support, which register it; binfmt_misc must be mounted)"
        )
