"""Where the coordinator listens by default, known to both processes.

With TLS on, the coordinator serves the agents' sessions (mutual TLS) on ``grpc_port`` and
``Enroll``/``Route`` (server TLS only) on ``enroll_port``, which defaults to the port after
``grpc_port``. An agent that knows only the session target finds enrollment there too.
"""

from __future__ import annotations

DEFAULT_GRPC_PORT = 50051


def default_enroll_port(grpc_port: int) -> int:
    """The coordinator's enroll port when none is set: the next one (0 stays "any free")."""
    return grpc_port + 1 if 0 < grpc_port < 65535 else 0


def enrollment_target(target: str, *, tls: bool) -> str:
    """The coordinator's Enroll address, given its session ``target`` (``host:port``).

    Without TLS one port serves both. With TLS it is the same host at the default enroll
    port; a target without a port is returned as it is.
    """
    host, sep, port = target.rpartition(":")
    if not tls or not sep or not port.isdigit() or host.endswith(":"):
        return target
    return f"{host}:{default_enroll_port(int(port))}"
