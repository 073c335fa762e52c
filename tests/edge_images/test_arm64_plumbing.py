"""The arm64 image's plumbing, checked cheaply in CI (which never builds arm64: emulated,
it takes minutes; `make image-cpu-arm64` does, docs/operators/images.md has its figures):
cache keys and names differ by architecture while amd64's stay as they were, the pip
download platform tags, the buildah platform arguments (a real arm64 `FROM scratch` image,
no RUN step, so no emulation), and clear errors for an unknown architecture or a missing
qemu registration."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.markers import Marker

from edge_images import arch as arch_mod
from edge_images.__main__ import main
from edge_images.arch import ARCHES, check_emulation, pip_platform_args
from edge_images.archcheck import (
    _cpuinfo_mount,
    archive_architecture,
    config_architecture,
    emulated_cpuinfo,
)
from edge_images.cache import key_of
from edge_images.errors import ImageBuildError
from edge_images.images import (
    ARCH_TARGETS,
    base_ref,
    build_image,
    buildah,
    check_target,
    platform_args,
    storage_args,
)
from edge_images.rootfs import PACKAGES, SUITE, VARIANT, RootFs, rootfs_key, rootfs_path
from edge_images.wheelhouse import (
    Wheelhouse,
    _marker_ok,
    pip_download_args,
    runtime_lock,
    wheelhouse_key,
)

REPO = Path(__file__).resolve().parents[2]


def test_rootfs_keys_and_paths_differ_by_arch_and_amd64s_are_unchanged() -> None:
    # amd64's key is the one from before architectures: its cached tarball stays valid
    assert rootfs_key() == key_of("rootfs", SUITE, VARIANT, sorted(PACKAGES), "v1")
    assert rootfs_key(arch="amd64") == rootfs_key()
    assert rootfs_key(arch="arm64") != rootfs_key(arch="amd64")
    assert rootfs_path(arch="arm64") != rootfs_path(arch="amd64")
    assert "-arm64-" in rootfs_path(arch="arm64").name
    assert "arm64" not in rootfs_path(arch="amd64").name


def test_wheelhouse_keys_and_base_refs_differ_by_arch() -> None:
    lock = runtime_lock(arch="arm64")
    assert lock == runtime_lock(arch="amd64")  # one set of versions for both
    assert any(pin.startswith("onnxruntime==") for pin in lock)
    assert wheelhouse_key(lock, "amd64") == key_of(
        "wheelhouse", lock, sys.version_info[:2], "manylinux_x86_64", "v1"
    )
    assert wheelhouse_key(lock, "arm64") != wheelhouse_key(lock, "amd64")
    rootfs = {a: RootFs(rootfs_path(arch=a), rootfs_key(arch=a), None) for a in ARCHES}
    houses = {a: Wheelhouse(Path("/nonexistent"), lock, "k", None) for a in ARCHES}
    amd, arm = (base_ref(rootfs[a], houses[a], a) for a in ("amd64", "arm64"))
    assert amd.startswith("localhost/edgefleet-base:")
    assert arm.startswith("localhost/edgefleet-base-arm64:")
    assert amd.rsplit(":", 1)[1] != arm.rsplit(":", 1)[1]


def test_pip_download_asks_for_aarch64_wheels_of_debians_python(tmp_path: Path) -> None:
    args = pip_download_args(tmp_path, "arm64")
    assert args[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--only-binary=:all:" in args and "--no-deps" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert "manylinux2014_aarch64" in platforms
    # llguidance 1.9.1 ships manylinux_2_31 only; bookworm's glibc is 2.36, not 2.37
    assert "manylinux_2_31_aarch64" in platforms and "manylinux_2_36_aarch64" in platforms
    assert "manylinux_2_37_aarch64" not in platforms
    assert all(p.endswith("_aarch64") for p in platforms)
    assert args[args.index("--python-version") + 1] == "3.11"
    assert args[args.index("--implementation") + 1] == "cp"
    abis = [args[i + 1] for i, a in enumerate(args) if a == "--abi"]
    assert abis == ["cp311", "abi3", "none"]
    assert args[-2:] == ["-r", str(tmp_path / "lock.txt")]
    # amd64 (native here) downloads for the running interpreter, as before
    assert pip_platform_args("amd64") == []
    assert "--platform" not in pip_download_args(tmp_path, "amd64")
    # with a replaced requirement (the CUDA image) the dependencies are resolved
    assert "--no-deps" not in pip_download_args(tmp_path, "amd64", deps=True)


def test_markers_are_evaluated_for_the_target_machine() -> None:
    x86_only = Marker('platform_machine == "x86_64"')
    assert _marker_ok(x86_only, frozenset(), arch_mod.marker_environment("amd64"))
    assert not _marker_ok(x86_only, frozenset(), arch_mod.marker_environment("arm64"))
    extra = Marker('extra == "cuda" and platform_machine == "aarch64"')
    assert _marker_ok(extra, frozenset({"cuda"}), arch_mod.marker_environment("arm64"))
    assert not _marker_ok(extra, frozenset({"cuda"}), arch_mod.marker_environment("amd64"))


def test_unknown_arch_and_unbuilt_pairs_are_refused_clearly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ImageBuildError, match=r"unknown architecture 'riscv64': one of amd64, "):
        build_image("agent-cpu", arch="riscv64")
    with pytest.raises(ImageBuildError, match="agent-cuda is not built for arm64"):
        check_target("agent-cuda", "arm64")
    with pytest.raises(ImageBuildError, match="unknown target 'agent-tpu'"):
        check_target("agent-tpu", "arm64")
    for arch, targets in ARCH_TARGETS.items():
        for target in targets:
            check_target(target, arch)
    with pytest.raises(ImageBuildError, match="unknown architecture 'x86_64'"):
        rootfs_key(arch="x86_64")  # uname's name, not Debian's
    # the command line: exit status 1 and the builder's message, nothing built
    assert main(["build", "agent-cpu", "--arch", "s390"]) == 1
    assert "unknown architecture 's390'" in capsys.readouterr().err
    assert main(["check-arch", "--arch", "mips", "--no-chat"]) == 1
    assert "unknown architecture 'mips'" in capsys.readouterr().err


def test_missing_qemu_registration_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arch_mod, "BINFMT", tmp_path)
    check_emulation("amd64")  # native: nothing to check
    with pytest.raises(ImageBuildError, match=r"system_deps.sh arm64"):
        check_emulation("arm64")
    (tmp_path / "qemu-aarch64").write_text("disabled\ninterpreter /usr/bin/qemu-aarch64\n")
    with pytest.raises(ImageBuildError, match="not registered and enabled"):
        check_emulation("arm64")
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/bin/qemu-aarch64\n")
    check_emulation("arm64")


def test_system_deps_refuses_an_unknown_argument() -> None:
    done = subprocess.run(["sh", str(REPO / "devtools" / "system_deps.sh"), "riscv64"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "unknown argument 'riscv64'" in done.stderr


def test_buildah_platform_args_make_an_arm64_image_and_archive(tmp_path: Path) -> None:
    """`buildah from` + `config` with platform_args (as the base and image stages run
    them), then commit and export: the config and the OCI archive say linux/arm64. No RUN
    step, so no emulation is needed."""
    assert platform_args("arm64") == ["--arch", "arm64", "--os", "linux"]
    assert platform_args("amd64") == ["--arch", "amd64", "--os", "linux"]
    ref = f"localhost/edgefleet-archtest-arm64:{tmp_path.name.lower()[-20:]}"
    (tmp_path / "hello").write_text("arm64\n")
    ctr = buildah("test: from", "from", *platform_args("arm64"), "scratch")
    try:
        buildah("test: copy", "copy", ctr, str(tmp_path / "hello"), "/hello")
        buildah("test: config", "config", *platform_args("arm64"), ctr)
        buildah("test: commit", "commit", "--quiet", "--rm", "--format", "docker", ctr, ref)
        assert config_architecture(ref) == {"oci": "linux/arm64", "docker": "linux/arm64"}
        oci = tmp_path / "img.oci.tar"
        docker = tmp_path / "img.docker.tar"
        buildah("test: export", "push", "--quiet", ref, f"oci-archive:{oci}:test")
        buildah("test: export", "push", "--quiet", ref, f"docker-archive:{docker}:test:x")
        assert archive_architecture(oci) == "linux/arm64"
        assert archive_architecture(docker) == "linux/arm64"
    finally:
        subprocess.run(["buildah", *storage_args(), "rm", ctr], capture_output=True, check=False)
        subprocess.run(["buildah", *storage_args(), "rmi", ref], capture_output=True, check=False)


def test_emulated_cpuinfo_lists_an_arm_core_per_host_cpu() -> None:
    """Under qemu-user the containers get an aarch64 /proc/cpuinfo (ONNX Runtime's CPU
    detection crashes on the host's x86 one); natively nothing is mounted."""
    present = Path("/sys/devices/system/cpu/present").read_text().strip()
    path = emulated_cpuinfo("arm64")
    assert path is not None
    blocks = path.read_text().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [f"processor\t: {n}" for n in range(len(blocks))]
    ranges = [part.partition("-") for part in present.split(",")]
    assert len(blocks) == sum(int(hi or lo) - int(lo) + 1 for lo, _, hi in ranges)
    assert all("CPU implementer\t: 0x41" in b and "asimd" in b for b in blocks)
    assert _cpuinfo_mount("arm64") == ["-v", f"{path}:/proc/cpuinfo:ro"]
    assert emulated_cpuinfo("amd64") is None and _cpuinfo_mount("amd64") == []


def test_archive_architecture_refuses_what_is_not_an_image(tmp_path: Path) -> None:
    bogus = tmp_path / "x.tar"
    with tarfile.open(bogus, "w") as tar:
        (tmp_path / "f").write_text("x")
        tar.add(tmp_path / "f", arcname="f")
    with pytest.raises(ImageBuildError, match="neither an OCI nor a Docker archive"):
        archive_architecture(bogus)
