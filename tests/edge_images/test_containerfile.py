"""edge_images/Containerfile is kept equivalent to the scripted buildah build: both built
(by buildah, from the same root filesystem archive, wheelhouse and model set), then what
they install is compared: Debian's packages (``dpkg -l``), the venv's distributions
(``pip freeze``), the model files and the image config a runtime reads."""

from __future__ import annotations

import subprocess
from pathlib import Path

from edge_images.images import (
    ImageBuild,
    build_containerfile,
    inspect_config,
    mount_image,
    unmount,
)


def _installed(ref: str) -> dict[str, str]:
    ctr, root = mount_image(ref)
    try:
        dpkg = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
             "-f=${Package} ${Version} ${Architecture}\\n"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        site = next((root / "opt/edgefleet/venv/lib").glob("python3*/site-packages"))
        freeze = sorted(p.name.removesuffix(".dist-info") for p in site.glob("*.dist-info"))
        models = sorted(
            str(p.relative_to(root)) + f" {p.stat().st_size}"
            for p in (root / "opt/edgefleet/models").rglob("*")
            if p.is_file()
        )
        return {"dpkg": dpkg, "pip": "\n".join(freeze), "models": "\n".join(models)}
    finally:
        unmount(ctr)


def test_containerfile_installs_what_the_scripted_build_installs(
    agent_image: ImageBuild, real_artifacts: Path
) -> None:
    ref, _ = build_containerfile(models=real_artifacts)
    scripted, containerfile = _installed(agent_image.ref), _installed(ref)
    assert scripted["dpkg"].count("\n") > 50  # a real Debian system, not an empty list
    assert "python3.11 " in scripted["dpkg"]
    assert "edgefleet-0.1.0" in scripted["pip"] and "onnxruntime-" in scripted["pip"]
    for what in ("dpkg", "pip", "models"):
        assert scripted[what] == containerfile[what], f"{what} differs"
    a, b = inspect_config(agent_image.ref), inspect_config(ref)
    for field in ("User", "Entrypoint", "Volumes", "WorkingDir", "ExposedPorts",
                  "Healthcheck", "StopSignal"):  # fmt: skip
        assert a.get(field) == b.get(field), field
    assert sorted(a["Env"]) == sorted(b["Env"])  # type: ignore[call-overload]
    labels_a, labels_b = dict(a["Labels"]), dict(b["Labels"])  # type: ignore[call-overload]
    for label in ("org.opencontainers.image.version", "io.edgefleet.onnxruntime.version",
                  "io.edgefleet.models"):  # fmt: skip
        assert labels_a[label] == labels_b[label], label
    # each names the git revision that first built it (the Containerfile's image is
    # rebuilt when its recipe, dependencies, edgefleet's version or models change, not on
    # every source change: images.build_containerfile)
    for labels in (labels_a, labels_b):
        assert len(labels["org.opencontainers.image.revision"]) == 40
