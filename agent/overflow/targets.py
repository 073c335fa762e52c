"""The overflow targets an agent holds: the coordinator's OverflowTargetsSection, with a
circuit breaker, in-flight counts and the credential of each.

Credentials: a target names an environment variable (``credential_env``) and/or a secret
file (``credential_file``) on this agent; the value is read here, when a request goes out,
and never kept in anything that is printed, logged, exported or sent to the coordinator.
Errors name the variable or the file, never the value.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.overflow.breaker import BreakerSettings, CircuitBreaker
from edgefleet.contract import (
    OverflowApi,
    OverflowEndpoint,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
)

#: Most bytes read from a secret file.
MAX_SECRET_BYTES = 16 << 10


class CredentialError(Exception):
    """A target's credential cannot be read. The message names where it was looked for."""


def read_credential(target: OverflowTarget, environ: Mapping[str, str] | None = None) -> str:
    """The target's credential ("" when it names none). Environment variable first."""
    env = os.environ if environ is None else environ
    if target.credential_env:
        value = env.get(target.credential_env, "").strip()
        if value:
            return value
        if not target.credential_file:
            raise CredentialError(
                f"overflow target {target.name}: environment variable "
                f"{target.credential_env} is not set"
            )
    if target.credential_file:
        path = Path(target.credential_file).expanduser()
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise CredentialError(
                f"overflow target {target.name}: cannot read secret file {path} "
                f"({exc.strerror or type(exc).__name__})"
            ) from None
        if len(raw) > MAX_SECRET_BYTES:
            raise CredentialError(
                f"overflow target {target.name}: secret file {path} is over "
                f"{MAX_SECRET_BYTES} bytes"
            )
        value = raw.decode("utf-8", "replace").strip()
        if not value:
            raise CredentialError(f"overflow target {target.name}: secret file {path} is empty")
        return value
    return ""


def api_of(target: OverflowTarget) -> OverflowApi:
    """The wire format: as the target says, else by kind (peers speak edgefleet)."""
    if target.api is not OverflowApi.UNSPECIFIED:
        return target.api
    return OverflowApi.EDGEFLEET if target.kind is OverflowKind.PEER else OverflowApi.OPENAI


def leaves_site(target: OverflowTarget) -> bool:
    """Pools and providers are beyond the site; peers are not."""
    return target.kind is not OverflowKind.PEER


@dataclass(eq=False)
class Target:
    """One target as the forwarder uses it."""

    spec: OverflowTarget
    breaker: CircuitBreaker
    in_flight: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def api(self) -> OverflowApi:
        return api_of(self.spec)

    def endpoints(self) -> tuple[OverflowEndpoint, ...]:
        return self.spec.endpoints or (OverflowEndpoint(self.spec.url),)

    def serves(self, model: str) -> bool:
        return not self.spec.models or model in self.spec.models

    def model_name(self, model: str) -> str:
        return self.spec.model_names.get(model, model)

    def has_room(self) -> bool:
        return any(self._room(e) for e in self.endpoints())

    def _room(self, endpoint: OverflowEndpoint) -> bool:
        return endpoint.capacity <= 0 or self.in_flight.get(endpoint.url, 0) < endpoint.capacity

    def pick_endpoint(
        self, avoid: Iterable[str] = (), rng: Callable[[], float] = random.random
    ) -> OverflowEndpoint | None:
        """An endpoint with room, by weight; one of ``avoid`` (tried already) only when no
        other has room."""
        avoided = set(avoid)
        open_ = [e for e in self.endpoints() if self._room(e)]
        fresh = [e for e in open_ if e.url not in avoided] or open_
        if not fresh:
            return None
        weights = [max(e.weight, 0.0) or 1.0 for e in fresh]
        point = rng() * sum(weights)
        for endpoint, weight in zip(fresh, weights, strict=True):
            point -= weight
            if point < 0:
                return endpoint
        return fresh[-1]


class TargetSet:
    """The targets in use, replaced whole by each new section; breakers and in-flight
    counts carry over for targets that stay (by name)."""

    def __init__(self, breaker: BreakerSettings | None = None) -> None:
        self._breaker = breaker or BreakerSettings()
        self._targets: tuple[Target, ...] = ()
        self.generation = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def get(self, name: str) -> Target | None:
        return next((t for t in self._targets if t.name == name), None)

    def update(self, section: OverflowTargetsSection) -> None:
        old = {t.name: t for t in self._targets}
        targets = []
        for spec in section.targets:
            held = old.get(spec.name)
            if held is not None:
                held.spec = spec
                targets.append(held)
            else:
                targets.append(Target(spec, CircuitBreaker(self._breaker)))
        self._targets = tuple(targets)
        self.generation = section.generation

    def set(self, specs: Iterable[OverflowTarget]) -> None:
        self.update(OverflowTargetsSection(self.generation + 1, tuple(specs)))
