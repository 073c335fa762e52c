"""Run by tests/agent/test_mdns.py inside a private network namespace (never on a real NIC).

Starts a real agent advertising on mDNS, discovers it with edgefleet_client, prints JSON.
The agent has no coordinator: it requires API keys from its keys file, made with
``python -m agent keys add`` as a standalone site's operator would; the client sends one.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from zeroconf import IPVersion, Zeroconf

from devtools.fleet import AgentProcess
from edgefleet_client import FleetClient, browse_mdns


def add_key(keys_file: Path) -> str:
    """A new key in ``keys_file`` (``python -m agent keys add``); its secret, printed once."""
    done = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), "--name", "lan"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


async def status_without_key(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/v1/models") as response:
        return response.status


async def main(models_dir: str) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="edgefleet-mdns-"))
    atexit.register(shutil.rmtree, work, True)
    keys_file = work / "keys.json"
    api_key = add_key(keys_file)
    agent = AgentProcess(
        models_dir=models_dir,
        serve=["tiny-llama"],
        agent_id="edge-lan",
        site="shop-7",
        extra_args=[
            "--set", "mdns.enabled=true", "--set", "mdns.interfaces=127.0.0.1",
            "--set", f"auth.keys_file={keys_file}",
        ],
    )  # fmt: skip
    async with agent:
        # another mDNS stack on the client's host (avahi-daemon, another client) holds port
        # 5353 too: the kernel may hand the unicast answer to a browser's first query to it
        neighbour = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        try:
            started = time.monotonic()
            found = await asyncio.to_thread(
                browse_mdns, timeout_s=20.0, interfaces=["127.0.0.1"], model="tiny-llama"
            )
            browse_s = time.monotonic() - started
            missing = await asyncio.to_thread(
                browse_mdns, timeout_s=1.0, interfaces=["127.0.0.1"], model="no-such-model"
            )
            fleet = FleetClient(
                "tiny-llama",
                mdns_interfaces=["127.0.0.1"],
                allow_insecure_agents=True,
                api_key=api_key,
            )
            base_url = await asyncio.to_thread(fleet.base_url)
            # a request through the discovered agent, with the key the client holds
            reply = await asyncio.to_thread(
                fleet.openai(timeout=60).chat.completions.create,
                model="tiny-llama",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
            )
            return {
                "agent_url": agent.url,
                "found": [
                    {
                        "id": a.agent_id,
                        "url": a.url,
                        "site": a.site,
                        "models": list(a.models),
                        "load": a.load,
                        "source": a.source,
                    }
                    for a in found
                ],
                "browse_s": browse_s,
                "missing": len(missing),
                "base_url": base_url,
                "reply_model": reply.model,
                "reply_choices": len(reply.choices),
                "without_key": await status_without_key(agent.url),
            }
        finally:
            neighbour.close()


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
