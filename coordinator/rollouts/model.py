"""What a rollout is: the policy an operator gave, the plan made from it, and where the
rollout stands (step, the step's stored start, the stats gathered so far). ``Rollout.json``
is also how the store keeps it (coordinator/store/rollouts.py: one row per rollout,
written on every change), so that a coordinator restarted mid-rollout resumes where it was.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.rollouts.gates import GateThresholds, MergedHistogram, StepStats
from coordinator.store.rollouts import StoredRollout

# Steps at most (canary + waves), agents named in a selector at most, history entries kept.
MAX_WAVES = 20
MAX_SELECTOR_ITEMS = 1000
MAX_HISTORY = 200
POLICY_FIELDS = frozenset({
    "model", "version", "selector", "from_version", "canary_count", "canary_percent", "waves",
    "soak_s", "min_requests", "max_error_rate", "max_ttft_p99_ratio", "min_baseline_requests",
    "require_self_check", "step_timeout_s",
})  # fmt: skip
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


class PolicyError(ValueError):
    """A rollout policy that cannot be run; ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class RolloutState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    # Every step passed; the selector's rule names the new version.
    COMPLETED = "completed"
    # A gate failed; the moved agents were sent back to their previous version.
    ROLLED_BACK = "rolled_back"
    # An operator aborted it (the moved agents sent back unless asked to keep them).
    ABORTED = "aborted"

    @property
    def active(self) -> bool:
        return self in (RolloutState.RUNNING, RolloutState.PAUSED)


@dataclass(frozen=True, slots=True)
class SelectorSpec:
    """Which agents a rollout covers; empty fields constrain nothing (all: the fleet)."""

    sites: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # "key=value"
    agent_ids: tuple[str, ...] = ()

    def json(self) -> dict[str, list[str]]:
        return {"sites": list(self.sites), "labels": list(self.labels),
                "agent_ids": list(self.agent_ids)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> SelectorSpec:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise PolicyError("selector", "selector must be an object {sites, labels, agent_ids}")
        unknown = set(data) - {"sites", "labels", "agent_ids"}
        if unknown:
            raise PolicyError("selector", f"unknown selector fields: {sorted(unknown)}")
        out: dict[str, tuple[str, ...]] = {}
        for key in ("sites", "labels", "agent_ids"):
            items = data.get(key, [])
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise PolicyError(f"selector.{key}", f"selector.{key} must be a list of strings")
            if len(items) > MAX_SELECTOR_ITEMS or any(not i or len(i) > 256 for i in items):
                raise PolicyError(
                    f"selector.{key}",
                    f"selector.{key}: at most {MAX_SELECTOR_ITEMS} non-empty strings of <= 256 "
                    "characters",
                )
            if key == "labels" and any("=" not in i for i in items):
                raise PolicyError("selector.labels", "labels are 'key=value'")
            out[key] = tuple(dict.fromkeys(items))
        return cls(**out)


@dataclass(frozen=True, slots=True)
class RolloutPolicy:
    """What an operator asks for: which version of which model, where, and how fast."""

    model: str
    version: str
    selector: SelectorSpec = field(default_factory=SelectorSpec)
    # The version to compare against and roll back to ("": the one most selected agents
    # desire when the rollout starts).
    from_version: str = ""
    # The canary step: a count of agents, or (when canary_percent > 0) a percentage.
    canary_count: int = 1
    canary_percent: float = 0.0
    # The waves after the canary: cumulative percentages of the selected agents; the
    # last is 100.
    waves: tuple[float, ...] = (100.0,)
    # How long each step (canary and every wave) is watched before it can pass.
    soak_s: float = 600.0
    thresholds: GateThresholds = field(default_factory=GateThresholds)
    # A step still not passed this long after it started fails (0: it may wait forever).
    step_timeout_s: float = 0.0

    def json(self) -> dict[str, Any]:
        t = self.thresholds
        return {
            "model": self.model, "version": self.version, "selector": self.selector.json(),
            "from_version": self.from_version,
            **({"canary_percent": self.canary_percent} if self.canary_percent > 0
               else {"canary_count": self.canary_count}),
            "waves": list(self.waves),
            "soak_s": self.soak_s, "min_requests": t.min_requests,
            "max_error_rate": t.max_error_rate, "max_ttft_p99_ratio": t.max_ttft_p99_ratio,
            "min_baseline_requests": t.min_baseline_requests,
            "require_self_check": t.require_self_check, "step_timeout_s": self.step_timeout_s,
        }  # fmt: skip

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RolloutPolicy:
        """Validate an operator's request (the admin API body); raises PolicyError."""
        unknown = set(body) - POLICY_FIELDS
        if unknown:
            raise PolicyError(sorted(unknown)[0], f"unknown fields: {sorted(unknown)}")
        model, version = _name(body, "model"), _name(body, "version")
        from_version = body.get("from_version", "")
        if not isinstance(from_version, str) or (from_version and not _NAME.match(from_version)):
            raise PolicyError("from_version", "from_version must be a version name")
        if from_version == version:
            raise PolicyError("from_version", "from_version must differ from version")
        canary_percent = _number(body, "canary_percent", 0.0, 0.0, 100.0)
        canary_count = _integer(body, "canary_count", 1, 1, 1_000_000)
        if "canary_percent" in body and "canary_count" in body:
            raise PolicyError("canary_count", "give canary_count or canary_percent, not both")
        if "canary_percent" in body and canary_percent <= 0:
            raise PolicyError("canary_percent", "canary_percent must be within (0, 100]")
        waves_raw = body.get("waves", [100])
        if not isinstance(waves_raw, list) or not 1 <= len(waves_raw) <= MAX_WAVES:
            raise PolicyError("waves", f"waves must be a list of 1 to {MAX_WAVES} percentages")
        waves: list[float] = []
        for value in waves_raw:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError("waves", "waves are numbers (cumulative percentages)")
            if not 0 < value <= 100 or (waves and value <= waves[-1]):
                raise PolicyError("waves", "waves must increase within (0, 100]")
            waves.append(float(value))
        if waves[-1] != 100:
            raise PolicyError("waves", "the last wave must be 100 (every selected agent)")
        thresholds = GateThresholds(
            min_requests=_integer(body, "min_requests", 200, 0, 100_000_000),
            max_error_rate=_number(body, "max_error_rate", 0.02, 0.0, 1.0),
            max_ttft_p99_ratio=_number(body, "max_ttft_p99_ratio", 1.5, 1.0, 1000.0),
            min_baseline_requests=_integer(body, "min_baseline_requests", 50, 1, 100_000_000),
            require_self_check=_boolean(body, "require_self_check", True),
        )
        return cls(
            model=model,
            version=version,
            selector=SelectorSpec.from_json(body.get("selector")),
            from_version=from_version,
            canary_count=canary_count,
            canary_percent=canary_percent,
            waves=tuple(waves),
            soak_s=_number(body, "soak_s", 600.0, 0.0, 30 * 86_400.0),
            thresholds=thresholds,
            step_timeout_s=_number(body, "step_timeout_s", 0.0, 0.0, 365 * 86_400.0),
        )

    def canary_size(self, selected: int) -> int:
        if selected <= 0:
            return 0
        if self.canary_percent > 0:
            return min(selected, max(1, math.ceil(self.canary_percent * selected / 100)))
        return min(selected, self.canary_count)

    def plan(self, agent_ids: list[str]) -> list[list[str]]:
        """The steps: the canary's agents, then each wave's (empty waves left out)."""
        total = len(agent_ids)
        done = self.canary_size(total)
        steps = [agent_ids[:done]] if done else []
        for percent in self.waves:
            upto = max(done, min(total, math.ceil(percent * total / 100 - 1e-9)))
            if upto > done:
                steps.append(agent_ids[done:upto])
                done = upto
        return steps


def _name(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not _NAME.match(value):
        raise PolicyError(name, f"{name} must be 1-128 letters, digits or ._+- starting "
                          f"with a letter or digit, got {value!r}")  # fmt: skip
    return value


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(name, f"{name} must be a number")
    if not low <= value <= high:
        raise PolicyError(name, f"{name} must be within [{low}, {high}]")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(name, f"{name} must be an integer")
    if not low <= value <= high:
        raise PolicyError(name, f"{name} must be within [{low}, {high}]")
    return value


def _boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise PolicyError(name, f"{name} must be true or false")
    return value


@dataclass(slots=True)
class Rollout:
    """One rollout and where it stands. Times are POSIX seconds (wall clock)."""

    rollout_id: str
    policy: RolloutPolicy
    previous_version: str
    # The agents of each step (step 0 is the canary).
    plan: list[list[str]]
    # Each planned agent's desired version before the rollout ("": none): its rollback.
    prior: dict[str, str]
    state: RolloutState = RolloutState.RUNNING
    step: int = 0
    # When the current step's agents were moved (None: not moved yet); paused time is
    # added to it on resume, so the soak counts running time only.
    step_started_at: float | None = None
    paused_at: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float | None = None
    created_by: str = ""
    # Why it stopped (a failed gate, an abort), or what it waits for.
    detail: str = ""
    step_stats: StepStats = field(default_factory=StepStats)
    # The previous version's TTFT, merged over the fleet (the hour before the rollout,
    # and on agents not moved during it).
    baseline: MergedHistogram = field(default_factory=MergedHistogram)
    # The previous version's TTFT on the agents not moved, since the current step started
    # (the gate's control group; reset when a step moves).
    control: MergedHistogram = field(default_factory=MergedHistogram)
    last_gate: dict[str, Any] | None = None
    # Events: step moves, passes, the end; each {"at", "event", ...}.
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def model(self) -> str:
        return self.policy.model

    @property
    def version(self) -> str:
        return self.policy.version

    def moved_agents(self) -> list[str]:
        """Agents this rollout has moved to the new version so far."""
        upto = self.step + (1 if self.step_started_at is not None else 0)
        return [a for step in self.plan[:upto] for a in step]

    def current_agents(self) -> list[str]:
        return self.plan[self.step] if self.step < len(self.plan) else []

    def note(self, at: float, event: str, **details: Any) -> None:
        self.history.append({"at": at, "event": event, **details})
        del self.history[:-MAX_HISTORY]

    def json(self) -> dict[str, Any]:
        """The rollout as the admin API shows it and the store keeps it."""
        return {
            "object": "rollout",
            "rollout_id": self.rollout_id,
            "model": self.model,
            "version": self.version,
            "previous_version": self.previous_version,
            "state": self.state.value,
            "step": self.step,
            "steps": len(self.plan),
            "step_name": "canary" if self.step == 0 else f"wave {self.step}",
            "step_started_at": self.step_started_at,
            "paused_at": self.paused_at,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "finished_at": self.finished_at,
            "created_by": self.created_by,
            "detail": self.detail,
            "policy": self.policy.json(),
            "plan": self.plan,
            "prior": self.prior,
            "moved": len(self.moved_agents()),
            "agents": sum(len(s) for s in self.plan),
            "step_stats": self.step_stats.json(),
            "baseline": self.baseline.json(),
            "control": self.control.json(),
            "last_gate": self.last_gate,
            "history": self.history,
        }

    def stored(self) -> StoredRollout:
        """The rollout as the store keeps it."""
        return StoredRollout(self.rollout_id, self.model, self.version, self.state.value,
                             self.created_at, self.updated_at, self.json())  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rollout:
        return cls(
            rollout_id=data["rollout_id"],
            policy=RolloutPolicy.from_json(data["policy"]),
            previous_version=data["previous_version"],
            plan=[list(s) for s in data["plan"]],
            prior=dict(data["prior"]),
            state=RolloutState(data["state"]),
            step=int(data["step"]),
            step_started_at=data["step_started_at"],
            paused_at=data["paused_at"],
            created_at=float(data["created_at"]),
            updated_at=float(data["updated_at"]),
            finished_at=data["finished_at"],
            created_by=data["created_by"],
            detail=data["detail"],
            step_stats=StepStats.from_json(data["step_stats"]),
            baseline=MergedHistogram.from_json(data["baseline"]),
            control=MergedHistogram.from_json(data.get("control")),
            last_gate=data["last_gate"],
            history=list(data["history"]),
        )
