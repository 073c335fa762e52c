"""Running the images with podman on this kind of machine (a CI box, no daemon).

:func:`podman_env` points podman at the builder's storage (vfs, in the cache directory)
and at a ``containers.conf`` with what this kernel needs: ``runc`` (crun refuses a hybrid
cgroup v1/v2 layout), the ``cgroupfs`` manager (no systemd here) and explicit file and
process limits (podman's default raises RLIMIT_NOFILE above what this sandbox allows). Podman
schedules healthchecks with systemd timers; without systemd it logs that it cannot, and
``podman healthcheck run NAME`` runs the image's probe on demand.
With that environment, the plain ``podman run ...`` of the site runbook
(docs/operators/runbook.md) works as is.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from edge_images.cache import cache_root

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def podman_env() -> dict[str, str]:
    """Environment for podman (and buildah) that uses the cached storage and the config
    above; the files are written to the cache directory."""
    root = cache_root()
    conf = root / "containers.conf"
    storage = root / "storage.conf"
    _write_if_changed(conf, CONTAINERS_CONF)
    _write_if_changed(
        storage,
        "[storage]\n"
        'driver = "vfs"\n'
        f'graphroot = "{root / "storage"}"\n'
        f'runroot = "{root / "run"}"\n',
    )
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)


def remove_container(env: dict[str, str], name: str, volume: str, stop_s: int = 10) -> None:
    """Remove a container (stopping it within ``stop_s``) and its state volume; either may
    already be gone."""
    subprocess.run(["podman", "rm", "-f", "-t", str(stop_s), name], env=env,
                   capture_output=True, check=False)  # fmt: skip
    subprocess.run(["podman", "volume", "rm", "-f", volume], env=env,
                   capture_output=True, check=False)  # fmt: skip
