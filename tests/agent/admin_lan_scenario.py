"""Run by tests/agent/test_agent_admin.py inside a private network namespace (never on a
real NIC), where 10.77.0.1 is one of the box's addresses (not a loopback one).

A standalone agent bound to that LAN address only (HTTPS with a certificate naming it, API
keys from its keys file) does not listen on loopback; ``python -m agent models list`` run
on the box with the agent's configuration still reaches its admin API, and a wrong token
is still refused. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from coordinator.identity.ca import CertificateAuthority
from devtools.fleet import AgentProcess

LAN = "10.77.0.1"


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "models", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip


async def main(models_dir: str) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="edgefleet-admin-lan-"))
    atexit.register(shutil.rmtree, work, True)
    issued = CertificateAuthority.load_or_create(work / "ca").issue_server([LAN])
    (work / "agent.crt").write_text(issued.cert_pem)
    (work / "agent.key").write_text(issued.key_pem)
    keys_file = work / "keys.json"
    subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file), "--name", "app"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    state = work / "state"
    settings = {
        "EDGEFLEET_AGENT_SERVER__HOST": LAN,
        "EDGEFLEET_AGENT_SERVER__TLS_CERT_FILE": str(work / "agent.crt"),
        "EDGEFLEET_AGENT_SERVER__TLS_KEY_FILE": str(work / "agent.key"),
        "EDGEFLEET_AGENT_AUTH__KEYS_FILE": str(keys_file),
        "EDGEFLEET_AGENT_COORDINATOR__STATE_DIR": str(state),
    }
    agent = AgentProcess(models_dir=models_dir, serve=["tiny-llama"], env=settings,
                         state_dir=state)  # fmt: skip
    async with agent:
        port = agent.url.rsplit(":", 1)[1]
        listed = run_cli({**settings, "EDGEFLEET_AGENT_SERVER__PORT": port}, "list")
        (work / "wrong-token").write_text("x" * 43 + "\n")
        wrong = run_cli(
            {**settings, "EDGEFLEET_AGENT_SERVER__PORT": port},
            "--admin-token-file", str(work / "wrong-token"), "list",
        )  # fmt: skip
        return {
            "agent_url": agent.url,
            "list_rc": listed.returncode,
            "list_out": listed.stdout,
            "list_err": listed.stderr[-2000:],
            "wrong_rc": wrong.returncode,
            "wrong_err": wrong.stderr[-2000:],
        }


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
