"""Checks of a built image's architecture, run on the build machine (under qemu-user
emulation for a foreign one): what its config and both archives say, what ``uname -m`` and
ONNX Runtime say inside it, and one chat completion from the agent started as the image
starts it (``python -m edge_images check-arch``; ``make image-cpu-arm64``).

Under emulation the containers get an aarch64 ``/proc/cpuinfo`` (:func:`emulated_cpuinfo`,
bind-mounted; podman's runc allows that file, as LXCFS uses it): Debian 12's qemu-user
(7.2) passes the host's x86 ``/proc/cpuinfo`` through, and ONNX Runtime's CPU detection
(cpuinfo, at ``import onnxruntime``) finds no ARM core in it and crashes (SIGSEGV) before
Python sees an error. A real arm64 machine has its own; the image does not change.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edge_images.arch import arch_of, is_native
from edge_images.cache import cache_lock, cache_root
from edge_images.errors import ImageBuildError
from edge_images.images import VENV, buildah
from edge_images.podman import podman_env, remove_container

LLM = "smollm2-135m-instruct"
QUESTION = "Name the capital of France."


def config_architecture(ref: str) -> dict[str, str]:
    """The architecture and os the image's OCI and Docker configs record."""
    data = json.loads(buildah("inspect", "inspect", "--type", "image", ref))
    oci = data.get("OCIv1") or {}
    docker = data.get("Docker") or {}
    return {
        "oci": f"{oci.get('os')}/{oci.get('architecture')}",
        "docker": f"{docker.get('os')}/{docker.get('architecture')}",
    }


def archive_architecture(path: Path) -> str:
    """``os/architecture`` from the config inside an OCI archive (index.json -> manifest
    -> config) or a Docker archive (manifest.json -> Config)."""
    with tarfile.open(path) as tar:

        def member(name: str) -> Any:
            fh = tar.extractfile(name)
            if fh is None:
                raise ImageBuildError(f"{path}: {name} is not a file")
            return json.loads(fh.read())

        names = set(tar.getnames())
        if "index.json" in names:
            index = member("index.json")
            digest = index["manifests"][0]["digest"].replace(":", "/")
            manifest = member(f"blobs/{digest}")
            config = member("blobs/" + manifest["config"]["digest"].replace(":", "/"))
        elif "manifest.json" in names:
            config = member(member("manifest.json")[0]["Config"])
        else:
            raise ImageBuildError(f"{path}: neither an OCI nor a Docker archive")
    return f"{config.get('os')}/{config.get('architecture')}"


def _present_cpus() -> list[int]:
    """The host's CPU numbers (``/sys/devices/system/cpu/present``, which the container
    sees too: cpuinfo counts the cores there and in ``/proc/cpuinfo``)."""
    text = Path("/sys/devices/system/cpu/present").read_text().strip()
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def emulated_cpuinfo(arch: str) -> Path | None:
    """For a foreign arm64: an aarch64 ``/proc/cpuinfo`` (Neoverse-N1 cores, one per host
    CPU) to bind-mount into the container (see the module docstring); None when native."""
    if is_native(arch):
        return None
    if arch_of(arch).machine != "aarch64":
        raise ImageBuildError(f"no emulated /proc/cpuinfo for {arch}")
    blocks = [
        f"processor\t: {n}\nBogoMIPS\t: 50.00\n"
        "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
        "asimdrdm lrcpc dcpop asimddp ssbs\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\n"
        "CPU part\t: 0xd0c\nCPU revision\t: 1\n"
        for n in _present_cpus()
    ]
    path = cache_root() / f"emulated-cpuinfo-{arch}"
    text = "\n".join(blocks)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _cpuinfo_mount(arch: str) -> list[str]:
    path = emulated_cpuinfo(arch)
    return [] if path is None else ["-v", f"{path}:/proc/cpuinfo:ro"]


def inside(ref: str, arch: str) -> dict[str, Any]:
    """``uname -m`` and ONNX Runtime's version and providers, run inside the image (podman,
    no network; emulated when the image is foreign), timed (container creation included)."""
    env = {**os.environ, **podman_env()}
    probe = ("import os, onnxruntime as o; print(os.uname().machine); print(o.__version__); "
             "print(','.join(o.get_available_providers()))")  # fmt: skip
    with cache_lock("containers"):
        t0 = time.perf_counter()
        out = _podman(env, "run", "--rm", "--network", "none", "--read-only",
                      *_cpuinfo_mount(arch), "--entrypoint", f"{VENV}/bin/python", ref,
                      "-c", probe).splitlines()  # fmt: skip
        run_s = time.perf_counter() - t0
    if len(out) < 3:
        raise ImageBuildError(f"check: unexpected output from the image: {out}")
    return {
        "uname_m": out[-3],
        "onnxruntime": out[-2],
        "providers": out[-1].split(","),
        "podman_run_s": round(run_s, 2),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _podman(env: dict[str, str], *args: str, timeout_s: float = 600) -> str:
    done = subprocess.run(["podman", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip
    if done.returncode != 0:
        raise ImageBuildError(f"podman {' '.join(args[:2])}: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def _post(url: str, body: dict[str, Any], timeout_s: float) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(req, timeout=timeout_s)


def _first_token(base: str, deadline_s: float) -> tuple[float, str]:
    """Poll a streamed chat until its first content chunk; (when it came, that chunk)."""
    body = {"model": LLM, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    end = time.perf_counter() + deadline_s
    last = "nothing answered"
    while time.perf_counter() < end:
        try:
            with _post(base + "/v1/chat/completions", body, 120) as reply:
                for line in reply:
                    if line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        delta = chunk["choices"][0].get("delta") or {}
                        if delta.get("content"):
                            return time.perf_counter(), str(delta["content"])
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ImageBuildError(f"no first token from {base} within {deadline_s:.0f} s ({last})")


def chat_from_image(
    ref: str, arch: str, *, deadline_s: float = 900, max_tokens: int = 16
) -> dict[str, Any]:
    """Start the agent from ``ref`` as deployed (podman, read-only root, a fresh state
    volume, the image's user and entrypoint and baked signed model set) on a free loopback
    port; time container start to the first token of a streamed chat, then ask one
    non-streamed chat completion. Emulated when the image is foreign."""
    env = {**os.environ, **podman_env()}
    port = _free_port()
    name = f"edgefleet-archcheck-{os.getpid()}"
    volume = f"{name}-state"
    with cache_lock("containers"):
        t0 = time.perf_counter()
        _podman(
            env, "create", "--name", name, "--read-only", "--network", "host",
            "-v", f"{volume}:/var/lib/edgefleet", *_cpuinfo_mount(arch),
            "-e", "EDGEFLEET_AGENT_SERVER__HOST=127.0.0.1",
            "-e", f"EDGEFLEET_AGENT_SERVER__PORT={port}", ref,
        )  # fmt: skip
        create_s = time.perf_counter() - t0
        try:
            t1 = time.perf_counter()
            _podman(env, "start", name)
            first_at, first = _first_token(f"http://127.0.0.1:{port}", deadline_s)
            body = {"model": LLM, "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
            t2 = time.perf_counter()
            with _post(f"http://127.0.0.1:{port}/v1/chat/completions", body, 600) as reply:
                answer = json.loads(reply.read())
            chat_s = time.perf_counter() - t2
            user = _podman(env, "exec", name, "id", "-u")
            machine = _podman(env, "exec", name, "uname", "-m")
        finally:
            remove_container(env, name, volume, stop_s=10)
    return {
        "podman_create_s": round(create_s, 2),
        "start_to_first_token_s": round(first_at - t1, 2),
        "first_token": first,
        "chat_completion_s": round(chat_s, 2),
        "chat_completion": answer["choices"][0]["message"]["content"],
        "completion_tokens": answer.get("usage", {}).get("completion_tokens"),
        "container_uid": user,
        "container_uname_m": machine,
    }


def check_arch_image(built: Any, arch: str, *, chat: bool = True) -> dict[str, Any]:
    """Everything above for a built image (an :class:`edge_images.images.ImageBuild`);
    ``ok`` when every architecture field says ``arch`` and ONNX Runtime lists its CPU
    provider (and, with ``chat``, the agent answered)."""
    want = arch_of(arch)
    config = config_architecture(built.ref)
    archives = {
        "oci_archive": archive_architecture(built.oci_archive),
        "docker_archive": archive_architecture(built.docker_archive),
    }
    seen = inside(built.ref, arch)
    result: dict[str, Any] = {"config": config, "archives": archives, "inside": seen}
    ok = (
        all(v == f"linux/{want.debian}" for v in [*config.values(), *archives.values()])
        and seen["uname_m"] == want.machine
        and "CPUExecutionProvider" in seen["providers"]
    )
    if chat:
        result["chat"] = chat_from_image(built.ref, arch)
        ok = ok and bool(result["chat"]["chat_completion"])
    result["ok"] = ok
    return result
