"""Fixtures for the image tests: the images, built once (and cached across runs under
~/.cache/edgefleet/images), and podman's environment for this machine."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_images.cache import cache_lock
from edge_images.images import ImageBuild, build_image
from edge_images.podman import podman_env

TOOLS = ("buildah", "mmdebstrap", "podman", "runc", "unshare", "ip", "curl")


@pytest.fixture(scope="session", autouse=True)
def _tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run devtools/system_deps.sh (CI does)")


@pytest.fixture(scope="session")
def agent_image(real_artifacts: Path) -> ImageBuild:
    """The CPU agent image with the real models baked in, and its archives."""
    return build_image("agent-cpu", models=real_artifacts)


@pytest.fixture(scope="session")
def empty_agent_image() -> ImageBuild:
    """The CPU agent image built with ``--models none`` (it syncs its models)."""
    return build_image("agent-cpu", models=None, export=False)


@pytest.fixture(scope="session")
def coordinator_image() -> ImageBuild:
    return build_image("coordinator", export=False)


@pytest.fixture
def podman() -> Iterator[dict[str, str]]:
    """podman's environment (cached storage, runc, cgroupfs), held under the cache's
    ``containers`` lock: the tests use fixed container and volume names."""
    with cache_lock("containers"):
        yield {**os.environ, **podman_env()}
