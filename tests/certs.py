"""Fleet certificates for tests: an agent's certificate and key issued by a test CA and
written where TLS contexts load them."""

from __future__ import annotations

from pathlib import Path

from coordinator.identity.ca import CertificateAuthority
from edgefleet.tls import CertFiles, write_atomically


def write_agent_cert(
    ca: CertificateAuthority, directory: Path, agent_id: str, host: str = "127.0.0.1"
) -> CertFiles:
    """Issue ``agent_id`` a fleet certificate for ``host``; its files in ``directory``.
    (tests/client/key_leak_replay.py keeps its own copy: it runs as a script against
    other trees.)"""
    issued = ca.issue_client(agent_id, server_names=[host])
    files = CertFiles(directory / f"{agent_id}.crt", directory / f"{agent_id}.key")
    write_atomically(files.key, issued.key_pem, private=True)
    write_atomically(files.cert, issued.cert_pem)
    return files
