"""A local wheelhouse for the images and the offline bundle: exactly the distributions the
development virtual environment has installed for edgefleet's run-time dependencies (the
*lock*), plus edgefleet's own wheel. Installing from it needs no package index
(``pip install --no-index --find-links``)."""

from __future__ import annotations

import importlib.metadata as md
import logging
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

from edge_images.arch import (
    DEBIAN_PYTHON,
    DEFAULT_ARCH,
    key_parts,
    marker_environment,
    name_suffix,
    pip_platform_args,
)
from edge_images.cache import (
    Timer,
    cache_lock,
    cache_root,
    digest_files,
    keep_recent,
    key_of,
    publish,
    run,
)
from edge_images.errors import ImageBuildError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
KEEP_WHEELS = 4  # edgefleet's own wheel and the wheelhouse: a new key with every commit
PROJECT = "edgefleet"


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_ok(
    marker: Marker | None, extras: frozenset[str], env: dict[str, str] | None = None
) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**(env or {}), "extra": e}) for e in (extras or frozenset({""})))


def runtime_lock(
    extras: tuple[str, ...] = (),
    replace: dict[str, str] | None = None,
    arch: str = DEFAULT_ARCH,
) -> list[str]:
    """``name==version`` for edgefleet's run-time closure (with ``extras``) as installed in
    this interpreter's environment, sorted. ``replace`` swaps a requirement for another
    distribution given as ``name==version`` (the CUDA image: onnxruntime -> onnxruntime-gpu),
    whose own dependencies are then not walked (it is not installed here). Markers are
    evaluated for ``arch``'s machine (the versions are this environment's: one lock)."""
    env = marker_environment(arch)
    replace = {_canon(k): v for k, v in (replace or {}).items()}
    seen: dict[str, str] = {}
    pinned_extra: list[str] = []
    todo: list[tuple[str, frozenset[str]]] = [(PROJECT, frozenset(extras))]
    while todo:
        name, want = todo.pop()
        for raw in md.requires(name) or []:
            req = Requirement(raw)
            if not _marker_ok(req.marker, want, env):
                continue
            canon = _canon(req.name)
            if canon in replace:
                pinned_extra.append(replace[canon])
                continue
            if canon in seen or canon == PROJECT:
                continue
            try:
                version = md.version(req.name)
            except md.PackageNotFoundError as exc:
                raise ImageBuildError(
                    f"wheelhouse: {req.name} (required by {name}) is not installed here"
                ) from exc
            if version not in req.specifier:
                raise ImageBuildError(
                    f"wheelhouse: installed {req.name} {version} does not satisfy {raw}"
                )
            seen[canon] = version
            todo.append((req.name, frozenset(req.extras)))
    lock = [f"{n}=={v}" for n, v in seen.items()] + pinned_extra
    return sorted(set(lock), key=str.lower)


@dataclass(frozen=True)
class Wheelhouse:
    path: Path  # third-party wheels (cached by lock) plus edgefleet's wheel
    lock: list[str]
    key: str
    built_s: float | None  # None: third-party wheels reused from the cache


# Folders the wheel's build copy leaves out (``shutil.ignore_patterns``), and so the digest:
# models/artifacts holds the built models and a build report rewritten by every build, which
# re-keyed the wheel, the wheelhouse and every image in each new clone.
_NOT_IN_WHEEL = ("__pycache__", "artifacts")


def project_digest() -> str:
    """What edgefleet's wheel is built from (the packages the wheel includes)."""
    parts = [REPO / "pyproject.toml"]
    parts += [REPO / p for p in ("agent", "coordinator", "models", "edgefleet", "edgefleet_client")]
    files = [p for p in parts if p.exists()]
    return digest_files(
        [f for f in _py_files(files)],
        root=REPO,
    )


def _py_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += [
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part in _NOT_IN_WHEEL for part in f.relative_to(p).parts)
            ]
        else:
            out.append(p)
    return out


def wheelhouse_key(lock: list[str], arch: str = DEFAULT_ARCH) -> str:
    """The third-party wheels' key: the lock, the Python and the platform they are for."""
    if arch == DEFAULT_ARCH:  # the key from before architectures (see edge_images.arch)
        return key_of("wheelhouse", lock, sys.version_info[:2], "manylinux_x86_64", "v1")
    return key_of("wheelhouse", lock, DEBIAN_PYTHON, pip_platform_args(arch), "v1",
                  *key_parts(arch))  # fmt: skip


def pip_download_args(dest: Path, arch: str = DEFAULT_ARCH, deps: bool = False) -> list[str]:
    """The ``pip download`` command for the lock file ``dest/lock.txt`` on ``arch``."""
    return [sys.executable, "-m", "pip", "download", "--quiet",
            *([] if deps else ["--no-deps"]), "--only-binary=:all:",
            *pip_platform_args(arch), "-d", str(dest), "-r", str(dest / "lock.txt")]  # fmt: skip


def build_wheelhouse(
    extras: tuple[str, ...] = (),
    replace: dict[str, str] | None = None,
    arch: str = DEFAULT_ARCH,
) -> Wheelhouse:
    """Download the lock's wheels for ``arch`` (cached under the lock's key), then add
    edgefleet's wheel (cached under the source digest; pure Python, one for every arch).
    ``pip download`` reads this machine's configured indexes; what it fetched is then all an
    install needs."""
    with cache_lock("wheelhouse"):
        return _build_wheelhouse(extras, replace, arch)


def _build_wheelhouse(
    extras: tuple[str, ...], replace: dict[str, str] | None, arch: str
) -> Wheelhouse:
    lock = runtime_lock(extras, replace, arch)
    key = wheelhouse_key(lock, arch)
    third = cache_root() / f"wheels{name_suffix(arch)}-{key}"
    built_s: float | None = None
    if not third.exists():
        timer = Timer()
        tmp = third.with_name(third.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / "lock.txt").write_text("\n".join(lock) + "\n")
        # With a replacement (the CUDA image's onnxruntime-gpu[cuda,cudnn]) its own
        # dependencies (NVIDIA's wheels) are resolved too, the rest held to the lock.
        run(
            f"wheelhouse (pip download, {arch})",
            pip_download_args(tmp, arch, deps=bool(replace)),
            timeout_s=3600,
        )
        # pip, setuptools for an offline `python3 -m venv` upgrade are not needed: the
        # venv's bundled pip installs wheels with --no-index.
        publish(tmp, third)
        built_s = timer.s
        log.info("wheelhouse: %d wheels in %.1f s", len(lock), built_s)
    digest = project_digest()
    own = cache_root() / f"edgefleet-wheel-{digest}"
    if not own.exists():
        tmp = own.with_name(own.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        build = cache_root() / f"edgefleet-build-{digest}"
        shutil.rmtree(build, ignore_errors=True)
        # Built from a copy of the sources so no build/ or egg-info lands in the clone.
        build.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, build / name)
        for pkg in ("agent", "coordinator", "models", "edgefleet", "edgefleet_client"):
            shutil.copytree(REPO / pkg, build / pkg, ignore=shutil.ignore_patterns(*_NOT_IN_WHEEL))
        run(
            "wheelhouse (edgefleet wheel)",
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--no-build-isolation", "-w", str(tmp), str(build)],
            timeout_s=600,
        )  # fmt: skip
        shutil.rmtree(build, ignore_errors=True)
        publish(tmp, own)
    # one key per commit: only the KEEP_WHEELS most recently used stay
    keep_recent(own, "edgefleet-wheel-" + "[0-9a-f]" * 16, KEEP_WHEELS)
    house = cache_root() / f"wheelhouse{name_suffix(arch)}-{key}-{digest}"
    if not house.exists():
        tmp = house.with_name(house.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for src in [*third.iterdir(), *own.iterdir()]:
            _link_or_copy(src, tmp / src.name)
        publish(tmp, house)
    hexes = "[0-9a-f]" * 16
    keep_recent(house, f"wheelhouse{name_suffix(arch)}-{hexes}-{hexes}", KEEP_WHEELS)
    return Wheelhouse(house, lock, key_of(key, digest), built_s)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copy2(src, dst)
