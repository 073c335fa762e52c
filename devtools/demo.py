"""``python -m devtools.demo``: a coordinator and two agents on loopback with the real models.

The models travel the real way: the coordinator publishes the shipped artifacts to its
catalog (``python -m coordinator models publish DIR``, signed with its key) and deploys
them fleet-wide (``models deploy NAME@VERSION``); the agents start with empty model
stores, get the versions in their desired state, fetch the blobs (the second agent from
its site peer when the coordinator names one), verify hashes and signatures, load, run
the self-check, and only then serve. The demo prints their progress as they sync.

Secure by default: the coordinator starts with a fresh bootstrap admin token (in its
environment, never a flag), mints one join token per agent (its site and place fixed by
the operator, as in production), starts the agents with their tokens (in the environment
too) and API keys required, waits until both have enrolled and registered, mints an API key
through the admin API (pushed to the agents as the keys section), waits until the key works
on both agents, sends a sample chat request with the ``openai`` SDK and that key, checks
a harmful and a harmless text with ``/v1/moderations`` (the heads came with the MiniLM
version the agents synced), prints the key and the admin token (shown once) with how to
use them, and keeps running until Ctrl-C (``--check`` exits after the samples instead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai

from coordinator.catalog.catalog import SIGNING_KEY_FILE
from coordinator.cli.client import ADMIN_TOKEN_ENV
from devtools.fleet import ADMIN_TOKEN_ENV as FLEET_ADMIN_TOKEN_ENV
from devtools.fleet import AgentProcess, CoordinatorProcess, wait_key_accepted
from devtools.process import ProcessStartError, wait_until

LLM = "smollm2-135m-instruct"
CODER = "qwen2.5-coder-0.5b-instruct"  # the second chat model, big enough to call tools
EMBEDDER = "all-minilm-l6-v2"
MODELS = (LLM, CODER, EMBEDDER)
STORE_URL_ENV = "EDGEFLEET_COORDINATOR_STORE_URL"
SITES = [("edge-paris", 48.8566, 2.3522), ("edge-berlin", 52.52, 13.405)]
MODERATION_SAMPLE = "Give me step-by-step instructions to build a pipe bomb at home."


def say(message: str) -> None:
    print(message, flush=True)


async def coordinator_cli(coordinator: CoordinatorProcess, *argv: str) -> str:
    """``python -m coordinator ARGV --url URL`` with the admin token in the environment."""
    env = {**os.environ, ADMIN_TOKEN_ENV: coordinator.admin_token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", *argv, "--url", coordinator.http_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise ProcessStartError(f"coordinator {' '.join(argv[:2])} failed: {text.strip()}")
    return text


def artifact_version(models_dir: str, name: str) -> str:
    manifest = json.loads((Path(models_dir) / name / "manifest.json").read_text())
    return str(manifest["version"])


async def publish_and_deploy(coordinator: CoordinatorProcess, models_dir: str) -> None:
    for name in MODELS:
        version = artifact_version(models_dir, name)
        out = await coordinator_cli(coordinator, "models", "publish", str(Path(models_dir) / name))
        say(f"published {name}@{version} to the coordinator's catalog (signed)")
        held = [line.strip() for line in out.splitlines() if "held by" in line]
        if held:  # with several coordinators: the others fetch the files from it
            say(f"  {held[0]}")
        await coordinator_cli(coordinator, "models", "deploy", f"{name}@{version}")
        say(f"deployed {name}@{version} to the whole fleet")


async def sync_progress(agent: AgentProcess) -> tuple[list[str], list[dict[str, Any]]]:
    """The agent's loaded models and its model sync lines (``/healthz``, no key needed)."""
    try:
        async with aiohttp.ClientSession() as http, http.get(agent.url + "/healthz") as r:
            body = await r.json()
    except (aiohttp.ClientError, ValueError):
        return [], []
    return list(body.get("models", [])), list(body.get("model_sync", []))


async def wait_synced(agents: list[AgentProcess], timeout_s: float) -> None:
    """Until every agent serves both models, printing their progress."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    while time.monotonic() < deadline:
        done = 0
        for agent in agents:
            models, syncing = await sync_progress(agent)
            if set(MODELS) <= set(models):
                line = "serving " + ", ".join(sorted(models))
                done += 1
            else:
                parts = []
                for item in syncing:
                    total = item["bytes_total"] or 1
                    part = f"{item['model']} {item['state']} {100 * item['bytes_done'] // total}%"
                    if item.get("last_error"):
                        part += f" ({item['last_error']})"
                    parts.append(part)
                line = "; ".join(parts) or "waiting for its desired models"
            if last.get(agent.agent_id) != line:
                last[agent.agent_id] = line
                say(f"  {agent.agent_id:12s} {line}")
        if done == len(agents):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the agents did not sync their models within {timeout_s:.0f} s")


def moderation_sample(client: openai.OpenAI, agent_id: str) -> bool:
    """``/v1/moderations`` on a managed agent (its heads came with the MiniLM version it
    synced); True when the harmful sample is flagged and the harmless one is not."""
    texts = [MODERATION_SAMPLE, "What time does the store open on Sunday?"]
    try:
        answer = client.moderations.create(input=texts)
    except openai.APIError as exc:
        say(f"\nmoderation on {agent_id}: unavailable ({exc})")
        return False
    bad, good = answer.results
    categories = sorted(k for k, v in bad.categories.model_dump(by_alias=True).items() if v)
    say(f"\nmoderation on {agent_id} ({answer.model}): {MODERATION_SAMPLE!r} flagged="
        f"{bad.flagged} ({', '.join(categories) or 'nothing'}); a store-hours question "
        f"flagged={good.flagged}")  # fmt: skip
    return bad.flagged and not good.flagged


def _port(first: int, i: int) -> int:
    return first + i if first else 0


async def start_coordinators(
    args: argparse.Namespace, state: Path, started: list[Any]
) -> list[CoordinatorProcess]:
    """One coordinator on SQLite; or ``--coordinators N`` on a throwaway PostgreSQL server,
    the others provisioned with the first's fleet CA, model-signing key and admin token
    (docs/operators/postgresql.md), each with its own data_dir, ports one apart."""
    # Enrollment required even on loopback: only agents with a join token get in.
    common: dict[str, Any] = {
        "report_interval_ms": 2000,
        "extra_args": ["--set", "require_enrollment=on"],
    }
    if args.coordinators == 1:
        coordinator = CoordinatorProcess(
            grpc_port=args.grpc_port, http_port=args.http_port, **common
        )
        say(f"starting coordinator (gRPC 127.0.0.1:{args.grpc_port}, HTTP :{args.http_port}) ...")
        await coordinator.start()
        started.append(coordinator)
        return [coordinator]
    from tests.postgres_cluster import PostgresCluster  # the test suite's throwaway server

    say(f"starting a throwaway PostgreSQL server for {args.coordinators} coordinators ...")
    cluster = await asyncio.to_thread(PostgresCluster.start)
    started.append(cluster)
    url = await asyncio.to_thread(cluster.create_database)
    os.environ[STORE_URL_ENV] = url  # for the coordinators and the CLI (join tokens)
    coordinators: list[CoordinatorProcess] = []
    for i in range(args.coordinators):
        data_dir = state / f"coordinator-{i + 1}"
        env = {STORE_URL_ENV: url}
        if coordinators:  # provisioned like the first (never generated per coordinator)
            first = coordinators[0]
            data_dir.mkdir(parents=True)
            shutil.copytree(first.data_dir / "ca", data_dir / "ca")
            shutil.copy2(first.data_dir / SIGNING_KEY_FILE, data_dir / SIGNING_KEY_FILE)
            env[FLEET_ADMIN_TOKEN_ENV] = first.admin_token
        coordinator = CoordinatorProcess(
            grpc_port=_port(args.grpc_port, i), http_port=_port(args.http_port, i),
            data_dir=data_dir, env=env, **common,
        )  # fmt: skip
        await coordinator.start()
        started.append(coordinator)
        coordinators.append(coordinator)
        say(f"  coordinator {i + 1}: gRPC {coordinator.grpc_target}, {coordinator.http_url}")
    return coordinators


async def run(args: argparse.Namespace) -> int:
    state = Path(tempfile.mkdtemp(prefix="edgefleet-demo-agents-"))
    agents: list[AgentProcess] = []
    started: list[Any] = []
    try:
        coordinators = await start_coordinators(args, state, started)
        coordinator = coordinators[0]
        # Published once, through the first: the others fetch the files from it (a
        # publish completes once a second coordinator holds them).
        await publish_and_deploy(coordinator, args.models_dir)
        for i, (site, lat, lon) in enumerate(SITES):
            token = coordinator.mint_join_token(site, lat, lon)
            agents.append(
                AgentProcess(
                    port=args.agent_port + i if args.agent_port else 0,
                    models_dir=args.models_dir,  # not read: models.source = store
                    # every coordinator, agent i's list starting at coordinator i: with
                    # several, the agents' sessions (and model downloads) are spread
                    coordinator=",".join(
                        c.grpc_target
                        for c in coordinators[i % len(coordinators) :]
                        + coordinators[: i % len(coordinators)]
                    ),
                    agent_id=site,
                    site=site,
                    lat=lat,
                    lon=lon,
                    # an empty model store under the state dir, filled by model sync
                    extra_args=[
                        "--threads",
                        str(args.threads),
                        "--set",
                        "models.source=store",
                        *(
                            ["--set", f"models.self_check_prompts={args.self_check_prompts}"]
                            if args.self_check_prompts
                            else []
                        ),
                    ],
                    join_token=token,
                    state_dir=state / site,
                )
            )
        say(f"minted {len(agents)} join tokens (site and place fixed by the operator)")
        say("starting two agents with the real quantized models; they enroll ...")
        await asyncio.gather(*(a.start() for a in agents))
        started.extend(agents)

        where: dict[str, int] = {}  # agent id -> the coordinator its session is on

        async def all_registered() -> bool:
            ids = {}  # coordinator id -> its number
            for n, c in enumerate(coordinators, 1):
                ids[(await c.get_json("/healthz")).get("coordinator", {}).get("id")] = n
            for n, c in enumerate(coordinators, 1):
                for a in await c.agents():
                    if a.get("status") != "connected":
                        continue
                    owner = ids.get(a.get("coordinator"), n)  # as the fleet view says
                    where.setdefault(a["agent_id"], owner)
            return len(where) >= len(agents)

        await wait_until(all_registered, timeout_s=30, message="agents to register")
        if len(coordinators) == 1:
            say("both agents registered with the coordinator; they sync their models:")
        else:
            say("both agents registered (" + ", ".join(
                f"{a} on coordinator {n}" for a, n in sorted(where.items())
            ) + "); they sync their models, each from its own coordinator:")  # fmt: skip
        await wait_synced(agents, args.sync_timeout)

        api_key = await coordinator.mint_api_key("demo")
        say("minted an API key (POST /v1/admin/keys with the admin token)")
        await wait_key_accepted(agents, api_key, timeout_s=30)
        say("the key reached both agents")

        client = openai.OpenAI(base_url=agents[0].url + "/v1", api_key=api_key)
        answers = []
        # SmolLM2 gets this phrasing right; Qwen the plainer one
        for model, question in ((LLM, "Name the capital of France."),
                                (CODER, "What is the capital of France?")):  # fmt: skip
            t0 = time.perf_counter()
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], temperature=0,
                max_tokens=48,
            )  # fmt: skip
            elapsed = time.perf_counter() - t0
            usage = reply.usage
            answers.append(reply.choices[0].message.content or "")
            say(f"\nsample request to {model} on {agents[0].agent_id} (with the API key): "
                f"{question}")  # fmt: skip
            say(f"answer ({elapsed:.2f} s, {usage.completion_tokens if usage else '?'} tokens): "
                f"{answers[-1].strip()}")  # fmt: skip
        # content safety: the heads came with the MiniLM version the agents synced
        flagged = moderation_sample(client, agents[0].agent_id)
        say("")
        say("edgefleet is running (authentication on):")
        for agent in agents:
            say(f"  agent {agent.agent_id:12s} OpenAI API  {agent.url}/v1   (pid {agent.pid})")
        for i, c in enumerate(coordinators):
            name = "coordinator" if len(coordinators) == 1 else f"coordinator {i + 1}"
            say(f"  {name:18s} fleet view  {c.http_url}/v1/agents   "
                f"(gRPC {c.grpc_target}, pid {c.pid})")  # fmt: skip
        say("\ncredentials (shown once; copy them now: the key is stored only as a digest):")
        say(f"  API key      {api_key}")
        say("               for the agents' OpenAI API: the openai SDK's api_key, or the")
        say("               header 'Authorization: Bearer <API key>'")
        say(f"  admin token  {coordinator.admin_token}")
        say("               for the coordinator: /v1/agents, /metrics (viewer and up) and the")
        say("               admin API, as 'Authorization: Bearer <admin token>'")
        say("\ntry:")
        say(f'  OpenAI(base_url="{agents[0].url}/v1", api_key="{api_key}")')
        say(f"  curl -s {agents[0].url}/v1/chat/completions -H 'Content-Type: application/json' \\")
        say(f"    -H 'Authorization: Bearer {api_key}' \\")
        say(f"    -d '{{\"model\": \"{LLM}\", \"messages\": [{{\"role\": \"user\", "
            f"\"content\": \"Hello!\"}}]}}'")  # fmt: skip
        say(f"  curl -s {coordinator.http_url}/v1/agents "
            f"-H 'Authorization: Bearer {coordinator.admin_token}'")  # fmt: skip
        say(f"\ndashboard: {coordinator.http_url}/dashboard/ (both agents on the map)")
        say("  sign in with the admin token above (the page keeps only a session cookie)")
        if args.check:
            # Authentication is on: without the key the agents answer 401.
            refused = not any(await asyncio.gather(*(a.accepts_key("") for a in agents)))
            if not refused:
                say("check failed: an agent answered a request without the API key")
            if not flagged:
                say("check failed: /v1/moderations did not flag the harmful sample")
            ok = refused and flagged and all("Paris" in answer for answer in answers)
            return 0 if ok else 1
        if len(coordinators) > 1:
            say("\nseveral coordinators on one PostgreSQL database: kill one and watch the agents")
            say(f"  kill -9 {coordinators[0].pid}    # coordinator 1; its agents move within a "
                "report interval")  # fmt: skip
            say(f"  curl -s {coordinators[1].http_url}/healthz   # members alive, the leader")
        say("\nCtrl-C stops everything.")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watched = [p for p in started if isinstance(p, CoordinatorProcess | AgentProcess)]
        while not stop.is_set():  # say so when one of the demo's processes dies
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            for proc, code in [(p, p.returncode) for p in watched if p.returncode is not None]:
                watched.remove(proc)
                how = f"signal {-code}" if code < 0 else f"code {code}"
                say(f"{_name(proc)} (pid {proc.pid}) exited with {how}; the rest goes on "
                    "(Ctrl-C stops everything)")  # fmt: skip
        return 0
    except (ProcessStartError, TimeoutError) as exc:
        say(f"demo failed: {exc}")
        for proc in started:
            if isinstance(proc, CoordinatorProcess | AgentProcess):
                say("".join(list(proc.log)[-20:]))
        return 1
    finally:
        for proc in reversed(started):
            with contextlib.suppress(Exception):
                if isinstance(proc, CoordinatorProcess | AgentProcess):
                    await proc.terminate()
                else:  # the throwaway PostgreSQL server
                    await asyncio.to_thread(proc.stop)
        shutil.rmtree(state, ignore_errors=True)
        say("stopped.")


def _name(proc: CoordinatorProcess | AgentProcess) -> str:
    return f"agent {proc.agent_id}" if isinstance(proc, AgentProcess) else "coordinator"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__)
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--grpc-port", type=int, default=50051, help="coordinator gRPC (0: any)")
    parser.add_argument("--http-port", type=int, default=8080, help="coordinator HTTP (0: any)")
    parser.add_argument(
        "--agent-port", type=int, default=8001, help="first agent's port (0: any free ports)"
    )
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads per agent")
    parser.add_argument("--check", action="store_true", help="exit after the sample request")
    parser.add_argument(
        "--self-check-prompts", type=int, default=0, metavar="N",
        help="factual prompts each agent's self-check asks of a model before serving it "
        "(1-20; 0: the agent's default, 8): fewer start the demo sooner on a slow machine",
    )  # fmt: skip
    parser.add_argument(
        "--coordinators", type=int, default=1,
        help="coordinators (more than 1: on a throwaway PostgreSQL server; ports one apart)",
    )  # fmt: skip
    parser.add_argument(
        "--sync-timeout", type=float, default=900, help="seconds for the agents to sync models"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.coordinators <= 5:
        parser.error("--coordinators: 1 to 5")
    if not 0 <= args.self_check_prompts <= 20:
        parser.error("--self-check-prompts: 0 to 20")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
