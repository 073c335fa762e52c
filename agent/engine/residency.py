"""Which text models hold their weights in memory, under one memory budget.

Every text model served here is known to the agent at all times by its light part (the
tokenizer, chat template and grammar compiler: requests are validated and templated
without the weights). Its heavy part (the ONNX Runtime session, its key/value cache and
its scheduler) is loaded when a request needs it and unloaded when it has been idle past
its keep-alive or when a newcomer needs its room:

- ``available``: known, not loaded. A request waits for its load, up to its deadline,
  in a bounded queue per model; past the queue it gets 503 with ``Retry-After`` from the
  expected load time. Requests for loaded models never wait behind a load.
- ``loading``: one model at a time, on the loader's own thread (the event loop and the
  engines' steps go on).
- ``loaded``: serving. Its commitment against the budget is its footprint (measured as the
  resident-set change across load and warm-up; before the first load, predicted from its
  files) plus the key/value cache and prefix cache it may grow to.
- ``draining``: being unloaded (its running requests finish first).
- ``failed``: its last load failed; its waiters got the error, and the next load is tried
  only on demand and not before ``failed_retry_s`` (never in a loop).

Room for a newcomer is made by unloading least-recently-used idle models that are not
pinned and were loaded at least ``min_residency_s`` ago, only as many as it needs. When
nothing can go, the load waits for a model to go idle (up to ``room_wait_s``) and then
fails its waiters with 503, which the overflow path may forward. This mirrors Ollama's
scheduler (``OLLAMA_MAX_LOADED_MODELS``, ``keep_alive``) and avoids its known failures:
the estimate is replaced by a measurement after the first load, a model that died is not
listed as loaded, and a failed load is not retried in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.engine import step_cores
from agent.engine.memory import heap_in_use, trim_heap
from agent.errors import AgentError, InvalidRequestError, ModelNotFoundError
from edgefleet.contract import Command, CommandKind

log = logging.getLogger(__name__)

__all__ = [
    "ModelLoadFailedError",
    "ModelState",
    "ModelUnavailableError",
    "Residency",
    "ResidencyConfig",
    "ResidencyListener",
    "default_budget_bytes",
    "parse_keep_alive",
]


class ModelState(enum.StrEnum):
    AVAILABLE = "available"
    LOADING = "loading"
    LOADED = "loaded"
    DRAINING = "draining"
    FAILED = "failed"


class ModelUnavailableError(AgentError):
    """The model is not loaded and cannot be now (its load queue is full, no room in the
    memory budget, or its load takes longer than the request may wait): try again after
    ``Retry-After``, or elsewhere."""

    status = 503
    error_type = "server_error"
    code = "model_not_loaded"

    def __init__(self, message: str, *, retry_after: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason  # queue_full, no_room, load_timeout (a metrics label)


class ModelLoadFailedError(AgentError):
    """The model's weights could not be loaded (said in the message); it is not retried
    before ``failed_retry_s``."""

    status = 503
    error_type = "server_error"
    code = "model_load_failed"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ResidencyConfig:
    budget_bytes: int  # what loaded models may commit together
    max_loaded: int = 0  # models loaded at once; 0: as many as fit
    keep_alive_s: float = 300.0  # idle this long, a model is unloaded; < 0: never
    pinned: frozenset[str] = frozenset()  # loaded at start, never unloaded for room
    min_residency_s: float = 10.0  # a model loaded this recently is never evicted
    max_waiting: int = 32  # requests waiting for one model's load; more get 503
    room_wait_s: float = 30.0  # how long a load waits for a loaded model to go idle
    failed_retry_s: float = 30.0  # after a failed load, the next try waits this long
    max_request_keep_alive_s: float = 3600.0  # a request's keep_alive is capped here


def default_budget_bytes(share: float = 0.75) -> int:
    """``share`` of this process's memory limit: the cgroup's (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) when one is set, else the machine's MemTotal."""
    limit = _mem_total()
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            text = Path(path).read_text().strip()
            if text and text != "max":
                limit = min(limit, int(text))
    return int(limit * share)


def _mem_total() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object) -> float:
    """Ollama's ``keep_alive``: seconds as a number, or a duration string ("30s", "5m",
    "1h", "1h30m", "-1"); negative means forever. InvalidRequestError otherwise."""
    if isinstance(value, bool):
        raise InvalidRequestError("keep_alive must be a number of seconds or a duration such "
                                  "as '5m'", param="keep_alive")  # fmt: skip
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and 0 < len(value) <= 32:
        seconds = _parse_duration(value.strip())
    else:
        raise InvalidRequestError(
            "keep_alive must be a number of seconds or a duration such as '5m'",
            param="keep_alive",
        )
    if not math.isfinite(seconds) or abs(seconds) > 10 * 365 * 86400:
        raise InvalidRequestError("keep_alive is out of range", param="keep_alive")
    return seconds


def _parse_duration(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    rest = text[1:] if text.startswith(("+", "-")) else text
    if not rest or rest[0] in "+-" or rest != rest.strip():  # " ", "-", "--5", "+-5m", "- 5"
        raise InvalidRequestError(
            f"keep_alive {text!r} is not a duration such as '30s', '5m' or '1h'",
            param="keep_alive",
        )
    try:
        return sign * float(rest)  # a bare number: seconds
    except ValueError:
        pass
    total, number = 0.0, ""
    i = 0
    while i < len(rest):
        ch = rest[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if rest.startswith("ms", i) else ch
        if unit not in _UNITS or not number:
            raise InvalidRequestError(
                f"keep_alive {text!r} is not a duration such as '30s', '5m' or '1h'",
                param="keep_alive",
            )
        try:
            total += float(number) * _UNITS[unit]
        except ValueError as exc:
            raise InvalidRequestError(f"keep_alive {text!r} is not a duration",
                                      param="keep_alive") from exc  # fmt: skip
        number = ""
        i += len(unit)
    if number:
        raise InvalidRequestError(f"keep_alive {text!r} lacks a unit after {number!r}",
                                  param="keep_alive")  # fmt: skip
    return sign * total


class Loadable(Protocol):
    """What the residency loads and unloads: a text model's heavy part."""

    @property
    def model_id(self) -> str: ...

    @property
    def version(self) -> str: ...

    def build_heavy(self, *, warm_up: bool = True) -> object:
        """Blocking: make the session and engine (run on the loader's thread); with
        ``warm_up``, run the session's first token there too (not on the step thread)."""
        ...

    def warm_heavy(self, heavy: object) -> None:
        """Blocking: run the first token through what :meth:`build_heavy` made without
        one, on the calling thread."""
        ...

    async def attach_heavy(self, heavy: object) -> None:
        """Start what :meth:`build_heavy` made and serve with it (on the event loop)."""
        ...

    async def warm_up(self) -> None: ...

    async def detach_heavy(
        self, *, trim: bool = True, free: bool = True
    ) -> Callable[[], None] | None:
        """Stop serving with the heavy part and release it (its requests finished);
        ``trim=False`` leaves trimming the C heap to the caller; ``free=False`` returns,
        once it no longer serves, the blocking call that frees its memory, unrun."""
        ...

    def busy(self) -> int:
        """Requests running or queued in the engine."""
        ...


_command_tasks: set[asyncio.Task[object]] = set()


def follow_model_command(residency: Residency | None, command: Command) -> bool:
    """Start what a coordinator's LOAD_MODEL or UNLOAD_MODEL command asks (on the running
    loop; its outcome is logged and shows in /v1/models and the next report). False when
    this agent does not manage that model's memory."""
    load = command.kind is CommandKind.LOAD_MODEL
    if command.kind not in (CommandKind.LOAD_MODEL, CommandKind.UNLOAD_MODEL):
        return False
    if residency is None or residency.state(command.model) is None:
        log.warning("coordinator command %s %r: not a text model this agent serves",
                    command.kind, command.model[:128])  # fmt: skip
        return False
    log.info("coordinator command: %s %s (%s)", command.kind, command.model, command.reason)
    job = residency.load(command.model) if load else residency.unload(command.model)
    task: asyncio.Task[object] = asyncio.get_running_loop().create_task(job)
    _command_tasks.add(task)

    def done(finished: asyncio.Task[object]) -> None:
        _command_tasks.discard(finished)
        if not finished.cancelled() and finished.exception() is not None:
            log.warning("coordinator command %s %s failed: %s", command.kind, command.model,
                        finished.exception())  # fmt: skip

    task.add_done_callback(done)
    return True


class ResidencyListener(Protocol):
    def on_load(self, model: str, reason: str, result: str, seconds: float) -> None: ...

    def on_load_wait(self, model: str, seconds: float) -> None: ...

    def on_eviction(self, model: str, reason: str) -> None: ...

    def on_reload_after_eviction(self, model: str) -> None: ...


@dataclass
class _Slot:
    model: Loadable
    predicted_bytes: int  # weights' footprint before the first load (from the files)
    reserve_bytes: int  # the key/value and prefix caches it may grow to
    state: ModelState = ModelState.AVAILABLE
    measured_bytes: int | None = None  # set by measured(): its change across load and warm-up
    active: int = 0  # requests holding it
    waiting: int = 0  # requests waiting for its load
    last_used: float = 0.0
    loaded_at: float = 0.0
    expires_at: float | None = None  # None: never (pinned, or keep-alive < 0)
    load_seconds: float | None = None  # the last load's duration
    # the last load's duration with the cores to itself, and beside serving models (its
    # loader then yields them: Qwen2.5-Coder on two cores, 0.9 s against 7-9 s)
    load_seconds_alone: float | None = None
    load_seconds_beside: float | None = None
    load_started: float | None = None  # the load in progress's start
    loading: asyncio.Future[None] | None = None
    failure: str = ""
    failed_at: float = 0.0
    room_made: bool = False  # loading, with its commitment inside the budget
    evicted_at: float | None = None
    # Who pins it: "config" (residency.pinned), "target" (the coordinator's model target
    # says pinned), "request" (a key allowed to pin asked keep_alive < 0). Pinned: never
    # unloaded for room or idleness.
    pins: set[str] = field(default_factory=set)

    @property
    def pinned(self) -> bool:
        return bool(self.pins)

    @property
    def footprint(self) -> int:
        return self.measured_bytes if self.measured_bytes is not None else self.predicted_bytes

    def measured(self, change: int | None) -> None:
        """A load's measured footprint; memory moves with other models' caches too, so a
        change far below the files' size is noise, not a footprint, and is not kept."""
        if change is not None and change > self.predicted_bytes // 4:
            self.measured_bytes = change

    @property
    def committed(self) -> int:
        return self.footprint + self.reserve_bytes


# nice 10, not 19: measured with the both-loaded scenario (two cores), Qwen2.5-Coder's cold
# load beside a busy SmolLM2 took 7-9 s at nice 10 against 6-27 s at nice 19, and
# SmolLM2's TTFT p99 meanwhile was 0.97-1.38x its own in five runs of the scenario alone
# (1.82 in the full benchmark's run) against 0.88-2.3x in eleven runs at nice 19 (over 1.5
# in two); at nice 0 the load took 1.5 s and SmolLM2's p99 was 2x its own. SCHED_IDLE with
# a floor under the load was measured beside nice 10 and not taken: its figures are in
# docs/operators/memory-budget.md (Cores)
LOADER_NICE = 10
# a model's expected load time (Retry-After, the wait a load report gives routers) before
# its first load, and the least given for a load in progress that runs past its last one's
DEFAULT_EXPECTED_LOAD_S = 5.0
MIN_EXPECTED_LOAD_S = 1.0


def _lower_priority(tid: int) -> None:
    """Linux: a thread's own nice value (``tid`` a native thread id of this process)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, LOADER_NICE)


class _LoaderThread:
    """Each load's blocking part (session and engine) on a thread of its own, at normal
    priority while no other model serves and at nice 10 from the moment one does (at the
    start of the load or during it): a load on a busy box then yields the cores to the
    engines' steps (on two cores, SmolLM2's TTFT p99 was 2.8x its own while Qwen loaded
    beside it at the same priority), and a load nothing else needs the cores for (a swap:
    the requests wait for it) is not held back by whatever else runs on the machine. A
    thread per load, because a thread cannot raise its priority again without privilege.
    While it yields, the steps' threads are each pinned to a core of their own
    (step_cores): a nice value orders only the threads that share a core, and Linux
    otherwise put the step thread and the pool's worker together on one core beside the
    loader alone on the other.
    """

    def __init__(self, name: str = "model-loader") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._tid: int | None = None  # the running load's thread
        self._yielding = False  # this load yields the cores (set at its start or during it)
        self._thread: threading.Thread | None = None
        self._separated = False  # this load asked step_cores to pin the steps' threads

    async def run(self, build: Callable[[], object], *, yielding: bool) -> object:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()

        def settle(result: object, error: BaseException | None) -> None:
            if future.done():  # its waiter was cancelled
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def target() -> None:
            with self._lock:
                self._tid = threading.get_native_id()
                if self._yielding:
                    _lower_priority(self._tid)
                    self._separate()
            result: object = None
            error: BaseException | None = None
            try:
                result = build()
            except BaseException as exc:  # handed to the awaiting coroutine
                error = exc
            finally:
                with self._lock:
                    self._tid = None
                    if self._separated:
                        self._separated = False
                        step_cores.restore()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, result, error)

        with self._lock:
            self._yielding = yielding
        self._thread = threading.Thread(target=target, name=self._name, daemon=True)
        self._thread.start()
        return await future

    @property
    def yielded(self) -> bool:
        """The last load yielded the cores at some point (from its start or later)."""
        with self._lock:
            return self._yielding

    def yield_cores(self) -> None:
        """A model started serving: the load in progress (if any) steps back from now."""
        with self._lock:
            if self._yielding:
                return
            self._yielding = True
            if self._tid is not None:
                _lower_priority(self._tid)
                self._separate()

    def _separate(self) -> None:
        """(Under the lock) the steps' threads on cores of their own while this load
        yields; see step_cores: a nice value orders only the threads sharing a core."""
        if not self._separated:
            self._separated = True
            step_cores.separate()

    def join(self) -> None:
        thread = self._thread
        if thread is not None:
            thread.join()


def _rss_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


class Residency:
    """Loads, keeps and unloads the agent's text models' heavy parts within the budget."""

    def __init__(
        self,
        config: ResidencyConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rss: Callable[[], int] = _rss_bytes,
        trim: Callable[[str], object] = trim_heap,
        heap: Callable[[], int | None] = heap_in_use,
    ) -> None:
        self.config = config
        self._clock = clock
        # A load's footprint: the change of the C heap's bytes in use across it (glibc), or
        # else of the resident set. The heap's gauge is the same whether or not freed pages
        # were given back, so with it a swap waits for no trim (10-30 ms each): the one
        # after the old model's free runs on a thread of its own beside the new session's
        # build (its pages are back long before the build peaks), and the one after the
        # build once the model serves. The resident set needs both trims first: pages left
        # in the heap would be reused without growing it, and the footprint measured short
        # (SmolLM2 loaded at start: 72-75 MiB, 122-128 MiB when loaded later). A model's
        # first load trims first either way: at start the heap holds what reading every
        # model's tokenizer left, which the first Qwen2.5-Coder load did not reuse (its
        # resident set peaked 86 MiB higher than its later loads').
        # A model measured before builds beside the free of the models unloaded for its
        # room (on a thread of its own): they leave the budget once they no longer serve,
        # and their pages are back long before the new session's weights are unpacked
        # (freeing Qwen2.5-Coder took 18-60 ms of a 0.5 s SmolLM2 load when done first).
        # The heap's change then mixes the two, so that load keeps the model's earlier
        # measure; a first load waits for the free and measures. When the newcomer commits
        # no more than what left, the freed pages are not trimmed: the build reuses them,
        # where a trim made it fault fresh pages in (SmolLM2 after Qwen2.5-Coder: 0.37 s
        # with the trim, 0.28 s without, medians of 6 in one process). A larger newcomer
        # waits for the free and for the trim of the freed pages: pages it does not reuse
        # would add to its peak (building beside the free, Qwen2.5-Coder's load after
        # SmolLM2 peaked 10-15 MiB higher in the swap benchmark; building beside the trim
        # with glibc's default malloc arenas, whose freed pages the build's arena does not
        # reuse, it peaked 53 MiB over the line in one run of two).
        self._heap = heap
        self._gauged = heap() is not None  # once: a reading takes 10-15 ms in a used heap
        self._rss = rss
        self._trim = trim
        self._background: set[asyncio.Future[object]] = set()  # frees and trims
        self._slots: dict[str, _Slot] = {}
        self._loader = _LoaderThread()
        self._load_lock = asyncio.Lock()  # one load at a time
        self._changed = asyncio.Event()  # a model went idle or was unloaded
        self._task: asyncio.Task[None] | None = None
        self.listeners: list[ResidencyListener] = []

    # ---- registration ---------------------------------------------------------------

    def register(
        self,
        model: Loadable,
        *,
        predicted_bytes: int,
        reserve_bytes: int,
        loaded: bool,
        measured_bytes: int | None = None,
    ) -> None:
        """Know ``model`` (replacing a slot of the same id: a new version swapped in);
        ``measured_bytes``: what a load made elsewhere (a rollout's) measured, if anything."""
        now = self._clock()
        slot = _Slot(model, predicted_bytes, reserve_bytes)
        if model.model_id in self.config.pinned:
            slot.pins.add("config")
        old = self._slots.get(model.model_id)
        if old is not None:  # a new version keeps its target's and requests' pins
            slot.pins |= old.pins - {"config"}
        if (
            old is not None
            and old.measured_bytes is not None
            and old.model.version == (model.version)
        ):
            slot.measured_bytes = old.measured_bytes
        slot.measured(measured_bytes)
        if loaded:
            slot.state = ModelState.LOADED
            slot.loaded_at = slot.last_used = now
            slot.expires_at = self._expiry(slot, now, None)
        self._slots[model.model_id] = slot

    def unregister(self, model_id: str) -> None:
        """Forget ``model_id`` (no longer served here); its owner closes its engine once its
        requests are done (a load in progress finishes first: its waiters are served)."""
        if self._slots.pop(model_id, None) is not None:
            self._changed.set()

    def set_pinned(self, model_id: str, source: str, pinned: bool) -> None:
        """Pin ``model_id`` (never unloaded for room or idleness) or take ``source``'s pin
        back; an unpinned idle model's keep-alive starts again from now."""
        slot = self._slot(model_id)
        if pinned:
            slot.pins.add(source)
            slot.expires_at = None
            return
        slot.pins.discard(source)
        if not slot.pinned and slot.state is ModelState.LOADED and slot.active == 0:
            slot.expires_at = self._expiry(slot, self._clock(), None)
            self._changed.set()

    def state(self, model_id: str) -> ModelState | None:
        slot = self._slots.get(model_id)
        return None if slot is None else slot.state

    # ---- what is committed ------------------------------------------------------------

    def cold(self) -> tuple[tuple[str, float], ...]:
        """Models not in memory now (name, expected load seconds), sorted by name: what a
        load report tells routers."""
        return tuple(
            (model_id, round(self.expected_load_s(slot), 3))
            for model_id, slot in sorted(self._slots.items())
            if slot.state is not ModelState.LOADED
        )

    def resident_bytes(self, model_id: str) -> int | None:
        """Bytes ``model_id``'s weights hold now (0: not loaded); None when not managed."""
        slot = self._slots.get(model_id)
        if slot is None:
            return None
        return slot.footprint if slot.state in (ModelState.LOADED, ModelState.DRAINING) else 0

    def committed_bytes(self) -> int:
        """What loaded and loading models commit against the budget."""
        return sum(
            s.committed for s in self._slots.values()
            if s.state in (ModelState.LOADED, ModelState.DRAINING)
            or (s.state is ModelState.LOADING and s.room_made)
        )  # fmt: skip

    def reserve_for(self, nbytes: int) -> None:
        """Raise if ``nbytes`` more (a rollout's second copy) does not fit now."""
        free = self.config.budget_bytes - self.committed_bytes()
        if nbytes > free:
            raise ModelUnavailableError(
                f"the memory budget has {max(0, free) >> 20} MiB free, {nbytes >> 20} MiB "
                "are needed",
                retry_after=self.config.room_wait_s,
                reason="no_room",
            )

    def snapshot(self) -> list[dict[str, object]]:
        """Per model: state, resident bytes, expiry (wall-clock seconds), pinned."""
        now_mono, now_wall = self._clock(), time.time()
        out: list[dict[str, object]] = []
        for model_id, slot in sorted(self._slots.items()):
            loaded = slot.state in (ModelState.LOADED, ModelState.DRAINING)
            expires = None
            if loaded and slot.expires_at is not None and slot.active == 0:
                expires = now_wall + max(0.0, slot.expires_at - now_mono)
            out.append({
                "model": model_id,
                "version": slot.model.version,
                "state": str(slot.state),
                "resident_bytes": slot.footprint if loaded else 0,
                "expires_at": expires,
                "pinned": slot.pinned,
            })  # fmt: skip
        return out

    # ---- requests ---------------------------------------------------------------------

    async def acquire(
        self,
        model_id: str,
        *,
        timeout_s: float | None = None,
        keep_alive_s: float | None = None,
        pin: bool = False,
    ) -> None:
        """Hold ``model_id`` loaded for one request: load it first when it is not, waiting
        at most ``timeout_s``. Pair with :meth:`release`. ``keep_alive_s`` only extends the
        model's idle expiry (capped at ``max_request_keep_alive_s``; a negative one counts
        as 0, never as forever) and never protects it from being unloaded for room;
        ``pin`` (a key allowed to pin models asked) pins it as the "request" source."""
        slot = self._slot(model_id)
        if slot.state is not ModelState.LOADED:
            await self._wait_loaded(slot, "request", timeout_s)
        elif self._load_lock.locked():  # a load runs beside this request's steps
            self._loader.yield_cores()
        now = self._clock()
        slot.active += 1
        slot.last_used = now
        if pin:
            self.set_pinned(model_id, "request", True)
        elif keep_alive_s is not None:
            keep_alive_s = min(max(keep_alive_s, 0.0), self.config.max_request_keep_alive_s)
            slot.expires_at = self._later(slot.expires_at, self._expiry(slot, now, keep_alive_s))

    def release(self, model_id: str) -> None:
        slot = self._slots.get(model_id)
        if slot is None:
            return
        slot.active = max(0, slot.active - 1)
        now = self._clock()
        slot.last_used = now
        if slot.active == 0:
            slot.expires_at = self._later(slot.expires_at, self._expiry(slot, now, None))
            self._changed.set()

    def _expiry(self, slot: _Slot, now: float, keep_alive_s: float | None) -> float | None:
        if slot.pinned:
            return None
        seconds = self.config.keep_alive_s if keep_alive_s is None else keep_alive_s
        return None if seconds < 0 else now + seconds

    @staticmethod
    def _later(a: float | None, b: float | None) -> float | None:
        """The later of two expiries (None: never): a request only ever extends one."""
        return None if a is None or b is None else max(a, b)

    def _slot(self, model_id: str) -> _Slot:
        slot = self._slots.get(model_id)
        if slot is None:
            raise ModelNotFoundError(f"The model '{model_id}' is not served here",
                                     param="model")  # fmt: skip
        return slot

    def expected_load_s(self, slot: _Slot) -> float:
        """Seconds until the model is loaded, as its last load measured: of a load like the
        one it would be now (beside serving models, or with the cores to itself), else of
        any; less what has passed of a load in progress (at least MIN_EXPECTED_LOAD_S);
        DEFAULT_EXPECTED_LOAD_S before its first load."""
        beside = self._serving()
        like_now = slot.load_seconds_beside if beside else slot.load_seconds_alone
        expected = like_now if like_now is not None else slot.load_seconds
        if expected is None:
            return DEFAULT_EXPECTED_LOAD_S
        if slot.state is ModelState.LOADING and slot.load_started is not None:
            expected -= self._clock() - slot.load_started
        return max(expected, MIN_EXPECTED_LOAD_S)

    async def _wait_loaded(self, slot: _Slot, reason: str, timeout_s: float | None) -> None:
        if slot.state is ModelState.FAILED:
            wait = slot.failed_at + self.config.failed_retry_s - self._clock()
            if wait > 0:
                raise ModelLoadFailedError(
                    f"model {slot.model.model_id} failed to load: {slot.failure}",
                    retry_after=wait,
                )
        if slot.waiting >= self.config.max_waiting:
            raise ModelUnavailableError(
                f"model {slot.model.model_id} is loading and {slot.waiting} requests already "
                "wait for it",
                retry_after=self.expected_load_s(slot),
                reason="queue_full",
            )
        started = self._clock()
        slot.waiting += 1
        try:
            future = self._start_load(slot, reason)
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError as exc:
            raise ModelUnavailableError(
                f"model {slot.model.model_id} did not load within the request's {timeout_s:.1f} s",
                retry_after=self.expected_load_s(slot),
                reason="load_timeout",
            ) from exc
        finally:
            slot.waiting -= 1
            for listener in self.listeners:
                listener.on_load_wait(slot.model.model_id, self._clock() - started)

    # ---- loading and unloading ------------------------------------------------------

    def _start_load(self, slot: _Slot, reason: str) -> asyncio.Future[None]:
        if slot.state is ModelState.LOADED:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if slot.loading is None or slot.loading.done():
            slot.loading = asyncio.ensure_future(self._load(slot, reason))
            # a failure nobody awaited (every waiter timed out) is logged, not "never
            # retrieved"
            slot.loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        return slot.loading

    async def load(self, model_id: str, reason: str = "command") -> None:
        """Load ``model_id`` now (an operator's command, a pinned model at start). Already
        loaded, its keep-alive starts again from now (how a coordinator keeps a model warm
        through a quiet stretch without unloading and loading it)."""
        slot = self._slot(model_id)
        if slot.state is ModelState.LOADED:
            now = self._clock()
            slot.last_used = now
            if slot.active == 0:
                slot.expires_at = self._later(slot.expires_at, self._expiry(slot, now, None))
            return
        await asyncio.shield(self._start_load(slot, reason))

    async def _load(self, slot: _Slot, reason: str) -> None:
        model_id = slot.model.model_id
        async with self._load_lock:
            if slot.state is ModelState.LOADED:
                return
            slot.state = ModelState.LOADING
            started = slot.load_started = self._clock()
            # A model measured before builds beside the free of the models unloaded for
            # its room (see __init__); one yet to measure waits for the free.
            beside = slot.measured_bytes is not None and self._gauged
            freeing: asyncio.Future[object] | None = None
            try:
                frees, freed_bytes = await self._make_room(slot, free_beside=beside)
                slot.room_made = True
                room_s = self._clock() - started
                if frees:
                    # a newcomer no larger than what leaves reuses the freed pages: a
                    # trim would only have it fault them back in; a larger one waits for
                    # the free and its trim, its peak on top of nothing the free still
                    # holds (see __init__)
                    growing = slot.committed > freed_bytes
                    freeing = self._free_later(frees, trim=growing)
                    if growing:
                        await asyncio.shield(freeing)
                if slot.measured_bytes is None:  # see __init__
                    await asyncio.to_thread(self._trim, "before a first load")
                measuring = self._gauged and not beside  # the heap's gauge, off the loop
                heap_before = await self._read_heap() if measuring else None
                rss_before = self._rss()
                # The session's first run pages in what its build did not (Qwen2.5-Coder:
                # 50-100 ms). Beside a serving model it runs on the loader's thread, not
                # as a step ahead of that model's steps; with nothing serving (a swap: its
                # requests wait for it) the engine's warm-up step is its first run, and a
                # token on the loader's thread would be one more (20-30 ms of SmolLM2's
                # 0.4 s load; a model that starts serving during the build then waits
                # for that step once).
                serving = self._serving()
                heavy = await self._loader.run(
                    functools.partial(slot.model.build_heavy, warm_up=serving), yielding=serving
                )
                if not serving and self._serving():  # one started serving meanwhile
                    await _LoaderThread().run(
                        functools.partial(slot.model.warm_heavy, heavy), yielding=True
                    )
                built_s = self._clock() - started
                await slot.model.attach_heavy(heavy)
                await slot.model.warm_up()
                if freeing is not None:
                    await asyncio.shield(freeing)
                    measured = None  # the heap moved with the free too: the last measure stays
                    self._trim_later("session loaded")
                elif measuring:
                    heap_after = await self._read_heap()
                    measured = (
                        heap_after - heap_before
                        if heap_after is not None and heap_before is not None
                        else None
                    )
                    self._trim_later("session loaded")
                else:
                    await asyncio.to_thread(self._trim, "session loaded")
                    measured = self._rss() - rss_before
            except asyncio.CancelledError:
                slot.state = ModelState.AVAILABLE
                slot.room_made = False
                raise
            except Exception as exc:
                slot.room_made = False
                slot.state = ModelState.FAILED
                slot.failure = str(exc.message if isinstance(exc, AgentError) else exc)
                slot.failed_at = self._clock()
                seconds = self._clock() - started
                log.error("model %s: load failed after %.1f s: %s", model_id, seconds,
                          slot.failure)  # fmt: skip
                self._notify_load(model_id, reason, "failed", seconds)
                if isinstance(exc, ModelUnavailableError):
                    slot.state = ModelState.AVAILABLE  # no room: nothing wrong with it
                    raise
                raise ModelLoadFailedError(
                    f"model {model_id} failed to load: {slot.failure}",
                    retry_after=self.config.failed_retry_s,
                ) from exc
            now = self._clock()
            slot.load_seconds = now - started
            if self._loader.yielded:
                slot.load_seconds_beside = slot.load_seconds
            else:
                slot.load_seconds_alone = slot.load_seconds
            slot.measured(measured)
            slot.state = ModelState.LOADED
            slot.room_made = False
            slot.failure = ""
            slot.loaded_at = slot.last_used = now
            slot.expires_at = self._expiry(slot, now, None)
            if slot.evicted_at is not None and now - slot.evicted_at < 60:
                for listener in self.listeners:
                    listener.on_reload_after_eviction(model_id)
            self._notify_load(model_id, reason, "loaded", slot.load_seconds)
            log.info("model %s@%s loaded (%s) in %.2f s (room %.2f, session and engine %.2f, "
                     "start and warm-up %.2f): %d MiB resident, %d MiB committed of the %d MiB "
                     "budget", model_id, slot.model.version, reason, slot.load_seconds, room_s,
                     built_s - room_s, slot.load_seconds - built_s, slot.footprint >> 20,
                     self.committed_bytes() >> 20, self.config.budget_bytes >> 20)  # fmt: skip

    async def _read_heap(self) -> int | None:
        """The heap's gauge, read on a thread of its own that ends with it (see __init__;
        the event loop's default executor would keep one more thread for good)."""
        result = await _LoaderThread("heap-gauge").run(self._heap, yielding=False)
        return result if isinstance(result, int) else None

    def _trim_later(self, reason: str) -> None:
        """Trim the C heap on a thread of its own, not awaited (see __init__). A thread that
        ends with the trim, as a load's does: a pool's would stay, one more thread for
        every agent that ever loaded two models at once."""
        self._in_background(
            _LoaderThread("heap-trim").run(lambda: self._trim(reason), yielding=False),
            "trimming the heap",
        )

    def _in_background(self, work: Awaitable[object], what: str) -> asyncio.Future[object]:
        """``work`` runs on, whoever awaits it or not; :meth:`close` waits for it."""
        future = asyncio.ensure_future(work)
        self._background.add(future)

        def done(f: asyncio.Future[object]) -> None:
            self._background.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.error("%s failed: %s", what, f.exception())

        future.add_done_callback(done)
        return future

    def _free_later(self, frees: list[Callable[[], None]], *, trim: bool) -> asyncio.Future[object]:
        """Free the memory of models unloaded for a load's room on a thread of its own
        (beside the newcomer's build, or awaited by it), then (``trim``) give the freed
        pages back to the kernel on the same thread: the future is done once both are."""

        def free_all() -> None:
            for free in frees:
                free()
            if trim:
                self._trim("room made")

        return self._in_background(
            _LoaderThread("model-free").run(free_all, yielding=False),
            "freeing an unloaded model",
        )

    def _notify_load(self, model_id: str, reason: str, result: str, seconds: float) -> None:
        for listener in self.listeners:
            listener.on_load(model_id, reason, result, seconds)

    def fits_now(self, model_id: str) -> bool:
        """Whether ``model_id`` would load now without unloading another model."""
        slot = self._slot(model_id)
        return slot.state is ModelState.LOADED or self._fits(slot)

    def _fits(self, newcomer: _Slot) -> bool:
        loaded = [
            s for s in self._slots.values()
            if s is not newcomer and s.state in (ModelState.LOADED, ModelState.DRAINING)
        ]  # fmt: skip
        if self.config.max_loaded and len(loaded) + 1 > self.config.max_loaded:
            return False
        others = sum(s.committed for s in loaded)
        return others + newcomer.committed <= self.config.budget_bytes

    async def _make_room(
        self, newcomer: _Slot, *, free_beside: bool = False
    ) -> tuple[list[Callable[[], None]], int]:
        """Unload least recently used idle models until ``newcomer`` fits; returns what
        they committed. ``free_beside``: the unloaded models stop serving and leave the
        budget, and their memory's frees are returned for the caller to run beside the
        newcomer's build."""
        if newcomer.committed > self.config.budget_bytes:
            raise ModelUnavailableError(
                f"model {newcomer.model.model_id} needs about {newcomer.committed >> 20} MiB "
                f"(weights {newcomer.footprint >> 20} MiB and caches "
                f"{newcomer.reserve_bytes >> 20} MiB), more than the whole memory budget "
                f"({self.config.budget_bytes >> 20} MiB: residency.budget_bytes)",
                retry_after=self.config.failed_retry_s,
                reason="no_room",
            )
        deadline = self._clock() + self.config.room_wait_s
        frees: list[Callable[[], None]] = []
        freed_bytes = 0
        try:
            while not self._fits(newcomer):
                victim = self._victim()
                if victim is not None:
                    freed_bytes += victim.committed
                    free = await self._unload(victim, "room", free=not free_beside)
                    if free is not None:
                        frees.append(free)
                    continue
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise ModelUnavailableError(
                        f"no room for model {newcomer.model.model_id} in the memory budget: "
                        "every loaded model is busy, pinned or loaded too recently to unload",
                        retry_after=self.config.min_residency_s,
                        reason="no_room",
                    )
                self._changed.clear()
                with contextlib.suppress(TimeoutError):  # a model went idle, or time passed
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
        except BaseException:  # no room after all: what was unloaded is freed all the same
            if frees:
                self._free_later(frees, trim=True)
            raise
        return frees, freed_bytes

    def _serving(self) -> bool:
        """Whether a loaded model has requests running or waiting."""
        return any(
            s.state is ModelState.LOADED and (s.active or s.model.busy())
            for s in self._slots.values()
        )

    def _victim(self) -> _Slot | None:
        """The least recently used idle, unpinned model loaded long enough ago."""
        now = self._clock()
        candidates = [
            s for s in self._slots.values()
            if s.state is ModelState.LOADED and not s.pinned and s.active == 0
            and s.model.busy() == 0 and now - s.loaded_at >= self.config.min_residency_s
        ]  # fmt: skip
        return min(candidates, key=lambda s: s.last_used, default=None)

    async def unload(self, model_id: str, reason: str = "command") -> bool:
        """Unload ``model_id`` once its requests are done; False when it was not loaded. A
        request's pin ends with it (the configuration's and the target's stay: the next
        request loads the model again and it stays)."""
        slot = self._slot(model_id)
        slot.pins.discard("request")
        if slot.state is not ModelState.LOADED:
            return False
        await self._unload(slot, reason)
        return True

    async def _unload(
        self, slot: _Slot, reason: str, *, free: bool = True
    ) -> Callable[[], None] | None:
        """``free=False``: returns once the model no longer serves, with the blocking call
        that frees its memory, unrun (see :meth:`_make_room`; the caller trims, or not)."""
        slot.state = ModelState.DRAINING
        while slot.active or slot.model.busy():  # its requests finish first
            await asyncio.sleep(0.05)
        # room for a load: the heap is trimmed beside the newcomer's build, not before it
        # (see __init__)
        beside = reason == "room" and self._gauged
        freeing: Callable[[], None] | None = None
        try:
            freeing = await slot.model.detach_heavy(trim=not beside, free=free)
        finally:
            if beside and freeing is None:
                self._trim_later("room made")
            slot.state = ModelState.AVAILABLE
            slot.evicted_at = self._clock()
            slot.expires_at = None
            self._changed.set()
        for listener in self.listeners:
            listener.on_eviction(slot.model.model_id, reason)
        log.info("model %s unloaded (%s): %d MiB committed of the %d MiB budget",
                 slot.model.model_id, reason, self.committed_bytes() >> 20,
                 self.config.budget_bytes >> 20)  # fmt: skip
        return freeing

    # ---- keep-alive -------------------------------------------------------------------

    async def expire_idle(self) -> list[str]:
        """Unload every idle model past its keep-alive; returns their ids."""
        now = self._clock()
        expired = [
            s for s in self._slots.values()
            if s.state is ModelState.LOADED and not s.pinned and s.active == 0
            and s.expires_at is not None and now >= s.expires_at and s.model.busy() == 0
        ]  # fmt: skip
        for slot in expired:
            async with self._load_lock:  # never beside a load making its room
                if slot.state is ModelState.LOADED and slot.active == 0:
                    await self._unload(slot, "keep_alive")
        return [s.model.model_id for s in expired]

    async def start(self, interval_s: float = 1.0) -> None:
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.expire_idle()
                except Exception:  # one model's unload failing must not stop the rest
                    log.exception("keep-alive expiry failed")

        self._task = asyncio.create_task(run(), name="model-residency")

    async def close(self) -> None:
        """Stop the keep-alive task and any load in progress (the models close their
        engines themselves)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for slot in self._slots.values():
            if slot.loading is not None and not slot.loading.done():
                slot.loading.cancel()
        await asyncio.to_thread(self._loader.join)
        while self._background:  # a free's trim joins when the free ends
            await asyncio.gather(*self._background, return_exceptions=True)
