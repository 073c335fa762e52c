"""The agent's control plane: its session with the coordinator.

- ``agent.control.session``: ``CoordinatorSession``, the long-lived gRPC stream (Hello,
  load reports, desired state and commands).
- ``agent.control.reconnect``: when to try again after the coordinator went away.

What travels on the session is the shared contract (``edgefleet.contract``), converted
to and from protobuf by ``edgefleet.contract_pb``.
"""

from agent.control.session import CoordinatorSession, IdentityProvider, LoadProvider

__all__ = ["CoordinatorSession", "IdentityProvider", "LoadProvider"]
