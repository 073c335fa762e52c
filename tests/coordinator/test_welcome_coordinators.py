"""Welcome.coordinators: the gRPC addresses of the coordinators alive now, this one first,
from the cluster membership; addresses nobody can dial left out."""

from __future__ import annotations

import socket

from coordinator.cluster.membership import ClusterMembership, dial_address
from coordinator.store.interface import CoordinatorMember
from tests.coordinator.test_coordinator_service import Running, coordinator, hello

__all__ = ["coordinator"]  # fixture


def member(coordinator_id: str, grpc_address: str, *, alive: bool = True) -> CoordinatorMember:
    return CoordinatorMember(coordinator_id, "i1", grpc_address, "", "1", alive=alive)


def test_dial_addresses_name_a_wildcard_listener_by_the_machine_name() -> None:
    assert dial_address("10.0.0.1", 50051) == "10.0.0.1:50051"
    assert dial_address("0.0.0.0", 50051) == f"{socket.gethostname()}:50051"
    assert dial_address("::", 1) == f"{socket.gethostname()}:1"
    assert dial_address("fd00::2", 1) == "[fd00::2]:1"


def test_the_list_is_this_coordinator_first_then_the_others_alive() -> None:
    own = ["a:50051"]
    cluster = ClusterMembership(
        object(),  # type: ignore[arg-type]  # no store: the members are set below
        "coord-a",
        lease_s=5.0,
        addresses=lambda: (own[0], "https://a:8080"),
    )
    assert cluster.grpc_addresses() == ["a:50051"]  # before the first read: itself
    cluster.members = [
        member("coord-b", "b:50051"),
        member("coord-a", ""),  # its first heartbeat, before gRPC listened
        member("coord-c", "c:50051", alive=False),
        member("coord-d", "0.0.0.0:50051"),  # an older coordinator's wildcard
        member("coord-e", "[::]:50051"),
        member("coord-f", "b:50051"),
        member("coord-g", "g:50051"),
    ]
    assert cluster.grpc_addresses() == ["a:50051", "b:50051", "g:50051"]
    own[0] = ""  # not listening (yet): the others only
    assert cluster.grpc_addresses() == ["b:50051", "g:50051"]


async def test_a_coordinator_alone_lists_itself_in_welcome(coordinator: Running) -> None:
    """SQLite: one coordinator, which its membership lists; Welcome names its gRPC address."""
    call = coordinator.stub.Session()
    await call.write(hello())
    first = await call.read()
    assert first.WhichOneof("body") == "welcome"
    assert list(first.welcome.coordinators) == [coordinator.grpc_target]
    call.cancel()
