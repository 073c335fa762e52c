"""Every TLS port of the fleet against Mozilla's "intermediate" profile, scanned as an
auditor scans it: sslyze (a tool venv of its own, devtools/sslyze_tool.py) on a
coordinator with TLS on and an agent enrolled with it serving HTTPS (``server.tls = on``),
then a plain Python client that offers only what the profile leaves out."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from agent.https import enrollment_cert_files
from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.sslyze_tool import scan, sslyze_command
from edgefleet.tls import CertFiles

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TINY = "tiny-llama"
#: sslyze validates against public trust stores; the fleet CA is private: always reported.
PRIVATE_CA = "certificate_path_validation"
#: gRPC's key-exchange groups cannot be set from Python (no option; only its suites have a
#: variable): its BoringSSL also accepts P-521 in TLS 1.3 (edgefleet/tls.py, harden_grpc).
GRPC_EXTRA_CURVES = {"secp521r1"}
#: TLS 1.2 suites outside the profile: CBC (the two first were offered)
CBC_ONLY = ":".join(
    ("ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA")
)
AEAD = "ECDHE-ECDSA-AES128-GCM-SHA256"


def host_port(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


def handshake(
    target: str,
    ca_file: Path,
    client: CertFiles,
    version: ssl.TLSVersion,
    *,
    ciphers: str | None = None,
    curve: str | None = None,
) -> str:
    """A TLS handshake with ``target`` offering only what is given; the negotiated suite."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False  # what is tested is the negotiation, not the name
    context.load_cert_chain(client.cert, client.key)  # gRPC's session port requires one
    context.set_alpn_protocols(["h2", "http/1.1"])
    context.minimum_version = context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if curve is not None:
        context.set_ecdh_curve(curve)
    host, port = target.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        suite = tls.cipher()
    assert suite is not None
    return suite[0]


def refused(
    target: str,
    ca_file: Path,
    client: CertFiles,
    version: ssl.TLSVersion,
    *,
    ciphers: str | None = None,
    curve: str | None = None,
) -> bool:
    try:
        handshake(target, ca_file, client, version, ciphers=ciphers, curve=curve)
    except (ssl.SSLError, ConnectionResetError):
        return True
    return False


async def test_every_tls_port_keeps_to_mozillas_intermediate_profile(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    sslyze = await asyncio.to_thread(sslyze_command)  # built once per machine, before any server
    assert sslyze
    async with CoordinatorProcess(tls=True) as coordinator:
        agent: AgentProcess = enrolled_agent(
            coordinator, agent_id="edge-tls", site="lab", state_dir=tmp_path / "agent",
            models_dir=str(tiny_artifacts), serve=[TINY], extra_args=["--threads", "1"],
        )  # fmt: skip
        async with agent:
            ports = {
                "coordinator HTTPS (API, dashboard, blobs)": host_port(coordinator.http_url),
                "coordinator gRPC sessions (mutual TLS)": coordinator.grpc_target,
                "coordinator gRPC enrollment": coordinator.enroll_target,
                "agent HTTPS (API, blobs for peers)": host_port(agent.url),
            }
            assert len(set(ports.values())) == 4, ports
            # the agent's own certificate: the session port completes no handshake without one
            client = enrollment_cert_files(tmp_path / "agent")
            found = await asyncio.to_thread(
                scan, list(ports.values()), tmp_path / "sslyze.json",
                client_cert=(client.cert, client.key),
            )  # fmt: skip
            ca_file = coordinator.ca_file

            names = "\n".join(f"{target}: {name}" for name, target in ports.items())
            report = f"{names}\n{found.output}"
            print(report)
            for name, target in ports.items():
                verdict = found.verdicts.get(target)
                assert verdict is not None, f"{name}: no verdict in\n{found.output}"
                assert verdict.verdict == "FAILED" and PRIVATE_CA in verdict.issues, report
                issues = set(verdict.issues) - {PRIVATE_CA}
                curves = {
                    c["name"]
                    for c in found.results[target]["scan_result"]["elliptic_curves"]["result"][
                        "supported_curves"
                    ]
                }
                if "gRPC" in name:
                    # the one known gap: gRPC's groups, not settable (see GRPC_EXTRA_CURVES)
                    assert curves - {"X25519", "secp256r1", "secp384r1"} <= GRPC_EXTRA_CURVES
                    issues.discard("tls_curves")
                else:
                    assert curves == {"secp256r1"}, f"{name}: {curves}\n{report}"
                assert not issues, f"{name}: not compliant beyond the private CA:\n{report}"

            tls12, tls13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3
            for name, target in ports.items():
                # the profile's own suite and group complete a handshake: the refusals count
                suite = handshake(target, ca_file, client, tls12, ciphers=AEAD, curve="prime256v1")
                assert suite == AEAD, name
                cbc = refused(target, ca_file, client, tls12, ciphers=CBC_ONLY)
                assert cbc, f"{name}: a CBC-only client got in"
                # groups in TLS 1.3 (in TLS 1.2 a client without P-256 is refused anyway: the
                # certificates' P-256 ECDSA keys need it in the client's list)
                for curve in ("secp521r1", "X448"):
                    if curve == "secp521r1" and "gRPC" in name:
                        continue  # the known gRPC gap above
                    only = refused(target, ca_file, client, tls13, curve=curve)
                    assert only, f"{name}: a client offering only {curve} got in"
