"""The operator commands over the admin HTTP API."""
