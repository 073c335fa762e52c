"""The model catalog as an operator drives it: a real coordinator process, the
``python -m coordinator models`` CLI over its admin API, the real tiny-llama artifact,
blob downloads resumed with Range, a tampered upload refused, and delete refused while an
agent desires the version."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import wait_until
from edgefleet.model_signing import decode_public_key, manifest_dir, verify_manifest
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc
from tests.coordinator.model_testing import REPO_ROOT, RawAgent

pytestmark = pytest.mark.timeout(120)


def cli(coordinator: CoordinatorProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEFLEET_ADMIN_TOKEN": coordinator.admin_token}
    return subprocess.run(
        [sys.executable, "-m", "coordinator", "models", *args, "--url", coordinator.http_url],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def cli_json(coordinator: CoordinatorProcess, *args: str) -> Any:
    done = cli(coordinator, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
async def test_publish_download_tamper_and_delete_over_the_cli(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    tiny = tiny_artifacts / "tiny-llama"
    manifest = json.loads((tiny / "manifest.json").read_text())
    name, version = manifest["name"], manifest["version"]
    weights = next(f for f in manifest["files"] if f["path"] == "model.onnx")
    async with CoordinatorProcess(data_dir=tmp_path / "data", report_interval_ms=200) as c:
        # Publish the real artifact: every file uploaded once, verified, signed.
        first = cli_json(c, "publish", str(tiny))
        assert first["created"] and first["ref"] == f"{name}@{version}"
        assert first["uploaded_bytes"] == sum(f["size"] for f in manifest["files"])
        # The same files as a second version: nothing to upload.
        second = cli(c, "publish", str(tiny), "--version", "v2")
        assert second.returncode == 0, second.stderr
        assert "0.0 MB uploaded" in second.stdout and "uploading" not in second.stderr
        listing = cli(c, "list")
        assert f"{name}@{version}" in listing.stdout and f"{name}@v2" in listing.stdout
        key = decode_public_key(cli_json(c, "list")["signing_public_key"])
        shown = cli_json(c, "show", f"{name}@v2")
        signed = base64.b64decode(shown["manifest_b64"])
        verify_manifest(key, signed, base64.b64decode(shown["signature_b64"]))
        assert json.loads(signed)["version"] == "v2"

        # A viewer downloads the weights in two parts, resuming with Range.
        url = f"{c.http_url}/v1/blobs/sha256/{weights['sha256']}"
        async with aiohttp.ClientSession(headers=c.admin_headers) as http:
            async with http.get(url, headers={"Range": "bytes=0-1048575"}) as part:
                assert part.status == 206
                head = await part.read()
                etag = part.headers["ETag"]
            async with http.get(url, headers={"Range": f"bytes={len(head)}-",
                                              "If-Range": etag}) as rest:  # fmt: skip
                assert rest.status == 206
                tail = await rest.read()
            assert len(head) + len(tail) == weights["size"]
            assert hashlib.sha256(head + tail).hexdigest() == weights["sha256"]

            # A tampered upload is refused and nothing is kept under that name.
            fake = hashlib.sha256(b"what the operator meant").hexdigest()
            upload = f"{c.http_url}/v1/admin/model-blobs/sha256/{fake}"
            async with http.put(upload, data=b"what an attacker sent") as refused:
                assert refused.status == 400
                assert (await refused.json())["error"]["code"] == "blob_sha256_mismatch"
            async with http.get(f"{c.http_url}/v1/blobs/sha256/{fake}") as gone:
                assert gone.status == 404

        # An agent (loopback development coordinator: no enrollment) is deployed v2.
        channel = grpc.aio.insecure_channel(c.grpc_target)
        agent = RawAgent(pb_grpc.CoordinatorStub(channel), "edge-1", models=[])
        try:
            await wait_until(lambda: agent.welcome is not None, message="welcome")
            assert agent.welcome is not None and agent.welcome.model_signing_key == key
            deployed = cli(c, "deploy", f"{name}@v2")
            assert deployed.returncode == 0, deployed.stderr
            assert "1 agent(s) match; 1 updated now" in deployed.stdout
            await wait_until(lambda: agent.versions() == {name: "v2"}, message="models section")
            # The connected agent may fetch blobs under its own id; a stranger may not.
            async with aiohttp.ClientSession() as http:
                for agent_id, expected in (("edge-1", 206), ("edge-2", 401)):
                    headers = {"Edgefleet-Agent": agent_id, "Range": "bytes=0-9"}
                    async with http.get(url, headers=headers) as response:
                        assert response.status == expected, agent_id

            in_use = cli(c, "delete", f"{name}@v2")
            assert in_use.returncode == 1 and "in use by 2 agent(s) or rule(s)" in in_use.stderr
            assert "edge-1" in in_use.stderr
            # The version nobody desires goes; the blobs it shares with v2 stay.
            deleted = cli_json(c, "delete", f"{name}@{version}")
            assert deleted["deleted"] and deleted["blobs_removed"] == 0

            # Export writes a signed set for an air-gapped site.
            out = tmp_path / "export"
            exported = cli_json(c, "export", "--out", str(out))
            assert exported["versions"] == [f"{name}@v2"] and exported["blobs_written"] == 3
            where = manifest_dir(out, name, "v2")
            verify_manifest(
                decode_public_key((out / "signing-key.pub").read_text()),
                (where / "manifest.json").read_bytes(),
                (where / "manifest.sig").read_bytes(),
            )
        finally:
            await agent.close()
            await channel.close()

        # Each change is in the audit log, with who made it.
        audit = await c.get_json("/v1/admin/audit")
        actions = [(e["action"], e["status"]) for e in audit["data"]]
        assert ("POST /v1/admin/models", 201) in actions
        assert ("PUT /v1/admin/model-blobs/sha256/{sha256}", 400) in actions
        assert ("DELETE /v1/admin/models/{name}/{version}", 409) in actions
        assert ("POST /v1/admin/models/{name}/{version}/deploy", 200) in actions

        # Without a token the CLI is refused, and says so.
        env = {k: v for k, v in os.environ.items() if k != "EDGEFLEET_ADMIN_TOKEN"}
        anonymous = subprocess.run(
            [sys.executable, "-m", "coordinator", "models", "list", "--url", c.http_url],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert anonymous.returncode == 1 and "401" in anonymous.stderr
