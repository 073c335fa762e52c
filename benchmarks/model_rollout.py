"""``python -m benchmarks.model_rollout``: roll a new model version out to a fleet.

What runs (all real processes on loopback):

- an **origin**: the coordinator's blob protocol (``GET /v1/blobs/sha256/{hex}`` with
  Range and strong ETags) over a signed model set, in its own process, counting every
  byte it sends (the coordinator's egress). It is the agent's own blob server over the
  export layout; the coordinator's catalog server (built apart, issue 10's catalog part)
  speaks the same protocol.
- one **site process** per site, holding that site's agents: ``--real`` of them are real
  agent apps (HTTP API, ONNX Runtime engine, model sync with the on-box self-check, on
  their own ports); the rest are real sync clients without the engine (model store,
  fetcher, blob server for their peers: ``models`` sync with loading off).
- this **controller**, which plays the coordinator's desired-state push: it hands each
  agent its ModelTarget (signed manifest, the origin as artifact_url, and as peer_urls
  the other agents of its site, as the coordinator names agents holding or fetching the
  version) through the site process, and collects when each agent converged. The
  coordinator's own push latency (one message on a live session) is not in the figure.

Versions: v1 is SmolLM2's int8 variant, v2 the shipped int4 (both published under the
shipped name, as ``models publish --name`` does); they share the tokenizer and config,
so the changed bytes are v2's graph. v1 is installed first (self-check off: it is the
fleet's state before the rollout); the rollout of v2 is measured, with one real agent
under load. v3, the fp32 variant, is then swapped in on that agent alone under load.

Figures: time from the push to every agent converged; coordinator egress per site with
site-local distribution, and without it (peers not named, on one site's worth of fresh
sync clients), against the changed bytes; download throughput of one agent's fetcher
(hash, write, fsync, rename) against a plain loopback HTTP read of the same bytes; the
self-check's time on the real agents; and a hot swap on one real agent under
``--streams`` concurrent streamed requests: none fails, each reply names the version that
served it and equals that version's greedy reference (its greedy replies with that
version alone on the agent, one at a time and at the load's concurrency). The swap that
is checked reply by reply is v2 -> v3: int8's replies are not one greedy text per prompt
under batching (its activations are quantized with one scale per batch, so a sequence's
tokens depend on what shares its batch: over 200 concurrent requests it wrote more than a
hundred different replies), so during the v2 rollout only int4's replies are checked and
int8's are counted.

Small run: ``python -m benchmarks.model_rollout --agents 6 --sites 2 --real 1 --streams 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.results_file import percentile, target, write_results

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "models" / "artifacts"
NAME = "smollm2-135m-instruct"
V1_DIR = ARTIFACTS / "_variants" / f"{NAME}-int8"
V2_DIR = ARTIFACTS / NAME
V3_DIR = ARTIFACTS / "_variants" / f"{NAME}-fp32"
PROMPT = "What is the capital of France?"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ signed versions


def signed(artifact: Path, signer: Any) -> dict[str, Any]:
    """The artifact as a catalog version under the shipped name: the target's fields."""
    data = json.loads((artifact / "manifest.json").read_text())
    data["name"] = NAME
    manifest = json.dumps(data, indent=2).encode()
    return {
        "name": NAME,
        "version": data["version"],
        "manifest": manifest,
        "signature": signer.sign(manifest),
        "sha256": hashlib.sha256(manifest).hexdigest(),
        "files": {e["sha256"]: (artifact / e["path"], e["size"]) for e in data["files"]},
    }


def target_json(version: dict[str, Any], origin: str, peers: list[str]) -> dict[str, Any]:
    return {
        "name": version["name"],
        "version": version["version"],
        "artifact_url": origin,
        "sha256": version["sha256"],
        "manifest": base64.b64encode(version["manifest"]).decode(),
        "signature": base64.b64encode(version["signature"]).decode(),
        "peer_urls": peers,
    }


def target_from_json(data: dict[str, Any]) -> Any:
    from edgefleet.contract import ModelTarget

    return ModelTarget(
        name=data["name"],
        version=data["version"],
        artifact_url=data["artifact_url"],
        sha256=data["sha256"],
        manifest=base64.b64decode(data["manifest"]),
        signature=base64.b64decode(data["signature"]),
        peer_urls=tuple(data["peer_urls"]),
    )


# --------------------------------------------------------------------------- origin


async def run_origin(store_dir: Path) -> None:
    from agent.sync.blob_server import blob_handler
    from agent.sync.store import ModelStore

    store = ModelStore(store_dir)
    sent = {"bytes": 0, "requests": 0}
    handler = blob_handler(lambda: store)

    async def counted(request: web.Request) -> web.StreamResponse:
        response = await handler(request)
        sent["requests"] += 1
        if response.status in (200, 206) and response.content_length:
            sent["bytes"] += response.content_length
        return response

    async def stats(request: web.Request) -> web.StreamResponse:
        return web.json_response(sent)

    app = web.Application()
    app.router.add_get("/v1/blobs/sha256/{hex}", counted)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(json.dumps({"url": f"http://127.0.0.1:{runner.addresses[0][1]}"}), flush=True)
    await asyncio.Event().wait()


# ------------------------------------------------------------------------ site process


async def run_site(args: argparse.Namespace) -> None:
    """This site's agents; commands on stdin, events on stdout (JSON lines)."""
    from aiohttp.test_utils import TestServer

    from agent.api.app import SYNC, create_app
    from agent.config import load_config
    from agent.sync.manager import ModelSync

    root = Path(args.store_root)
    syncs: dict[str, ModelSync] = {}
    servers: list[Any] = []
    agents: list[dict[str, Any]] = []
    for i in range(args.count):
        real = i < args.real
        agent_id = f"{args.site}-{i:02d}"
        models = {
            "source": "store",
            "store_dir": str(root / agent_id),
            "trusted_keys": [args.key],
            "self_check": real,
            "self_check_threads": 1,
            "load_memory_factor": 1.2,
        }
        overrides: dict[str, Any] = {"models": models, "log_level": "WARNING"}
        if real:
            overrides |= {
                "engine": {"intra_op_threads": args.threads, "max_running": 32,
                           "max_queue": 1024, "max_queue_wait_s": 600,
                           "request_timeout_s": 900, "default_max_tokens": 16},
                "cache": {"enabled": False},  # every request reaches the engine
                "server": {"max_connections": 2048},
            }  # fmt: skip
        app = create_app(load_config(environ={}, overrides=overrides))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        sync = app[SYNC]
        sync.options.load = real  # sync-only clients fetch, verify and serve peers
        url = str(server.make_url("")).rstrip("/")
        sync.options.own_blob_url = f"{url}/v1/blobs"
        syncs[agent_id] = sync
        agents.append({"id": agent_id, "blob_url": f"{url}/v1/blobs", "real": real,
                       "http_url": url if real else None})  # fmt: skip
    print(json.dumps({"agents": agents}), flush=True)

    async def watch(agent_id: str, generation: int, version: str) -> None:
        sync = syncs[agent_id]
        await sync.wait_applied(generation, 3600)
        entry = next((i for i in sync.inventory() if i.version == version and i.name == NAME), None)
        check = entry.self_check if entry is not None else None
        print(json.dumps({
            "event": "converged", "id": agent_id, "t": time.time(), "version": version,
            "state": None if entry is None else str(entry.state),
            "error": "" if entry is None else entry.last_error,
            "from_peers": 0 if entry is None else entry.bytes_from_peers,
            "from_coordinator": 0 if entry is None else entry.bytes_from_coordinator,
            "self_check_s": None if check is None else check.seconds,
            "self_check_passed": None if check is None else check.passed,
        }), flush=True)  # fmt: skip

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)  # a command holds every target
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    watchers: set[asyncio.Task[None]] = set()
    from edgefleet.contract import ModelsSection

    while line := await reader.readline():
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        if command["cmd"] == "apply":
            for agent_id, tj in command["targets"].items():
                sync = syncs[agent_id]
                sync.options.self_check = bool(command.get("self_check")) and sync.options.load
                section = ModelsSection(command["generation"], (target_from_json(tj),))
                sync.apply(section)
                task = asyncio.create_task(watch(agent_id, command["generation"], tj["version"]))
                watchers.add(task)
                task.add_done_callback(watchers.discard)
    for server in servers:
        await server.close()


# -------------------------------------------------------------------------- controller


class Site:
    def __init__(self, name: str, proc: asyncio.subprocess.Process, agents: list[dict[str, Any]]):
        self.name = name
        self.proc = proc
        self.agents = agents

    async def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        await self.proc.stdin.drain()

    async def events(self, count: int) -> list[dict[str, Any]]:
        assert self.proc.stdout is not None
        out: list[dict[str, Any]] = []
        while len(out) < count:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"site {self.name} exited")
            out.append(json.loads(line))
        return out


async def start_process(*argv: str) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.model_rollout", *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
        limit=1 << 24,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 600)
    if not line:
        raise RuntimeError(f"{argv[:2]} did not start")
    return proc, json.loads(line)


async def origin_bytes(origin: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(origin + "/stats") as r:
        return int((await r.json())["bytes"])


async def rollout(
    sites: list[Site], version: dict[str, Any], origin: str, generation: int,
    *, peers: bool, self_check: bool,
) -> tuple[float, list[dict[str, Any]]]:  # fmt: skip
    """Push ``version`` to every agent; (seconds until all converged, their events)."""
    started = time.time()
    for site in sites:
        urls = [a["blob_url"] for a in site.agents]
        targets = {
            a["id"]: target_json(
                version,
                origin + "/v1/blobs",
                [u for u in urls if u != a["blob_url"]] if peers else [],
            )
            for a in site.agents
        }
        await site.send({"cmd": "apply", "generation": generation, "targets": targets,
                         "self_check": self_check})  # fmt: skip
    results = await asyncio.gather(*(s.events(len(s.agents)) for s in sites))
    events = [e for site_events in results for e in site_events]
    return max(e["t"] for e in events) - started, events


async def throughput(origin: str, sha: str, size: int, scratch: Path,
                     rounds: int = 7) -> dict[str, Any]:  # fmt: skip
    """Our fetcher (hash, write, fsync, rename) against a plain copy of the same bytes over
    the same loopback HTTP (read and written to a file, like ``curl -o``), alternated
    ``rounds`` times (plain first, then ours, each round) and compared by their medians.
    One plain copy before them is not counted: it reads the blob into the page cache and
    opens the connection pool, which would otherwise slow the first plain copy alone."""
    from agent.sync.fetch import BlobFetcher, BlobSource
    from agent.sync.store import ModelStore

    plain: list[float] = []
    ours: list[float] = []
    for round_ in range(rounds + 1):
        copy = scratch / "plain-copy"
        async with aiohttp.ClientSession() as http:
            began = time.perf_counter()
            got = 0
            with open(copy, "wb") as fh:  # what `curl -o` does: no hash, no fsync
                async with http.get(f"{origin}/v1/blobs/sha256/{sha}") as response:
                    async for chunk in response.content.iter_chunked(1 << 20):
                        fh.write(chunk)
                        got += len(chunk)
            if round_:
                plain.append(time.perf_counter() - began)
        copy.unlink()
        assert got == size
        if not round_:
            continue  # the warm-up
        fetcher = BlobFetcher(ModelStore(scratch / "throughput-store"))
        began = time.perf_counter()
        await fetcher.fetch(sha, size, [BlobSource(origin + "/v1/blobs", "coordinator")],
                            lambda n, kind: None)  # fmt: skip
        ours.append(time.perf_counter() - began)
        await fetcher.close()
        shutil.rmtree(scratch / "throughput-store")
    plain_s, ours_s = statistics.median(plain), statistics.median(ours)
    return {"plain_MBps": size / plain_s / 1e6, "fetcher_MBps": size / ours_s / 1e6,
            "ratio": plain_s / ours_s, "bytes": size, "rounds": rounds,
            "plain_s": [round(x, 3) for x in plain],
            "fetcher_s": [round(x, 3) for x in ours]}  # fmt: skip


async def stream_once(http: aiohttp.ClientSession, url: str) -> tuple[str, str]:
    payload = {"model": NAME, "messages": [{"role": "user", "content": PROMPT}],
               "max_tokens": 16, "temperature": 0, "stream": True}  # fmt: skip
    async with http.post(url + "/v1/chat/completions", json=payload) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        text, model, done = "", "", False
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            model = event["model"]
            for choice in event["choices"]:
                text += choice["delta"].get("content") or ""
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        return model, text


async def calibrate(url: str, streams: int, references: dict[str, set[str]]) -> None:
    """The version's greedy replies alone (batch of one) and at the load's concurrency
    (the engine's batched numerics can change a greedy token against a batch of one)."""
    connector = aiohttp.TCPConnector(limit=streams + 8)
    async with aiohttp.ClientSession(connector=connector) as http:
        replies = [await stream_once(http, url)]
        replies += await asyncio.gather(*(stream_once(http, url) for _ in range(streams)))
    for model, text in replies:
        references.setdefault(model, set()).add(text)


async def hot_swap_load(
    url: str, streams: int, swapped: asyncio.Event
) -> AsyncIterator[tuple[str, str] | Exception]:
    """``streams`` clients streaming back to back until the swap, then one more each."""
    queue: asyncio.Queue[tuple[str, str] | Exception | None] = asyncio.Queue()
    connector = aiohttp.TCPConnector(limit=streams + 8)
    timeout = aiohttp.ClientTimeout(total=1800)

    async def client(http: aiohttp.ClientSession) -> None:
        after = 0
        while after < 2:
            if swapped.is_set():
                after += 1
            try:
                await queue.put(await stream_once(http, url))
            except Exception as exc:  # every failure is a reported figure
                await queue.put(exc)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tasks = [asyncio.create_task(client(http)) for _ in range(streams)]
        done = asyncio.gather(*tasks)
        done.add_done_callback(lambda _: queue.put_nowait(None))
        while (item := await queue.get()) is not None:
            yield item
        await done


async def under_load(
    url: str | None, streams: int, new_version: str, push: Any
) -> tuple[Any, list[tuple[str, str] | Exception]]:
    """Await ``push`` (a coroutine) while ``streams`` clients stream to ``url``; the load
    ends two replies per client after the first reply from ``new_version``."""
    swapped = asyncio.Event()
    replies: list[tuple[str, str] | Exception] = []

    async def load() -> None:
        if url:
            async for item in hot_swap_load(url, streams, swapped):
                replies.append(item)
                if isinstance(item, tuple) and item[0].endswith(new_version):
                    swapped.set()

    load_task = asyncio.create_task(load())
    if url:
        while len(replies) < min(streams, 10) and not load_task.done():
            await asyncio.sleep(0.1)
    result = await push
    swapped.set()  # (a swap that never happened still ends the load)
    await load_task
    return result, replies


def load_summary(
    replies: list[tuple[str, str] | Exception],
    references: dict[str, set[str]],
    streams: int,
    checked: set[str],
) -> dict[str, Any]:
    """Replies, failures, replies per version, and per checked version the replies that
    are not one of its greedy references."""
    ok = [r for r in replies if isinstance(r, tuple)]
    errors = [str(r) for r in replies if isinstance(r, Exception)]
    by_version: dict[str, int] = {}
    mismatched = {m: 0 for m in sorted(checked)}
    samples: list[tuple[str, str]] = []
    for model, text in ok:
        by_version[model] = by_version.get(model, 0) + 1
        if model in checked and text not in references.get(model, set()):
            mismatched[model] += 1
            if len(samples) < 3:
                samples.append((model, text))
    return {
        "concurrent_streams": streams,
        "replies": len(replies),
        "failed": len(errors),
        "errors": errors[:5],
        "by_version": by_version,
        "not_equal_to_reference": mismatched,
        "references_per_version": {m: len(t) for m, t in references.items()},
        "not_equal_samples": samples,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from edgefleet.model_signing import ManifestSigner, encode_public_key

    scratch = Path(tempfile.mkdtemp(prefix="model-rollout-", dir=args.scratch))
    procs: list[asyncio.subprocess.Process] = []
    try:
        signer = ManifestSigner.load_or_create(scratch / "signing.pem")
        key = encode_public_key(signer.public_key)
        v1, v2 = signed(V1_DIR, signer), signed(V2_DIR, signer)
        v3 = signed(V3_DIR, signer)
        changed = {h: s for h, (_, s) in v2["files"].items() if h not in v1["files"]}
        changed_bytes = sum(changed.values())
        # the origin's store: the signed set layout (export), blobs linked to the artifacts
        origin_store = scratch / "origin"
        from agent.sync.store import ModelStore

        store = ModelStore(origin_store)
        for v in (v1, v2, v3):
            store.put_manifest(v["name"], v["version"], v["manifest"], v["signature"])
            for sha, (path, _) in v["files"].items():
                if not store.blob(sha).exists():
                    os.symlink(path, store.blob(sha))
        origin_proc, origin_info = await start_process(
            "--role", "origin", "--store", str(origin_store)
        )
        procs.append(origin_proc)
        origin = origin_info["url"]
        say(f"origin {origin}; v1 {v1['version']} -> v2 {v2['version']}, "
            f"{changed_bytes / 1e6:.1f} MB changed")  # fmt: skip

        big = max(changed, key=lambda h: changed[h])
        tput = await throughput(origin, big, changed[big], scratch, args.throughput_rounds)
        say(f"throughput: fetcher {tput['fetcher_MBps']:.0f} MB/s, plain copy "
            f"{tput['plain_MBps']:.0f} MB/s ({tput['ratio']:.2f})")  # fmt: skip
        if args.throughput_only:
            return {
                "figures": {"download_throughput": tput, "note": "--throughput-only"},
                "targets": {"download_throughput_ratio": target(
                    round(tput["ratio"], 3), ">= 0.8", tput["ratio"] >= 0.8)},
            }  # fmt: skip

        per_site = [args.agents // args.sites + (1 if i < args.agents % args.sites else 0)
                    for i in range(args.sites)]  # fmt: skip
        real_left = args.real
        sites: list[Site] = []
        for i, count in enumerate(per_site):
            real = min(real_left, max(1, args.real // args.sites) if real_left else 0, count)
            real_left -= real
            proc, info = await start_process(
                "--role", "site", "--site", f"site{i}", "--count", str(count), "--real",
                str(real), "--store-root", str(scratch / "agents"), "--key", key,
                "--threads", str(args.threads),
            )  # fmt: skip
            procs.append(proc)
            sites.append(Site(f"site{i}", proc, info["agents"]))
        real_agents = [a for s in sites for a in s.agents if a["real"]]
        say(f"{args.agents} agents over {args.sites} sites ({len(real_agents)} real agents, "
            f"{args.agents - len(real_agents)} sync-only clients)")  # fmt: skip

        # v1: the fleet's state before the rollout
        t_v1, events_v1 = await rollout(sites, v1, origin, 1, peers=True, self_check=False)
        failed = [e for e in events_v1 if e["error"]]
        if failed:
            raise RuntimeError(f"v1 install failed: {failed[:3]}")
        say(f"v1 on every agent in {t_v1:.1f} s")

        # reference answers of v1 before the rollout
        swap_agent = real_agents[0] if real_agents else None
        swap_url = swap_agent["http_url"] if swap_agent else None
        references: dict[str, set[str]] = {}
        if swap_url:
            await calibrate(swap_url, args.streams, references)

        # the rollout of v2, with one real agent under load
        egress_before = await origin_bytes(origin)
        (t_v2, events_v2), rollout_replies = await under_load(
            swap_url, args.streams, v2["version"],
            rollout(sites, v2, origin, 2, peers=True, self_check=True),
        )  # fmt: skip
        egress_with = await origin_bytes(origin) - egress_before
        say(f"v2 on every agent in {t_v2:.1f} s; coordinator egress {egress_with / 1e6:.1f} MB")
        if swap_url:
            await calibrate(swap_url, args.streams, references)

        # the hot swap checked reply by reply: v2 -> v3 on that agent alone, under load
        swap_replies: list[tuple[str, str] | Exception] = []
        if swap_agent is not None:
            site = next(s for s in sites if swap_agent in s.agents)
            target_v3 = target_json(v3, origin + "/v1/blobs", [])

            async def push_v3() -> list[dict[str, Any]]:
                await site.send({"cmd": "apply", "generation": 3, "self_check": True,
                                 "targets": {swap_agent["id"]: target_v3}})  # fmt: skip
                return await site.events(1)

            swap_events, swap_replies = await under_load(
                swap_url, args.streams, v3["version"], push_v3()
            )
            if swap_events[0]["error"]:
                raise RuntimeError(f"v3 on {swap_agent['id']}: {swap_events[0]['error']}")
            await calibrate(swap_url, args.streams, references)  # type: ignore[arg-type]
            say(f"hot swap v2 -> v3 on {swap_agent['id']}: {len(swap_replies)} replies")

        # without site-local distribution: one site's worth of fresh sync-only clients
        proc, info = await start_process(
            "--role", "site", "--site", "nopeers", "--count", str(per_site[0]), "--real", "0",
            "--store-root", str(scratch / "nopeers"), "--key", key, "--threads", "1",
        )  # fmt: skip
        procs.append(proc)
        nopeers = Site("nopeers", proc, info["agents"])
        before = await origin_bytes(origin)
        t_nopeers, _ = await rollout([nopeers], v2, origin, 1, peers=False, self_check=False)
        egress_without = await origin_bytes(origin) - before
        shutil.rmtree(scratch / "nopeers", ignore_errors=True)

        during = load_summary(rollout_replies, references, args.streams,
                              {f"{NAME}@{v2['version']}"})  # fmt: skip
        swap = load_summary(swap_replies, references, args.streams,
                            {f"{NAME}@{v2['version']}", f"{NAME}@{v3['version']}"})  # fmt: skip
        mismatched = sum(swap["not_equal_to_reference"].values())
        failed_v2 = [e for e in events_v2 if e["error"]]
        per_site_egress = egress_with / args.sites
        checks = [e["self_check_s"] for e in events_v2 if e["self_check_s"] is not None]
        convergence = sorted(e["t"] for e in events_v2)
        figures = {
            "agents": args.agents,
            "sites": args.sites,
            "real_agents": len(real_agents),
            "sync_only_clients": args.agents - len(real_agents),
            "real_agent_config": "models.source=store, engine.max_running=32, max_queue=1024, "
            "max_queue_wait_s=600, cache off, server.max_connections=2048",
            "v1": f"{NAME}@{v1['version']} (the int8 variant)",
            "v2": f"{NAME}@{v2['version']} (the shipped int4)",
            "v3": f"{NAME}@{v3['version']} (the fp32 variant; hot swap on one agent)",
            "changed_bytes": changed_bytes,
            "push_to_all_converged_s": round(t_v2, 2),
            "push_to_half_converged_s": round(
                convergence[len(convergence) // 2] - (convergence[-1] - t_v2), 2
            ),
            "v1_install_s": round(t_v1, 2),
            "agents_failed_v2": [(e["id"], e["error"]) for e in failed_v2],
            "coordinator_egress_bytes_with_peers": egress_with,
            "coordinator_egress_per_site_with_peers": per_site_egress,
            "per_site_egress_over_changed_bytes": round(per_site_egress / changed_bytes, 3),
            "coordinator_egress_one_site_without_peers": egress_without,
            "one_site_without_peers_over_changed_bytes": round(egress_without / changed_bytes, 3),
            "one_site_without_peers_s": round(t_nopeers, 2),
            "download_throughput": tput,
            "self_check_s_on_real_agents": checks,
            "self_check_s_median": percentile(checks, 50) if checks else None,
            "rollout_under_load": during
            | {
                "what": "the v1 -> v2 rollout, one real agent under load; only v2 (int4) "
                "replies are checked against references: v1 (int8, dynamic activation "
                "quantization) writes different greedy text in different batches",
                "references": {m: sorted(t)[:5] for m, t in references.items()},
            },
            "hot_swap": swap
            | {
                "what": f"v2 -> v3 ({NAME}@{v3['version']}, the fp32 variant) on one real "
                "agent alone, under load; every reply checked",
            },
            "note": "controller pushes ModelsSections through the site processes (the "
            "coordinator's push latency is not included)",
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        }
        targets = {
            "per_site_egress_over_changed_bytes": target(
                figures["per_site_egress_over_changed_bytes"], "<= 1.2",
                figures["per_site_egress_over_changed_bytes"] <= 1.2,
            ),
            "download_throughput_ratio": target(
                round(tput["ratio"], 3), ">= 0.8", tput["ratio"] >= 0.8
            ),
            "hot_swap_failed": target(swap["failed"], "== 0",
                                      swap["failed"] == 0 and bool(swap_url)),
            "hot_swap_not_equal_to_reference": target(mismatched, "== 0", mismatched == 0),
            "hot_swap_served_both_versions": target(
                len(swap["by_version"]), "== 2", len(swap["by_version"]) == 2
            ),
            "rollout_under_load_failed": target(during["failed"], "== 0",
                                                during["failed"] == 0 and bool(swap_url)),
            "rollout_under_load_int4_not_equal_to_reference": target(
                sum(during["not_equal_to_reference"].values()), "== 0",
                sum(during["not_equal_to_reference"].values()) == 0,
            ),
            "agents_converged": target(
                len(events_v2) - len(failed_v2), f"== {args.agents}",
                len(events_v2) - len(failed_v2) == args.agents,
            ),
        }  # fmt: skip
        return {"figures": figures, "targets": targets}
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("controller", "origin", "site"), default="controller")
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--real", type=int, default=10, help="real agent apps (with engine)")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="ORT threads per real agent")
    parser.add_argument("--scratch", default=None, help="where the agents' stores go")
    parser.add_argument("--out", default="model_rollout")
    parser.add_argument("--throughput-rounds", type=int, default=7,
                        help="alternated rounds (medians compared)")  # fmt: skip
    parser.add_argument("--throughput-only", action="store_true",
                        help="only the download throughput against a plain copy")  # fmt: skip
    # site / origin roles
    parser.add_argument("--store")
    parser.add_argument("--site")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--store-root")
    parser.add_argument("--key")
    args = parser.parse_args()
    if args.role == "origin":
        asyncio.run(run_origin(Path(args.store)))
        return
    if args.role == "site":
        asyncio.run(run_site(args))
        return
    result = asyncio.run(main_async(args))
    path = write_results(args.out, result["figures"], result["targets"])
    print(json.dumps(result, indent=2))
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
