"""The committed generated code must be exactly what protos/generate.py makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("fleet_pb2.py", "fleet_pb2.pyi", "fleet_pb2_grpc.py")


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "edgefleet" / "v1" / name).read_bytes()
        != (REPO_ROOT / "edgefleet" / "v1" / name).read_bytes()
    ]
    assert not stale, (
        f"generated code is stale: {stale}; run `python protos/generate.py` and commit the result"
    )


def test_generated_code_imports_under_its_package() -> None:
    from edgefleet.v1 import fleet_pb2 as pb
    from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

    assert pb.DESCRIPTOR.package == "edgefleet.v1"
    assert hasattr(pb_grpc, "CoordinatorStub")
    assert hasattr(pb_grpc, "add_CoordinatorServicer_to_server")
    message = pb.AgentMessage(hello=pb.Hello(agent_id="a-1", site="lab"))
    assert pb.AgentMessage.FromString(message.SerializeToString()).hello.site == "lab"
