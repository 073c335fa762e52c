"""This coordinator among those sharing its database: its heartbeat, who else is alive, and
whether it holds the leader lease.

``ClusterMembership.step()`` runs every ``coordinator_heartbeat_s`` (a ``periodic_task``
owned by the app's ``cleanup_ctx``): it records this coordinator as alive (id, addresses,
version), renews or takes over the ``"leader"`` lease (coordinator/store/membership.py: an
epoch bumped on every change of tenure, expiry by the database's clock) and reads the
members back. On SQLite there is one coordinator: it lists itself and always leads.

Whether this coordinator leads is decided conservatively on its own monotonic clock: from
the moment it *sent* the renewal, for the lease's remaining time as the database measured
it. A coordinator paused past that (SIGSTOP, a stalled host) knows at once on waking that
it no longer leads, before it hears from the database; and a write it makes as leader
carries ``fence`` (the lease's name, holder and epoch), which the database refuses once
another coordinator took over (``LeaseLostError``), whatever this one believes.

What runs under the lease (issue 24): the rollout engine (its writes carry ``fence``;
coordinator/rollouts/engine.py) and the fleet-wide housekeeping (coordinator/app.py
``_leader_jobs``: pruning the change feed and request records, forgetting never-enrolled
agents long gone). The liveness sweep of each coordinator's own view runs everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from coordinator.errors import StoreError
from coordinator.store.membership import (
    CoordinatorMember,
    LeaseFence,
    LeaseLostError,
    LeaseState,
    MembershipTable,
)

logger = logging.getLogger(__name__)

#: The lease the leader holds.
LEADER_LEASE = "leader"
#: How long a stopping coordinator tries to sign off (else its lease expires by itself).
STOP_WAIT_S = 2.0


def default_coordinator_id(data_dir: Path) -> str:
    """The machine's name and a short hash of the data directory's full path: stable
    across restarts on one data_dir, different for two coordinators on one machine."""
    path = str(data_dir.expanduser().resolve())
    return f"{socket.gethostname()}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


#: Hosts that name every interface of the machine that listens: no address to dial.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def dialable(address: str) -> bool:
    """False for a gRPC address another machine cannot dial (wildcard or empty host)."""
    host, sep, port = address.rpartition(":")
    return bool(sep) and host not in _WILDCARD_HOSTS and port.isdigit()


def dial_address(host: str, port: int) -> str:
    """``host:port`` as agents dial it: a wildcard host (listening on every interface) as
    the machine's name (which the coordinator's gRPC certificate names), IPv6 in brackets."""
    if host in _WILDCARD_HOSTS:
        host = socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def coordinator_version() -> str:
    try:
        return package_version("edgefleet")
    except PackageNotFoundError:
        return "0+unknown"


class ClusterMembership:
    """This coordinator's membership and leadership; ``step()`` periodically, ``stop()``
    once at the end.

    ``addresses()``: this coordinator's gRPC and HTTP addresses as they are now (known
    once its servers listen). ``lease_s``: how long a renewal holds the leader lease, and
    how long a member stays alive after its last heartbeat.
    """

    def __init__(
        self,
        store: MembershipTable,
        coordinator_id: str,
        *,
        lease_s: float,
        addresses: Callable[[], tuple[str, str]] = lambda: ("", ""),
        version: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.coordinator_id = coordinator_id
        self.incarnation = secrets.token_hex(8)
        self.lease_s = lease_s
        self.version = version or coordinator_version()
        self._store = store
        self._addresses = addresses
        self._clock = clock
        self.members: list[CoordinatorMember] = []
        #: The leader lease as last seen (None before the first step).
        self.lease: LeaseState | None = None
        # Until when (this process's monotonic clock) the lease is surely still ours.
        self._held_until = -math.inf
        self._was_leader = False
        #: Another live process heartbeats under this coordinator_id: no leadership then.
        self.duplicate_id = False
        self.last_error: str | None = None

    # ------------------------------------------------------------------ reads

    @property
    def is_leader(self) -> bool:
        return self.lease is not None and self.lease.held and self._clock() < self._held_until

    @property
    def fence(self) -> LeaseFence | None:
        """What a leader's write carries; None when this coordinator does not lead."""
        return self.lease.fence if self.is_leader and self.lease is not None else None

    @property
    def leader_id(self) -> str | None:
        """The leader as last seen: this coordinator, another, or None (nobody, or its
        lease expired)."""
        if self.lease is None or not self.lease.holder:
            return None
        if self.lease.held:
            return self.coordinator_id if self.is_leader else None
        return self.lease.holder if self.lease.remaining_s > 0 else None

    @property
    def epoch(self) -> int:
        return 0 if self.lease is None else self.lease.epoch

    def alive(self) -> list[CoordinatorMember]:
        return [m for m in self.members if m.alive]

    def grpc_addresses(self) -> list[str]:
        """What Welcome.coordinators says: the gRPC addresses of the coordinators alive as
        last read, this one first, each once. A coordinator alone (SQLite, or the only one
        alive) lists itself; before its first read of the members, or when its own address
        is not known yet, only what it knows. Addresses a peer cannot dial (a wildcard or
        empty host, recorded by a coordinator that listens on every interface and knew no
        better) are left out."""
        own = self._addresses()[0]
        found = [own] if own and dialable(own) else []
        for member in self.alive():
            address = member.grpc_address
            if address and address not in found and dialable(address):
                found.append(address)
        return found

    def json(self) -> dict[str, object]:
        """``/healthz``'s ``coordinator`` object. /healthz answers anyone: the ids, not the
        members' addresses, and no database error text (the log has it; ``store`` in
        /healthz says how the database is)."""
        return {
            "id": self.coordinator_id,
            "members_alive": len(self.alive()),
            "is_leader": self.is_leader,
            "leader": self.leader_id,
            "lease_epoch": self.epoch,
            "duplicate_id": self.duplicate_id,
        }

    # ----------------------------------------------------------------- writes

    async def step(self) -> None:
        """Heartbeat, renew or take over the leader lease, read the members. A database
        that does not answer is logged (once per outage); leadership then lapses on its
        own when the lease's time is up."""
        grpc_address, http_address = self._addresses()
        me = CoordinatorMember(
            coordinator_id=self.coordinator_id,
            incarnation=self.incarnation,
            grpc_address=grpc_address,
            http_address=http_address,
            version=self.version,
        )
        try:
            if not await self._store.heartbeat_member(me, self.lease_s):
                if not self.duplicate_id:
                    logger.error(
                        "coordinator_id %s is in use by another live coordinator process: "
                        "give each coordinator its own (config coordinator_id); this one "
                        "does not take the leader lease meanwhile", self.coordinator_id,
                    )  # fmt: skip
                self.duplicate_id = True
            else:
                self.duplicate_id = False
                sent = self._clock()
                lease = await self._store.acquire_lease(
                    LEADER_LEASE, self.coordinator_id, self.incarnation, self.lease_s
                )
                self._saw(lease, sent)
            self.members = await self._store.list_members(self.lease_s)
        except StoreError as exc:
            if self.last_error is None:
                logger.warning("coordinator membership: the fleet database: %s", exc)
            self.last_error = str(exc)
        else:
            if self.last_error is not None:
                logger.info("coordinator membership: the fleet database answers again")
            self.last_error = None
        self._log_change()

    def _saw(self, lease: LeaseState, sent: float) -> None:
        self.lease = lease
        self._held_until = sent + lease.remaining_s if lease.held else -math.inf

    def lost(self, exc: LeaseLostError) -> None:
        """A fenced write was refused: this coordinator no longer leads (until a later
        step takes the lease again, at a new epoch)."""
        logger.warning("coordinator %s: %s", self.coordinator_id, exc)
        self._held_until = -math.inf
        self._log_change()

    def _log_change(self) -> None:
        leader = self.is_leader
        if leader and not self._was_leader:
            logger.info(
                "coordinator %s leads (lease %r, epoch %d)",
                self.coordinator_id, LEADER_LEASE, self.epoch,
            )  # fmt: skip
        elif self._was_leader and not leader:
            logger.warning(
                "coordinator %s no longer leads (leader: %s, epoch %d)",
                self.coordinator_id, self.leader_id or "none yet", self.epoch,
            )  # fmt: skip
        self._was_leader = leader

    async def stop(self) -> None:
        """A clean stop: give the lease up (another coordinator takes it at once) and
        leave the members' list."""
        fence = self.fence
        self._held_until = -math.inf
        try:
            async with asyncio.timeout(STOP_WAIT_S):
                if fence is not None:
                    await self._store.release_lease(fence)
                await self._store.remove_member(self.coordinator_id, self.incarnation)
        except (StoreError, TimeoutError) as exc:
            logger.warning("coordinator membership: could not sign off: %s", exc)
        if fence is not None:
            logger.info(
                "coordinator %s gave up the leader lease (epoch %d)",
                self.coordinator_id, fence.epoch,
            )  # fmt: skip
        self._was_leader = False

    # ---------------------------------------------------------------- metrics

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_MembershipCollector(self))


class _MembershipCollector(Collector):
    """edgefleet_coordinator_members / _is_leader / _lease_epoch: read at scrape time."""

    def __init__(self, membership: ClusterMembership) -> None:
        self._membership = membership

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self._membership
        yield GaugeMetricFamily(
            "edgefleet_coordinator_members",
            "Coordinators alive on this fleet database (heartbeat within the lease time, "
            "by the database's clock), this one included.",
            value=float(len(m.alive())),
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_is_leader",
            "1 while this coordinator holds the leader lease, else 0.",
            value=1.0 if m.is_leader else 0.0,
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_lease_epoch",
            "The leader lease's epoch as last seen (goes up with every change of leader).",
            value=float(m.epoch),
        )
