"""Coordinators sharing one database: who is there (table ``coordinators``) and who leads
(table ``leases``), both by the database's clock.

Every time here is the database server's (PostgreSQL's ``clock_timestamp()``; SQLite's
``julianday('now')``, the one machine's clock), never a coordinator's: a member is alive
while its last heartbeat is younger than ``dead_after_s`` as the database measures it, and
a lease is held until ``expires_at`` as the database measures it. Coordinators whose
clocks disagree therefore still agree on who is alive and who leads.

A lease (Temporal's shard fencing): a row per name with its holder, an **epoch** and an
expiry. ``acquire_lease`` is one atomic statement: it renews the lease for its holder
(same coordinator, same process: ``incarnation``) while unexpired, or takes it over once
expired, bumping the epoch whenever the tenure changes (another holder, or the same one
after its lease lapsed). A leader's write carries a :class:`LeaseFence` (name, holder,
epoch): the store applies it only while that lease is still held at that epoch and
unexpired, checked in the write's own statement or transaction under a share lock of the
lease row (so a takeover waits for a fenced write under way, and a fenced write after a
takeover sees it). A leader paused (SIGSTOP, a long GC, a partition) past its expiry and
superseded gets :class:`LeaseLostError` for its writes when it resumes, not merely a lease
that expired.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from coordinator.errors import StoreError

__all__ = [
    "CoordinatorMember",
    "LeaseFence",
    "LeaseLostError",
    "LeaseState",
    "MembershipTable",
]


class LeaseLostError(StoreError):
    """A fenced write was refused: its lease is held by another coordinator now, at a
    newer epoch, or expired (nothing of the write was kept)."""


@dataclass(frozen=True, slots=True)
class CoordinatorMember:
    """One coordinator as the ``coordinators`` table has it."""

    coordinator_id: str
    #: A fresh random value per process start: tells a restart (or a second process
    #: wrongly given the same id) from the same process heartbeating again.
    incarnation: str
    grpc_address: str
    http_address: str
    version: str
    #: Its first heartbeat and its last, by the database's clock (set by the store: what a
    #: caller passes to ``heartbeat_member`` is ignored).
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    #: Whether that heartbeat is younger than ``dead_after_s``, by the database's clock.
    alive: bool = True


@dataclass(frozen=True, slots=True)
class LeaseFence:
    """What a leader's write carries: applied only while ``holder`` still holds ``name``
    at ``epoch``, unexpired."""

    name: str
    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A lease as ``acquire_lease`` left it."""

    name: str
    #: The coordinator holding it now (this one when ``held``), "" when nobody ever did.
    holder: str
    epoch: int
    #: Whether the caller holds it (it was just renewed or taken over).
    held: bool
    #: Seconds until it expires, by the database's clock (<= 0: expired).
    remaining_s: float

    @property
    def fence(self) -> LeaseFence:
        return LeaseFence(self.name, self.holder, self.epoch)


class MembershipTable(Protocol):
    async def heartbeat_member(self, member: CoordinatorMember, dead_after_s: float) -> bool:
        """Record ``member`` as alive now, by the database's clock (its ``started_at``,
        ``heartbeat_at`` and ``alive`` are the store's to set). False, writing nothing,
        when another process (another ``incarnation``) holds this ``coordinator_id`` and
        heartbeat within ``dead_after_s``: two coordinators given one id."""
        ...

    async def list_members(self, dead_after_s: float) -> list[CoordinatorMember]:
        """Every coordinator on record, by id, each ``alive`` when it heartbeat within
        ``dead_after_s`` by the database's clock."""
        ...

    async def remove_member(self, coordinator_id: str, incarnation: str) -> None:
        """Forget this process's row (a clean stop); another incarnation's is kept."""
        ...

    async def acquire_lease(
        self, name: str, holder: str, incarnation: str, duration_s: float
    ) -> LeaseState:
        """In one statement: renew ``name`` for ``holder`` (this ``incarnation``), or take
        it over when it is free or expired (by the database's clock), until
        ``duration_s`` from now; the epoch goes up by one whenever the tenure changes.
        When another holds it unexpired, nothing changes and ``held`` is False."""
        ...

    async def release_lease(self, fence: LeaseFence) -> None:
        """Let the lease expire now when still held at that epoch (a clean stop), so
        another coordinator takes it over at once."""
        ...

    async def lease_valid(self, fence: LeaseFence) -> bool:
        """Whether ``fence`` still holds now, by the database's clock."""
        ...
