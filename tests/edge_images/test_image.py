"""The CPU agent image as built: its config (user, entrypoint, state volume, healthcheck,
labels), its size, and its exported archives (OCI layout and Docker's)."""

from __future__ import annotations

import importlib.metadata as md
import json
import tarfile

from edge_images.images import STATE, UID, VENV, ImageBuild, git_revision, inspect_config


def test_agent_image_config(agent_image: ImageBuild) -> None:
    config = inspect_config(agent_image.ref)
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == [f"{VENV}/bin/edgefleet-agent"]
    assert config["Volumes"] == {STATE: {}}
    env = dict(e.split("=", 1) for e in config["Env"])  # type: ignore[attr-defined]
    assert env["EDGEFLEET_AGENT_CONFIG"] == "/etc/edgefleet/agent.toml"
    health = config["Healthcheck"]
    assert health["Test"][0] == "CMD" and "healthcheck" in health["Test"][-1]  # type: ignore[index]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == md.version("edgefleet")  # type: ignore[index]
    assert labels["io.edgefleet.onnxruntime.version"] == md.version("onnxruntime")  # type: ignore[index]
    assert labels["io.edgefleet.models"] == "smollm2-135m-instruct,all-minilm-l6-v2"  # type: ignore[index]
    revision = labels["org.opencontainers.image.revision"]  # type: ignore[index]
    assert len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)
    # the label names a revision of this repository (the one that first built this content)
    assert revision == agent_image.labels["org.opencontainers.image.revision"]
    assert git_revision()
    # rootfs + venv + two models: hundreds of MB, not GB
    assert 300e6 < agent_image.size_bytes < 1.5e9


def test_archives_are_loadable_layouts(agent_image: ImageBuild) -> None:
    with tarfile.open(agent_image.oci_archive) as oci:
        names = set(oci.getnames())
        assert {"oci-layout", "index.json"} <= names
        index = json.load(oci.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    with tarfile.open(agent_image.docker_archive) as docker:
        manifest = json.load(docker.extractfile("manifest.json"))  # type: ignore[arg-type]
        tags = manifest[0]["RepoTags"]
        assert tags and all(t.endswith(f"/edgefleet-agent-cpu:{agent_image.key}") for t in tags)
        config = json.load(docker.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        assert config["config"]["Healthcheck"]["Test"][0] == "CMD"
        assert config["config"]["User"] == f"{UID}:{UID}"
