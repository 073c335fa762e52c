"""Building the overflow service from the agent's config."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.config import AgentConfig
from agent.enrolled_tls import EnrolledClientContext
from agent.overflow.breaker import BreakerSettings
from agent.overflow.forwarder import ForwardSettings
from agent.overflow.service import OverflowService
from agent.redaction import Redactor
from edgefleet.contract import DesiredState
from edgefleet.tls import TlsError, agent_client_context

log = logging.getLogger(__name__)


def overflow_service_for(
    config: AgentConfig, registry: CollectorRegistry | None, redactor: Redactor
) -> OverflowService:
    o = config.overflow
    return OverflowService(
        redactor=redactor,
        registry=registry,
        site=config.identity.site,
        policy_allows_cloud=o.allow_cloud,
        forward_reasons=(
            ("queue_full", "predicted_wait", "queue_timeout", "model_not_loaded")
            if o.enabled
            else ()
        ),
        settings=ForwardSettings(
            max_retries=o.max_retries,
            backoff_s=o.backoff_s,
            connect_timeout_s=o.connect_timeout_s,
            first_token_timeout_s=o.first_token_timeout_s,
            total_timeout_s=o.total_timeout_s,
        ),
        breaker=BreakerSettings(
            failures=o.breaker_failures,
            error_rate=o.breaker_error_rate,
            window=o.breaker_window,
            min_calls=max(2, o.breaker_window // 2),
            cooldown_s=o.breaker_cooldown_s,
        ),
    )


def peer_client_context(config: AgentConfig) -> ssl.SSLContext | None:
    """Mutual TLS to peers: this agent's enrollment certificate, trusting the fleet CA;
    None when the agent is not enrolled (forwards to https peers then fail; plain-http
    loopback peers still work)."""
    from agent.enrollment import CA_FILE, state_dir_of
    from agent.https import enrollment_cert_files

    files = enrollment_cert_files(state_dir_of(config))
    ca = files.cert.parent / CA_FILE
    if config.coordinator.ca_file:
        ca = Path(config.coordinator.ca_file).expanduser()
    if not (files.cert.is_file() and files.key.is_file() and ca.is_file()):
        return None
    try:
        return agent_client_context(files, ca.read_text(encoding="ascii"))
    except (OSError, TlsError) as exc:
        log.warning("overflow to peers without mutual TLS: %s", exc)
        return None


def peer_client_tls(config: AgentConfig) -> EnrolledClientContext:
    """:func:`peer_client_context` as each forward starts, made again when enrollment (in
    the first session, for an agent serving plain HTTP) or a renewal wrote its files."""
    from agent.enrollment import CA_FILE, state_dir_of
    from agent.https import enrollment_cert_files

    files = enrollment_cert_files(state_dir_of(config))
    ca = files.cert.parent / CA_FILE
    if config.coordinator.ca_file:
        ca = Path(config.coordinator.ca_file).expanduser()
    return EnrolledClientContext(lambda: peer_client_context(config), [ca, files.cert, files.key])


def desired_state_appliers(
    *appliers: Callable[[DesiredState], None] | None,
) -> Callable[[DesiredState], None]:
    """One ``on_desired_state`` calling each applier in turn (a failure is the session's)."""
    chosen = [a for a in appliers if a is not None]

    def apply(desired: DesiredState) -> None:
        for applier in chosen:
            applier(desired)

    return apply
