"""The agent's control session with the coordinator.

``CoordinatorSession`` holds one long-lived bidirectional gRPC stream
(``edgefleet.v1.Coordinator/Session``): it sends ``Hello`` (from an identity
provider), then a ``LoadReport`` (from a load provider) every report interval
the coordinator names in ``Welcome``, and keeps the ``DesiredState`` and
``Command`` messages the coordinator pushes. When the coordinator is away it
reconnects with exponential backoff and jitter; it never raises into the agent,
which keeps serving with its last-known state. With an ``Enroller`` it enrolls (or
loads saved credentials) before each session, sends the enrolled agent id and
credentials in Hello and, with TLS, connects with the client certificate.

Everything the rest of the agent sees is a plain dataclass defined here; gRPC
and protobuf types stay inside this module.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

import grpc

from agent.enrollment import Enroller, EnrollmentUnavailableError
from agent.errors import FatalError
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


# --------------------------------------------------------------------- what we send


class ModelInfo(NamedTuple):
    """A model the agent has loaded. A plain (name, version, task, variant) tuple works too."""

    name: str
    version: str
    task: str = ""
    variant: str = ""


@dataclass(frozen=True, slots=True)
class HardwareInfo:
    """What the edge box has to run models on."""

    cpu_count: int = 0
    memory_bytes: int = 0
    # Accelerator names, e.g. "NVIDIA L4".
    accelerators: tuple[str, ...] = ()
    # ONNX Runtime execution providers, e.g. "CPUExecutionProvider".
    execution_providers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who the agent is and what it serves: the content of Hello.

    The identity provider is called at every (re)connect, so a changed model
    list is announced on the next session.
    """

    agent_id: str
    site: str
    # Base URL where clients reach this agent's HTTP API, e.g. "http://10.0.0.7:8000".
    http_url: str
    # WGS84 degrees; None when the agent does not know where it is.
    lat: float | None = None
    lon: float | None = None
    # Agent software version.
    version: str = ""
    hardware: HardwareInfo = HardwareInfo()
    # ModelInfo or plain (name, version, task, variant) tuples.
    models: Sequence[ModelInfo | tuple[str, str, str, str]] = ()
    # Credential from enrollment; never printed.
    token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """One load sample: the content of LoadReport."""

    # Requests accepted but not yet started.
    queue_depth: int = 0
    # Sequences in the running batch.
    running_sequences: int = 0
    # Sequences waiting for a batch slot.
    waiting_sequences: int = 0
    # Generated tokens per second over the last interval.
    tokens_per_second: float = 0.0
    # Fraction [0, 1] of the KV cache in use.
    kv_cache_used_fraction: float = 0.0
    kv_cache_used_tokens: int = 0
    free_memory_bytes: int = 0
    # Counters since agent start.
    requests_total: int = 0
    requests_failed_total: int = 0
    overflow_requests_total: int = 0
    # The agent is draining: it finishes running work and should get no new routes.
    draining: bool = False
    # When the sample was taken; None means "now" (when it is sent).
    timestamp: datetime | None = None


# ------------------------------------------------------------------ what we receive


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """A model version the coordinator wants this agent to have."""

    name: str
    version: str
    artifact_url: str
    # Hex sha256 of the artifact.
    sha256: str


@dataclass(frozen=True, slots=True)
class OverflowTarget:
    """Where to send work the agent cannot take itself."""

    name: str
    # "peer", "gpu_pool", "hosted_provider" or "unspecified".
    kind: str
    url: str
    # Models the target serves; empty means any.
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What the coordinator wants this agent to run."""

    version: int
    models: tuple[ModelTarget, ...] = ()
    overflow_targets: tuple[OverflowTarget, ...] = ()
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Command:
    """An instruction from the coordinator."""

    # "drain", "resume", "reload" or "unspecified".
    kind: str
    reason: str = ""


IdentityProvider = Callable[[], AgentIdentity]
LoadProvider = Callable[[], LoadSnapshot]


class _SessionLost(Exception):
    """The session ended or could not start; the run loop retries. Never leaves this module."""

    def __init__(self, reason: str, *, rejected: bool = False) -> None:
        super().__init__(reason)
        # The coordinator refused us (bad Hello, credentials): retrying alone will not help.
        self.rejected = rejected


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
        target: str,
        identity: IdentityProvider,
        load: LoadProvider,
        *,
        enroller: Enroller | None = None,
        on_desired_state: Callable[[DesiredState], None] | None = None,
        on_command: Callable[[Command], None] | None = None,
        default_report_interval_s: float = 2.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        if not target:
            raise ValueError("target must be a gRPC target such as 'coordinator:50051'")
        if not 0 < initial_backoff_s <= max_backoff_s:
            raise ValueError("need 0 < initial_backoff_s <= max_backoff_s")
        if default_report_interval_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("intervals and timeouts must be positive")
        self.target = target
        self._identity = identity
        self._load = load
        self._enroller = enroller
        self._on_desired_state = on_desired_state
        self._on_command = on_command
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._connect_timeout_s = connect_timeout_s
        self._rng = rng or random.Random()

        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        #: Id of the current session (from Welcome); None while disconnected.
        self.session_id: str | None = None
        #: Report interval in use (the coordinator's, once welcomed).
        self.report_interval_s = default_report_interval_s
        #: Latest DesiredState received, kept across reconnects; None until the first.
        self.last_desired_state: DesiredState | None = None
        #: Why the last session ended or failed; None while none has.
        self.last_error: str | None = None
        #: Sessions opened (Welcome received) since start.
        self.sessions_opened = 0

    @property
    def connected(self) -> bool:
        """True while a session is open (Welcome received, stream alive)."""
        return self.session_id is not None

    async def start(self) -> None:
        """Start the background session task (no-op when already running)."""
        if self._task is not None and not self._task.done():
            return
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name=f"coordinator-session-{self.target}")

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
        failures = 0
        while not self._stopping.is_set():
            opened_before = self.sessions_opened
            rejected = False
            try:
                await self._run_session()
                reason = "coordinator closed the session"
            except _SessionLost as exc:
                reason, rejected = str(exc), exc.rejected
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("coordinator session failed unexpectedly")
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self.session_id = None
            if self._stopping.is_set():
                return
            self.last_error = reason
            failures = 0 if self.sessions_opened > opened_before else failures + 1
            delay = self._backoff(failures)
            if rejected:
                level = logging.ERROR
            else:
                level = logging.WARNING if failures <= 1 else logging.DEBUG
            logger.log(
                level,
                "coordinator session with %s ended: %s; reconnecting in %.1f s",
                self.target,
                reason,
                delay,
            )
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
            except TimeoutError:
                continue

    def _backoff(self, failures: int) -> float:
        """Exponential backoff with equal jitter, capped at max_backoff_s."""
        ceiling = min(self._max_backoff_s, self._initial_backoff_s * 2.0**failures)
        return ceiling / 2.0 + self._rng.uniform(0.0, ceiling / 2.0)

    def _channel(self, credentials: grpc.ChannelCredentials | None) -> Any:
        if credentials is None:
            return grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.target, credentials, options=_CHANNEL_OPTIONS)

    async def _session_identity(self) -> tuple[AgentIdentity, grpc.ChannelCredentials | None]:
        """Who to say we are, and how to connect (enrolling first when configured).

        The channel is TLS only with enrollment's client certificate; without an enroller
        it is plaintext (``agent.__main__`` refuses ``coordinator.tls`` without one).
        """
        identity = self._identity()
        if self._enroller is None:
            return identity, None
        try:
            enrolled = await self._enroller.ensure()
        except FatalError as exc:
            raise _SessionLost(str(exc), rejected=True) from exc
        except EnrollmentUnavailableError as exc:
            raise _SessionLost(str(exc)) from exc
        identity = replace(identity, agent_id=enrolled.agent_id, token=enrolled.token)
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
                raise _SessionLost(
                    f"{exc.code().name}: {exc.details()}", rejected=exc.code() in _REJECTIONS
                ) from exc
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
                raise _SessionLost(f"stream closed: {exc}") from exc
            finally:
                call.cancel()

    async def _open(self, call: Any, identity: AgentIdentity) -> None:
        hello = _hello_to_pb(identity)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await call.write(hello)
                first = await call.read()
        except TimeoutError:
            raise _SessionLost(
                f"no Welcome within {self._connect_timeout_s:g} s from {self.target}"
            ) from None
        if first is grpc.aio.EOF:
            raise _SessionLost("coordinator closed the stream before Welcome")
        if first.WhichOneof("body") != "welcome":
            raise _SessionLost(f"expected Welcome, got {first.WhichOneof('body')}")
        welcome = first.welcome
        if welcome.report_interval_ms > 0:
            self.report_interval_s = welcome.report_interval_ms / 1000.0
        self.session_id = welcome.session_id
        self.sessions_opened += 1
        self.last_error = None
        logger.info(
            "connected to coordinator %s (session %s, report every %.1f s)",
            self.target,
            welcome.session_id,
            self.report_interval_s,
        )

    async def _exchange(self, call: Any) -> None:
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
                state = _desired_state_from_pb(message.desired_state)
                self.last_desired_state = state
                logger.info(
                    "desired state v%d: %d models, %d overflow targets",
                    state.version,
                    len(state.models),
                    len(state.overflow_targets),
                )
                _notify(self._on_desired_state, state)
            elif kind == "command":
                command = _command_from_pb(message.command)
                logger.info("coordinator command %s (%s)", command.kind, command.reason or "-")
                _notify(self._on_command, command)
            else:
                logger.warning("ignoring unexpected %s from coordinator", kind)

    async def _report_loop(self, call: Any) -> None:
        while True:
            report = self._take_load_report()
            if report is not None:
                await call.write(pb.AgentMessage(load_report=report))
            try:
                await asyncio.wait_for(self._stopping.wait(), self.report_interval_s)
            except TimeoutError:
                continue
            await call.write(pb.AgentMessage(bye=pb.Bye(reason="agent stopping")))
            await call.done_writing()
            return

    def _take_load_report(self) -> Any:
        try:
            snapshot = self._load()
        except Exception:
            logger.exception("load provider failed; skipping this report")
            return None
        return _load_to_pb(snapshot)


def _notify(callback: Callable[[Any], None] | None, value: object) -> None:
    if callback is None:
        return
    try:
        callback(value)
    except Exception:
        logger.exception("coordinator session callback %r failed", callback)


# ------------------------------------------------------------- wire conversion


def _hello_to_pb(identity: AgentIdentity) -> Any:
    location = None
    if identity.lat is not None and identity.lon is not None:
        location = pb.Location(lat=identity.lat, lon=identity.lon)
    hw = identity.hardware
    return pb.AgentMessage(
        hello=pb.Hello(
            agent_id=identity.agent_id,
            token=identity.token,
            agent_version=identity.version,
            site=identity.site,
            location=location,
            hardware=pb.Hardware(
                cpu_count=hw.cpu_count,
                memory_bytes=hw.memory_bytes,
                accelerators=list(hw.accelerators),
                execution_providers=list(hw.execution_providers),
            ),
            http_url=identity.http_url,
            models=[
                pb.LoadedModel(name=m.name, version=m.version, task=m.task, variant=m.variant)
                for m in (ModelInfo(*model) for model in identity.models)
            ],
        )
    )


def _load_to_pb(snapshot: LoadSnapshot) -> Any:
    report = pb.LoadReport(
        queue_depth=snapshot.queue_depth,
        running_sequences=snapshot.running_sequences,
        waiting_sequences=snapshot.waiting_sequences,
        tokens_per_second=snapshot.tokens_per_second,
        kv_cache_used_fraction=snapshot.kv_cache_used_fraction,
        kv_cache_used_tokens=snapshot.kv_cache_used_tokens,
        free_memory_bytes=snapshot.free_memory_bytes,
        requests_total=snapshot.requests_total,
        requests_failed_total=snapshot.requests_failed_total,
        overflow_requests_total=snapshot.overflow_requests_total,
        draining=snapshot.draining,
    )
    report.timestamp.FromDatetime(snapshot.timestamp or datetime.now(UTC))
    return report


_OVERFLOW_KINDS = {
    pb.OVERFLOW_KIND_PEER: "peer",
    pb.OVERFLOW_KIND_GPU_POOL: "gpu_pool",
    pb.OVERFLOW_KIND_HOSTED_PROVIDER: "hosted_provider",
}
_COMMAND_KINDS = {
    pb.Command.KIND_DRAIN: "drain",
    pb.Command.KIND_RELOAD: "reload",
    pb.Command.KIND_RESUME: "resume",
}


def _desired_state_from_pb(message: Any) -> DesiredState:
    return DesiredState(
        version=message.version,
        models=tuple(
            ModelTarget(
                name=m.name, version=m.version, artifact_url=m.artifact_url, sha256=m.sha256
            )
            for m in message.models
        ),
        overflow_targets=tuple(
            OverflowTarget(
                name=t.name,
                kind=_OVERFLOW_KINDS.get(t.kind, "unspecified"),
                url=t.url,
                models=tuple(t.models),
            )
            for t in message.overflow_targets
        ),
        config=dict(message.config),
    )


def _command_from_pb(message: Any) -> Command:
    return Command(kind=_COMMAND_KINDS.get(message.kind, "unspecified"), reason=message.reason)
