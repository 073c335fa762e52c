"""``python -m agent`` / ``edgefleet-agent``: serve local models over the OpenAI API.

Options come from a TOML file (``--config``), then ``EDGEFLEET_AGENT_*`` environment
variables, then these flags; ``--set section.key=value`` reaches any option.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from agent.admin_cli import run_models_command
from agent.agent_state import AgentState
from agent.api.admin import ADMIN_TOKEN
from agent.api.app import (
    KEYS,
    METRICS,
    MODEL_STATS,
    MODERATION_GATE,
    REDACTOR,
    REGISTRY,
    REQUEST_LOG,
    STATE,
    SYNC,
    create_app,
)
from agent.auth.cli import run_keys_command
from agent.auth.startup import KeysApplier, check_auth_configured, last_keys_path
from agent.config import FLAGS, AgentConfig, load_config
from agent.control import CoordinatorSession
from agent.engine.memory import limit_malloc_arenas
from agent.engine.ort_session import use_shared_thread_pool
from agent.engine.residency import follow_model_command
from agent.enrollment import (
    Enroller,
    EnrollmentUnavailableError,
    build_enroller,
    state_dir_of,
)
from agent.errors import AgentError, ConfigError, FatalError, ModelLoadError
from agent.https import build_server_context, enrollment_cert_files, server_cert_files
from agent.identity import build_identity, default_agent_id
from agent.load_sampler import LoadSampler
from agent.mdns import MdnsAdvertiser
from agent.model_registry import ModelRegistry
from agent.overflow.hook import OVERFLOW
from agent.overflow.wiring import desired_state_appliers, peer_client_tls
from agent.redaction import Redactor, install_log_filter
from agent.sync.fetch import BlobSource
from agent.sync.manager import ModelSync
from agent.sync.setup import models_source
from edgefleet import config_loading
from edgefleet.addresses import is_loopback_host
from edgefleet.config_loading import add_arguments
from edgefleet.contract import Command, DesiredState
from edgefleet.http_limits import LimitedAppRunner
from edgefleet.tls import CertificateReloader

log = logging.getLogger("agent")


# The explicit opt-outs of a secure default: flag -> (dotted key, the value it sets, help).
# Read by build_parser and overrides_from_args, and by the docs' configuration reference.
INSECURE_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--insecure-no-tls": (
        "server.tls",
        "off",
        "serve plain HTTP even beyond loopback (server.tls = off): keys and prompts "
        "travel unencrypted; for a trusted network only",
    ),
    "--insecure-no-auth": (
        "auth.insecure_no_auth",
        True,
        "serve without API keys even beyond loopback (auth.insecure_no_auth)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-agent",
        description="Serve ONNX models over the OpenAI HTTP API and report to a coordinator.",
        epilog="Precedence: defaults < --config file < EDGEFLEET_AGENT_<SECTION>__<KEY> "
        "environment variables < flags.",
    )
    add_arguments(parser, AgentConfig, FLAGS, example="engine.default_max_tokens=128")
    for flag, (_, _, help_text) in INSECURE_FLAGS.items():
        parser.add_argument(flag, action="store_true", help=help_text)
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted key -> value for the flags given; ValueError for a malformed ``--set``."""
    overrides = config_loading.overrides_from_args(args, FLAGS)
    for flag, (key, value, _) in INSECURE_FLAGS.items():
        if getattr(args, flag.removeprefix("--").replace("-", "_"), False):
            overrides[key] = value
    return overrides


def _busy(registry: ModelRegistry) -> int:
    """Sequences running or queued, for the mDNS TXT record."""
    load = registry.load()
    return load.running + load.waiting


def check_coordinator_tls(config: AgentConfig) -> None:
    """With ``coordinator.tls`` the session is mutual TLS: it needs enrollment's certificate.

    Without enrollment the session would fall back to plaintext, so refuse to start.
    """
    c = config.coordinator
    if c.target and c.tls and build_enroller(config, "") is None:
        raise ConfigError(
            "coordinator.tls is on but this agent is not enrolled: the session needs the "
            "client certificate enrollment gives. Set coordinator.join_token (or keep the "
            f"credentials saved in coordinator.state_dir {c.state_dir}), or turn "
            "coordinator.tls off"
        )


def check_models_dir(config: AgentConfig) -> None:
    """``models.dir`` is a directory this process can list (before anything loads)."""
    where = Path(config.models.dir)
    try:
        with os.scandir(where):
            pass
    except FileNotFoundError:
        raise ModelLoadError(
            f"models.dir {where} does not exist; build artifacts with `python -m models build` "
            "or point models.dir (--models-dir) at them"
        ) from None
    except NotADirectoryError:
        raise ModelLoadError(f"models.dir {where} is not a directory") from None
    except OSError as exc:
        raise ModelLoadError(f"models.dir {where} cannot be read: {exc.strerror}") from None


def _cannot_listen(host: str, port: int, exc: OSError) -> FatalError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return FatalError(
        f"cannot listen for HTTP on {host}:{port} (server.host, server.port): {reason}"
    )


def check_port_free(config: AgentConfig) -> None:
    """Fail before the models load when ``server.port`` is taken (the bind itself rechecks)."""
    host, port = config.server.host, config.server.port
    if port == 0:
        return
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from None


async def start_http(
    config: AgentConfig, app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Load the models and listen (HTTPS with ``ssl_context``); failures become FatalErrors."""
    runner = LimitedAppRunner(
        app, config.server.limits(), handler_cancellation=True, access_log=None
    )
    try:
        await runner.setup()  # loads the models
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load the models in models.dir {config.models.dir}: {exc}"
        ) from None
    host, port = config.server.host, config.server.port
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    except OSError as exc:
        await runner.cleanup()
        raise _cannot_listen(host, port, exc) from None
    return runner


async def enroll_before_serving(config: AgentConfig) -> Enroller | None:
    """Enroll now when the API must serve HTTPS with enrollment's certificate and there is
    none yet (beyond loopback, or ``server.tls = on``, without ``server.tls_cert_file``):
    enrollment writes ``agent.key``, ``agent.crt`` and ``ca.pem`` into the state dir, which
    the HTTPS server then serves. Returns the Enroller used (the session reuses it), or
    None when there is nothing to do here (the session enrolls as usual)."""
    s, c = config.server, config.coordinator
    if not c.target or s.tls == "off" or s.tls_cert_file:
        return None
    if s.tls == "auto" and is_loopback_host(s.host):
        return None
    if enrollment_cert_files(state_dir_of(config)).cert.is_file():
        return None
    requested = config.identity.agent_id or (default_agent_id(s.port) if s.port else "")
    enroller = build_enroller(config, requested)
    if enroller is None:
        return None  # no join token: server_cert_files says what is missing
    unavailable: list[str] = []
    for target in c.targets:  # several coordinators: the next one when one is away
        enroller.target = c.enrollment_target_for(target)
        try:
            credentials = await enroller.ensure()  # EnrollmentRefusedError is a FatalError
        except EnrollmentUnavailableError as exc:
            unavailable.append(str(exc))
            continue
        break
    else:
        raise FatalError(
            f"{'; '.join(unavailable)}; this agent needs its certificate from enrollment "
            "before it can serve HTTPS (it exits so that its supervisor retries)"
        )
    log.info("enrolled as %s before serving HTTPS (certificate in %s)",
             credentials.agent_id, state_dir_of(config))  # fmt: skip
    return enroller


class DesiredStateApplier:
    """The session's ``on_desired_state``: API keys to the key table, models to model sync
    (a ModelsSection only when its generation changed)."""

    def __init__(self, keys: KeysApplier | None, sync: ModelSync | None) -> None:
        self._keys = keys
        self._sync = sync
        self._models_generation = -1

    def __call__(self, desired: DesiredState) -> None:
        if self._keys is not None:
            self._keys(desired)
        section = desired.models
        sync = self._sync
        if (
            sync is not None
            and section is not None
            and section.generation != self._models_generation
        ):
            self._models_generation = section.generation
            sync.apply(section)


def infrastructure_hosts(config: AgentConfig) -> list[str]:
    """Hosts the operator configured (this agent's, its coordinator's): kept in logs."""
    hosts = [config.server.host, urlsplit(config.server.public_url).hostname or ""]
    for target in config.coordinator.targets:
        hosts.append(target.rsplit(":", 1)[0].strip("[]"))
    return [h for h in hosts if h]


def prepare_sync(
    sync: ModelSync, public_url: str, enroller: Enroller | None, agent_id: str
) -> None:
    """This agent's own blob URL (never a source for itself), and how it identifies itself
    to the coordinator's blob server: ``Edgefleet-Agent: <id>`` always, and the session
    credential as a bearer token once enrolled (coordinator/api/models.py checks both; an
    agent that never enrolled is served only while its session is live, on coordinators
    that do not require enrollment)."""
    sync.options.own_blob_url = f"{public_url.rstrip('/')}/v1/blobs"

    def headers(source: BlobSource) -> dict[str, str]:
        if source.kind != "coordinator":
            return {}
        credentials = None if enroller is None else enroller.credentials
        found = {"Edgefleet-Agent": credentials.agent_id if credentials else agent_id}
        if credentials is not None and credentials.token:
            found["Authorization"] = f"Bearer {credentials.token}"
        return found

    sync.fetcher.headers = headers


def _on_command(state: AgentState, registry: ModelRegistry, command: Command) -> None:
    """A coordinator's command: drain and resume change the agent's state, load and
    unload a model's weights go to its residency."""
    state.apply(command)
    follow_model_command(registry.residency, command)


async def serve(config: AgentConfig) -> None:
    # first: the threads started from here on share these C heaps (see limit_malloc_arenas)
    limit_malloc_arenas(config.engine.malloc_arenas)
    check_coordinator_tls(config)  # before the models load
    check_auth_configured(config)
    if models_source(config) == "dir":
        check_models_dir(config)
    check_port_free(config)
    enroller = await enroll_before_serving(config)  # before the certificate is looked up
    cert_files = server_cert_files(config)  # ConfigError: HTTPS required, no certificate
    ssl_context = build_server_context(config, cert_files) if cert_files else None
    # before any session: the models' steps (and the embedding model's, the moderation
    # heads', a rollout's self-check) run on one pool instead of one pool per session
    use_shared_thread_pool(config.engine.intra_op_threads, config.engine.inter_op_threads)
    app = create_app(config)
    try:  # the loopback admin API's token, where `python -m agent models` finds it
        app[ADMIN_TOKEN].value()
    except (OSError, AgentError) as exc:
        log.warning("no admin token (the loopback admin API will refuse every call): %s", exc)
    runner = await start_http(config, app, ssl_context)
    port = runner.addresses[0][1]
    scheme = "https" if ssl_context else "http"
    public_url = config.server.public_url or f"{scheme}://{config.server.host}:{port}"
    reloader: asyncio.Task[None] | None = None
    if ssl_context is not None and cert_files is not None:
        reloading = CertificateReloader(ssl_context, cert_files)
        reloader = asyncio.create_task(
            reloading.run(config.server.tls_reload_interval_s), name="tls-reloader"
        )
    agent_id = config.identity.agent_id or default_agent_id(port)
    registry, metrics, state, keys = app[REGISTRY], app[METRICS], app[STATE], app[KEYS]
    overflow = app[OVERFLOW]
    overflow.agent_id = agent_id
    # agent-to-agent mutual TLS for forwards to peers (enrollment's certificate)
    overflow.forwarder.peer_ssl = peer_client_tls(config)
    session: CoordinatorSession | None = None
    sync = app.get(SYNC)
    if config.coordinator.target:
        session_enroller = enroller or build_enroller(config, agent_id)
        if sync is not None:
            prepare_sync(sync, public_url, session_enroller, agent_id)
        keys_applier = KeysApplier(keys, last_keys_path(config)) if keys.enabled else None
        session = CoordinatorSession(
            config.coordinator.targets,
            lambda: build_identity(config, registry, agent_id, public_url),  # models change
            LoadSampler(
                registry,
                metrics,
                state,
                keys if keys.enabled else None,
                redactions=app[REDACTOR].totals,
                overflow_usage=overflow.book.take,
                inventory=None if sync is None else sync.inventory,
                model_stats=app[MODEL_STATS],
                # the gate is made at startup: looked up per report
                moderation=lambda: app[MODERATION_GATE].report(),
            ),
            enroller=session_enroller,
            on_desired_state=desired_state_appliers(
                DesiredStateApplier(keys_applier, sync), overflow
            ),
            on_signing_key=None if sync is None else sync.trust.welcome_key,
            models_applied=None if sync is None else (lambda: sync.applied_generation),
            on_command=functools.partial(_on_command, state, registry),
            max_backoff_s=config.coordinator.max_backoff_s,
            enroll_target_for=config.coordinator.enrollment_target_for,
            on_coordinator=metrics.set_coordinator,
            request_log=app[REQUEST_LOG].open(
                Path(config.coordinator.state_dir).expanduser() / "request-log" / agent_id,
                agent_id,
                max_bytes=config.audit.spool_max_bytes,
            ),
        )
        await session.start()
    advertiser: MdnsAdvertiser | None = None
    if config.mdns.enabled:
        advertiser = MdnsAdvertiser(
            agent_id,
            public_url,
            site=config.identity.site,
            models=registry.ids,
            load=lambda: _busy(registry),
            status=lambda: state.status,
            interfaces=config.mdns.interfaces,
        )
        await advertiser.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("agent %s serving %s on %s", agent_id, ", ".join(registry.ids), public_url)
    print(f"edgefleet agent {agent_id} ready: {public_url}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        if advertiser is not None:
            await advertiser.stop()
        if session is not None:
            await session.stop()
        if reloader is not None:
            reloader.cancel()
            await asyncio.wait([reloader])
        await runner.cleanup()
        app[REQUEST_LOG].close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "keys":
        return run_keys_command(argv[1:])
    if argv and argv[0] == "models":
        return run_models_command(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)  # `keys ...`: python -m agent keys --help
    try:
        config = load_config(args.config, overrides=overrides_from_args(args))
    except (ConfigError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.redaction.redact_logs:  # placeholders, not values, in what the agent logs
        install_log_filter(
            Redactor.from_config(config.redaction), keep=infrastructure_hosts(config)
        )
    try:
        asyncio.run(serve(config))
    except FatalError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
