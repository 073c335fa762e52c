"""The coordinator's settings, declared once: types, ranges and defaults.

Read by pydantic-settings with the one rule of :mod:`edgefleet.config_loading`: defaults <
TOML file (``--config`` or ``$EDGEFLEET_COORDINATOR_CONFIG``) < environment
(``EDGEFLEET_COORDINATOR_<KEY>``) < flags (``--set KEY=VALUE`` reaches every key). The
file is flat::

    grpc_port = 50051
    http_port = 8080
    report_interval_ms = 2000

Routing defaults are the route policy's own (``coordinator.routing.scorer.RoutePolicy``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from coordinator.errors import ConfigError
from coordinator.event_loop import EventLoopChoice
from coordinator.routing.scorer import RoutePolicy
from coordinator.store.location import StoreLocation, check_store_url
from edgefleet.addresses import is_loopback_host
from edgefleet.config_loading import Flag, ProcessSettings, Switch, Upper, load_settings
from edgefleet.http_limits import HttpLimits
from edgefleet.ports import DEFAULT_GRPC_PORT, default_enroll_port

ENV_PREFIX = "EDGEFLEET_COORDINATOR_"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_POLICY = RoutePolicy()
_HTTP = HttpLimits()


def _switch(value: Any) -> Any:
    """A Switch that also reads booleans: true / false (TOML or text) are on / off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    value = value.strip().lower() if isinstance(value, str) else value
    return {"true": "on", "false": "off", "yes": "on", "no": "off"}.get(value, value)


BoolSwitch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_switch)]


class CoordinatorConfig(ProcessSettings):
    """Settings of one coordinator process."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    grpc_host: str = Field(default="127.0.0.1", min_length=1)
    """Address the gRPC server (agents' sessions, Enroll, Route) listens on."""
    grpc_port: int = Field(default=DEFAULT_GRPC_PORT, ge=0, le=65535)
    """Port of the gRPC server (mutual TLS for Session when TLS is on); 0: any free port."""
    http_host: str = Field(default="127.0.0.1", min_length=1)
    """Address of the HTTP server (admin API, dashboard, /metrics, /healthz)."""
    http_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the HTTP server; 0: any free port."""
    report_interval_ms: int = Field(default=2000, ge=100, le=3_600_000)
    """How often agents send a LoadReport (told to them in Welcome)."""
    hello_timeout_s: float = Field(default=10.0, gt=0)
    """How long a new session may take to send its Hello."""
    shutdown_grace_s: float = Field(default=5.0, gt=0)
    """How long shutdown waits for in-flight RPCs before cancelling them."""
    restart_grace_s: float = Field(default=30.0, ge=0)
    """After a restart, how long agents on record are still routed to (as unconfirmed) before
    they reconnect; 0: not at all."""
    log_level: Annotated[LogLevel, Upper] = "INFO"
    """Level of the coordinator's log (DEBUG, INFO, WARNING, ERROR, CRITICAL)."""
    event_loop: EventLoopChoice = "auto"
    """The event loop: auto (uvloop when installed, else asyncio's), uvloop, or asyncio."""
    grpc_thread_nice: int = Field(default=10, ge=0, le=19)
    """Niceness of gRPC's own I/O threads (Linux), so that on a busy CPU the event loop,
    which answers route lookups, runs first; 0: leave them as they start."""

    # --- HTTP server limits (edgefleet/http_limits.py)
    http_header_timeout_s: float = Field(default=_HTTP.header_timeout_s, gt=0, le=3600)
    """A request's head must arrive within this many seconds of connecting or of the
    previous response (idle keep-alive connections close after it too)."""
    http_body_timeout_s: float = Field(default=_HTTP.body_timeout_s, gt=0, le=3600)
    """A request's body must arrive within this many seconds of its head (else 408)."""
    http_max_connections: int = Field(default=_HTTP.max_connections, ge=1)
    """Open HTTP connections at most; those beyond get 503 and are closed."""

    # --- gRPC server limits
    grpc_max_concurrent_rpcs: int = Field(default=25_000, ge=1)
    """RPCs in progress at once (each connected agent holds one Session): more get
    RESOURCE_EXHAUSTED. Must exceed max_agents."""
    grpc_max_concurrent_streams: int = Field(default=256, ge=1)
    """Concurrent streams one HTTP/2 connection may open (an agent needs one or two)."""
    grpc_max_message_bytes: int = Field(default=4 << 20, ge=64 << 10)
    """Largest message received or sent, in bytes."""
    enroll_rate_per_minute: float = Field(default=30.0, gt=0)
    """Enroll calls per peer IP: the rate a token bucket refills at."""
    enroll_burst: int = Field(default=10, ge=1)
    """Enroll calls per peer IP: how many the token bucket holds."""

    # --- fleet bounds
    max_agents: int = Field(default=20_000, ge=1)
    """Agents on record at most; a Hello from a new agent id beyond it is refused
    (RESOURCE_EXHAUSTED), except that an enrolled agent takes the place of the
    never-enrolled, disconnected agent seen longest ago."""
    stale_unenrolled_after_s: float = Field(default=3600.0, gt=0)
    """A never-enrolled agent disconnected this long is removed from the registry and
    store."""

    # --- persistence
    data_dir: str = Field(default="~/.local/share/edgefleet/coordinator", min_length=1)
    """Directory for the SQLite database (fleet.db) and the CA (ca/); "~" is expanded."""
    store_url: str = Field(default="", max_length=2048)
    """The fleet database: empty for SQLite in data_dir (fleet.db), or
    postgresql://USER@HOST:PORT/DATABASE for PostgreSQL (the CA, signing key and model blobs
    stay in data_dir). Never with the password in it: store_password or
    store_password_file."""
    store_password: str = Field(default="", repr=False)
    """The PostgreSQL password: from the environment (EDGEFLEET_COORDINATOR_STORE_PASSWORD)
    or the config file, never a flag. Empty: store_password_file, else libpq's own
    (~/.pgpass, PGPASSWORD) or none."""
    store_password_file: str = ""
    """A file holding the PostgreSQL password (first line; keep it 0600). Used when
    store_password is empty."""
    store_max_connections: int = Field(default=10, ge=1, le=1000)
    """PostgreSQL connections the coordinator keeps open at most (its pool)."""
    store_statement_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    """How long one store call's statements may run before they are stopped (a StoreError,
    nothing of the call kept), and how long a call waits for another connection's write
    lock."""

    # --- several coordinators on one database (coordinator/cluster/membership.py)
    coordinator_id: str = Field(default="", max_length=200)
    """This coordinator's name among those sharing the fleet database (its heartbeat, the
    leader lease). Empty: the machine's name and a hash of data_dir's full path."""
    coordinator_heartbeat_s: float = Field(default=1.0, gt=0, le=60)
    """How often this coordinator records itself as alive and renews (or tries to take) the
    leader lease."""
    leader_lease_s: float = Field(default=5.0, gt=0, le=600)
    """How long the leader lease holds after a renewal, and how long a coordinator counts
    as alive after its last heartbeat, both by the database's clock; at least twice
    coordinator_heartbeat_s."""

    # --- enrollment and TLS
    tls: Switch = "auto"
    """TLS on the gRPC ports. "auto": unless grpc_host is loopback; "on": always; "off":
    plaintext (dev only)."""
    enroll_port: int = Field(default=default_enroll_port(DEFAULT_GRPC_PORT), ge=0, le=65535)
    """With TLS on: the port for Enroll and Route (server-authenticated TLS, no client
    certificate); the Session port (grpc_port) then requires mutual TLS. Default: the port
    after grpc_port (what agents assume); 0: any free port."""
    tls_server_names: str = ""
    """Extra host names / IPs for the server certificates, comma-separated."""
    require_enrollment: BoolSwitch = "auto"
    """"auto": agents must be enrolled whenever TLS is on or gRPC listens beyond loopback;
    "on": always; "off" (or false): agents that never enrolled may connect (enrolled ones
    are always checked). tls = "off" beyond loopback refuses to start unless this is
    explicitly "off". Even then, a Hello never replaces another live session."""
    agent_cert_days: float = Field(default=7.0, gt=0, le=3650)
    """Lifetime of the client certificates issued to agents, in days (renewed over the
    session once 2/3 of it has passed)."""
    agent_cert_grace_days: float = Field(default=90.0, ge=0, le=3650)
    """An agent whose certificate expired may still renew with its enrollment credential
    for this many days after the expiry."""
    check_agent_url_host: bool = True
    """An agent's Hello.http_url host must be its gRPC peer address (or resolve to it)
    unless the operator fixed its URL; agents connecting over loopback are exempt."""
    max_agent_tokens_per_second: float = Field(default=100_000.0, gt=0)
    """An agent's reported tokens/s is clamped to this (so a lying agent cannot rank itself
    first)."""
    max_agent_sequences: int = Field(default=10_000, ge=1)
    """An agent's reported sequence counts are clamped to this."""
    dashboard_session_ttl_s: int = Field(default=8 * 3600, ge=60, le=7 * 86_400)
    """Dashboard sign-in sessions (kept in the database as a hash) last this long."""
    http_tls: Switch = "auto"
    """HTTPS on the HTTP port. "auto": on unless http_host is loopback; "on": always; "off":
    plain HTTP (dev only). The certificate is http_tls_cert_file/http_tls_key_file when
    given (e.g. from a public CA), else one issued by this coordinator's CA at every start
    for http_host, localhost, the machine's name and tls_server_names."""
    http_tls_cert_file: str = ""
    """PEM certificate (chain) for HTTPS; empty: one from this coordinator's CA. Set with
    http_tls_key_file."""
    http_tls_key_file: str = ""
    """PEM key of http_tls_cert_file."""
    admin_token: str = Field(default="", repr=False)
    """The bootstrap admin token (role admin), at least 32 characters: from the environment
    (EDGEFLEET_COORDINATOR_ADMIN_TOKEN) or the config file, never a flag (a flag's value is
    readable in /proc/PID/cmdline). Empty: only tokens minted with
    `python -m coordinator admin-tokens mint` are accepted. Loopback grants nothing."""
    admin_token_file: str = ""
    """A file holding the bootstrap admin token (first line; keep it 0600). Used when
    admin_token is empty."""
    request_records_max_rows: int = Field(default=5_000_000, ge=1000)
    """Most per-request records kept (the oldest tenth goes past it)."""

    # --- liveness
    suspect_after_reports: int = Field(default=2, ge=1)
    """Missed load reports before an agent is suspect (routed last)."""
    down_after_reports: int = Field(default=5, ge=1)
    """Missed load reports before an agent is down (not routed); above
    suspect_after_reports."""

    # --- routing (coordinator/routing/scorer.py says why these defaults)
    route_weight_proximity: float = Field(default=_POLICY.weights.proximity, ge=0)
    """Weight of proximity (distance, or the client's measured RTT) in an agent's score."""
    route_weight_queue: float = Field(default=_POLICY.weights.queue, ge=0)
    """Weight of the agent's load, relative to the other candidates', in its score."""
    route_weight_kv: float = Field(default=_POLICY.weights.kv, ge=0)
    """Weight of the agent's KV-cache use in its score."""
    route_weight_wait: float = Field(default=_POLICY.weights.wait, ge=0)
    """Weight of the agent's predicted wait in its score."""
    route_distance_scale_km: float = Field(default=_POLICY.distance_scale_km, gt=0)
    """Distance (km) at which the proximity term halves."""
    route_rtt_scale_ms: float = Field(default=_POLICY.rtt_scale_ms, gt=0)
    """Client-measured RTT (ms) at which the proximity term halves."""
    route_expected_tokens: int = Field(default=_POLICY.expected_tokens, ge=1)
    """Tokens a typical request generates, for predicted wait = backlog * this / tokens per
    second."""
    route_saturation_queue_depth: int = Field(default=_POLICY.saturation_queue_depth, ge=1)
    """Waiting sequences at which an agent is saturated and gets no new routes."""
    route_saturation_kv_fraction: float = Field(default=_POLICY.saturation_kv_fraction, gt=0, le=1)
    """KV-cache use at which an agent is saturated and gets no new routes."""
    route_limit: int = Field(default=_POLICY.limit, ge=1)
    """Most agents returned per answer."""
    route_candidate_pool: int = Field(default=64, ge=1)
    """How many nearest candidates are scored per lookup."""
    site_networks: str = ""
    """"CIDR=site,CIDR=site": which site a client IP belongs to."""

    # --- keeping models warm where their demand is (coordinator/routing/warmth.py)
    warm_by_demand: bool = True
    """Count route lookups per (site, model) and send LOAD_MODEL to an agent at a site where
    its model has demand now, or had it at this time yesterday, and no agent there holds it
    in memory (agents that load models on demand). Off: lookups are not counted."""
    warm_interval_s: float = Field(default=30.0, ge=0.1, le=3600)
    """How often the warm-by-demand policy looks at the demand and the agents' reports."""
    warm_recent_window_s: float = Field(default=1800.0, ge=60, le=7200)
    """Lookups within this many seconds count as demand now."""
    warm_yesterday_window_s: float = Field(default=3600.0, ge=0, le=7200)
    """Lookups within this many seconds either side of this time yesterday count as demand
    now (the first request of the morning finds its model loaded); 0: yesterday is not
    looked at."""
    warm_min_lookups: int = Field(default=4, ge=1)
    """Lookups for a model at a site, in either window, at which it is kept warm there."""
    warm_backoff_s: float = Field(default=300.0, ge=0)
    """No second LOAD_MODEL to the same agent for the same model within this many seconds."""
    warm_refresh_s: float = Field(default=120.0, ge=0)
    """While demand lasts, an agent holding the model is sent LOAD_MODEL this often, which
    restarts its keep-alive (keep it below the agents' residency.keep_alive_s); 0: never."""
    warm_max_commands_per_cycle: int = Field(default=10, ge=0, le=10_000)
    """LOAD_MODEL commands sent per policy run at most (the busiest pairs first); 0: none
    sent (the demand is still counted, and shown in the metrics)."""
    warm_max_pairs: int = Field(default=4096, ge=1, le=1_000_000)
    """(site, model) pairs whose demand is kept, about 1.3 KiB each (26 hours of 5-minute
    buckets); past it the pair looked up least recently is forgotten."""

    # --- model catalog
    blob_base_url: str = Field(default="", max_length=2048)
    """The URL agents fetch model blobs from (sent as ModelTarget.artifact_url), e.g.
    https://coordinator.example:8080/v1/blobs. Empty: this coordinator's HTTP address
    (http_host, or the machine's name when it listens on every interface, and the port)."""

    # --- overflow
    overflow_targets_file: str = ""
    """A JSON file of cloud GPU pools and hosted providers (coordinator/routing/overflow.py:
    OverflowTargetsFile; credentials by env var / file NAME); peers at each site come from
    the registry. Empty: peers only."""
    overflow_name: str = ""
    """Name of the static overflow answer of older configs, used when overflow_targets_file
    is empty."""
    overflow_url: str = ""
    """URL of the static overflow answer of older configs (with overflow_name)."""

    @model_validator(mode="before")
    @classmethod
    def _enroll_port_follows_grpc_port(cls, data: Any) -> Any:
        if isinstance(data, dict) and "enroll_port" not in data and "grpc_port" in data:
            with contextlib.suppress(TypeError, ValueError):  # grpc_port's check reports it
                data = {**data, "enroll_port": default_enroll_port(int(data["grpc_port"]))}
        return data

    @field_validator("site_networks")
    @classmethod
    def _site_networks(cls, value: str) -> str:
        from coordinator.routing.site_networks import parse_site_networks

        parse_site_networks(value)  # ValueError names the bad entry
        return value

    @field_validator("store_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        return check_store_url(value)

    @field_validator("admin_token")
    @classmethod
    def _admin_token_strong(cls, value: str) -> str:
        return check_admin_token(value, "admin_token")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.down_after_reports <= self.suspect_after_reports:
            raise ValueError(
                "down_after_reports must be greater than suspect_after_reports, got "
                f"{self.down_after_reports} <= {self.suspect_after_reports}"
            )
        if bool(self.http_tls_cert_file) != bool(self.http_tls_key_file):
            raise ValueError(
                "http_tls_cert_file and http_tls_key_file go together: set both, or neither "
                "for a certificate from the coordinator's CA"
            )
        if (
            self.tls == "off"
            and not is_loopback_host(self.grpc_host)
            and self.require_enrollment != "off"
        ):
            raise ValueError(
                f'tls = "off" with grpc_host {self.grpc_host} (beyond loopback) needs an explicit '
                "require_enrollment = false: agents would connect unauthenticated in plaintext"
            )
        if self.grpc_max_concurrent_rpcs <= self.max_agents:
            raise ValueError(
                "grpc_max_concurrent_rpcs must be greater than max_agents (each connected "
                f"agent holds one Session RPC), got {self.grpc_max_concurrent_rpcs} <= "
                f"{self.max_agents}"
            )
        if self.leader_lease_s < 2 * self.coordinator_heartbeat_s:
            raise ValueError(
                "leader_lease_s must be at least twice coordinator_heartbeat_s (a lease "
                f"renewed that seldom would lapse), got {self.leader_lease_s} < "
                f"2 x {self.coordinator_heartbeat_s}"
            )
        weights = (self.route_weight_proximity, self.route_weight_queue, self.route_weight_kv)
        if sum(weights) + self.route_weight_wait <= 0:
            raise ValueError("at least one of the route_weight_* settings must be above 0")
        return self

    def bootstrap_admin_token(self) -> str:
        """``admin_token``, else the first line of ``admin_token_file``; "" for none."""
        if self.admin_token or not self.admin_token_file:
            return self.admin_token
        path, token = _secret_file_line(self.admin_token_file, "admin_token_file")
        try:
            return check_admin_token(token, f"admin_token_file {path}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    def store_location(self, url: str | None = None) -> StoreLocation:
        """Where the fleet store is (SQLite in data_dir, or PostgreSQL at store_url, or at
        ``url`` when given), with the password read now (ConfigError when its file cannot
        be read)."""
        url = self.store_url if url is None else url
        return StoreLocation(
            data_dir=self.data_path,
            url=url,
            password=self._store_password() if url else "",
            statement_timeout_s=self.store_statement_timeout_s,
            max_connections=self.store_max_connections,
        )

    def _store_password(self) -> str:
        if self.store_password or not self.store_password_file:
            return self.store_password
        return _secret_file_line(self.store_password_file, "store_password_file")[1]

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            header_timeout_s=self.http_header_timeout_s,
            body_timeout_s=self.http_body_timeout_s,
            max_connections=self.http_max_connections,
        )

    @property
    def tls_enabled(self) -> bool:
        if self.tls == "auto":
            return not is_loopback_host(self.grpc_host)
        return self.tls == "on"

    @property
    def http_tls_enabled(self) -> bool:
        if self.http_tls == "auto":
            return not is_loopback_host(self.http_host)
        return self.http_tls == "on"

    @property
    def enrollment_required(self) -> bool:
        if self.require_enrollment == "auto":
            return self.tls_enabled or not is_loopback_host(self.grpc_host)
        return self.require_enrollment == "on"


def _secret_file_line(file: str, key: str) -> tuple[Path, str]:
    """The path of the secret file set by ``key`` and its first line, trimmed ("" when it is
    empty); a warning when other users may read it, ConfigError when it cannot be read."""
    path = Path(file).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {key} {path}: {exc}") from exc
    if mode & 0o077:
        logging.getLogger(__name__).warning(
            "%s %s is readable by other users (chmod 600 it)", key, path
        )
    return path, lines[0].strip() if lines else ""


MIN_ADMIN_TOKEN_LENGTH = 32


def check_admin_token(value: str, where: str) -> str:
    """A bootstrap admin token: empty, or 32+ printable ASCII characters without spaces."""
    if not value:
        return value
    if len(value) < MIN_ADMIN_TOKEN_LENGTH:
        raise ValueError(
            f"{where} is {len(value)} characters; an admin token needs at least "
            f"{MIN_ADMIN_TOKEN_LENGTH} (e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`)"
        )
    if not all(33 <= ord(c) <= 126 for c in value):
        raise ValueError(f"{where} must be printable ASCII without spaces")
    return value


STORE_PASSWORD_FLAG_REFUSED = (
    "the store password cannot be given as a flag (anyone on the host can read a process's "
    f"flags in /proc/PID/cmdline): set {ENV_PREFIX}STORE_PASSWORD in the environment, or "
    "store_password_file = PATH (a 0600 file) in the config file"
)

ADMIN_TOKEN_FLAG_REFUSED = (
    "the admin token cannot be given as a flag (anyone on the host can read a process's "
    f"flags in /proc/PID/cmdline): set {ENV_PREFIX}ADMIN_TOKEN in the environment, or "
    "admin_token_file = PATH (a 0600 file) in the config file"
)

# Named flags (every key is also reachable with --set KEY=VALUE).
FLAGS = (
    Flag("--grpc-host", "grpc_host", "HOST"),
    Flag("--grpc-port", "grpc_port", "PORT"),
    Flag("--http-host", "http_host", "HOST"),
    Flag("--http-port", "http_port", "PORT"),
    Flag("--report-interval-ms", "report_interval_ms", "MS"),
    Flag("--hello-timeout-s", "hello_timeout_s", "S"),
    Flag("--shutdown-grace-s", "shutdown_grace_s", "S"),
    Flag("--restart-grace-s", "restart_grace_s", "S"),
    Flag("--log-level", "log_level", "LEVEL"),
    Flag("--data-dir", "data_dir", "DIR"),
    Flag("--tls", "tls", "auto|on|off"),
    Flag("--http-tls", "http_tls", "auto|on|off"),
    Flag("--enroll-port", "enroll_port", "PORT", default="grpc_port + 1"),
)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CoordinatorConfig:
    """Defaults < ``path`` (or ``$EDGEFLEET_COORDINATOR_CONFIG``) < environment < flags.

    The admin token and the store password may not come from a flag (``--set
    admin_token=...``): refused.
    """
    if overrides and overrides.get("admin_token"):
        raise ConfigError(ADMIN_TOKEN_FLAG_REFUSED)
    if overrides and overrides.get("store_password"):
        raise ConfigError(STORE_PASSWORD_FLAG_REFUSED)
    return load_settings(
        CoordinatorConfig,
        error=ConfigError,
        path=path,
        environ=os.environ if environ is None else environ,
        overrides=overrides,
        flags=FLAGS,
    )


def log_level_number(config: CoordinatorConfig) -> int:
    return int(getattr(logging, config.log_level))
