"""``python -m agent`` / ``edgefleet-agent``: serve local models over the OpenAI API.

Options come from a TOML file (``--config``), then ``EDGEFLEET_AGENT_*`` environment
variables, then these flags; ``--set section.key=value`` reaches any option.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.api.app import METRICS, REGISTRY, STATE, create_app
from agent.config import AgentConfig, load_config
from agent.control import CoordinatorSession
from agent.enrollment import build_enroller
from agent.errors import ConfigError, FatalError
from agent.identity import build_identity, default_agent_id
from agent.load_sampler import LoadSampler
from agent.mdns import MdnsAdvertiser
from agent.model_registry import ModelRegistry

log = logging.getLogger("agent")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-agent",
        description="Serve ONNX models over the OpenAI HTTP API and report to a coordinator.",
    )
    parser.add_argument("--config", type=Path, help="TOML config file")
    parser.add_argument("--host", help="listen address (server.host, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (server.port, default 8000)")
    parser.add_argument("--public-url", help="URL clients reach this agent at (server.public_url)")
    parser.add_argument("--models-dir", help="artifact directory (models.dir)")
    parser.add_argument(
        "--serve",
        action="append",
        metavar="NAME",
        help="artifact to serve, repeatable (models.serve; default: all found)",
    )
    parser.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (0 = cores)")
    parser.add_argument(
        "--execution-provider",
        choices=["auto", "cpu", "cuda"],
        help="engine.execution_provider (default auto)",
    )
    parser.add_argument("--max-context-tokens", type=int, help="engine.max_context_tokens")
    parser.add_argument("--coordinator", help="coordinator gRPC host:port (coordinator.target)")
    parser.add_argument("--agent-id", help="identity.agent_id")
    parser.add_argument("--site", help="identity.site")
    parser.add_argument("--lat", type=float, help="identity.latitude")
    parser.add_argument("--lon", type=float, help="identity.longitude")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="set any config option, e.g. --set engine.default_max_tokens=128",
    )
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    flat: dict[str, Any] = {
        "server.host": args.host,
        "server.port": args.port,
        "server.public_url": args.public_url,
        "models.dir": args.models_dir,
        "models.serve": tuple(args.serve) if args.serve else None,
        "engine.intra_op_threads": args.threads,
        "engine.execution_provider": args.execution_provider,
        "engine.max_context_tokens": args.max_context_tokens,
        "coordinator.target": args.coordinator,
        "identity.agent_id": args.agent_id,
        "identity.site": args.site,
        "identity.latitude": args.lat,
        "identity.longitude": args.lon,
        "log_level": args.log_level,
    }
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        flat[key.strip()] = value
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None:
            continue
        section, _, name = key.rpartition(".")
        (nested.setdefault(section, {}) if section else nested)[name] = value
    return nested


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


async def serve(config: AgentConfig) -> None:
    check_coordinator_tls(config)  # before the models load
    app = create_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()  # loads the models
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    port = runner.addresses[0][1]
    public_url = config.server.public_url or f"http://{config.server.host}:{port}"
    agent_id = config.identity.agent_id or default_agent_id(port)
    registry, metrics, state = app[REGISTRY], app[METRICS], app[STATE]
    session: CoordinatorSession | None = None
    if config.coordinator.target:
        identity = build_identity(config, registry, agent_id, public_url)
        session = CoordinatorSession(
            config.coordinator.target,
            lambda: identity,
            LoadSampler(registry, metrics, state),
            enroller=build_enroller(config, agent_id),
            on_command=state.apply,
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
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, overrides=overrides_from_args(args))
    except FatalError as exc:
        print(f"edgefleet-agent: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(serve(config))
    except FatalError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
