"""Overflow: what the agent cannot take goes to a peer at the site, a cloud GPU pool or a
hosted provider (see forwarder.py for the order, retries, failover and continuation;
policy.py for who may leave the site; adapters.py for the wire formats)."""
