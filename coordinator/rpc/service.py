"""The gRPC side of the coordinator: a thin servicer and the server that hosts it.

The servicer converts wire messages to internal dataclasses (``coordinator.rpc.convert``)
and calls the FleetRegistry; it holds no fleet state of its own beyond the
outgoing queue of each live session.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from coordinator import GRPC_HARDENED
from coordinator.access.api_keys import KeyDistributor
from coordinator.catalog.assignments import ModelAssignments
from coordinator.cluster.membership import dial_address
from coordinator.config import CoordinatorConfig
from coordinator.errors import (
    AgentRevokedError,
    CertificateRequestError,
    EnrollmentError,
    FleetFullError,
    PermissionDeniedError,
    ProtocolError,
    ServerStartError,
    SessionTakenError,
    SiteMismatchError,
    StoreError,
)
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.registry import FleetRegistry
from coordinator.fleet.report_hooks import ReportHooks
from coordinator.fleet.request_records import BatchResult, RequestRecordStore
from coordinator.identity.ca import CertificateAuthority, certificate_serial
from coordinator.identity.enrollment import EnrollmentService
from coordinator.identity.peer_rate_limit import PeerRateLimiter, peer_ip
from coordinator.identity.session_auth import (
    Peer,
    SessionAuthenticator,
    peer_address,
    resolve_url_host,
)
from coordinator.routing.service import Router
from coordinator.rpc import convert as proto_convert
from coordinator.rpc.report_queue import ReportQueue
from coordinator.store.ownership import OwnershipTable
from edgefleet import contract_pb
from edgefleet.addresses import is_loopback_host
from edgefleet.contract import (
    CommandKind,
    DesiredState,
    Hello,
    LoadReport,
    OverflowUsage,
    Section,
)
from edgefleet.tls import GRPC_CIPHER_SUITES, GRPC_CIPHER_SUITES_ENV
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

_STORE_AWAY = (
    "the coordinator's fleet database is unavailable for now, so new sessions and "
    "enrollments cannot be checked; retry in a few seconds (sessions already open and "
    "route lookups are not affected)"
)

# HTTP/2 keepalive: notice dead peers on idle connections; let agents ping us.
_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    # Keepalive enforcement: a peer pinging more often than the interval above gets a
    # strike; after this many its connection is closed (GOAWAY "too_many_pings").
    ("grpc.http2.max_ping_strikes", 2),
    # A connection with no RPC for this long is closed (agents keep a Session open).
    ("grpc.max_connection_idle_ms", 300_000),
    # A second coordinator on the same port must fail, not share the port.
    ("grpc.so_reuseport", 0),
]


# gRPC's default for grpc.server.max_pending_requests_hard_limit.
_GRPC_PENDING_HARD_LIMIT = 3000


def server_options(config: CoordinatorConfig) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments: keepalive, stream and message-size caps.

    gRPC holds a call it received until the application asks for the next one (the
    asyncio server asks for one per turn of its event loop), and by default refuses new
    calls at random once 1,000 are waiting and all of them past 3,000. A fleet that
    connects at once (5,000 agents in a few seconds, as after a coordinator restart)
    crosses that while the loop is busy: sessions failed with CANCELLED, or INTERNAL when
    the agent's first write raced the refusal. Now as many may wait as the server admits
    (``grpc_max_concurrent_rpcs``, which refuses the rest with RESOURCE_EXHAUSTED once it
    picks them up), and never fewer than gRPC's own hard limit."""
    waiting = max(config.grpc_max_concurrent_rpcs, _GRPC_PENDING_HARD_LIMIT)
    return [
        *_SERVER_OPTIONS,
        ("grpc.server.max_pending_requests", waiting),
        ("grpc.server.max_pending_requests_hard_limit", waiting),
        ("grpc.max_concurrent_streams", config.grpc_max_concurrent_streams),
        ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
        ("grpc.max_send_message_length", config.grpc_max_message_bytes),
    ]


@dataclass(eq=False)
class _LiveSession:
    agent_id: str
    session_id: str
    # Authenticated with enrollment credentials (may renew its certificate).
    enrolled: bool = False
    # Messages to push to the agent; None ends the stream.
    outbox: asyncio.Queue[pb.CoordinatorMessage | None] = field(default_factory=asyncio.Queue)
    # Set when an operator revoked the agent: the stream ends with PERMISSION_DENIED.
    revoked: str = ""
    # Its ownership epoch (coordinator/store/ownership.py); 0: not claimed (no database).
    epoch: int = 0


def refuse(context: Any, code: grpc.StatusCode, details: str) -> None:
    """End the RPC with ``code`` and ``details`` once its handler returns.

    Not ``context.abort``: grpc.aio keeps the AbortError it raises on the RPC's state, and
    with it the traceback's frames (the Hello, the session, the context itself), a cycle
    the garbage collector never freed: each refused session or enrollment stayed in memory
    (a flood of 620 refused Hellos kept about 15 MiB more each time it was repeated)."""
    context.set_code(code)
    context.set_details(details)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a finished task's exception as retrieved (its caller reads or reports it)."""
    if not task.cancelled():
        task.exception()


def _status_for(error: EnrollmentError) -> grpc.StatusCode:
    """Refused identities: UNAUTHENTICATED, unless the caller is known but not allowed."""
    if isinstance(error, SessionTakenError):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(error, CertificateRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, PermissionDeniedError | SiteMismatchError):
        return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.UNAUTHENTICATED


def peer_agent_id(context: Any) -> str | None:
    """Common name of the peer's verified client certificate; None without one."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode() if names else None


def session_peer(context: Any) -> Peer:
    """The peer's certificate identity (common name, serial) and IP address."""
    auth = context.auth_context()
    names = auth.get("x509_common_name")
    serial = ""
    pems = auth.get("x509_pem_cert")
    if pems:
        try:
            serial = certificate_serial(pems[0])
        except ValueError:
            serial = ""
    return Peer(
        agent_id=names[0].decode() if names else None,
        cert_serial=serial,
        address=peer_address(context.peer() or ""),
    )


class CoordinatorServicer:
    """Implements edgefleet.v1.Coordinator on top of a FleetRegistry."""

    def __init__(
        self,
        registry: FleetRegistry,
        metrics: CoordinatorMetrics,
        *,
        router: Router,
        enrollment: EnrollmentService,
        authenticator: SessionAuthenticator,
        report_interval_ms: int,
        hello_timeout_s: float,
        records: RequestRecordStore | None = None,
        load_limits: proto_convert.LoadLimits = proto_convert.DEFAULT_LOAD_LIMITS,
        keys: KeyDistributor | None = None,
        enroll_limiter: PeerRateLimiter | None = None,
        models: ModelAssignments | None = None,
        report_hooks: ReportHooks | None = None,
        model_signing_key: bytes = b"",
        coordinators: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """``keys``: gives each agent its API keys section when it connects and takes the
        per-key usage of its load reports (no keys are pushed without it). ``models``:
        sets each agent's models section when it connects. ``report_hooks``: called with
        every accepted load report. ``model_signing_key``: the public key sent in
        EnrollResponse and Welcome. ``coordinators``: the gRPC addresses of the coordinators
        alive now, sent in every Welcome (``bind_coordinators`` sets it later; none without
        it)."""
        self._records = records
        if records is not None:
            records.bind(self._resend_records)
        self._registry = registry
        self._metrics = metrics
        self._router = router
        self._enrollment = enrollment
        self._authenticator = authenticator
        self._report_interval_ms = report_interval_ms
        self._hello_timeout_s = hello_timeout_s
        self._load_limits = load_limits
        self._enroll_limiter = enroll_limiter
        self._live: dict[str, _LiveSession] = {}
        self._keys = keys
        self._models = models
        self._report_hooks = report_hooks
        self._reports: ReportQueue[_LiveSession, LoadReport] = ReportQueue(self._apply_report)
        self._model_signing_key = model_signing_key
        self._coordinators = coordinators
        self._ownership: OwnershipTable | None = None
        self._coordinator_id = ""
        self._on_claim: Callable[[str, int], Awaitable[None]] | None = None
        self._fresh_generations: Callable[[str], Awaitable[None]] | None = None
        # The ownership epoch of each agent's last session claimed here (by this process).
        self._claimed_here: dict[str, int] = {}

    def bind_fresh_generations(self, fresh: Callable[[str], Awaitable[None]]) -> None:
        """Awaited as a session opens, before its desired state is built and sent, unless
        the agent's previous session was here (see ``_claim``): ``fresh(agent_id)`` makes
        its section generations newer than any another coordinator sent it
        (coordinator/store/generations.py)."""
        self._fresh_generations = fresh

    def bind_ownership(
        self,
        store: OwnershipTable,
        coordinator_id: str,
        on_claim: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        """Claim each agent whose session opens here (as ``coordinator_id``, epoch bumped
        in ``store``) and tell ``on_claim(agent_id, epoch)`` (the change feed: another
        coordinator holding a stale session for it ends it at once)."""
        self._ownership = store
        self._coordinator_id = coordinator_id
        self._on_claim = on_claim

    async def _claim(self, live: _LiveSession) -> bool:
        """Claim the agent; True when its previous session was on this coordinator: this
        process claimed the epoch just before, so no other coordinator held it since and
        every section the agent holds came from here (a reconnect needs no fresh
        generations). False when unknown (no ownership, the claim failed, a first claim
        since this process started)."""
        if self._ownership is None:
            return False
        try:
            live.epoch = await self._ownership.claim_agent(live.agent_id, self._coordinator_id)
        except StoreError as exc:  # the session stands; the periodic check skips it
            logger.warning("agent %s: could not record this coordinator as its owner: %s",
                           live.agent_id, exc)  # fmt: skip
            return False
        previous = self._claimed_here.get(live.agent_id)
        self._claimed_here[live.agent_id] = live.epoch
        # its live states are written at this epoch (refused once the agent moved on)
        self._registry.claimed(live.agent_id, live.session_id, live.epoch)
        if self._on_claim is not None:
            await self._on_claim(live.agent_id, live.epoch)
        return previous is not None and live.epoch == previous + 1

    def end_superseded(self, agent_id: str, owner: str, epoch: int) -> bool:
        """The agent is owned by ``owner`` at ``epoch``: end this coordinator's session
        for it when that session is older (a stale one: the agent moved on). True when
        one was ended."""
        live = self._live.get(agent_id)
        if live is None or live.epoch == 0:
            return False
        if owner == self._coordinator_id and epoch <= live.epoch:
            return False
        if epoch < live.epoch:
            return False  # an older claim arriving late: this session is the newer one
        logger.warning(
            "agent %s: its session moved to coordinator %s (epoch %d); ending the stale "
            "session here (epoch %d)", agent_id, owner, epoch, live.epoch,
        )  # fmt: skip
        self._metrics.sessions_superseded.inc()
        live.outbox.put_nowait(None)
        return True

    async def check_ownership(self) -> int:
        """End the sessions here whose agents another coordinator owns now, or at a newer
        epoch (what the change feed may have missed); how many were ended."""
        if self._ownership is None or not self._live:
            return 0
        live = {a: s.epoch for a, s in self._live.items() if s.epoch}
        owners = await self._ownership.agent_owners(live)
        return sum(
            self.end_superseded(agent_id, *owners[agent_id])
            for agent_id in live
            if agent_id in owners
        )

    def bind_coordinators(self, coordinators: Callable[[], Sequence[str]]) -> None:
        """Where Welcome.coordinators comes from (the cluster membership, made after the
        servicer)."""
        self._coordinators = coordinators

    def _coordinators_now(self) -> tuple[str, ...]:
        """Welcome.coordinators: what the membership says now; none when it fails (a
        Welcome never waits on it, nor fails for it)."""
        if self._coordinators is None:
            return ()
        try:
            return tuple(self._coordinators())
        except Exception:
            logger.exception("could not list the coordinators for Welcome")
            return ()

    # ------------------------------------------------------------------ RPCs

    async def Enroll(self, request: pb.EnrollRequest, context: Any) -> pb.EnrollResponse:
        if self._enroll_limiter is not None:
            wait_s = self._enroll_limiter.try_acquire(context.peer())
            if wait_s > 0:
                self._metrics.enrollments.labels(result="rate_limited").inc()
                refuse(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"too many enrollment attempts from {peer_ip(context.peer())} (at most "
                    f"{self._enroll_limiter.rate_per_s * 60:g} a minute, bursts of "
                    f"{self._enroll_limiter.burst}); retry in {math.ceil(wait_s)} s",
                )
                return pb.EnrollResponse()
        try:
            enrolled = await self._enrollment.enroll(
                request.join_token, request.requested_name, request.site, request.csr_pem
            )
        except EnrollmentError as exc:
            self._metrics.enrollments.labels(result=exc.reason).inc()
            logger.warning(
                "refused enrollment with join token %s from %s: %s",
                self._enrollment.token_id_of(request.join_token),
                context.peer(),
                exc,
            )
            refuse(context, _status_for(exc), str(exc))
            return pb.EnrollResponse()
        except StoreError as exc:
            self._metrics.enrollments.labels(result="store_unavailable").inc()
            logger.warning("could not enroll from %s: the fleet database is unavailable: %s",
                           context.peer(), exc)  # fmt: skip
            refuse(context, grpc.StatusCode.UNAVAILABLE, _STORE_AWAY)
            return pb.EnrollResponse()
        self._metrics.enrollments.labels(result="ok").inc()
        response = pb.EnrollResponse(
            agent_id=enrolled.agent_id,
            credentials=enrolled.credentials,
            ca_cert_pem=enrolled.ca_cert_pem,
            client_cert_pem=enrolled.client_cert_pem,
            client_key_pem=enrolled.client_key_pem,
            site=enrolled.site,
            http_url=enrolled.http_url,
            cert_not_after_unix=int(enrolled.not_after.timestamp()) if enrolled.not_after else 0,
            model_signing_key=self._model_signing_key,
        )
        if enrolled.location is not None:
            response.location.lat = enrolled.location.lat
            response.location.lon = enrolled.location.lon
        return response

    async def Route(self, request: pb.RouteRequest, context: Any) -> pb.RouteResponse:
        try:
            query = proto_convert.route_query_from_pb(request)
        except ProtocolError as exc:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return pb.RouteResponse()
        if self._keys is not None and self._keys.needs_content_safety(_authorization(context)):
            query = replace(query, moderation=True)  # as GET /v1/route reads the key
        decision = self._router.route(query, client_ip=request.client_ip)
        return proto_convert.route_response_to_pb(decision)

    async def Session(self, request_iterator: AsyncIterator[pb.AgentMessage], context: Any) -> None:
        # The agent's messages are read with context.read(), never through request_iterator:
        # grpc.aio makes that iterator an async generator, which stays suspended at its
        # yield, holding the last message, when a session ends before the agent's stream
        # does (a refused Hello). Measured: a coordinator process fed 6 floods of 310
        # refused 50-KB Hellos grew 96 -> 227 MiB, and 96 -> 125 MiB reading with read().
        # Likewise the handler writes with context.write() and is no generator: grpc.aio
        # sends a generator's messages from its own loop, and a cancellation landing while
        # it sends one would leave the generator suspended at its yield, its `finally`
        # (which ends the session in the registry) run only when the garbage collector
        # finalizes it.
        del request_iterator
        hello = await self._receive_hello(context)
        if hello is None:
            return  # refused (the status is set)
        opening = self._metrics.session_open_seconds
        began = time.perf_counter()
        peer = session_peer(context)
        if self._authenticator.check_url_host and hello.http_url:
            peer = replace(peer, url_addresses=await resolve_url_host(hello.http_url))
        try:
            hello, enrolled = await self._authenticator.authenticate(hello, peer)
            session_id = self._registry.open_session(hello, enrolled=enrolled)
        except EnrollmentError as exc:
            self._metrics.sessions_rejected.labels(reason=exc.reason).inc()
            logger.warning(
                "refused session for agent %s from %s: %s", hello.agent_id, context.peer(), exc
            )
            refuse(context, _status_for(exc), str(exc))
            return
        except StoreError as exc:
            # Sessions already open never need the database; a new one is authenticated
            # against it (credentials, revocations), so it waits until the database is back.
            self._metrics.sessions_rejected.labels(reason="store_unavailable").inc()
            logger.warning("could not open a session for agent %s: the fleet database is "
                           "unavailable: %s", hello.agent_id, exc)  # fmt: skip
            refuse(context, grpc.StatusCode.UNAVAILABLE, _STORE_AWAY)
            return
        except FleetFullError as exc:
            self._metrics.sessions_rejected.labels(reason="fleet_full").inc()
            logger.warning("refused session for agent %s: %s", hello.agent_id, exc)
            refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        self._metrics.sessions.inc()
        authenticated = time.perf_counter()
        opening.labels(step="authenticate").observe(authenticated - began)
        live = _LiveSession(agent_id=hello.agent_id, session_id=session_id, enrolled=enrolled)
        replaced = self._live.pop(hello.agent_id, None)
        if replaced is not None:
            replaced.outbox.put_nowait(None)
        self._live[hello.agent_id] = live
        here_before = await self._claim(live)
        claimed = time.perf_counter()
        opening.labels(step="claim").observe(claimed - authenticated)
        if self._fresh_generations is not None and not here_before:
            try:
                await self._fresh_generations(hello.agent_id)
            except StoreError as exc:  # the session stands; its sections may be ignored
                logger.warning("agent %s: could not reserve fresh section generations: %s",
                               hello.agent_id, exc)  # fmt: skip
            opening.labels(step="generations").observe(time.perf_counter() - claimed)
        if self._keys is not None:
            self._keys.on_connect(hello.agent_id)  # sent with the full desired state below
        if self._models is not None:
            self._models.on_connect(hello.agent_id)  # likewise
        logger.info(
            "agent %s connected (session %s, site %r, %d models, peer %s)",
            hello.agent_id,
            session_id,
            hello.site,
            len(hello.models),
            context.peer(),
        )

        reader = asyncio.create_task(
            self._consume(context, live), name=f"session-reader-{session_id}"
        )
        reader.add_done_callback(lambda _: live.outbox.put_nowait(None))
        reader.add_done_callback(_retrieve)  # read below; retrieved even if that is cut short
        opening.labels(step="total").observe(time.perf_counter() - began)
        try:
            welcome = proto_convert.welcome_to_pb(
                session_id,
                self._report_interval_ms,
                self._model_signing_key,
                coordinators=self._coordinators_now(),
            )
            await context.write(welcome)
            desired = self._registry.desired_state(hello.agent_id)
            await context.write(proto_convert.desired_state_to_pb(desired))
            if self._registry.get(hello.agent_id).draining:
                drain = proto_convert.command_to_pb(CommandKind.DRAIN, "drained by an operator")
                await context.write(drain)
            while (message := await live.outbox.get()) is not None:
                await context.write(message)
            if live.revoked:
                self._metrics.sessions_rejected.labels(reason="revoked").inc()
                refuse(context, grpc.StatusCode.PERMISSION_DENIED, live.revoked)
            elif reader.done() and not reader.cancelled():
                failure = reader.exception()
                if isinstance(failure, ProtocolError):
                    self._metrics.sessions_rejected.labels(reason="protocol").inc()
                    refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(failure))
                elif failure is not None:
                    raise failure
        finally:
            # The session ends here before anything is awaited: grpc.aio cancels this
            # handler when the agent's stream goes away, and it may do so while it waits
            # below (the reader saw the end first); the session then stayed "connected".
            reader.cancel()  # it reads no more: nothing reaches the report queue after this
            self._reports.flush()  # none applied after the session's end
            if self._live.get(hello.agent_id) is live:
                del self._live[hello.agent_id]
                if self._keys is not None:
                    self._keys.on_disconnect(hello.agent_id)
            if self._registry.close_session(hello.agent_id, session_id):
                logger.info("agent %s disconnected (session %s)", hello.agent_id, session_id)
            await asyncio.wait([reader])

    # ------------------------------------------------------------- lifecycle

    def push(self, agent_id: str, message: pb.CoordinatorMessage) -> bool:
        """Queue a message for an agent's live session; False when it has none."""
        live = self._live.get(agent_id)
        if live is None:
            return False
        live.outbox.put_nowait(message)
        return True

    def send_command(
        self, agent_id: str, kind: CommandKind | str, reason: str, model: str = ""
    ) -> bool:
        """Push a Command ("drain", "resume", "reload", "load_model" or "unload_model" of
        ``model``); False when the agent has no session here."""
        return self.push(agent_id, proto_convert.command_to_pb(CommandKind(kind), reason, model))

    def set_section(self, agent_id: str, section: Section) -> DesiredState:
        """Set one section of an agent's desired state and push it on its live session.

        The registry bumps the section's generation; the agent gets the whole section
        now when it is connected, else with the full desired state when it next
        connects. Returns the agent's new desired state; raises UnknownAgentError.
        """
        desired = self._registry.set_section(agent_id, section)
        name = type(section)
        pushed = next(s for s in desired.sections() if type(s) is name)
        update = DesiredState(version=desired.version).with_section(pushed)
        self.push(agent_id, proto_convert.desired_state_to_pb(update))
        return desired

    def end_session(self, agent_id: str, *, revoked: str = "") -> bool:
        """End an agent's live session now (with PERMISSION_DENIED and ``revoked`` as the
        message when given); False when it has none."""
        live = self._live.get(agent_id)
        if live is None:
            return False
        live.revoked = revoked
        live.outbox.put_nowait(None)
        return True

    def connected_agent_ids(self) -> list[str]:
        """The agents with a live session on this coordinator."""
        return list(self._live)

    def set_keys_section(self, agent_id: str, section: Section) -> None:
        """Set and push an agent's keys section (KeyDistributor's push)."""
        self.set_section(agent_id, section)

    def end_all_sessions(self) -> None:
        """Finish every live session cleanly (agents reconnect on their own)."""
        for live in list(self._live.values()):
            live.outbox.put_nowait(None)

    # --------------------------------------------------------------- helpers

    async def _receive_hello(self, context: Any) -> Hello | None:
        """The session's Hello; None when it is refused (its status set on ``context``)."""
        try:
            first = await asyncio.wait_for(context.read(), self._hello_timeout_s)
        except TimeoutError:
            self._metrics.sessions_rejected.labels(reason="hello_timeout").inc()
            refuse(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no Hello within {self._hello_timeout_s:g} s of opening the session",
            )
            return None
        closed = first is grpc.aio.EOF
        kind = None if closed else first.WhichOneof("body")
        if kind != "hello":
            self._metrics.sessions_rejected.labels(reason="no_hello").inc()
            refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "session closed before the agent sent Hello" if closed else
                f"the first message of a Session must be Hello, got {kind or 'an empty message'}",
            )  # fmt: skip
            return None
        try:
            return proto_convert.hello_from_pb(first.hello)
        except proto_convert.UnsupportedContractError as exc:
            self._metrics.sessions_rejected.labels(reason="contract_version").inc()
            refuse(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ProtocolError as exc:
            self._metrics.sessions_rejected.labels(reason="invalid_hello").inc()
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return None

    def _record_overflow(self, usage: tuple[OverflowUsage, ...]) -> None:
        """An agent's overflow use since its last report, into the fleet's metrics."""
        self._metrics.record_overflow(usage)

    async def _consume(self, context: Any, live: _LiveSession) -> None:
        """Read the agent's messages until it half-closes the stream."""
        while (message := await context.read()) is not grpc.aio.EOF:
            kind = message.WhichOneof("body")
            if kind == "load_report":
                # parsed here (a malformed report ends the session), applied in slices
                report = proto_convert.load_report_from_pb(message.load_report, self._load_limits)
                self._reports.put(live, report)
                continue
            self._reports.flush()  # what the session sent before comes first
            if kind == "bye":
                logger.info("agent %s says bye: %s", live.agent_id, message.bye.reason or "-")
                self._registry.record_bye(live.agent_id, live.session_id, message.bye.reason)
            elif kind == "request_records":
                await self._store_records(live, message.request_records)
            elif kind == "renew_certificate":
                await self._renew(live, message.renew_certificate.csr_pem)
            elif kind == "hello":
                raise ProtocolError("Hello may only be sent once, as the first message")
            else:
                raise ProtocolError("empty AgentMessage (no body set)")

    def _apply_report(self, live: _LiveSession, report: LoadReport) -> None:
        """A session's load report into the fleet (from the report queue, in order)."""
        self._registry.record_report(live.agent_id, live.session_id, report)
        self._metrics.load_reports.inc()
        if report.key_usage and self._keys is not None:
            self._keys.record_usage(live.agent_id, report.key_usage)
        if self._report_hooks is not None:
            self._report_hooks(live.agent_id, report)
        if report.overflow_usage:
            self._record_overflow(report.overflow_usage)

    async def _store_records(self, live: _LiveSession, message: pb.RequestRecords) -> None:
        """Hand a batch of request records to be written (fleet.request_records), and
        acknowledge it once written: the session's reader never waits for the database
        (its load reports keep coming while the database is slow or away)."""
        if self._records is None:
            return
        batch = contract_pb.request_records_from_pb(message)
        counter = self._metrics.request_records

        def written(result: BatchResult) -> None:
            for outcome, count in (
                ("stored", result.stored),
                ("invalid", result.invalid),
                ("lost_at_agent", result.lost_at_agent),
                ("pruned", result.pruned),
            ):
                if count:
                    counter.labels(outcome=outcome).inc(count)
            if result.ack is not None:
                ack = contract_pb.records_ack_to_pb(result.ack)
                live.outbox.put_nowait(pb.CoordinatorMessage(records_ack=ack))

        # ProtocolError (an unusable batch) ends the session
        self._records.submit(live.agent_id, live.session_id, batch, written)

    def _resend_records(self, agent_id: str, session_id: str) -> None:
        """End a session whose request records were left unacknowledged (the kept ones'
        bound), so that its agent reconnects and sends them again."""
        live = self._live.get(agent_id)
        if live is not None and live.session_id == session_id:
            live.outbox.put_nowait(None)

    async def _renew(self, live: _LiveSession, csr_pem: str) -> None:
        """Answer RenewCertificate with CertificateIssued (enrolled sessions only)."""
        if not live.enrolled:
            raise ProtocolError("RenewCertificate from an agent that is not enrolled")
        try:
            issued = await self._enrollment.renew(live.agent_id, csr_pem)
        except AgentRevokedError as exc:
            self.end_session(live.agent_id, revoked=str(exc))
            return
        except EnrollmentError as exc:
            logger.warning("refused certificate renewal of agent %s: %s", live.agent_id, exc)
            self._metrics.enrollments.labels(result=f"renew_{exc.reason}").inc()
            return
        self._metrics.enrollments.labels(result="renewed").inc()
        live.outbox.put_nowait(
            pb.CoordinatorMessage(
                certificate_issued=pb.CertificateIssued(
                    client_cert_pem=issued.cert_pem,
                    ca_cert_pem=self._enrollment.ca_cert_pem,
                    not_after_unix=int(issued.not_after.timestamp()),
                )
            )
        )


class GrpcServer:
    """Owns the grpc.aio server; ``port`` (and ``enroll_port`` with TLS) once started.

    Without TLS one plaintext port serves every RPC. With TLS, ``port`` requires a
    client certificate signed by the coordinator's CA (mutual TLS, for Session) and
    ``enroll_port`` is server-authenticated TLS only (for Enroll and Route).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        servicer: CoordinatorServicer,
        ca: CertificateAuthority | None = None,
    ) -> None:
        self._config = config
        self.servicer = servicer
        self._ca = ca
        self._server: Any = None
        self.port: int | None = None
        self.enroll_port: int | None = None

    @property
    def tls(self) -> bool:
        return self._config.tls_enabled

    @property
    def address(self) -> str:
        return f"{self._config.grpc_host}:{self.port}"

    @property
    def dial_address(self) -> str:
        """The Session port as agents dial it (a wildcard grpc_host as the machine's name,
        IPv6 in brackets): what this coordinator's membership record and Welcome give."""
        return dial_address(self._config.grpc_host, self.port or 0)

    @property
    def enroll_address(self) -> str:
        return f"{self._config.grpc_host}:{self.enroll_port or self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(
            options=server_options(self._config),
            maximum_concurrent_rpcs=self._config.grpc_max_concurrent_rpcs,
        )
        pb_grpc.add_CoordinatorServicer_to_server(self.servicer, server)
        host = self._config.grpc_host
        if self.tls:
            if self._ca is None:
                raise ServerStartError("TLS is on but the coordinator has no CA")
            names = [host, "localhost", "127.0.0.1", "::1", socket.gethostname()]
            names += [n.strip() for n in self._config.tls_server_names.split(",") if n.strip()]
            issued = self._ca.issue_server(names)
            if os.environ.get(GRPC_CIPHER_SUITES_ENV) != GRPC_CIPHER_SUITES or not GRPC_HARDENED:
                logger.warning(
                    "gRPC's TLS suites are not the fleet's (%s is %r%s)",
                    GRPC_CIPHER_SUITES_ENV,
                    os.environ.get(GRPC_CIPHER_SUITES_ENV),
                    "" if GRPC_HARDENED else ", set after grpc was imported: no effect",
                )
            pair = [(issued.key_pem.encode(), issued.cert_pem.encode())]
            mutual = grpc.ssl_server_credentials(
                pair, root_certificates=self._ca.cert_pem.encode(), require_client_auth=True
            )
            server_only = grpc.ssl_server_credentials(pair)
            self.port = self._bind(server, host, self._config.grpc_port, mutual)
            self.enroll_port = self._bind(server, host, self._config.enroll_port, server_only)
        else:
            if not is_loopback_host(host):
                logger.warning(
                    "gRPC on %s without TLS: agent credentials travel in plaintext "
                    '(set tls = "on" outside development)',
                    host,
                )
            self.port = self._bind(server, host, self._config.grpc_port, None)
        await server.start()
        self._server = server
        if self.tls:
            logger.info(
                "gRPC listening on %s (mutual TLS) and %s (TLS, enrollment)",
                self.address,
                self.enroll_address,
            )
        else:
            logger.info("gRPC listening on %s (plaintext)", self.address)

    @staticmethod
    def _bind(server: Any, host: str, port: int, credentials: Any) -> int:
        bind = f"{host}:{port}"
        try:
            if credentials is None:
                bound = server.add_insecure_port(bind)
            else:
                bound = server.add_secure_port(bind, credentials)
        except RuntimeError as exc:
            raise ServerStartError(f"cannot listen for gRPC on {bind}: {exc}") from exc
        if bound == 0:
            raise ServerStartError(f"cannot listen for gRPC on {bind}")
        return int(bound)

    async def stop(self) -> None:
        if self._server is None:
            return
        self.servicer.end_all_sessions()
        await self._server.stop(self._config.shutdown_grace_s)
        self._server = None
        logger.info("gRPC server stopped")


def _authorization(context: Any) -> str:
    """The call's ``authorization`` metadata (``Bearer ef-...``: the client's API key), or
    "" when it sent none."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""
