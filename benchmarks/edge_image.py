"""``python -m benchmarks.edge_image [--starts 3]``: the edge images' sizes and the agent
image's cold start, from container start to the first token of a streamed chat request.

The container runs as deployed (podman, read-only root, a fresh state volume, the image's
user and entrypoint, the signed model set baked in) with the agent standalone on a free
loopback port, so everything the agent does at start is counted: config, the model store
on the state volume adopting the baked set (its read-only seed), each manifest's ed25519
signature checked against the trusted key (``models.trusted_keys_file``), the sha256 of
every model file, ONNX Runtime sessions for both models, the HTTP server.
``podman create`` (with vfs storage it copies the image: not part of a start) is timed
apart. Each start is a new container (the page cache is warm after the first). Results:
``benchmarks/results/edge_image.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import time
from typing import Any

import aiohttp

from benchmarks.results_file import percentile, target, write_results
from edge_images.cache import cache_lock
from edge_images.images import build_image
from edge_images.podman import podman_env, remove_container

LLM = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _podman(env: dict[str, str], *args: str, timeout_s: float = 300) -> str:
    done = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


async def _first_token(url: str, deadline_s: float) -> float:
    """Poll until a streamed chat answers; return when its first content chunk arrived."""
    body = {"model": LLM, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Name the capital of France."}]}  # fmt: skip
    end = time.perf_counter() + deadline_s
    async with aiohttp.ClientSession() as http:
        while time.perf_counter() < end:
            try:
                async with http.post(url + "/v1/chat/completions", json=body) as reply:
                    if reply.status != 200:
                        await asyncio.sleep(0.05)
                        continue
                    async for line in reply.content:
                        if line.startswith(b"data: {") and b'"content"' in line:
                            return time.perf_counter()
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise TimeoutError(f"no first token from {url} within {deadline_s} s")


def cold_start(ref: str, env: dict[str, str], n: int) -> dict[str, Any]:
    creates: list[float] = []
    starts: list[float] = []
    for i in range(n):
        port = _free_port()
        name = f"edgefleet-bench-{os.getpid()}-{i}"
        volume = f"{name}-state"
        t0 = time.perf_counter()
        _podman(
            env, "create", "--name", name, "--read-only", "--network", "host",
            "-v", f"{volume}:/var/lib/edgefleet",
            "-e", "EDGEFLEET_AGENT_SERVER__HOST=127.0.0.1",
            "-e", f"EDGEFLEET_AGENT_SERVER__PORT={port}", ref,
        )  # fmt: skip
        creates.append(time.perf_counter() - t0)
        try:
            t1 = time.perf_counter()
            _podman(env, "start", name)
            first = asyncio.run(_first_token(f"http://127.0.0.1:{port}", 180))
            starts.append(first - t1)
            print(f"start {i + 1}/{n}: create {creates[-1]:.1f} s, start to first token "
                  f"{starts[-1]:.2f} s", flush=True)  # fmt: skip
        finally:
            remove_container(env, name, volume, stop_s=5)
    return {
        "starts": n,
        "start_to_first_token_s": [round(s, 3) for s in starts],
        "start_to_first_token_p50_s": round(percentile(starts, 50), 3),
        "start_to_first_token_max_s": round(max(starts), 3),
        "podman_create_p50_s": round(percentile(creates, 50), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.edge_image", description=__doc__)
    parser.add_argument("--starts", type=int, default=3, help="cold starts to time")
    args = parser.parse_args(argv)
    t = time.perf_counter()
    agent = build_image("agent-cpu")
    agent_build_s = time.perf_counter() - t
    t = time.perf_counter()
    coordinator = build_image("coordinator")
    coordinator_build_s = time.perf_counter() - t
    env = {**os.environ, **podman_env()}
    with cache_lock("containers"):
        start = cold_start(agent.ref, env, args.starts)
    figures: dict[str, Any] = {
        "agent_cpu": {
            "image": agent.ref,
            "size_bytes": agent.size_bytes,
            "oci_archive_bytes": agent.oci_archive.stat().st_size,
            "docker_archive_bytes": agent.docker_archive.stat().st_size,
            "labels": agent.labels,
            # verified at every start: signatures and every file's sha256
            "signed_model_set": agent.labels["io.edgefleet.models"].split(","),
            "build_s_this_run": round(agent_build_s, 1),
            "build_steps_s": agent.steps_s,  # empty: everything came from the cache
        },
        "coordinator": {
            "image": coordinator.ref,
            "size_bytes": coordinator.size_bytes,
            "oci_archive_bytes": coordinator.oci_archive.stat().st_size,
            "build_s_this_run": round(coordinator_build_s, 1),
        },
        "cold_start": start,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    p50 = start["start_to_first_token_p50_s"]
    targets = {
        "start_to_first_token_p50_s": target(p50, "< 10", p50 < 10),
        "agent_cpu_size_bytes": target(agent.size_bytes, "< 1.5e9", agent.size_bytes < 1.5e9),
    }
    path = write_results("edge_image", figures, targets)
    print(f"agent-cpu {agent.size_bytes / 1e6:.0f} MB (OCI archive "
          f"{agent.oci_archive.stat().st_size / 1e6:.0f} MB), coordinator "
          f"{coordinator.size_bytes / 1e6:.0f} MB; start to first token p50 {p50:.2f} s "
          f"(max {start['start_to_first_token_max_s']:.2f} s) -> {path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
