"""The offline bundle, installed the way a box without containers gets it: in a network
namespace with only loopback (no package index reachable), ``install.sh`` makes a fresh
virtual environment with Debian 12's python3 and ``pip --no-index``; the installed agent
then enrolls with a coordinator over mutual TLS and serves a chat request with an API key
and the real model from the bundle's signed model set (the store's read-only seed, every
signature and sha256 checked at start)."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from edge_images.bundle import build_bundle
from edge_images.model_set import check_signed_set, model_refs
from edge_images.netns import run_in_netns

DEBIAN_PYTHON = "/usr/bin/python3"

SCRIPT = r"""
tar -xf "$BUNDLE"
./edgefleet-bundle/install.sh --prefix "$PWD/opt" --config-dir "$PWD/etc" \
  --models-dir "$PWD/models" --python "$DEBIAN_PYTHON" --no-system
"$PWD/opt/venv/bin/python" -c 'import sys; print("venv-python=%d.%d" % sys.version_info[:2])'
"$PWD/opt/venv/bin/python" -m pip download --no-deps --quiet -d dl onnxruntime >/dev/null 2>&1 \
  && echo "index=reachable" || echo "index=unreachable"
export EDGEFLEET_COORDINATOR_ADMIN_TOKEN=$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
"$DEV_PYTHON" -m coordinator --data-dir "$PWD/coord" --tls on --http-tls off \
  --grpc-port 50051 --http-port 8080 2> coordinator.log &
COORD=$!
trap 'kill $COORD $AGENT 2>/dev/null || true' EXIT
AGENT=""
for _ in $(seq 120); do grep -q "coordinator ready" coordinator.log && break; sleep 0.5; done
JOIN_TOKEN=$("$DEV_PYTHON" -m coordinator tokens create --data-dir "$PWD/coord" \
  --site lab --uses 1 --expires-in 1h --http-url https://localhost:8000)
EDGEFLEET_AGENT_COORDINATOR__TARGET=localhost:50051 \
EDGEFLEET_AGENT_COORDINATOR__CA_FILE="$PWD/coord/ca/ca.pem" \
EDGEFLEET_AGENT_COORDINATOR__JOIN_TOKEN="$JOIN_TOKEN" \
EDGEFLEET_AGENT_COORDINATOR__STATE_DIR="$PWD/state" \
EDGEFLEET_AGENT_IDENTITY__SITE=lab EDGEFLEET_AGENT_IDENTITY__AGENT_ID=lab-bundle \
EDGEFLEET_AGENT_SERVER__PUBLIC_URL=https://localhost:8000 \
  "$PWD/opt/venv/bin/edgefleet-agent" --config "$PWD/etc/agent.toml" 2> agent.log &
AGENT=$!
H="Authorization: Bearer $EDGEFLEET_COORDINATOR_ADMIN_TOKEN"
for _ in $(seq 240); do
  curl -fsS -H "$H" http://127.0.0.1:8080/v1/agents | grep -q '"status": "connected"' && break
  sleep 0.5
done
curl -fsS -H "$H" http://127.0.0.1:8080/v1/agents > fleet.json
API_KEY=$(curl -fsS -H "$H" -H 'Content-Type: application/json' -d '{"name": "lab"}' \
  http://127.0.0.1:8080/v1/admin/keys | sed -n 's/.*"secret": *"\([^"]*\)".*/\1/p')
for _ in $(seq 120); do
  curl -fsS -o /dev/null --cacert coord/ca/ca.pem -H "Authorization: Bearer $API_KEY" \
    https://localhost:8000/v1/models && break
  sleep 0.5
done
curl -fsS --cacert coord/ca/ca.pem https://localhost:8000/v1/chat/completions \
  -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2-135m-instruct", "max_tokens": 16, "temperature": 0,
       "messages": [{"role": "user", "content": "Name the capital of France."}]}' > chat.json
kill -TERM $AGENT; wait $AGENT && echo "agent-exit=0"
"""


def test_bundle_installs_offline_enrolls_and_serves(real_artifacts: Path, tmp_path: Path) -> None:
    if not Path(DEBIAN_PYTHON).exists():
        pytest.fail(f"{DEBIAN_PYTHON} missing: run devtools/system_deps.sh")
    bundle = build_bundle(models=real_artifacts)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "BUNDLE": str(bundle.path),
        "DEBIAN_PYTHON": DEBIAN_PYTHON,
        "DEV_PYTHON": sys.executable,
        # this machine's pip configuration names local indexes; the bundle must not need them
        "PIP_CONFIG_FILE": "/dev/null",
    }
    out = run_in_netns(SCRIPT, cwd=tmp_path, env=env, timeout_s=420)
    facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert facts["venv-python"] == "3.11"
    assert facts["index"] == "unreachable"
    (agent,) = json.loads((tmp_path / "fleet.json").read_text())["data"]
    assert agent["agent_id"] == "lab-bundle" and agent["enrolled"] is True
    assert agent["status"] == "connected" and agent["site"] == "lab"
    reply = json.loads((tmp_path / "chat.json").read_text())
    assert reply["usage"]["completion_tokens"] > 0
    assert "Paris" in reply["choices"][0]["message"]["content"]
    assert facts["agent-exit"] == "0"
    # the installed tree holds the bundle's signed model set, and the config makes it the
    # store's seed with its key trusted; the agent served it in place (nothing copied)
    models = tmp_path / "models"
    assert check_signed_set(models) == model_refs(models)
    [llm] = [r for r in model_refs(models) if r.startswith("smollm2-135m-instruct@")]
    assert reply["model"] == llm
    config = tomllib.loads((tmp_path / "etc" / "agent.toml").read_text())["models"]
    assert config["seed_dir"] == str(models)
    assert config["trusted_keys_file"] == str(models / "signing-key.pub")
    store = tmp_path / "state" / "models"
    assert json.loads((store / "active.json").read_text()) == dict(
        r.split("@") for r in model_refs(models)
    )
    assert list((store / "blobs" / "sha256").iterdir()) == []
    shutil.rmtree(tmp_path / "opt", ignore_errors=True)
