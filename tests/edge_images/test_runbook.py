"""The site runbook (docs/operators/runbook.md), extracted verbatim and run in order: the
coordinator and the agent images started as deployed (podman, read-only root, one state
volume, their own user and entrypoint) in a network namespace with only loopback; the agent
enrolls over mutual TLS, appears in the fleet view and serves a chat request with an API key
and the real model from the signed set baked into the image; a second site's agent, from the
image built with ``--models none``, syncs the version the coordinator publishes and deploys.
Then, on the first running agent: its user, its read-only root, its writable state volume,
its health probe, and a SIGTERM during a streamed request that it finishes before exiting 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from edge_images.images import STATE, UID, ImageBuild
from edge_images.netns import run_in_netns

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operators" / "runbook.md"
MARK = "@@runbook-block-done@@"


def baked_version(image: ImageBuild, name: str) -> str:
    refs = dict(r.split("@") for r in image.labels["io.edgefleet.models"].split(","))
    return refs[name]


def runbook_blocks() -> list[str]:
    """The ```bash blocks between the runbook page's markers, as written."""
    text = RUNBOOK.read_text()
    start, end = text.index("<!-- runbook:start -->"), text.index("<!-- runbook:end -->")
    blocks = re.findall(r"```bash\n(.*?)```", text[start:end], flags=re.S)
    assert len(blocks) >= 4, "the runbook lost its steps"
    return blocks


# After the runbook (harness, not runbook): what the image guarantees, then a graceful stop.
CHECKS = f"""
echo "uid=$(podman exec edgefleet-agent awk '/^Uid:/ {{print $2}}' /proc/1/status)"
if podman exec edgefleet-agent sh -c 'echo x > /opt/edgefleet/probe' 2>/dev/null; then
  echo "root=writable"; else echo "root=read-only"; fi
podman exec edgefleet-agent sh -c 'echo x > {STATE}/probe && rm {STATE}/probe' \\
  && echo "state=writable"
podman exec edgefleet-agent ls {STATE}/agent | tr '\\n' ' ' | sed 's/^/state-files=/'; echo
echo "store-blobs=$(podman exec edgefleet-agent ls {STATE}/agent/models/blobs/sha256 | wc -l)"
echo "store-active=$(podman exec edgefleet-agent cat {STATE}/agent/models/active.json)"
podman healthcheck run edgefleet-agent && echo "health=ok"
curl -sN --cacert ca.pem https://localhost:8000/v1/chat/completions \\
  -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \\
  -d '{{"model": "smollm2-135m-instruct", "max_tokens": 48, "stream": true, "temperature": 0,
       "messages": [{{"role": "user", "content": "Tell me about Paris."}}]}}' > stream.out &
CURL=$!
for _ in $(seq 200); do grep -q '^data: ' stream.out && break; sleep 0.05; done
podman kill --signal TERM edgefleet-agent > /dev/null
wait $CURL
echo "exit=$(podman wait edgefleet-agent)"
"""
# the containers' last lines on stderr (in the failure's message when a step fails)
LOGS = "; ".join(
    f'podman logs --tail 15 {c} 2>&1 | sed "s/^/{c}: /" >&2'
    for c in ("edgefleet-coordinator", "edgefleet-agent", "edgefleet-agent-sync")
)
CLEANUP = (
    "podman rm -f -t 5 edgefleet-agent edgefleet-agent-sync edgefleet-coordinator "
    ">/dev/null 2>&1 || true; podman volume rm -f edgefleet-state edgefleet-state-sync "
    "edgefleet-coordinator >/dev/null 2>&1 || true"
)


def test_runbook_enrolls_and_serves_then_drains_on_sigterm(
    agent_image: ImageBuild,
    empty_agent_image: ImageBuild,
    coordinator_image: ImageBuild,
    real_artifacts: Path,
    podman: dict[str, str],
    tmp_path: Path,
) -> None:
    blocks = runbook_blocks()
    script = (
        f"{CLEANUP}\ntrap '{LOGS}; {CLEANUP}' EXIT\n"
        + "".join(f"{b}\necho {MARK}\n" for b in blocks)
        + CHECKS
    )
    env = {**podman, "AGENT_IMAGE": agent_image.ref, "COORDINATOR_IMAGE": coordinator_image.ref,
           "EMPTY_AGENT_IMAGE": empty_agent_image.ref, "MODELS": str(real_artifacts)}  # fmt: skip
    out = run_in_netns(script, cwd=tmp_path, env=env, timeout_s=840)
    parts = out.split(MARK)
    assert len(parts) == len(blocks) + 1
    # step 3: the fleet view lists the agent, enrolled (its session is mutual TLS), at the
    # site and place the operator fixed on the token
    fleet = json.loads(parts[3].strip())
    (agent,) = fleet["data"]
    assert agent["agent_id"] == "store-042-a"
    assert agent["status"] == "connected" and agent["enrolled"] is True
    assert agent["site"] == "store-042"
    assert agent["location"] == {"lat": 48.8566, "lon": 2.3522}
    assert agent["http_url"] == "https://localhost:8000"
    assert {m["name"] for m in agent["models"]} == {"smollm2-135m-instruct", "all-minilm-l6-v2"}
    # step 4: the chat request, with the key, answered by the real model
    reply = json.loads(parts[4].strip())
    assert reply["object"] == "chat.completion"
    assert (
        reply["model"]
        == f"smollm2-135m-instruct@{baked_version(agent_image, 'smollm2-135m-instruct')}"
    )
    assert reply["usage"]["completion_tokens"] > 0
    assert reply["choices"][0]["message"]["content"].strip()
    # step 5: the empty image synced the published version (signed by the coordinator)
    # into its store and serves it
    synced = json.loads(parts[5].strip().splitlines()[-1])
    assert synced["model"] == "smollm2-135m-instruct@site-1"
    assert "Paris" in synced["choices"][0]["message"]["content"]
    facts = dict(
        line.split("=", 1)
        for line in parts[len(blocks)].splitlines()
        if re.match(r"^[a-z-]+=", line)
    )
    assert facts["uid"] == str(UID)  # the entrypoint runs as the image's user
    assert facts["root"] == "read-only"
    assert facts["state"] == "writable"
    assert {"agent.key", "agent.crt", "enrollment.json", "models"} <= set(
        facts["state-files"].split()
    )
    # the model store on the state volume serves the image's signed set in place: each
    # version adopted (and verified: signature, every sha256) with no file copied
    baked = dict(r.split("@") for r in agent_image.labels["io.edgefleet.models"].split(","))
    assert json.loads(facts["store-active"]) == baked
    assert facts["store-blobs"] == "0"
    assert facts["health"] == "ok"
    # SIGTERM mid-stream: the stream was finished, then the agent exited 0
    stream = (tmp_path / "stream.out").read_text()
    assert stream.rstrip().endswith("data: [DONE]"), stream[-500:]
    chunks = [ln for ln in stream.splitlines() if ln.startswith("data: {")]
    assert len(chunks) > 3
    assert facts["exit"] == "0"
