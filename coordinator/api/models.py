"""HTTP for the model catalog: blob serving and the admin API's model routes.

Blobs: ``GET``/``HEAD /v1/blobs/sha256/{sha256}`` serve a file of the blob store with a
strong ETag (``"<sha256>"``), ``If-None-Match`` (304), ``If-Range`` and one byte range
(``Range: bytes=a-b``, ``a-``, ``-n``: 206 with ``Content-Range``; 416 when it lies
outside the file; a header that is not one byte range is ignored: the whole file). The
protocol is :mod:`edgefleet.blob_http`, shared with the agents' peer blob servers. Who
may read them: a viewer (or higher) admin token, or an agent:

    Authorization: Bearer <the agent's enrollment credential (Hello.token)>
    Edgefleet-Agent: <its agent id>

An agent that never enrolled gets blobs without a credential only where the coordinator
lets it open a Session without one (``require_enrollment`` resolves to off: loopback
development setups), and only while that session is live. Being on loopback grants
nothing by itself. Site peers serve the same path from their own stores. Peer
coordinators read blobs with a peer token (header ``Edgefleet-Peer``,
coordinator/catalog/replication.py), which grants nothing else.

A blob a listed version names that this coordinator lacks (another coordinator published
it, and it has not arrived yet) is fetched from a peer coordinator while the agent's
request waits (``LAZY_WAIT_S`` at most); else the answer is 503 with
``X-Edgefleet-Fetching: 1`` and ``Retry-After`` (ask again), never a 404. A peer's own
request is never passed on (no loops): it gets the 404.

Admin routes (``ADMIN_ROUTES`` in ``coordinator.api.routes`` lists them with their role):
list, show, publish (manifest + blobs uploaded first, only those the coordinator lacks),
deprecate, delete (refused while in use), deploy (a rule: every agent the selector
matches runs name@version).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
from typing import Any

from aiohttp import web

from coordinator.api.app_keys import (
    BLOB_REPLICATOR_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    MODEL_ASSIGNMENTS_KEY,
    MODEL_CATALOG_KEY,
    REGISTRY_KEY,
    STORE_KEY,
)
from coordinator.api.common import InvalidParameter, error_response, json_body
from coordinator.catalog.assignments import BLOB_PATH, Selector
from coordinator.catalog.replication import FETCHING_HEADER, LAZY_WAIT_S, PEER_HEADER
from coordinator.errors import ModelCatalogError, StoreError, UnknownAgentError
from coordinator.fleet.records import AgentStatus, valid_agent_id
from coordinator.identity.join_tokens import sha256_hex
from edgefleet.blob_http import RangeNotSatisfiable, send_blob
from edgefleet.contract import Residency
from edgefleet.model_signing import SHA256_PATTERN, encode_public_key

logger = logging.getLogger(__name__)

AGENT_ID_HEADER = "Edgefleet-Agent"
BLOB_ROUTE = BLOB_PATH + "/sha256/{sha256}"
#: Routes an agent may read with its own credential instead of an admin token.
AGENT_ROUTES = frozenset({("GET", BLOB_ROUTE)})
_BLOB_HEADERS = {"Cache-Control": "public, immutable"}
#: The peer coordinator a blob request came from (its token checked).
PEER_KEY = web.RequestKey("edgefleet_peer", str)
_UPLOAD_CHUNK = 1 << 20
# An upload whose body stalls this long is dropped (s).
UPLOAD_IDLE_S = 60.0


# ------------------------------------------------------------------ agents' access


async def agent_may_read(request: web.Request) -> bool:
    """The request carries an agent's identity that may read blobs (see the module doc)."""
    agent_id = request.headers.get(AGENT_ID_HEADER, "")
    if not agent_id or not valid_agent_id(agent_id):
        return False
    stored = await request.config_dict[STORE_KEY].get_agent(agent_id)
    if stored is not None and stored.revoked:
        return False
    if stored is not None and stored.enrolled:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip() or not stored.credential_sha256:
            return False
        return hmac.compare_digest(stored.credential_sha256, sha256_hex(given.strip()))
    if request.config_dict[CONFIG_KEY].enrollment_required:
        return False
    try:
        record = request.config_dict[REGISTRY_KEY].get(agent_id)
    except UnknownAgentError:
        return False
    return record.status is AgentStatus.CONNECTED and not record.enrolled


def peer_may_read(request: web.Request) -> bool:
    """The request carries a good peer coordinator token (it may read blobs only)."""
    token = request.headers.get(PEER_HEADER, "")
    replicator = request.config_dict.get(BLOB_REPLICATOR_KEY)
    if not token or replicator is None:
        return False
    peer = replicator.credential.check(token)
    if peer is None:
        return False
    request[PEER_KEY] = peer
    return True


# ------------------------------------------------------------------ blobs


def _sha256_param(request: web.Request) -> str:
    sha = request.match_info["sha256"]
    if not SHA256_PATTERN.fullmatch(sha):
        raise InvalidParameter("sha256", "the blob name must be a lowercase hex sha256")
    return sha


def _not_found(sha: str) -> web.Response:
    return error_response(404, f"no blob with sha256 {sha}", type_="invalid_request_error",
                          code="blob_not_found", param="sha256")  # fmt: skip


async def get_blob(request: web.Request) -> web.StreamResponse:
    """The blob protocol is :mod:`edgefleet.blob_http`; here: the path, the 404 and 416
    bodies in the admin API's error format, and the egress metric."""
    sha = _sha256_param(request)
    path = request.config_dict[MODEL_CATALOG_KEY].blobs.path(sha)
    sent = request.config_dict[METRICS_KEY].blob_bytes_sent.labels(
        reader="agent" if AGENT_ID_HEADER in request.headers else "admin"
    )
    replicator = request.config_dict.get(BLOB_REPLICATOR_KEY)
    if (
        replicator is not None
        and PEER_KEY not in request
        and not path.exists()
        and (size := request.config_dict[MODEL_CATALOG_KEY].blob_size(sha)) is not None
    ):
        # Listed but not here yet (published through another coordinator): fetch it from
        # a peer while the agent waits, or tell it to ask again; never a 404.
        try:
            async with asyncio.timeout(LAZY_WAIT_S):
                held = await replicator.ensure(sha, size)
        except TimeoutError:
            held = False
        if not held:
            return error_response(
                503, f"blob {sha} is being fetched from another coordinator: ask again",
                type_="server_error", code="blob_fetching",
                headers={FETCHING_HEADER: "1", "Retry-After": "2"},
            )  # fmt: skip
    try:
        return await send_blob(request, path, sha, extra_headers=_BLOB_HEADERS, on_bytes=sent.inc)
    except FileNotFoundError:
        return _not_found(sha)
    except RangeNotSatisfiable as exc:
        return error_response(416, exc.message, type_="invalid_request_error",
                              code="range_not_satisfiable", headers=exc.headers)  # fmt: skip


# ------------------------------------------------------------------ admin: reading


def _ref(request: web.Request) -> tuple[str, str]:
    return request.match_info["name"], request.match_info["version"]


def catalog_error(exc: ModelCatalogError) -> web.Response:
    return error_response(exc.status, str(exc), type_="invalid_request_error", code=exc.code,
                          param=exc.param)  # fmt: skip


async def list_models(request: web.Request) -> web.Response:
    catalog = request.config_dict[MODEL_CATALOG_KEY]
    name = request.query.get("name") or None
    assignments = request.config_dict[MODEL_ASSIGNMENTS_KEY]
    data = []
    replicator = request.config_dict.get(BLOB_REPLICATOR_KEY)
    holders = None
    if replicator is not None:
        try:
            holders = await replicator.holders()
        except StoreError:  # the listing answers from memory; only this needs the database
            holders = None
    for item in catalog.versions(name):
        view = item.json()
        if holders is not None:  # the live coordinators holding every blob
            view["held_by"] = len(holders.get((item.name, item.version), []))
        view["desired_by"] = len(assignments.agents_desiring(item.name, item.version))
        view["loaded_on"] = len(assignments.agents_holding(item.name, item.version))
        data.append(view)
    return web.json_response({
        "object": "list",
        "data": data,
        "signing_public_key": encode_public_key(catalog.public_key),
        "rules": [r.json() for r in assignments.rules(name)],
    })  # fmt: skip


async def show_model(request: web.Request) -> web.Response:
    name, version = _ref(request)
    try:
        item = request.config_dict[MODEL_CATALOG_KEY].require(name, version)
    except ModelCatalogError as exc:
        return catalog_error(exc)
    assignments = request.config_dict[MODEL_ASSIGNMENTS_KEY]
    view = item.json(with_manifest=True)
    replicator = request.config_dict.get(BLOB_REPLICATOR_KEY)
    if replicator is not None:
        view["held_by"] = (await replicator.holders()).get((name, version), [])
    view["desired_by"] = sorted(assignments.agents_desiring(name, version))
    view["loaded_on"] = sorted(assignments.agents_holding(name, version))
    return web.json_response(view)


# ------------------------------------------------------------------ admin: publishing


async def missing_blobs(request: web.Request) -> web.Response:
    """Body {"sha256": [...]}: which of those the blob store lacks (upload only those)."""

    body = await json_body(request)
    wanted = body.get("sha256")
    if not isinstance(wanted, list) or len(wanted) > 10_000:
        raise InvalidParameter("sha256", "sha256 must be a list of at most 10000 hex digests")
    for item in wanted:
        if not isinstance(item, str) or not SHA256_PATTERN.fullmatch(item):
            raise InvalidParameter("sha256", f"{str(item)[:80]!r} is not a lowercase hex sha256")
    missing = request.config_dict[MODEL_CATALOG_KEY].blobs.missing(wanted)
    return web.json_response({"object": "blob_check", "missing": missing})


async def upload_blob(request: web.Request) -> web.Response:
    """The body is the file's bytes (Content-Length required); stored only when they
    hash to the sha256 in the path."""
    sha = _sha256_param(request)
    blobs = request.config_dict[MODEL_CATALOG_KEY].blobs
    if blobs.has(sha):
        return web.json_response({"object": "blob", "sha256": sha, "size": blobs.size(sha),
                                  "stored": False})  # fmt: skip
    if request.content_length is None:
        return error_response(411, "a blob upload needs Content-Length",
                              type_="invalid_request_error", code="length_required")  # fmt: skip
    writer = blobs.writer(sha)
    try:
        if request.content_length <= request.client_max_size:
            writer.write(await request.read())  # already read (bounded by body_deadline)
        else:
            while True:
                async with asyncio.timeout(UPLOAD_IDLE_S):
                    chunk = await request.content.read(_UPLOAD_CHUNK)
                if not chunk:
                    break
                writer.write(chunk)
        if writer.size != request.content_length:
            raise InvalidParameter("body", "the body is shorter than its Content-Length")
        await asyncio.to_thread(writer.commit)
    except ModelCatalogError as exc:
        return catalog_error(exc)
    except TimeoutError:
        writer.abort()
        return error_response(408, f"no upload bytes for {UPLOAD_IDLE_S:g} s",
                              type_="invalid_request_error", code="upload_timeout")  # fmt: skip
    except BaseException:
        writer.abort()
        raise
    request.config_dict[METRICS_KEY].blob_bytes_received.inc(writer.size)
    logger.info("blob %s stored (%d bytes)", sha, writer.size)
    return web.json_response({"object": "blob", "sha256": sha, "size": writer.size,
                              "stored": True}, status=201)  # fmt: skip


def _optional_name(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidParameter(key, f"{key} must be a string")
    return value


async def publish_model(request: web.Request) -> web.Response:
    """Body {"manifest_b64": ..., "name"?: ..., "version"?: ...}: every file the manifest
    lists must be in the blob store already."""

    body = await json_body(request)
    encoded = body.get("manifest_b64")
    if not isinstance(encoded, str):
        raise InvalidParameter("manifest_b64", "manifest_b64 (the manifest.json bytes, base64) "
                               "is required")  # fmt: skip
    try:
        manifest = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameter("manifest_b64", "manifest_b64 is not base64") from None
    try:
        published = await request.config_dict[MODEL_CATALOG_KEY].publish(
            manifest, name=_optional_name(body, "name"), version=_optional_name(body, "version")
        )
    except ModelCatalogError as exc:
        return catalog_error(exc)
    warnings = list(published.warnings)
    replication: dict[str, int] = {}
    replicator = request.config_dict.get(BLOB_REPLICATOR_KEY)
    if replicator is not None:
        # Complete once a second live coordinator holds every blob too (or every one
        # alive does, when fewer): bounded by publish_wait_s.
        held, wanted = await replicator.wait_held(published.version)
        replication = {"held_by": held, "held_by_wanted": wanted}
        if held < wanted:
            warnings.append(
                f"{published.version.ref}: only {held} of the {wanted} coordinators wanted "
                f"hold its files after {replicator.publish_wait_s:g} s; the others fetch "
                "them from a peer that holds them (see the coordinators' logs)"
            )
    view = (
        published.version.json()
        | replication
        | {
            "created": published.created,
            "warnings": warnings,
        }
    )
    return web.json_response(view, status=201 if published.created else 200)


async def deprecate_model(request: web.Request) -> web.Response:
    """Body {"deprecated": true|false} (default true)."""

    name, version = _ref(request)
    body = await json_body(request)
    flag = body.get("deprecated", True)
    if not isinstance(flag, bool):
        raise InvalidParameter("deprecated", "deprecated must be true or false")
    try:
        item = await request.config_dict[MODEL_CATALOG_KEY].set_deprecated(name, version, flag)
    except ModelCatalogError as exc:
        return catalog_error(exc)
    return web.json_response(item.json())


async def delete_model(request: web.Request) -> web.Response:
    name, version = _ref(request)
    catalog = request.config_dict[MODEL_CATALOG_KEY]
    try:
        users = request.config_dict[MODEL_ASSIGNMENTS_KEY].in_use_by(name, version)
        removed = await catalog.delete(name, version, in_use_by=users)
    except ModelCatalogError as exc:
        return catalog_error(exc)
    return web.json_response({"object": "model_version", "name": name, "version": version,
                              "deleted": True, "blobs_removed": len(removed)})  # fmt: skip


async def deploy_model(request: web.Request) -> web.Response:
    """Body {"sites"?: [...], "labels"?: [...], "agent_ids"?: [...], "residency"?:
    "on_demand" | "pinned" | "store_only"}: every agent the selector matches (empty: the
    whole fleet) runs name@version, later joiners too, holding its weights as residency
    says (absent: as the rule it replaces did, else on demand)."""

    name, version = _ref(request)
    body = await json_body(request)
    residency = body.pop("residency", None)
    if residency is not None:
        if not isinstance(residency, str) or residency not in set(Residency):
            raise InvalidParameter("residency", "residency must be one of: " + ", ".join(Residency))
        residency = Residency(residency)
    try:
        selector = Selector.from_json(body)
    except ValueError as exc:
        raise InvalidParameter("selector", str(exc)) from None
    assignments = request.config_dict[MODEL_ASSIGNMENTS_KEY]
    try:
        pushed = await assignments.set_rule(selector, name, version, residency=residency)
    except ModelCatalogError as exc:
        return catalog_error(exc)
    rule = next(r for r in assignments.rules(name) if r.selector.key() == selector.key())
    return web.json_response({
        "object": "model_rule",
        "name": name,
        "version": version,
        "selector": selector.json(),
        "residency": str(rule.residency),
        "agents_matching": len(assignments.agents_desiring(name, version)),
        "agents_updated": pushed,
    })  # fmt: skip
