"""The valid API keys of this agent, their scopes, rate limits and usage.

A key's secret reads ``ef-<key_id>-<random>`` (256 random bits). The agent holds only
SHA-256 digests: a check hashes the presented secret, looks the digest up in a dict and
confirms it with ``hmac.compare_digest`` (a few microseconds; see
``benchmarks/key_check.py``), with no round trip to the coordinator.

Keys come from two sources, merged: the coordinator's ``keys`` desired-state section (the
last one received is kept on disk, so a restarted agent checks keys while the coordinator
is away) and ``auth.keys_file`` (a standalone agent's keys). A key listed by neither is
refused; so is one past its ``expires_at_unix``.

Rate limits are sliding windows per key: ``requests_per_minute`` and ``tokens_per_minute``
are this agent's share of the key's fleet-wide budget (the coordinator splits and
rebalances it; see docs/operators/keys.md). A window keeps what was accepted in the last
60 s (time, amount) with a running sum and accepts a request while the sum plus its amount
stays within the share: a key idle for a minute may use its whole share at once, and no
60-second window ever holds more than the share (a token bucket holding a minute and
refilling continuously let twice the share through in a minute). Entries taken within
``COALESCE_S`` of each other share one, so a window holds at most about
``WINDOW_S / COALESCE_S`` entries whatever the share.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.errors import InvalidApiKeyError, InvalidRequestError, KeyRateLimitError, KeyScopeError
from edgefleet.contract import ApiKey, KeyUsage

log = logging.getLogger(__name__)

PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}
SECRET_PREFIX = "ef-"


def secret_digest(secret: str) -> bytes:
    """SHA-256 of the whole secret string (what the coordinator stores and pushes)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """What a request's ``keep_alive`` comes to: how long its model stays loaded once idle
    (seconds, already capped), or a pin (loaded until an operator unloads it)."""

    seconds: float = 0.0  # with pin, unused
    pin: bool = False


def keep_alive_for(key: ApiKey | None, requested_s: float, agent_cap_s: float | None) -> KeepAlive:
    """A request's ``keep_alive`` (seconds; negative: forever) as it applies for ``key``
    (None: keys are off): a duration is lowered to the key's ``max_keep_alive_s`` (when
    above 0) and to the agent's ``agent_cap_s`` (None: left to the residency's own cap);
    a negative one pins the model, only for a key with ``may_pin_models``, else
    InvalidRequestError (400) naming ``keep_alive``. Without keys, no request may pin."""
    if requested_s < 0:
        if key is None:
            raise InvalidRequestError(
                "keep_alive < 0 (pin the model) needs an API key allowed to pin models "
                "(may_pin_models), and this agent runs without API keys; ask for a duration "
                "such as '30m'",
                param="keep_alive",
            )
        if not key.may_pin_models:
            raise InvalidRequestError(
                f"API key {key.key_id} may not pin models (keep_alive < 0); ask for a "
                "duration such as '30m', or use a key with may_pin_models",
                param="keep_alive",
            )
        return KeepAlive(pin=True)
    seconds = requested_s
    if key is not None and key.max_keep_alive_s > 0:  # NaN from the wire: the agent's cap
        seconds = min(seconds, key.max_keep_alive_s)
    if agent_cap_s is not None:
        seconds = min(seconds, agent_cap_s)
    return KeepAlive(seconds=seconds)


def model_allowed(key: ApiKey, model_id: str, version: str | None) -> bool:
    """Empty ``models``: every model; else ``name`` or ``name@version`` must match."""
    if not key.models:
        return True
    for allowed in key.models:
        name, _, pinned = allowed.partition("@")
        if name == model_id and (not pinned or pinned == version):
            return True
    return False


WINDOW_S = 60.0
#: Amounts accepted within this many seconds of an entry's start join that entry, which is
#: then held until its latest amount is 60 s old (never released early).
COALESCE_S = 0.1


class SlidingWindow:
    """At most ``share`` units accepted in any ``WINDOW_S`` seconds.

    ``entries`` holds ``[start, end, amount]`` for what was accepted in the last minute
    (amounts accepted from ``start`` to ``end``, less what was given back); an entry counts
    until ``end`` is ``WINDOW_S`` old, and ``used`` is the sum of the amounts.
    """

    __slots__ = ("entries", "share", "used")

    def __init__(self, share: float) -> None:
        self.share = share
        self.entries: deque[list[float]] = deque()
        self.used = 0.0

    def _expire(self, now: float) -> None:
        entries = self.entries
        while entries and now - entries[0][1] >= WINDOW_S:
            self.used -= entries.popleft()[2]
        if not entries:
            self.used = 0.0  # no float drift carried across idle minutes

    def take(self, amount: float, now: float) -> float:
        """Accept ``amount`` at ``now``; 0.0 when accepted, else the seconds (> 0) until
        enough of the window's oldest entries expire for it to fit (for an amount larger
        than the whole share: until the window is empty, at least 1 s; it never fits)."""
        self._expire(now)
        if self.used + amount <= self.share:
            last = self.entries[-1] if self.entries else None
            if last is not None and now - last[0] < COALESCE_S:
                last[1] = max(last[1], now)
                last[2] += amount
            else:
                self.entries.append([now, now, amount])
            self.used += amount
            return 0.0
        if amount > self.share:
            return max(1.0, self.entries[-1][1] + WINDOW_S - now) if self.entries else 1.0
        left = self.used
        for _, entry_end, entry_amount in self.entries:
            left -= entry_amount
            if left + amount <= self.share:
                return max(entry_end + WINDOW_S - now, 1e-3)
        return WINDOW_S  # not reached: an empty window fits any amount <= share

    def give_back(self, amount: float, taken_at: float) -> None:
        """Remove ``amount`` from what was accepted at ``taken_at`` (a request charged more
        than it used, or refused after taking); nothing when that has left the window."""
        for entry in reversed(self.entries):
            if entry[0] <= taken_at:
                returned = min(max(amount, 0.0), entry[2])
                entry[2] -= returned
                self.used = max(0.0, self.used - returned)
                return

    def resize(self, share: float) -> None:
        """A new share of the key's budget: the window's entries stay and count against it."""
        self.share = share


@dataclass(slots=True)
class _Usage:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected: int = 0


@dataclass(slots=True)
class _Entry:
    key: ApiKey
    requests: SlidingWindow | None
    tokens: SlidingWindow | None


def _retry_message(what: str, key: ApiKey, per_minute: float, wait_s: float) -> str:
    return (
        f"API key {key.key_id} is over its {what} limit on this agent ({per_minute:g}/min, "
        f"this agent's share of the key's fleet-wide budget); retry in {wait_s:.1f} s"
    )


@dataclass(eq=False, slots=True)
class KeyGrant:
    """One request's valid key: its scopes, and where its usage is counted."""

    key: ApiKey
    _table: KeyTable = field(repr=False)
    #: When ``charge_tokens`` took from the tokens/min window (what ``settle`` gives back to).
    _charged_at: float | None = field(default=None, repr=False)

    @property
    def key_id(self) -> str:
        return self.key.key_id

    def clamp_priority(self, priority: str) -> str:
        """A priority above the key's ceiling is lowered to the ceiling."""
        ceiling = self.key.max_priority
        if PRIORITY_RANK.get(priority, 1) > PRIORITY_RANK.get(ceiling, 1):
            return ceiling
        return priority

    def check_model(self, model_id: str, version: str | None) -> None:
        if not model_allowed(self.key, model_id, version):
            self._table.count_rejected(self.key.key_id)
            raise KeyScopeError(
                f"API key {self.key.key_id} may not use model {model_id!r} "
                f"(allowed: {', '.join(self.key.models)})",
                param="model",
            )

    def max_tokens(self, requested: int | None, param: str) -> int | None:
        """The key's cap on completion tokens: a request asking for more gets 400; one
        naming none is capped at it (None: no cap)."""
        cap = self.key.max_tokens_per_request
        if cap <= 0:
            return None
        if requested is not None and requested > cap:
            self._table.count_rejected(self.key.key_id)
            raise InvalidRequestError(
                f"{param} {requested} is more than API key {self.key.key_id} allows per "
                f"request ({cap})",
                param=param,
            )
        return cap

    def keep_alive(self, requested_s: float, agent_cap_s: float | None) -> KeepAlive:
        """The request's ``keep_alive`` as it applies for this key (see
        :func:`keep_alive_for`); a refused pin counts as a rejected request."""
        try:
            return keep_alive_for(self.key, requested_s, agent_cap_s)
        except InvalidRequestError:
            self._table.count_rejected(self.key.key_id)
            raise

    def charge_tokens(self, amount: int) -> None:
        """Charge ``amount`` (prompt + most completion tokens) to the tokens/min window."""
        self._charged_at = self._table.charge_tokens(self.key.key_id, amount)

    def settle(self, prompt_tokens: int, completion_tokens: int, charged: int) -> None:
        """Count what the request used and give back what it was charged beyond that."""
        self._table.settle(
            self.key.key_id, prompt_tokens, completion_tokens, charged, self._charged_at
        )


class KeyTable:
    """The keys this agent accepts, from the coordinator and ``auth.keys_file``.

    ``enabled`` False: no key is needed (loopback development, ``auth.insecure_no_auth``).
    Single-threaded: used from the event loop only.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.enabled = enabled
        self._clock = clock
        self._wall = wall_clock
        self._sources: dict[str, tuple[ApiKey, ...]] = {}
        self._by_digest: dict[bytes, _Entry] = {}
        self._by_id: dict[str, _Entry] = {}
        self._usage: dict[str, _Usage] = {}
        #: Generation of the coordinator's keys section in use (0: none).
        self.generation = 0

    def __len__(self) -> int:
        return len(self._by_digest)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._by_id)

    def set_source(self, source: str, keys: Iterable[ApiKey], generation: int = 0) -> None:
        """Replace the keys from one source ("coordinator" or "file")."""
        self._sources[source] = tuple(keys)
        if source == "coordinator":
            self.generation = generation
        self._rebuild()

    def _rebuild(self) -> None:
        keys: dict[str, ApiKey] = {}
        # The coordinator's keys win over the file's when both name one key id.
        for source in sorted(self._sources, key=lambda s: s == "coordinator"):
            keys.update((key.key_id, key) for key in self._sources[source])
        old = self._by_id
        self._by_id = {
            key_id: _Entry(
                key,
                _window(old.get(key_id), "requests", key.requests_per_minute),
                _window(old.get(key_id), "tokens", key.tokens_per_minute),
            )
            for key_id, key in keys.items()
        }
        self._by_digest = {e.key.secret_sha256: e for e in self._by_id.values()}

    def authenticate(self, authorization: str | None) -> KeyGrant:
        """The key presented as ``Authorization: Bearer <secret>``; raises
        InvalidApiKeyError (401) when missing, unknown (or revoked) or expired."""
        if not authorization:
            raise InvalidApiKeyError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
                "(the OpenAI SDK's api_key)."
            )
        scheme, _, secret = authorization.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise InvalidApiKeyError("Send the API key as 'Authorization: Bearer <key>'.")
        digest = secret_digest(secret)
        entry = self._by_digest.get(digest)
        if entry is None or not hmac.compare_digest(entry.key.secret_sha256, digest):
            raise InvalidApiKeyError("Incorrect API key provided (unknown or revoked).")
        key = entry.key
        if key.expires_at_unix and self._wall() >= key.expires_at_unix:
            self.count_rejected(key.key_id)
            raise InvalidApiKeyError(f"API key {key.key_id} has expired.")
        if entry.requests is not None:
            wait = entry.requests.take(1, self._clock())
            if wait:
                self.count_rejected(key.key_id)
                raise KeyRateLimitError(
                    _retry_message("requests/min", key, key.requests_per_minute, wait),
                    retry_after=wait,
                )
        self.count_request(key.key_id)
        return KeyGrant(key, self)

    # -------------------------------------------------------------- accounting

    def _entry(self, key_id: str) -> _Entry | None:
        return self._by_id.get(key_id)

    def _counter(self, key_id: str) -> _Usage:
        usage = self._usage.get(key_id)
        if usage is None:
            usage = self._usage[key_id] = _Usage()
        return usage

    def count_rejected(self, key_id: str) -> None:
        self._counter(key_id).rejected += 1

    def count_request(self, key_id: str) -> None:
        self._counter(key_id).requests += 1

    def charge_tokens(self, key_id: str, amount: int) -> float | None:
        """Charge ``amount`` to the key's tokens/min window: when it was taken (None: the
        key has no token limit), or KeyRateLimitError (429)."""
        entry = self._entry(key_id)
        if entry is None or entry.tokens is None:
            return None
        now = self._clock()
        wait = entry.tokens.take(amount, now)
        if wait:
            self.count_rejected(key_id)
            share = entry.key.tokens_per_minute
            detail = f" (this request may use up to {amount} tokens)"
            if amount > share:
                detail = (
                    f" (this request may use up to {amount} tokens, more than this agent's "
                    f"whole share: lower max_tokens or the prompt)"
                )
            raise KeyRateLimitError(
                _retry_message("tokens/min", entry.key, share, wait) + detail,
                retry_after=wait,
            )
        return now

    def settle(
        self,
        key_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        charged: int,
        charged_at: float | None = None,
    ) -> None:
        usage = self._counter(key_id)
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        unused = charged - prompt_tokens - completion_tokens
        entry = self._entry(key_id)
        if unused > 0 and charged_at is not None and entry is not None and entry.tokens is not None:
            entry.tokens.give_back(unused, charged_at)

    def take_usage(self) -> tuple[KeyUsage, ...]:
        """What each key used since the last call (for the next LoadReport); resets."""
        taken, self._usage = self._usage, {}
        return tuple(
            KeyUsage(k, u.requests, u.prompt_tokens, u.completion_tokens, u.rejected)
            for k, u in sorted(taken.items())
        )


def _window(old: _Entry | None, kind: str, per_minute: float) -> SlidingWindow | None:
    """The key's window for ``kind``: the previous one (its entries kept) at the new share."""
    if per_minute <= 0:
        return None
    previous: SlidingWindow | None = getattr(old, kind) if old is not None else None
    if previous is None:
        return SlidingWindow(per_minute)
    if previous.share != per_minute:
        previous.resize(per_minute)
    return previous


def new_secret() -> tuple[str, str]:
    """A new key: (key_id, secret) with 256 random bits, ``ef-<key_id>-<random>``."""
    key_id = secrets.token_hex(6)
    return key_id, f"{SECRET_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"
