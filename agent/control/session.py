"""The agent's control session with the coordinator.

``CoordinatorSession`` holds one long-lived bidirectional gRPC stream
(``edgefleet.v1.Coordinator/Session``): it sends ``Hello`` (from an identity
provider), then a ``LoadReport`` (from a load provider) every report interval the
coordinator names in ``Welcome``, and keeps the ``DesiredState`` sections and
``Command`` messages the coordinator pushes. When the coordinator is away it
reconnects (``agent.control.reconnect``: backoff capped at one report interval, reset
after every session, and a port probe that reconnects as soon as the coordinator is
back); it never raises into the agent, which keeps serving with its last-known state.
With several coordinators (a list of targets, or a name with several addresses) a broken
session or a failed connect moves on to the next one at once; the backoff comes only after
each of them was tried once (``agent.control.reconnect.round_order``), and the next
round starts with the one that worked last. ``coordinator`` names the one in use.
Each Welcome lists the coordinators alive then (``Welcome.coordinators``); the agent adds
them to its rotation after the configured ones (``learned``, checked entry by entry,
bounded: ``agent.control.reconnect.learned_targets``), so it can move to a coordinator it
was never configured with. A later Welcome's list replaces them; an empty one (a
coordinator that knows of none, or predates the field) leaves them as they are.
With an ``Enroller`` it enrolls (or loads saved credentials) before each session, sends
the enrolled agent id and credentials in Hello (and what the operator fixed: site,
location, URL) and, with TLS, connects with the client certificate. Once two thirds of
the certificate's lifetime have passed it sends RenewCertificate (a CSR on the key the
agent keeps) and saves the CertificateIssued answer for its next connection.

The rest of the agent sees only the contract dataclasses (``edgefleet.contract``);
gRPC stays inside this module and protobuf inside ``edgefleet.contract_pb``.

Desired state: each section received with a newer generation than the one held
replaces it (``DesiredState.merged``); ``on_desired_state`` is called with the whole
last-known state, and when it returns the changed sections' generations are
acknowledged in every following LoadReport (``LoadReport.applied``). A section whose
callback raised is not acknowledged. With ``models_applied`` (model sync), the models
section's acknowledged generation is what it returns: a ModelsSection is applied once its
versions are loaded or failed, not when it arrives. Today the agent applies a section by keeping it
as last-known state; later features (model sync, overflow, keys) act on it in the
callback.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import grpc

from agent.control.reconnect import (
    Candidate,
    ReconnectBackoff,
    host_port,
    learned_targets,
    resolve,
    round_order,
    wait_to_retry,
)
from agent.enrollment import Enroller, EnrollmentUnavailableError
from agent.errors import FatalError
from agent.request_log import RequestLog
from edgefleet import contract_pb
from edgefleet.contract import (
    Bye,
    Command,
    DesiredState,
    Hello,
    LoadReport,
    RecordsAck,
    RequestRecords,
    SectionGenerations,
)
from edgefleet.v1 import fleet_pb2 as pb
from edgefleet.v1 import fleet_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

# Keep idle connections honest; the coordinator permits pings this often.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]
# How long a graceful stop waits for the coordinator to close the stream.
_BYE_TIMEOUT_S = 1.0

# Request-record batches sent per report interval at most (500 records each).
_RECORD_BATCHES_PER_REPORT = 8
# In the coordinator's refusal of a Hello that contradicts the agent's record.
FIXED_BY_OPERATOR = "the operator fixed"

IdentityProvider = Callable[[], Hello]
LoadProvider = Callable[[], LoadReport]


class _SessionLost(Exception):
    """The session ended or could not start; the run loop retries. Never leaves this module."""

    def __init__(self, reason: str, *, rejected: bool = False, unreachable: bool = False) -> None:
        super().__init__(reason)
        # The coordinator refused us (bad Hello, credentials): retrying alone will not help.
        self.rejected = rejected
        # The coordinator could not be reached (nothing listening, network down).
        self.unreachable = unreachable


# Status codes meaning "the coordinator is there but refuses this agent".
_REJECTIONS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


class CoordinatorSession:
    """The agent's long-lived control session with the coordinator.

    ``start()`` launches a background task; ``stop()`` says Bye and ends it.
    Nothing raised by gRPC or by the providers escapes into the caller.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        identity: IdentityProvider,
        load: LoadProvider,
        *,
        enroller: Enroller | None = None,
        on_desired_state: Callable[[DesiredState], None] | None = None,
        on_command: Callable[[Command], None] | None = None,
        default_report_interval_s: float = 2.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float | None = None,
        probe_interval_s: float = 0.25,
        connect_timeout_s: float = 10.0,
        rng: random.Random | None = None,
        request_log: RequestLog | None = None,
        on_signing_key: Callable[[bytes], None] | None = None,
        models_applied: Callable[[], int] | None = None,
        enroll_target_for: Callable[[str], str] | None = None,
        on_coordinator: Callable[[str | None], None] | None = None,
    ) -> None:
        """``target``: one coordinator, or several (a sequence, or comma-separated), tried
        in turn. ``max_backoff_s`` caps the delay between attempts; None: the report
        interval in use (the coordinator's once welcomed). ``probe_interval_s``: how often
        the port of an unreachable coordinator is tried while waiting (see
        agent.control.reconnect). ``enroll_target_for``: the Enroll address for a target
        (the enroller's is used as it is without). ``on_coordinator``: called with the
        coordinator a session opened with, and None when it ended.
        """
        targets = tuple(
            t.strip() for t in (target.split(",") if isinstance(target, str) else target)
        )
        if not targets or not all(targets):
            raise ValueError("target must be a gRPC target such as 'coordinator:50051'")
        if not 0 < initial_backoff_s <= (max_backoff_s or initial_backoff_s):
            raise ValueError("need 0 < initial_backoff_s <= max_backoff_s")
        if min(default_report_interval_s, connect_timeout_s, probe_interval_s) <= 0:
            raise ValueError("intervals and timeouts must be positive")
        #: The coordinators, as configured (a name may stand for several addresses).
        self.targets = targets
        #: The coordinators learned from the last Welcome that listed any (valid, bounded,
        #: none of ``targets``): tried after the configured ones.
        self.learned: tuple[str, ...] = ()
        #: The coordinator last tried (the one in use while connected).
        self.target = targets[0]
        #: The coordinator of the open session, named as in logs; None while disconnected.
        self.coordinator: str | None = None
        self._candidate = Candidate(targets[0], targets[0])
        self._enroll_target_for = enroll_target_for
        self._on_coordinator = on_coordinator
        self._identity = identity
        self._load = load
        self._enroller = enroller
        self._on_desired_state = on_desired_state
        self._on_command = on_command
        self._rng = rng or random.Random()
        self._backoff = ReconnectBackoff(initial_backoff_s, self._rng)
        self._max_backoff_s = max_backoff_s
        self._probe_interval_s = probe_interval_s
        self._connect_timeout_s = connect_timeout_s
        self._request_log = request_log
        # v1.3: Welcome's model-signing key (pinned when none is); and, with model sync,
        # the ModelsSection generation to acknowledge (once its versions loaded or failed).
        self._on_signing_key = on_signing_key
        self._models_applied = models_applied
        # Request records sent on this session, up to this seq (reset on a new session).
        self._records_sent_through = 0

        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        #: Id of the current session (from Welcome); None while disconnected.
        self.session_id: str | None = None
        #: Report interval in use (the coordinator's, once welcomed).
        self.report_interval_s = default_report_interval_s
        #: Last-known desired state: the newest generation of each section received,
        #: kept across reconnects (sections never received are None).
        self.desired_state = DesiredState()
        #: The generation of each section applied, acknowledged in every LoadReport.
        self.applied = SectionGenerations()
        #: Why the last session ended or failed; None while none has.
        self.last_error: str | None = None
        #: Sessions opened (Welcome received) since start.
        self.sessions_opened = 0
        #: Certificates renewed over the session since start.
        self.certificates_renewed = 0
        # A RenewCertificate is waiting for its answer on the current session.
        self._renewal_pending = False
        # The coordinator said our Hello contradicts what the operator fixed: re-enroll
        # with the credential before the next session to learn the fixed values.
        self._refresh_identity = False
        # The coordinator of the last session opened (to say when the agent moved).
        self._coordinator_used: str | None = None

    @property
    def connected(self) -> bool:
        """True while a session is open (Welcome received, stream alive)."""
        return self.session_id is not None

    async def start(self) -> None:
        """Start the background session task (no-op when already running)."""
        if self._task is not None and not self._task.done():
            return
        self._stopping.clear()
        self._task = asyncio.create_task(
            self._run(), name=f"coordinator-session-{','.join(self.targets)}"
        )

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Say Bye, close the stream and wait for the task (cancel it after ``timeout_s``)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            task.cancel()
            await asyncio.wait([task])
        except Exception:  # _run never raises; belt and braces for the contract
            logger.exception("coordinator session task failed")

    # ----------------------------------------------------------------- internals

    async def _run(self) -> None:
        failures = 0  # rounds in a row in which no session opened
        preferred: Candidate | None = None  # the coordinator that worked last
        while not self._stopping.is_set():
            learned = self.learned
            order = round_order(await resolve(self.targets + learned), preferred)
            opened_in_round = rejected = False
            probes: list[tuple[str, int]] = []
            reason = ""
            for index, candidate in enumerate(order):  # order grows with what is learned
                opened, reason, rejected, unreachable = await self._attempt(candidate)
                if self._stopping.is_set():
                    return
                self.last_error = reason
                if opened:
                    opened_in_round, preferred = True, candidate
                if self.learned != learned:  # a Welcome named others: tried in this round
                    new = [e for e in self.learned if e not in learned]
                    learned = self.learned
                    order += [c for c in await resolve(new) if c not in order]
                if unreachable and (where := host_port(candidate.target)) is not None:
                    probes.append(where)
                if index + 1 < len(order):
                    # another coordinator not tried in this round: at once
                    logger.log(
                        logging.ERROR if rejected else logging.WARNING,
                        "coordinator session with %s ended: %s; trying %s now",
                        candidate.label,
                        reason,
                        order[index + 1].label,
                    )
            # A round with a session that opened resets the backoff: the next comes quickly.
            failures = 0 if opened_in_round else failures + 1
            delay = self._backoff.delay(failures, self.max_backoff_s)
            if rejected:
                level = logging.ERROR
            else:
                level = logging.WARNING if failures <= 1 else logging.DEBUG
            logger.log(
                level,
                "coordinator session with %s ended: %s; reconnecting in %.1f s",
                self._candidate.label if len(order) == 1 else "every coordinator",
                reason,
                delay,
            )
            await wait_to_retry(
                self._stopping,
                delay,
                probe=probes or None,
                probe_interval_s=self._probe_interval_s,
                rng=self._rng,
            )

    async def _attempt(self, candidate: Candidate) -> tuple[bool, str, bool, bool]:
        """One session with ``candidate``: (opened, why it ended, rejected, unreachable)."""
        self._candidate, self.target = candidate, candidate.entry
        opened_before = self.sessions_opened
        rejected = unreachable = False
        try:
            await self._run_session()
            reason = "coordinator closed the session"
        except _SessionLost as exc:
            reason, rejected, unreachable = str(exc), exc.rejected, exc.unreachable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("coordinator session failed unexpectedly")
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            if self.session_id is not None:
                _notify(self._on_coordinator, None)
            self.session_id = self.coordinator = None
        return self.sessions_opened > opened_before, reason, rejected, unreachable

    @property
    def max_backoff_s(self) -> float:
        """The cap on the delay between attempts."""
        return self._max_backoff_s or self.report_interval_s

    def _channel(self, credentials: grpc.ChannelCredentials | None) -> Any:
        target = self._candidate.target
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        options: list[tuple[str, Any]] = list(_CHANNEL_OPTIONS)
        if self._candidate.server_name:  # an address of a name: its certificate names the name
            options.append(("grpc.ssl_target_name_override", self._candidate.server_name))
        return grpc.aio.secure_channel(target, credentials, options=options)

    async def _session_identity(self) -> tuple[Hello, grpc.ChannelCredentials | None]:
        """Who to say we are, and how to connect (enrolling first when configured).

        The channel is TLS only with enrollment's client certificate; without an enroller
        it is plaintext (``agent.__main__`` refuses ``coordinator.tls`` without one).
        """
        identity = self._identity()
        if self._enroller is None:
            return identity, None
        if self._enroll_target_for is not None:
            self._enroller.target = self._enroll_target_for(self._candidate.entry)
        try:
            if self._refresh_identity:
                self._refresh_identity = False
                enrolled = await self._enroller.refresh()
            else:
                enrolled = await self._enroller.ensure()
        except FatalError as exc:
            raise _SessionLost(str(exc), rejected=True) from exc
        except EnrollmentUnavailableError as exc:
            raise _SessionLost(str(exc)) from exc
        identity = replace(identity, agent_id=enrolled.agent_id, token=enrolled.token)
        if enrolled.site:
            identity = replace(identity, site=enrolled.site)
        if enrolled.location is not None:
            identity = replace(identity, location=enrolled.location)
        if enrolled.http_url:
            identity = replace(identity, http_url=enrolled.http_url)
        return identity, self._enroller.channel_credentials()

    async def _run_session(self) -> None:
        """One session, from Hello to the end of the stream. Raises _SessionLost."""
        identity, credentials = await self._session_identity()
        async with self._channel(credentials) as channel:
            call = pb_grpc.CoordinatorStub(channel).Session()
            try:
                await self._open(call, identity)
                await self._exchange(call)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.PERMISSION_DENIED and FIXED_BY_OPERATOR in (
                    exc.details() or ""
                ):
                    self._refresh_identity = self._enroller is not None
                raise _SessionLost(
                    f"{exc.code().name}: {exc.details()}",
                    rejected=exc.code() in _REJECTIONS,
                    unreachable=exc.code() is grpc.StatusCode.UNAVAILABLE,
                ) from exc
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
                raise _SessionLost(f"stream closed: {exc}") from exc
            finally:
                call.cancel()

    async def _open(self, call: Any, identity: Hello) -> None:
        hello = pb.AgentMessage(hello=contract_pb.hello_to_pb(identity))
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await call.write(hello)
                first = await call.read()
        except TimeoutError:
            raise _SessionLost(
                f"no Welcome within {self._connect_timeout_s:g} s from {self._candidate.label}"
            ) from None
        if first is grpc.aio.EOF:
            raise _SessionLost("coordinator closed the stream before Welcome")
        if first.WhichOneof("body") != "welcome":
            raise _SessionLost(f"expected Welcome, got {first.WhichOneof('body')}")
        welcome = contract_pb.welcome_from_pb(first.welcome)
        if welcome.report_interval_ms > 0:
            self.report_interval_s = welcome.report_interval_ms / 1000.0
        self.session_id = welcome.session_id
        previous, self.coordinator = self._coordinator_used, self._candidate.label
        self._coordinator_used = self.coordinator
        _notify(self._on_coordinator, self.coordinator)
        if welcome.model_signing_key:
            _notify(self._on_signing_key, welcome.model_signing_key)
        if welcome.coordinators:
            self._learn(welcome.coordinators)
        self._records_sent_through = 0 if self._request_log is None else self._request_log.acked
        self.sessions_opened += 1
        self.last_error = None
        if previous is not None and previous != self.coordinator:
            logger.warning("moved to coordinator %s (from %s)", self.coordinator, previous)
        logger.info(
            "connected to coordinator %s (session %s, contract v1.%d, report every %.1f s)",
            self.coordinator,
            welcome.session_id,
            welcome.contract_minor,
            self.report_interval_s,
        )

    def _learn(self, listed: Sequence[str]) -> None:
        """Take the coordinators a Welcome lists as ``learned`` (garbage left out, logged)."""
        learned, problems = learned_targets(self.targets, listed)
        for problem in problems:
            logger.warning(
                "ignoring a coordinator address in %s's Welcome: %s", self._candidate.label, problem
            )
        if learned != self.learned:
            logger.info(
                "coordinators learned from %s: %s",
                self._candidate.label,
                ", ".join(learned) or "none beyond those configured",
            )
            self.learned = learned

    async def _exchange(self, call: Any) -> None:
        self._renewal_pending = False
        reader = asyncio.create_task(self._read_loop(call), name="coordinator-session-reader")
        writer = asyncio.create_task(self._report_loop(call), name="coordinator-session-writer")
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if writer in done and writer.exception() is None:
                # We said Bye and half-closed: give the coordinator a moment to finish.
                await asyncio.wait({reader}, timeout=_BYE_TIMEOUT_S)
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.wait({reader, writer})
        for task in (writer, reader):
            if not task.cancelled() and (failure := task.exception()) is not None:
                raise failure

    async def _read_loop(self, call: Any) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            kind = message.WhichOneof("body")
            if kind == "desired_state":
                self._apply(contract_pb.desired_state_from_pb(message.desired_state))
            elif kind == "records_ack":
                self._records_acked(contract_pb.records_ack_from_pb(message.records_ack))
            elif kind == "certificate_issued":
                self._renewal_pending = False
                if self._enroller is not None:
                    issued = message.certificate_issued
                    try:
                        self._enroller.save_certificate(issued.client_cert_pem, issued.ca_cert_pem)
                    except FatalError:
                        logger.exception("could not save the renewed certificate")
                    else:
                        self.certificates_renewed += 1
            elif kind == "command":
                command = contract_pb.command_from_pb(message.command)
                logger.info("coordinator command %s (%s)", command.kind, command.reason or "-")
                _notify(self._on_command, command)
            else:
                logger.warning("ignoring unexpected %s from coordinator", kind)

    def _apply(self, update: DesiredState) -> None:
        """Keep the sections of ``update`` newer than ours; acknowledge them once applied."""
        merged, changed = self.desired_state.merged(update)
        self.desired_state = merged
        if not changed:
            return
        generations = merged.generations()
        logger.info(
            "desired state v%d: %s",
            merged.version,
            ", ".join(f"{name} generation {getattr(generations, name)}" for name in changed),
        )
        if self._on_desired_state is not None:
            try:
                self._on_desired_state(merged)
            except Exception:
                logger.exception("applying desired state v%d failed", merged.version)
                return
        self.applied = self.applied._replace(**{n: getattr(generations, n) for n in changed})

    async def _report_loop(self, call: Any) -> None:
        """A LoadReport every report interval, on this session's own grid: the time a write
        takes (gRPC flow control, a slow coordinator) does not push every later report back
        (waiting a whole interval after each one, the reports came every interval plus the
        writes' time, and a slow spell stretched the gap past the coordinator's liveness
        count). A report whose time passed while the last one was written is sent at once,
        and the grid starts again from it: never a burst to catch up."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            report = self._take_load_report()
            if report is not None:
                await call.write(pb.AgentMessage(load_report=report))
            await self._send_records(call)
            if (renewal := self._renewal_request()) is not None:
                await call.write(renewal)
            now = loop.time()
            due = max(due + self.report_interval_s, now)
            try:
                await asyncio.wait_for(self._stopping.wait(), due - now)
            except TimeoutError:
                continue
            bye = contract_pb.bye_to_pb(Bye(reason="agent stopping"))
            await call.write(pb.AgentMessage(bye=bye))
            await call.done_writing()
            return

    # ------------------------------------------------ per-request records (request_log)

    async def _send_records(self, call: Any) -> None:
        """Send the spooled request records not sent on this session yet, a few batches per
        report interval; they leave the spool only when the coordinator acknowledges."""
        log = self._request_log
        if log is None:
            return
        for _ in range(_RECORD_BATCHES_PER_REPORT):
            batch = log.batch(self._records_sent_through)
            if batch is None:
                return
            first_seq, packed, count = batch
            records = RequestRecords(first_seq, packed, dropped=log.dropped_unreported)
            await call.write(
                pb.AgentMessage(request_records=contract_pb.request_records_to_pb(records))
            )
            log.dropped_unreported = 0
            self._records_sent_through = first_seq + count - 1

    def _records_acked(self, ack: RecordsAck) -> None:
        if self._request_log is not None:
            self._request_log.ack(ack.through_seq)

    def _renewal_request(self) -> pb.AgentMessage | None:
        """RenewCertificate when the certificate is two thirds through its life (once per
        session until answered)."""
        enroller = self._enroller
        if enroller is None or self._renewal_pending:
            return None
        credentials = enroller.credentials
        if credentials is None or not credentials.needs_renewal():
            return None
        try:
            csr = enroller.renewal_csr()
        except FatalError:
            logger.exception("cannot make a certificate renewal request")
            return None
        self._renewal_pending = True
        logger.info("asking the coordinator to renew the client certificate")
        return pb.AgentMessage(renew_certificate=pb.RenewCertificate(csr_pem=csr))

    def _take_load_report(self) -> pb.LoadReport | None:
        try:
            report = self._load()
        except Exception:
            logger.exception("load provider failed; skipping this report")
            return None
        applied = self.applied
        if self._models_applied is not None:
            applied = applied._replace(models=self._models_applied())
        return contract_pb.load_report_to_pb(report._replace(applied=applied))


def _notify(callback: Callable[[Any], None] | None, value: object) -> None:
    if callback is None:
        return
    try:
        callback(value)
    except Exception:
        logger.exception("coordinator session callback %r failed", callback)
