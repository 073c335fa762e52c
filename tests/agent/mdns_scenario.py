"""Run by tests/agent/test_mdns.py inside a private network namespace (never on a real NIC).

Starts a real agent advertising on mDNS, discovers it with edgefleet_client, prints JSON.
The agent has no coordinator: it requires API keys from its keys file, made with
``python -m agent keys add`` as a standalone site's operator would, and serves HTTPS with a
certificate from the site's CA; the client sends a key and trusts that CA.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
from zeroconf import DNSOutgoing, DNSPointer, IPVersion, Zeroconf
from zeroconf.const import _CLASS_IN, _FLAGS_AA, _FLAGS_QR_RESPONSE, _TYPE_PTR

from coordinator.identity.ca import CertificateAuthority
from devtools.fleet import AgentProcess
from edgefleet_client import FleetClient, browse_mdns
from edgefleet_client._mdns import SERVICE_TYPE
from tests.certs import write_agent_cert


def add_key(keys_file: Path) -> str:
    """A new key in ``keys_file`` (``python -m agent keys add``); its secret, printed once."""
    done = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), "--name", "lan"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def lie(zc: Zeroconf, stop: threading.Event) -> None:
    """Multicast answers naming 40 services of ours with no SRV, TXT or address records
    (what a hostile or broken responder on the LAN can send), until ``stop``."""
    answer = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
    for i in range(40):
        name = f"bogus-{i}.{SERVICE_TYPE}"
        answer.add_answer_at_time(DNSPointer(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN, 120, name), 0)
    while not stop.wait(0.2):
        zc.send(answer)


async def status_without_key(url: str, ca_pem: str) -> int:
    trusted = ssl.create_default_context(cadata=ca_pem)
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + "/v1/models", ssl=trusted) as response,
    ):
        return response.status


async def main(models_dir: str) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="edgefleet-mdns-"))
    atexit.register(shutil.rmtree, work, True)
    keys_file = work / "keys.json"
    api_key = add_key(keys_file)
    # HTTPS, as shipped: the site's own CA issued the agent's certificate, and the client
    # trusts that CA (no coordinator to enroll with)
    ca = CertificateAuthority.load_or_create(work / "ca")
    ca_file = work / "ca.pem"
    ca_file.write_text(ca.cert_pem)
    cert = write_agent_cert(ca, work, "edge-lan")
    agent = AgentProcess(
        models_dir=models_dir,
        serve=["tiny-llama"],
        agent_id="edge-lan",
        site="shop-7",
        extra_args=[
            "--tls", "on",
            "--set", f"server.tls_cert_file={cert.cert}",
            "--set", f"server.tls_key_file={cert.key}",
            "--set", "mdns.enabled=true", "--set", "mdns.interfaces=127.0.0.1",
            "--set", f"auth.keys_file={keys_file}",
        ],
    )  # fmt: skip
    async with agent:
        # another mDNS stack on the client's host (avahi-daemon, another client) holds port
        # 5353 too: the kernel may hand the unicast answer to a browser's first query to it.
        # And it lies: it names 40 services whose records it never gives
        neighbour = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        lying = threading.Event()
        liar = threading.Thread(target=lie, args=(neighbour, lying), daemon=True)
        liar.start()
        try:
            started = time.monotonic()
            found = await asyncio.to_thread(
                browse_mdns, timeout_s=20.0, interfaces=["127.0.0.1"], model="tiny-llama"
            )
            browse_s = time.monotonic() - started
            lying.set()
            missing = await asyncio.to_thread(
                browse_mdns, timeout_s=1.0, interfaces=["127.0.0.1"], model="no-such-model"
            )
            fleet = FleetClient(
                "tiny-llama",
                mdns_interfaces=["127.0.0.1"],
                ca_file=ca_file,
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
                "without_key": await status_without_key(agent.url, ca.cert_pem),
            }
        finally:
            lying.set()
            liar.join()
            neighbour.close()


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
