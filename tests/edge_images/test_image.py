"""The CPU agent image as built: its config (user, entrypoint, state volume, healthcheck,
labels), its size, its signed model set, and its exported archives (OCI layout and
Docker's)."""

from __future__ import annotations

import importlib.metadata as md
import json
import tarfile
import tomllib

from edge_images.images import (
    MODELS_IN_IMAGE,
    STATE,
    UID,
    VENV,
    ImageBuild,
    git_revision,
    inspect_config,
    mount_image,
    unmount,
)
from edge_images.model_set import check_signed_set


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
    # the signed set's versions (name@version), as `coordinator models export` wrote them
    baked = labels["io.edgefleet.models"].split(",")  # type: ignore[index]
    assert sorted(r.split("@")[0] for r in baked) == ["all-minilm-l6-v2", "smollm2-135m-instruct"]
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


def test_agent_image_carries_a_signed_model_set(agent_image: ImageBuild) -> None:
    """The baked set verifies (every manifest with its key, every blob with its sha256), is
    the config's seed and trusted key, and is read-only to the agent's user."""
    ctr, root = mount_image(agent_image.ref)
    try:
        baked = root / MODELS_IN_IMAGE.lstrip("/")
        refs = check_signed_set(baked)
        assert refs == agent_image.labels["io.edgefleet.models"].split(",")
        config = tomllib.loads((root / "etc/edgefleet/agent.toml").read_text())["models"]
        assert config["source"] == "store" and config["seed_dir"] == MODELS_IN_IMAGE
        assert config["trusted_keys_file"] == f"{MODELS_IN_IMAGE}/signing-key.pub"
        for path in [baked, *baked.rglob("*")]:
            st = path.stat()
            assert st.st_uid == 0 and not st.st_mode & 0o022, path  # root's, not writable
            assert st.st_mode & 0o004, path  # readable by the agent's user
    finally:
        unmount(ctr)
