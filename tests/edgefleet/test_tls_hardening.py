"""The fleet's TLS profile without a scanner (tests/e2e/test_tls_profile.py scans the real
ports with sslyze): what a server context offers, and gRPC's suites set before its import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from coordinator.identity.ca import CertificateAuthority
from edgefleet.tls import GRPC_CIPHER_SUITES, GRPC_CIPHER_SUITES_ENV, server_context
from tests.certs import write_agent_cert

REPO = Path(__file__).resolve().parents[2]


def test_a_server_context_offers_tls12_and_13_aead_suites_only(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    context = server_context(write_agent_cert(ca, tmp_path, "edge-1"))
    suites = context.get_ciphers()
    assert {s["protocol"] for s in suites} == {"TLSv1.2", "TLSv1.3"}
    assert all(s["aead"] for s in suites), [s["name"] for s in suites if not s["aead"]]
    tls12 = [s for s in suites if s["protocol"] == "TLSv1.2"]
    assert {s["kea"] for s in tls12} == {"kx-ecdhe"}
    assert context.minimum_version == context.minimum_version.TLSv1_2


def _grpc_suites_in_a_coordinator_process(environ: dict[str, str]) -> dict[str, object]:
    code = (
        "import json, os; import coordinator.rpc.service; from coordinator import GRPC_HARDENED;"
        f"print(json.dumps([os.environ.get({GRPC_CIPHER_SUITES_ENV!r}), GRPC_HARDENED]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=environ,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    suites, hardened = json.loads(done.stdout)
    return {"suites": suites, "hardened": hardened}


def test_the_coordinator_sets_grpcs_suites_before_grpc_is_imported() -> None:
    environ = {k: v for k, v in os.environ.items() if k != GRPC_CIPHER_SUITES_ENV}
    seen = _grpc_suites_in_a_coordinator_process(environ)
    assert seen == {"suites": GRPC_CIPHER_SUITES, "hardened": True}
    # an operator's own list stands
    mine = "TLS_AES_256_GCM_SHA384:ECDHE-ECDSA-AES256-GCM-SHA384"
    seen = _grpc_suites_in_a_coordinator_process({**environ, GRPC_CIPHER_SUITES_ENV: mine})
    assert seen == {"suites": mine, "hardened": True}
