"""API keys at the agent: checked locally, in microseconds, on every request.

- ``agent.auth.keys``: ``KeyTable`` (the digests of the valid keys and their scopes, the
  per-key sliding-window rate limits and usage counters) and ``KeyGrant`` (one request's key).
- ``agent.auth.key_files``: the keys file format (``auth.keys_file``, and the last-known
  keys section the agent keeps under its state directory), written atomically, 0600.
- ``agent.auth.middleware``: the aiohttp middleware that refuses requests without a
  valid key before any handler runs.
- ``agent.auth.cli``: ``python -m agent keys add|list|remove`` for a standalone agent's file.
"""

from agent.auth.keys import KeyGrant, KeyTable, secret_digest

__all__ = ["KeyGrant", "KeyTable", "secret_digest"]
