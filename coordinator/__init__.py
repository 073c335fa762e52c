"""The fleet coordinator (``python -m coordinator``)."""

from edgefleet.tls import harden_grpc

#: gRPC reads its TLS suites from the environment once, when grpc is first imported: set
#: here, before any coordinator module imports it. False: grpc came first (its defaults).
GRPC_HARDENED = harden_grpc()
