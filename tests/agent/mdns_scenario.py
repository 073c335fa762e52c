"""Run by tests/agent/test_mdns.py inside a private network namespace (never on a real NIC).

Starts a real agent advertising on mDNS, discovers it with edgefleet_client, prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from devtools.fleet import AgentProcess
from edgefleet_client import FleetClient, browse_mdns


async def main(models_dir: str) -> dict[str, object]:
    agent = AgentProcess(
        models_dir=models_dir,
        serve=["tiny-llama"],
        agent_id="edge-lan",
        site="shop-7",
        extra_args=["--set", "mdns.enabled=true", "--set", "mdns.interfaces=127.0.0.1"],
    )
    async with agent:
        found = await asyncio.to_thread(
            browse_mdns, timeout_s=2.0, interfaces=["127.0.0.1"], model="tiny-llama"
        )
        missing = await asyncio.to_thread(
            browse_mdns, timeout_s=1.0, interfaces=["127.0.0.1"], model="no-such-model"
        )
        fleet = FleetClient(
            "tiny-llama",
            mdns_timeout_s=2.0,
            mdns_interfaces=["127.0.0.1"],
            allow_insecure_agents=True,
        )
        base_url = await asyncio.to_thread(fleet.base_url)
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
            "missing": len(missing),
            "base_url": base_url,
        }


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
