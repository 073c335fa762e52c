"""The gRPC side: the servicer and proto conversion."""
