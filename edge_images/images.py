"""OCI images built with ``buildah`` (vfs storage, chroot isolation: no daemon, no registry,
no privileges beyond what a CI user has), from the cached root filesystem and wheelhouse.

Two stages, each cached in buildah's storage under a tag that is the key of its inputs:

- ``edgefleet-base:<key>``: Debian's root filesystem, the non-root user ``edgefleet``
  (uid 10001) and a virtual environment with the third-party wheels of the lock
  (the slow step: it changes only when the package list or the lock does);
- ``edgefleet-<target>:<key>``: the base plus edgefleet's wheel, the config file, the
  health probe and, for the agent, the signed model set (the ``models`` build input, see
  :mod:`edge_images.model_set`) at ``/opt/edgefleet/models``, with the user, entrypoint,
  state volume, healthcheck and labels set. Committed in Docker format
  (the OCI image format has no HEALTHCHECK field), exported as both an OCI archive and a
  Docker archive.

``edge_images/Containerfile`` builds the same image for people with Docker or Podman;
:func:`build_containerfile` builds it with ``buildah bud`` from the same inputs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from edge_images.arch import DEFAULT_ARCH, arch_of, check_emulation, key_parts, name_suffix
from edge_images.cache import Timer, cache_lock, cache_root, digest_files, key_of, run
from edge_images.errors import ImageBuildError
from edge_images.model_set import model_refs, set_digest, signed_model_set
from edge_images.rootfs import RootFs, build_rootfs
from edge_images.wheelhouse import REPO, Wheelhouse, build_wheelhouse

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
UID = 10001
USER = "edgefleet"
STATE = "/var/lib/edgefleet"
VENV = "/opt/edgefleet/venv"
MODELS_IN_IMAGE = "/opt/edgefleet/models"
# The model set baked into the agent image: THE one build input for models. Either the
# built artifacts (models/artifacts; the build signs them through a throwaway catalog) or
# a signed set `python -m coordinator models export --out DIR` wrote (baked as it is).
# The agent's store reads it as its read-only seed (agent.image.toml).
DEFAULT_MODELS = REPO / "models" / "artifacts"
DEFAULT_SERVE = ("smollm2-135m-instruct", "all-minilm-l6-v2")
TARGETS = ("agent-cpu", "agent-cuda", "coordinator")


def storage_args() -> list[str]:
    """buildah's (and podman's) global flags: vfs storage in the cache directory, so
    images survive between CI runs and nothing touches the system's container storage."""
    root = cache_root()
    return [
        "--root", str(root / "storage"),
        "--runroot", str(root / "run"),
        "--storage-driver", "vfs",
    ]  # fmt: skip


def buildah(step: str, *args: str, timeout_s: float = 1800) -> str:
    return run(
        step,
        ["buildah", *storage_args(), *args],
        env={"BUILDAH_ISOLATION": "chroot"},
        timeout_s=timeout_s,
    ).strip()


def image_exists(ref: str) -> bool:
    done = subprocess.run(
        ["buildah", *storage_args(), "inspect", "--type", "image", ref],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def git_revision() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def project_version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


@dataclass
class ImageBuild:
    target: str
    ref: str  # localhost/edgefleet-<target>:<key> in the cache's buildah storage
    key: str
    oci_archive: Path
    docker_archive: Path
    size_bytes: int  # the image's uncompressed size (sum of its layers)
    steps_s: dict[str, float] = field(default_factory=dict)  # what was built, and how long
    labels: dict[str, str] = field(default_factory=dict)


def _models_input(
    models: Path | None, serve: tuple[str, ...], signing_key: Path | None = None
) -> Path | None:
    """The signed model set to bake (None: the image starts empty and syncs)."""
    if models is None:
        return None
    return signed_model_set(models, serve, signing_key=signing_key)


def _extras(target: str) -> tuple[str, ...]:
    """The coordinator's image holds the PostgreSQL driver (the ``postgres`` extra: psycopg
    with its own libpq, psycopg_pool), so it runs with ``store_url = "postgresql://..."``;
    its own wheelhouse and base (the agents' images do not carry it)."""
    return ("postgres",) if target == "coordinator" else ()


def _ort_package(target: str) -> dict[str, str] | None:
    if target == "agent-cuda":
        return {"onnxruntime": f"onnxruntime-gpu[cuda,cudnn]=={cuda_ort_version()}"}
    return None


# onnxruntime-gpu for the CUDA image: the newest release the package index has (1.32.0,
# the CPU image's version, is not published for onnxruntime-gpu there). Its extras
# [cuda,cudnn] bring NVIDIA's CUDA 12 runtime and cuDNN 9 as wheels (several GB).
CUDA_ORT_VERSION = os.environ.get("EDGEFLEET_CUDA_ORT_VERSION", "1.31.1")


def cuda_ort_version() -> str:
    return CUDA_ORT_VERSION


def base_ref(rootfs: RootFs, house: Wheelhouse, arch: str = DEFAULT_ARCH) -> str:
    """The base stage's reference: its key is its inputs (package list, lock, arch)."""
    key = key_of("base", rootfs.key, house.lock, UID, VENV, "v1", *key_parts(arch))
    return f"localhost/edgefleet-base{name_suffix(arch)}:{key}"


def platform_args(arch: str = DEFAULT_ARCH) -> list[str]:
    """``buildah from`` / ``buildah config`` flags that make the image's config say
    ``arch`` (the OCI config's architecture and os fields)."""
    return ["--arch", arch_of(arch).debian, "--os", "linux"]


def build_base(
    rootfs: RootFs, house: Wheelhouse, steps: dict[str, float], arch: str = DEFAULT_ARCH
) -> str:
    """The base stage (see the module docstring); returns its image reference. On a
    foreign ``arch`` its RUN step (venv, pip install, useradd) runs under qemu-user."""
    ref = base_ref(rootfs, house, arch)
    key = ref.rsplit(":", 1)[1]
    if image_exists(ref):
        return ref
    timer = Timer()
    ctr = buildah("base: from scratch", "from", *platform_args(arch),
                  "--name", f"efbase-{key}-{os.getpid()}", "scratch")  # fmt: skip
    try:
        buildah("base: add rootfs", "add", ctr, str(rootfs.tarball), "/")
        buildah("base: copy wheelhouse", "copy", ctr, str(house.path), "/tmp/wheelhouse")
        buildah(
            "base: venv and wheels",
            "run", "--network", "none", ctr, "--", "/bin/sh", "-ec",
            f"python3 -m venv {VENV}; "
            f"{VENV}/bin/pip install --no-index --find-links /tmp/wheelhouse --no-cache-dir "
            f"--disable-pip-version-check --quiet -r /tmp/wheelhouse/lock.txt; "
            "rm -rf /tmp/wheelhouse; "
            f"useradd --system --uid {UID} --user-group --home-dir {STATE} "
            f"--shell /usr/sbin/nologin {USER}; "
            f"install -d -m 0700 -o {UID} -g {UID} {STATE}",
        )  # fmt: skip
        buildah("base: platform", "config", *platform_args(arch), ctr)
        buildah("base: commit", "commit", "--quiet", "--rm", ctr, ref)
    except ImageBuildError:
        subprocess.run(["buildah", *storage_args(), "rm", ctr], capture_output=True, check=False)
        raise
    steps["base"] = timer.s
    return ref


def _config_for(target: str, has_models: bool = True) -> tuple[Path, str, list[str], str]:
    """(config file, its path in the image, entrypoint, config env var)."""
    if target == "coordinator":
        return (
            HERE / "coordinator.image.toml",
            "/etc/edgefleet/coordinator.toml",
            [f"{VENV}/bin/edgefleet-coordinator"],
            "EDGEFLEET_COORDINATOR_CONFIG",
        )
    return (
        HERE / ("agent.image.toml" if has_models else "agent.image-empty.toml"),
        "/etc/edgefleet/agent.toml",
        [f"{VENV}/bin/edgefleet-agent"],
        "EDGEFLEET_AGENT_CONFIG",
    )


def build_image(
    target: str = "agent-cpu",
    *,
    models: Path | None = DEFAULT_MODELS,
    serve: tuple[str, ...] = DEFAULT_SERVE,
    export: bool = True,
    signing_key: Path | None = None,
    arch: str = DEFAULT_ARCH,
) -> ImageBuild:
    """Build (or reuse) the image for ``target`` on ``arch`` and export its archives.
    ``signing_key``: the ed25519 PEM that signs artifact directories (see
    :mod:`edge_images.model_set`). A foreign ``arch`` (arm64 here) is built under qemu-user
    emulation (see :mod:`edge_images.arch`)."""
    check_target(target, arch)
    with cache_lock(f"build-{target}{name_suffix(arch)}"):
        return _build_image(target, models, serve, export, signing_key, arch)


# What each architecture builds: the CUDA image is x86-64 only (onnxruntime-gpu's CUDA 12
# wheels, NVIDIA's container toolkit on the usual GPU servers).
ARCH_TARGETS: dict[str, tuple[str, ...]] = {
    "amd64": TARGETS,
    "arm64": ("agent-cpu", "coordinator"),
}


def check_target(target: str, arch: str = DEFAULT_ARCH) -> None:
    """A clear error for an unknown target, an unknown arch or a pair not built."""
    if target not in TARGETS:
        raise ImageBuildError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    arch_of(arch)
    if target not in ARCH_TARGETS[arch]:
        raise ImageBuildError(
            f"{target} is not built for {arch}: {arch} builds {', '.join(ARCH_TARGETS[arch])}"
        )


def _build_image(
    target: str,
    models: Path | None,
    serve: tuple[str, ...],
    export: bool,
    signing_key: Path | None = None,
    arch: str = DEFAULT_ARCH,
) -> ImageBuild:
    check_target(target, arch)
    check_emulation(arch)
    steps: dict[str, float] = {}
    if target == "coordinator":
        models = None
    rootfs = build_rootfs(arch=arch)
    if rootfs.built_s is not None:
        steps["rootfs"] = rootfs.built_s
    house = build_wheelhouse(extras=_extras(target), replace=_ort_package(target), arch=arch)
    if house.built_s is not None:
        steps["wheelhouse"] = house.built_s
    model_set = _models_input(models, serve, signing_key)
    config, config_at, entrypoint, config_env = _config_for(target, model_set is not None)
    revision = git_revision()
    base = base_ref(rootfs, house, arch)
    key = key_of(
        "image", target, base, house.key,
        set_digest(model_set) if model_set else "no-models",
        digest_files([config, HERE / "healthcheck.py"], root=HERE),
        "recipe-3",  # bump when _assemble changes what it writes
        *key_parts(arch),
    )  # fmt: skip
    # The git revision is a label, not part of the key: an image whose every input is
    # unchanged is reused, and its label names the revision that first built that content.
    # an agent image without a model set is another image (both are kept in the cache)
    name = f"edgefleet-{target}" + ("-empty" if target != "coordinator" and not model_set else "")
    name += name_suffix(arch)  # its own name: remove_stale never drops the other arch's
    ref = f"localhost/{name}:{key}"
    labels = {
        "org.opencontainers.image.title": name,
        "org.opencontainers.image.version": project_version(),
        "org.opencontainers.image.revision": revision,
        "io.edgefleet.onnxruntime.version": _ort_version(house),
        "io.edgefleet.models": ",".join(model_refs(model_set)) if model_set else "none",
    }
    if not image_exists(ref):
        # the base only when the image itself must be built (a kept image needs no base)
        base = build_base(rootfs, house, steps, arch)
        timer = Timer()
        ctr = buildah("image: from base", "from", *platform_args(arch), "--pull-never",
                      "--name", f"ef-{key}-{os.getpid()}", base)  # fmt: skip
        try:
            _assemble(ctr, target, house, model_set, config, config_at, entrypoint, config_env,
                      labels, arch)  # fmt: skip
            buildah("image: commit", "commit", "--quiet", "--rm", "--format", "docker", ctr, ref)
        except ImageBuildError:
            subprocess.run(
                ["buildah", *storage_args(), "rm", ctr], capture_output=True, check=False
            )
            raise
        steps["image"] = timer.s
        remove_stale(f"localhost/{name}", keep=ref)
    out = cache_root() / "archives"
    out.mkdir(exist_ok=True)
    oci = out / f"{name}-{key}.oci.tar"
    docker = out / f"{name}-{key}.docker.tar"
    if export:
        for stale in out.glob(f"{name}-*.tar"):
            if key not in stale.name and re.fullmatch(rf"{name}-[0-9a-f]+\.\w+\.tar", stale.name):
                stale.unlink(missing_ok=True)
        for path, transport in ((oci, "oci-archive"), (docker, "docker-archive")):
            if not path.exists():
                timer = Timer()
                tmp = path.with_name(path.name + ".partial")
                tmp.unlink(missing_ok=True)
                dest = f"{tmp}:{name}:{key}"
                buildah(f"export {transport}", "push", "--quiet", ref, f"{transport}:{dest}")
                tmp.rename(path)
                steps[f"export_{transport}"] = timer.s
    # A reused image keeps the labels it was built with (its revision is the one that first
    # built this content): report those.
    built_labels = dict(inspect_config(ref).get("Labels") or {})  # type: ignore[call-overload]
    labels = {k: str(built_labels.get(k, v)) for k, v in labels.items()}
    return ImageBuild(target, ref, key, oci, docker, image_size(ref), steps, labels)


def _ort_version(house: Wheelhouse) -> str:
    for pin in house.lock:
        name, _, version = pin.partition("==")
        if name.split("[")[0] in ("onnxruntime", "onnxruntime-gpu"):
            return version
    raise ImageBuildError("wheelhouse: no onnxruntime in the lock")


def _assemble(
    ctr: str,
    target: str,
    house: Wheelhouse,
    model_set: Path | None,
    config: Path,
    config_at: str,
    entrypoint: list[str],
    config_env: str,
    labels: dict[str, str],
    arch: str = DEFAULT_ARCH,
) -> None:
    own = sorted(p for p in house.path.glob("edgefleet-*.whl"))
    if len(own) != 1:
        raise ImageBuildError(f"wheelhouse: expected one edgefleet wheel, found {own}")
    buildah("image: copy wheel", "copy", ctr, str(own[0]), f"/tmp/{own[0].name}")
    buildah(
        "image: install edgefleet",
        "run", "--network", "none", ctr, "--", "/bin/sh", "-ec",
        f"{VENV}/bin/pip install --no-index --no-deps --no-cache-dir --quiet "
        f"--disable-pip-version-check /tmp/{own[0].name}; rm /tmp/{own[0].name}",
    )  # fmt: skip
    buildah("image: copy config", "copy", "--chmod", "0644", ctr, str(config), config_at)
    buildah(
        "image: copy probe", "copy", "--chmod", "0755", ctr,
        str(HERE / "healthcheck.py"), "/opt/edgefleet/bin/healthcheck",
    )  # fmt: skip
    if model_set is not None:  # root's files, readable (not writable) by the agent's user
        buildah("image: copy signed model set", "copy", ctr, str(model_set), MODELS_IN_IMAGE)
        buildah("image: model set permissions", "run", "--network", "none", ctr, "--",
                "chmod", "-R", "u=rwX,go=rX", MODELS_IN_IMAGE)  # fmt: skip
    env = {
        config_env: config_at,
        "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": STATE,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if target == "coordinator":
        env["EDGEFLEET_HEALTHCHECK_PORT"] = "8080"
    if target == "agent-cuda":
        # NVIDIA's wheels put CUDA and cuDNN under site-packages/nvidia/*/lib; the CUDA
        # provider finds them (and `ldd` resolves them) through LD_LIBRARY_PATH. The driver
        # (libcuda.so.1) comes from the host (NVIDIA container toolkit / CDI).
        libs = buildah(
            "image: nvidia library dirs", "run", ctr, "--", "/bin/sh", "-c",
            f"ls -d {VENV}/lib/python3*/site-packages/nvidia/*/lib",
        ).split()  # fmt: skip
        env["LD_LIBRARY_PATH"] = ":".join(libs)
        env["EDGEFLEET_AGENT_ENGINE__EXECUTION_PROVIDER"] = "cuda"
    cfg: list[str] = [
        *platform_args(arch),
        "--user", f"{UID}:{UID}",
        "--workingdir", STATE,
        "--volume", STATE,
        "--entrypoint", json.dumps(entrypoint),
        "--cmd", "[]",
        "--stop-signal", "SIGTERM",
        "--healthcheck", f"CMD {VENV}/bin/python /opt/edgefleet/bin/healthcheck",
        "--healthcheck-interval", "10s",
        "--healthcheck-timeout", "5s",
        "--healthcheck-start-period", "60s",
        "--healthcheck-retries", "3",
    ]  # fmt: skip
    ports = ["8080", "50051", "50052"] if target == "coordinator" else ["8000"]
    for p in ports:
        cfg += ["--port", f"{p}/tcp"]  # as Docker's EXPOSE 8000 records it
    for k, v in env.items():
        cfg += ["--env", f"{k}={v}"]
    for k, v in labels.items():
        cfg += ["--label", f"{k}={v}"]
    buildah("image: config", "config", *cfg, ctr)


def check_cuda(ref: str) -> dict[str, object]:
    """Inside the CUDA image (no GPU needed): the providers ONNX Runtime lists, and what
    ``ldd`` leaves unresolved in the CUDA provider's library (the driver's libcuda.so.1 is
    expected there: the host supplies it)."""
    ctr = buildah("cuda check: from", "from", "--pull-never", ref)
    try:
        providers = buildah(
            "cuda check: providers", "run", ctr, "--",
            f"{VENV}/bin/python", "-c",
            "import onnxruntime as o; print(','.join(o.get_available_providers()))",
        ).split(",")  # fmt: skip
        ldd = buildah(
            "cuda check: ldd", "run", ctr, "--", "/bin/sh", "-c",
            f"ldd {VENV}/lib/python3*/site-packages/onnxruntime/capi/"
            "libonnxruntime_providers_cuda.so",
        )  # fmt: skip
    finally:
        subprocess.run(["buildah", *storage_args(), "rm", ctr], capture_output=True, check=False)
    missing = sorted({ln.split()[0] for ln in ldd.splitlines() if "not found" in ln})
    ok = "CUDAExecutionProvider" in providers and set(missing) <= {"libcuda.so.1"}
    return {"providers": providers, "ldd_not_found": missing, "ok": ok, "ldd": ldd}


def image_size(ref: str) -> int:
    """Uncompressed size of the image in bytes (its layers, as podman counts them)."""
    out = run(
        "image size",
        ["podman", *storage_args(), "image", "inspect", "--format", "{{.Size}}", ref],
    )
    return int(out.strip())


def inspect_config(ref: str) -> dict[str, object]:
    """The image's Docker-format config (user, entrypoint, env, labels, healthcheck)."""
    out = buildah("inspect", "inspect", "--type", "image", ref)
    data = json.loads(out)
    docker = data.get("Docker", {}).get("config", {})
    return dict(docker)


def mount_image(ref: str) -> tuple[str, Path]:
    """A working container of ``ref`` and its mounted root (read it, do not write it);
    :func:`unmount` removes the container."""
    ctr = buildah("mount: from", "from", "--pull-never", ref)
    path = buildah("mount", "mount", ctr)
    return ctr, Path(path)


def unmount(ctr: str) -> None:
    subprocess.run(["buildah", *storage_args(), "umount", ctr], capture_output=True, check=False)
    subprocess.run(["buildah", *storage_args(), "rm", ctr], capture_output=True, check=False)


def remove_stale(ref_prefix: str, keep: str) -> None:
    """Remove older tags of ``ref_prefix`` (keeps the cache from growing without end)."""
    out = buildah("images", "images", "--json")
    for row in json.loads(out or "[]"):
        for name in row.get("names") or []:
            if name.startswith(ref_prefix + ":") and name != keep:
                subprocess.run(
                    ["buildah", *storage_args(), "rmi", name], capture_output=True, check=False
                )


def copy_tree_linked(src: Path, dst: Path) -> None:
    """``cp -al`` (hard links) with a copying fallback across file systems."""
    done = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)


def make_context(
    dest: Path,
    *,
    models: Path | None = DEFAULT_MODELS,
    serve: tuple[str, ...] = DEFAULT_SERVE,
    signing_key: Path | None = None,
) -> dict[str, str]:
    """The Containerfile's build context in ``dest`` (hard links into the cache where the
    file system allows); returns the build arguments for its labels."""
    rootfs = build_rootfs()
    house = build_wheelhouse()
    model_set = _models_input(models, serve, signing_key)
    dest.mkdir(parents=True, exist_ok=True)
    copy_tree_linked(rootfs.tarball, dest / "rootfs.tar")
    copy_tree_linked(house.path, dest / "wheelhouse")
    # edgefleet's own wheel in a folder of its own: the Containerfile installs it in its
    # last layer, so that a layer cache keeps everything else across source changes
    (dest / "edgefleet").mkdir(exist_ok=True)
    for own in (dest / "wheelhouse").glob("edgefleet-*.whl"):
        own.rename(dest / "edgefleet" / own.name)
    if model_set is not None:
        copy_tree_linked(model_set, dest / "models")
    else:
        (dest / "models").mkdir(exist_ok=True)
    config, _, _, _ = _config_for("agent-cpu", model_set is not None)
    shutil.copy2(config, dest / "agent.image.toml")
    for name in ("healthcheck.py", "Containerfile"):
        shutil.copy2(HERE / name, dest / name)
    return {
        "VERSION": project_version(),
        "REVISION": git_revision(),
        "ORT_VERSION": _ort_version(house),
        "MODELS": ",".join(model_refs(model_set)) if model_set else "none",
    }


def build_containerfile(
    *, models: Path | None = DEFAULT_MODELS, serve: tuple[str, ...] = DEFAULT_SERVE
) -> tuple[str, float | None]:
    """``buildah bud`` of edge_images/Containerfile from the same inputs as
    :func:`build_image` (cached under their key); returns (reference, seconds or None)."""
    with cache_lock("build-containerfile"):
        return _build_containerfile(models, serve)


def _build_containerfile(models: Path | None, serve: tuple[str, ...]) -> tuple[str, float | None]:
    context = cache_root() / f"context-{os.getpid()}"
    shutil.rmtree(context, ignore_errors=True)
    try:
        build_args = make_context(context, models=models, serve=serve)
        # Keyed by what decides what the recipe installs: the Containerfile, the config,
        # the model set, the dependencies' wheels and edgefleet's wheel by its name (its
        # version), not its content: the image serves a comparison of what each build
        # installs (tests/edge_images/test_containerfile.py), which no source change
        # alters, and a build of it takes a minute of CI on each commit otherwise (its
        # layers do not help there: on the vfs storage driver each is a full copy)
        key = key_of(
            "containerfile",
            digest_files([context / "Containerfile", context / "agent.image.toml",
                          context / "healthcheck.py", context / "models",
                          context / "wheelhouse"], root=context),
            sorted(p.name for p in (context / "edgefleet").iterdir()),
            build_rootfs().key, {k: v for k, v in build_args.items() if k != "REVISION"}, "v2",
        )  # fmt: skip
        ref = f"localhost/edgefleet-agent-cpu-containerfile:{key}"
        if image_exists(ref):
            return ref, None
        timer = Timer()
        args = ["bud", "--quiet", "--isolation", "chroot",
                "--format", "docker", "--layers=false", "-f", str(context / "Containerfile"),
                "-t", ref]  # fmt: skip
        for k, v in build_args.items():
            args += ["--build-arg", f"{k}={v}"]
        buildah("containerfile: buildah bud", *args, str(context))
        remove_stale("localhost/edgefleet-agent-cpu-containerfile", keep=ref)
        return ref, timer.s
    finally:
        shutil.rmtree(context, ignore_errors=True)
