"""Model rollouts over HTTP: start, list, show, pause, resume, abort.

Rollouts run on the leader only (coordinator/rollouts/engine.py). Asked of a coordinator
that does not lead, an action (start, pause, resume, abort) is forwarded to the leader's
HTTP address (its ``coordinators`` row) with the caller's credentials, and the leader's
answer is returned as it is: the leader checks the caller again and does the action, so
there is one writer and the caller sees its real outcome (a rollout id, a 409). Forwarded
once at most (header ``X-Edgefleet-Forwarded-By``); with no leader alive the answer is 503
``no_leader`` with ``Retry-After`` (a new leader is in place within ``leader_lease_s``).
Reads (list, show) are answered by any coordinator from the database.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from coordinator.api.app_keys import (
    CLUSTER_KEY,
    CONFIG_KEY,
    ROLLOUTS_KEY,
)
from coordinator.api.audit import _query_int
from coordinator.api.common import CALLER_KEY, InvalidParameter, error_response, json_body
from coordinator.rollouts.engine import NotLeaderError, RolloutEngine, RolloutError
from coordinator.rollouts.model import PolicyError, Rollout, RolloutPolicy, RolloutState

#: Set on an action forwarded to the leader (its value: the forwarding coordinator's id).
FORWARDED_HEADER = "X-Edgefleet-Forwarded-By"
#: The headers of the caller's request that travel with a forwarded action.
FORWARDED_REQUEST_HEADERS = ("Authorization", "Cookie", "Content-Type")
FORWARD_TIMEOUT_S = 60.0


class RolloutsUnavailable(Exception):
    """This coordinator runs without the rollout engine (no model catalog installed)."""


def _rollouts(request: web.Request) -> RolloutEngine:
    engine = request.config_dict.get(ROLLOUTS_KEY)
    if engine is None:
        raise RolloutsUnavailable
    return engine


def _rollout_error(exc: RolloutsUnavailable | PolicyError | RolloutError) -> web.Response:
    if isinstance(exc, RolloutsUnavailable):
        return error_response(503, "Model rollouts are not enabled on this coordinator.",
                              type_="server_error", code="rollouts_unavailable")  # fmt: skip
    if isinstance(exc, PolicyError):
        return error_response(400, str(exc), type_="invalid_request_error",
                              code="invalid_parameter", param=exc.param)  # fmt: skip
    return error_response(exc.status, str(exc), type_="invalid_request_error", code=exc.code,
                          param="rollout_id" if exc.status == 404 else None)  # fmt: skip


async def _to_leader(request: web.Request) -> web.Response:
    """The leader's answer to this action (this coordinator does not lead)."""
    cluster = request.config_dict.get(CLUSTER_KEY)
    retry = {"Retry-After": "1"}
    if cluster is None or request.headers.get(FORWARDED_HEADER):
        return error_response(503, "This coordinator does not lead (the leader changed while "
                              "the request was forwarded): try again.", type_="server_error",
                              code="not_leader", headers=retry)  # fmt: skip
    leader = cluster.leader_id
    member = next((m for m in cluster.alive() if m.coordinator_id == leader), None)
    if (
        leader is None
        or leader == cluster.coordinator_id
        or member is None
        or not member.http_address
    ):
        return error_response(503, "No coordinator leads right now (rollouts run on the "
                              "leader; a new one is in place within leader_lease_s): try "
                              "again.", type_="server_error", code="no_leader",
                              headers=retry)  # fmt: skip
    headers = {k: request.headers[k] for k in FORWARDED_REQUEST_HEADERS if k in request.headers}
    if "Origin" in request.headers:  # checked here already (authorize): the leader's own
        parts = urlsplit(member.http_address)
        headers["Origin"] = f"{parts.scheme}://{parts.netloc}"
    headers[FORWARDED_HEADER] = cluster.coordinator_id
    context: ssl.SSLContext | bool = True
    if member.http_address.startswith("https:"):
        context = ssl.create_default_context()
        fleet_ca = request.config_dict[CONFIG_KEY].data_path / "ca" / "ca.pem"
        if fleet_ca.is_file():  # the leader's HTTPS certificate is the fleet CA's
            context.load_verify_locations(cafile=str(fleet_ca))
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as http,
            http.request(request.method, member.http_address + request.path_qs,
                         data=await request.read(), headers=headers, ssl=context) as answer,
        ):  # fmt: skip
            body = await answer.read()
            content_type = answer.content_type
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Not no_leader: the leader may have done the action before its answer was lost
        # (the CLI tries no_leader and not_leader again by itself, never this).
        return error_response(503, f"The leader ({leader}) did not answer: {exc}; see "
                              "whether the action was done before trying again.",
                              type_="server_error", code="leader_unreachable",
                              headers=retry)  # fmt: skip
    return web.Response(status=status, body=body, content_type=content_type,
                        headers={"X-Edgefleet-Leader": leader})  # fmt: skip


_SUMMARY_FIELDS = (
    "object", "rollout_id", "model", "version", "previous_version", "state", "step", "steps",
    "step_name", "moved", "agents", "created_at", "updated_at", "finished_at", "created_by",
    "detail",
)  # fmt: skip


def rollout_summary(rollout: Rollout) -> dict[str, Any]:
    full = rollout.json()
    return {k: full[k] for k in _SUMMARY_FIELDS}


async def start_rollout(request: web.Request) -> web.Response:
    """Start a rollout: the body is a rollout policy (coordinator.rollouts.model)."""
    body = await json_body(request)
    caller = request[CALLER_KEY]
    try:
        rollout = await _rollouts(request).start(
            RolloutPolicy.from_json(body), created_by=f"{caller.name} ({caller.token_id})"
        )
    except NotLeaderError:
        return await _to_leader(request)
    except (RolloutsUnavailable, PolicyError, RolloutError) as exc:
        return _rollout_error(exc)
    return web.json_response(rollout.json(), status=201)


async def list_rollouts(request: web.Request) -> web.Response:
    raw = [s for s in request.query.get("state", "").split(",") if s]
    try:
        states = tuple(RolloutState(s) for s in raw)
    except ValueError:
        allowed = ", ".join(s.value for s in RolloutState)
        raise InvalidParameter("state", f"state must be among {allowed}") from None
    limit = _query_int(request, "limit", 100, 1000)
    try:
        found = await _rollouts(request).rollouts(states, limit)
    except RolloutsUnavailable as exc:
        return _rollout_error(exc)
    return web.json_response({"object": "list", "data": [rollout_summary(r) for r in found]})


async def show_rollout(request: web.Request) -> web.Response:
    """One rollout in full, with its current step's gate as it stands now."""
    try:
        engine = _rollouts(request)
        rollout = await engine.get(request.match_info["rollout_id"])
    except (RolloutsUnavailable, RolloutError) as exc:
        return _rollout_error(exc)
    view = rollout.json()
    view["gate"] = engine.gate(rollout).json() if rollout.state.active else None
    return web.json_response(view)


async def _rollout_action(request: web.Request, action: str) -> web.Response:
    rollout_id = request.match_info["rollout_id"]
    try:
        engine = _rollouts(request)
        if action == "pause":
            rollout = await engine.pause(rollout_id)
        elif action == "resume":
            rollout = await engine.resume(rollout_id)
        else:
            body = await json_body(request)
            rollback, reason = body.get("rollback", True), body.get("reason", "")
            if not isinstance(rollback, bool):
                raise InvalidParameter("rollback", "rollback must be true or false")
            if not isinstance(reason, str) or len(reason) > 1024:
                raise InvalidParameter("reason", "reason must be a string of <= 1024 characters")
            caller = request[CALLER_KEY]
            reason = f"aborted by {caller.name}" + (f": {reason}" if reason else "")
            rollout = await engine.abort(rollout_id, rollback=rollback, reason=reason)
    except NotLeaderError:
        return await _to_leader(request)
    except (RolloutsUnavailable, RolloutError) as exc:
        return _rollout_error(exc)
    return web.json_response(rollout_summary(rollout))


async def pause_rollout(request: web.Request) -> web.Response:
    """Pause: no further step moves and the soak clock stops; moved agents stay."""
    return await _rollout_action(request, "pause")


async def resume_rollout(request: web.Request) -> web.Response:
    return await _rollout_action(request, "resume")


async def abort_rollout(request: web.Request) -> web.Response:
    """Abort; moved agents go back to their previous version unless ``rollback`` is false."""
    return await _rollout_action(request, "abort")
