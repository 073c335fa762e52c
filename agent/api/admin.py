"""A standalone agent's own admin API: load and unload a model's weights now.

An agent run by a coordinator takes these as commands over its session (the
coordinator's ``agents load-model|unload-model``). A standalone agent has no coordinator,
so its operator asks the agent itself, and only from the box:

* ``POST /v1/admin/models/{model}/load``: load the weights now (waits for the load,
  bounded by ``LOAD_WAIT_S``); the model then stays for its keep-alive like any other.
* ``POST /v1/admin/models/{model}/unload``: unload them once the model's requests are
  done (it stays served: its next request loads it again); a request's pin ends here.
* ``GET /v1/admin/models``: every text model's state, resident bytes, expiry and pin.

Both conditions hold for every call: the call comes from this box (the peer is on
loopback, 127.0.0.0/8 or ::1, or it is the very address the call was made to: how a
command on the box reaches an agent bound only to its LAN address; Linux drops packets
from another machine that claim a local source address), so a request from the LAN is
refused with 403 even with the right token; and
``Authorization: Bearer <admin token>`` matches the agent's admin token (401 otherwise,
compared in constant time). The token is not an API key: API keys never reach these
routes, and the admin token serves nothing else. It lives in ``auth.admin_token_file``
(default ``<coordinator.state_dir>/admin-token``), made by the agent at start when it is
missing (32 random bytes, mode 0600); ``python -m agent models load NAME`` reads it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.config import AgentConfig
from agent.engine.residency import Residency
from agent.errors import (
    AdminForbiddenError,
    AgentError,
    InvalidAdminTokenError,
    InvalidRequestError,
    ModelNotFoundError,
    NotManagedError,
)
from agent.model_registry import ModelRegistry
from edgefleet.addresses import is_loopback_host

log = logging.getLogger(__name__)

ADMIN_PREFIX = "/v1/admin/"
TOKEN_PREFIX = "efa-"
#: How long ``load`` waits for the weights before answering 202 (the load goes on).
LOAD_WAIT_S = 120.0
_MODEL_ID_CHARS = 256


def admin_token_path(config: AgentConfig) -> Path:
    configured = config.auth.admin_token_file
    if configured:
        return Path(configured).expanduser()
    return Path(config.coordinator.state_dir).expanduser() / "admin-token"


def ensure_admin_token(path: Path) -> str:
    """The token in ``path``, made (0600, directory 0700) when the file is missing."""
    try:
        return read_admin_token(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return read_admin_token(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    log.info("admin token for this agent's loopback admin API written to %s", path)
    return token


def read_admin_token(path: Path) -> str:
    token = path.read_text("utf-8").strip()
    if len(token) < 16:
        raise AgentError(f"{path}: the admin token is missing or shorter than 16 characters")
    return token


class AdminToken:
    """The agent's admin token, read (or made) on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token: str | None = None

    def value(self) -> str:
        if self._token is None:
            self._token = ensure_admin_token(self.path)
        return self._token

    def check(self, request: web.Request) -> None:
        if not _from_this_box(request):
            raise AdminForbiddenError(
                "the agent's admin API answers only calls from its own box (run the command "
                "there, or use the coordinator's admin API for a managed agent)"
            )
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        expected = self.value()
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), expected.encode()
        ):
            raise InvalidAdminTokenError(
                f"missing or wrong admin token (the agent's is in {self.path})"
            )


def _from_this_box(request: web.Request) -> bool:
    """The peer is on loopback, or is the local address it connected to."""
    peer = request.remote or ""
    if is_loopback_host(peer):
        return True
    transport = request.transport
    local = transport.get_extra_info("sockname") if transport is not None else None
    if not peer or not isinstance(local, tuple) or not local:
        return False
    try:
        return _plain(ipaddress.ip_address(peer.strip("[]"))) == _plain(
            ipaddress.ip_address(str(local[0]))
        )
    except ValueError:
        return False


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> object:
    """An IPv4-mapped IPv6 address as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


ADMIN_TOKEN = web.AppKey("admin_token", AdminToken)


Registry = Callable[[web.Request], ModelRegistry]


def _residency_of(registry: ModelRegistry, model_id: str) -> Residency:
    if len(model_id) > _MODEL_ID_CHARS or "@" in model_id:
        raise InvalidRequestError("model must be a served model's name", param="model")
    if model_id in registry.embedding_models:
        raise NotManagedError(
            f"{model_id} is an embedding model: it is always loaded", param="model"
        )
    if model_id not in registry.text_models:
        served = ", ".join(sorted(registry.text_models)) or "none"
        raise ModelNotFoundError(
            f"The model '{model_id}' is not served here (text models: {served})", param="model"
        )
    if registry.residency is None or registry.residency.state(model_id) is None:
        raise NotManagedError(f"{model_id}'s memory is not managed here", param="model")
    return registry.residency


def _state(residency: Residency, model_id: str) -> dict[str, Any]:
    found = next((s for s in residency.snapshot() if s["model"] == model_id), None)
    return {"object": "model_residency"} | (found or {"model": model_id})


def admin_routes(registry_of: Registry) -> list[web.RouteDef]:
    """The admin routes, reading the app's model registry through ``registry_of``."""

    async def admin_models(request: web.Request) -> web.Response:
        request.app[ADMIN_TOKEN].check(request)
        residency = registry_of(request).residency
        data = [] if residency is None else residency.snapshot()
        return web.json_response({"object": "list", "data": data})

    async def admin_load(request: web.Request) -> web.Response:
        request.app[ADMIN_TOKEN].check(request)
        model_id = request.match_info["model"]
        residency = _residency_of(registry_of(request), model_id)
        job = asyncio.ensure_future(residency.load(model_id, "command"))
        done, _ = await asyncio.wait([job], timeout=LOAD_WAIT_S)
        if not done:  # still loading: it goes on, and /v1/admin/models shows when it is in
            return web.json_response(_state(residency, model_id), status=202)
        job.result()  # a failure is the residency's own error (503 with Retry-After)
        log.info("admin: %s loaded on an operator's request", model_id)
        return web.json_response(_state(residency, model_id))

    async def admin_unload(request: web.Request) -> web.Response:
        request.app[ADMIN_TOKEN].check(request)
        model_id = request.match_info["model"]
        residency = _residency_of(registry_of(request), model_id)
        unloaded = await residency.unload(model_id, "command")
        log.info("admin: %s %s on an operator's request", model_id,
                 "unloaded" if unloaded else "was not loaded")  # fmt: skip
        return web.json_response(_state(residency, model_id) | {"unloaded": unloaded})

    return [
        web.get("/v1/admin/models", admin_models),
        web.post("/v1/admin/models/{model}/load", admin_load),
        web.post("/v1/admin/models/{model}/unload", admin_unload),
    ]
