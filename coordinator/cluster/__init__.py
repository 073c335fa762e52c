"""Coordinators sharing one fleet database: membership (heartbeats by the database's clock)
and the leader lease with its epoch (``membership.py``)."""
