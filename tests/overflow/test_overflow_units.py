"""The overflow parts on their own: breaker, hop marker, credentials, target choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.overflow.breaker import BreakerSettings, BreakerState, CircuitBreaker
from agent.overflow.forwarder import OverflowRequest
from agent.overflow.policy import hop_honoured, requires_constraints
from agent.overflow.service import OverflowService, overflow_record
from agent.overflow.targets import CredentialError, TargetSet, read_credential
from agent.redaction import Redactor
from edgefleet.contract import (
    DesiredState,
    OverflowEndpoint,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_on_consecutive_failures_and_half_opens_after_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerSettings(failures=3, cooldown_s=10, window=100, min_calls=50), clock)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.state is BreakerState.CLOSED
    b.allow()
    b.failure()
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.now += 10
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow() and not b.allow()  # one trial at a time
    b.failure()  # the trial failed: open again, a new cooldown
    assert b.state is BreakerState.OPEN
    clock.now += 10
    assert b.allow()
    b.success()
    assert b.state is BreakerState.CLOSED and b.allow()


def test_breaker_opens_on_error_rate() -> None:
    b = CircuitBreaker(BreakerSettings(failures=100, error_rate=0.5, window=10, min_calls=10))
    for i in range(10):  # alternate, never 2 failures in a row: 50% is not over the rate
        b.allow()
        (b.failure if i % 2 else b.success)()
    assert b.state is BreakerState.CLOSED
    b.allow()
    b.failure()  # 6 of the last 10 failed
    assert b.state is BreakerState.OPEN


def test_the_hop_marker_is_honoured_from_anyone() -> None:
    """It only ever stops a request from being forwarded again (see policy.py)."""
    assert hop_honoured("1")
    assert not hop_honoured(None)
    assert not hop_honoured("")
    assert not hop_honoured("  ")


def test_credentials_come_from_env_or_file_and_errors_name_only_where(tmp_path: Path) -> None:
    target = OverflowTarget("p", OverflowKind.GPU_POOL, "http://x", credential_env="POOL_KEY")
    assert read_credential(target, {"POOL_KEY": " s3cret\n"}) == "s3cret"
    with pytest.raises(CredentialError, match="POOL_KEY is not set"):
        read_credential(target, {})
    secret = tmp_path / "key"
    secret.write_text("from-file\n")
    both = OverflowTarget(
        "p", OverflowKind.GPU_POOL, "http://x", credential_env="POOL_KEY",
        credential_file=str(secret),
    )  # fmt: skip
    assert read_credential(both, {}) == "from-file"
    assert read_credential(both, {"POOL_KEY": "env-wins"}) == "env-wins"
    secret.write_text("")
    with pytest.raises(CredentialError, match="is empty"):
        read_credential(both, {})
    secret.unlink()
    with pytest.raises(CredentialError) as missing:
        read_credential(both, {})
    assert str(secret) in str(missing.value)
    none = OverflowTarget("p", OverflowKind.GPU_POOL, "http://x")
    assert read_credential(none, {}) == ""
    assert "s3cret" not in repr(target)


def test_pool_endpoints_by_weight_and_capacity() -> None:
    targets = TargetSet()
    targets.set([
        OverflowTarget(
            "pool", OverflowKind.GPU_POOL, "http://a",
            endpoints=(OverflowEndpoint("http://a", 3.0, 1), OverflowEndpoint("http://b", 1.0, 0)),
        )
    ])  # fmt: skip
    target = targets.get("pool")
    assert target is not None
    assert target.pick_endpoint(rng=lambda: 0.0).url == "http://a"  # type: ignore[union-attr]
    assert target.pick_endpoint(rng=lambda: 0.99).url == "http://b"  # type: ignore[union-attr]
    target.in_flight["http://a"] = 1  # full
    assert target.pick_endpoint(rng=lambda: 0.0).url == "http://b"  # type: ignore[union-attr]
    # a retry avoids the endpoint just tried while another has room
    target.in_flight["http://a"] = 0
    assert target.pick_endpoint(["http://a"], rng=lambda: 0.0).url == "http://b"  # type: ignore[union-attr]


def test_the_section_replaces_targets_and_keeps_breakers() -> None:
    service = OverflowService(redactor=Redactor())
    a = OverflowTarget("a", OverflowKind.GPU_POOL, "http://a")
    service(DesiredState(overflow_targets=OverflowTargetsSection(1, (a,))))
    held = service.targets.get("a")
    assert held is not None
    held.breaker.failure()
    b = OverflowTarget("b", OverflowKind.PEER, "http://b")
    service(DesiredState(overflow_targets=OverflowTargetsSection(2, (a, b))))
    assert [t.name for t in service.targets] == ["a", "b"]
    assert service.targets.get("a") is held and service.targets.generation == 2


def test_constrained_requests_need_a_target_that_enforces_constraints() -> None:
    assert requires_constraints({"response_format": {"type": "json_schema", "json_schema": {}}})
    assert requires_constraints({"guided_json": {}})
    assert not requires_constraints({"response_format": {"type": "text"}})
    assert not requires_constraints({})


def test_cost_is_computed_once_in_the_record() -> None:
    from agent.overflow.forwarder import Leg

    req = OverflowRequest("chat", {}, "m", True, reason="queue_full", served_by="b")
    req.legs = [
        Leg("a", "gpu_pool", 0, 0, False, 1.0, 1.0),
        Leg("b", "hosted_provider", 1000, 500, True, 3.0, 15.0),
    ]
    record = overflow_record(req)
    assert record["cost"] == pytest.approx(3.0 + 7.5)
    assert [leg["failed"] for leg in record["overflow"]] == [True, False]
    assert record["served_by"] == "b" and record["overflow_reason"] == "queue_full"
