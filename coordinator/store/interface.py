"""The store's interface: ``FleetStore``, every table the coordinator keeps, as async methods.

Each resource has its module in ``coordinator/store/`` with its records and its table
protocol (``join_tokens``, ``agents``, ``api_keys``, ``generations``, ``last_state``,
``admin_tokens``, ``audit``, ``catalog``, ``assignments``, ``request_records``,
``rollouts``, ``membership``); ``FleetStore`` is all of them plus opening, closing and backing up.
``coordinator.store.sqlite.SQLiteFleetStore`` is the default implementation. Every method
is one statement or one transaction, awaited: a backend runs them off the event loop
(SQLite on a thread of its own) and bounds each by a statement timeout (StoreError
beyond it). Callers get records (frozen dataclasses), never rows, cursors or
connections. Live state (sessions, load reports) goes through the store only as a
periodic, batched snapshot (``AgentLastState``), so that a restarted coordinator can keep
routing to the agents it knew until they reconnect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from coordinator.errors import StoreError
from coordinator.store.admin_tokens import AdminTokenRecord, AdminTokenTable
from coordinator.store.agents import AgentTable, Site, StoredAgent
from coordinator.store.api_keys import ApiKeyRecord, ApiKeyTable
from coordinator.store.assignments import AssignmentRecord, AssignmentTable, RuleRecord
from coordinator.store.audit import AuditEntry, AuditTable
from coordinator.store.catalog import CatalogTable, CatalogVersion
from coordinator.store.changes import ChangeTable
from coordinator.store.generations import GenerationTable
from coordinator.store.join_tokens import JoinToken, JoinTokenTable
from coordinator.store.key_demand import KeyDemandTable
from coordinator.store.last_state import AgentLastState, LastStateTable
from coordinator.store.membership import (
    CoordinatorMember,
    LeaseFence,
    LeaseLostError,
    LeaseState,
    MembershipTable,
)
from coordinator.store.ownership import OwnershipTable
from coordinator.store.request_records import RequestRecord, RequestRecordTable
from coordinator.store.rollouts import RolloutTable, StoredRollout

__all__ = [
    "AdminTokenRecord",
    "AgentLastState",
    "ApiKeyRecord",
    "AssignmentRecord",
    "AuditEntry",
    "CatalogVersion",
    "CoordinatorMember",
    "FleetStore",
    "JoinToken",
    "LeaseFence",
    "LeaseLostError",
    "LeaseState",
    "RequestRecord",
    "RuleRecord",
    "Site",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "StoredAgent",
    "StoredRollout",
]


class StoreUnavailableError(StoreError):
    """The database did not answer: unreachable, restarting, or too slow (a call that is
    worth trying again later, unlike one the database refused)."""


class StoreTimeoutError(StoreUnavailableError):
    """A store call ran past its statement timeout and was stopped (nothing of it kept)."""


class FleetStore(
    JoinTokenTable,
    AgentTable,
    ApiKeyTable,
    GenerationTable,
    LastStateTable,
    AdminTokenTable,
    AuditTable,
    CatalogTable,
    AssignmentTable,
    RequestRecordTable,
    RolloutTable,
    MembershipTable,
    ChangeTable,
    KeyDemandTable,
    OwnershipTable,
    Protocol,
):
    """Durable coordinator state. Awaited methods; none blocks the event loop."""

    async def open(self) -> None:
        """Connect and bring the schema up to date (idempotent); StoreError when the
        database cannot be opened or was written by a newer coordinator."""
        ...

    async def close(self) -> None:
        """Finish the calls under way and disconnect (idempotent)."""
        ...

    async def ping(self) -> None:
        """One cheap round trip to the database (``SELECT 1``); StoreError when it fails."""
        ...

    async def backup_to(self, path: Path) -> int:
        """Write a consistent copy of the whole store to ``path`` (while in use); the
        copy's schema version."""
        ...
