"""Who may overflow, and where.

A request may leave the site (go to a pool or a provider) only when all three allow it:
the agent's policy (``overflow.allow_cloud``), the API key's ``allow_cloud`` (no key
needed: nothing to forbid it) and the request's own ``allow_cloud`` (the body's
``"edgefleet": {"allow_cloud": false}`` or the ``X-Edgefleet-Allow-Cloud: false`` header;
absent: allowed). Peers at the same site are not "leaving"; they are always eligible.

A forwarded request carries the hop marker (``X-Edgefleet-Hop``), and a request that
carries it is never forwarded again, whoever sent it. That is what stops two peers that
cannot serve a request from forwarding it back and forth; it must hold over plain HTTP
too, where no peer has a certificate. A client that sets the marker itself only keeps its
own request from overflowing (as ``allow_cloud: false`` keeps it on the site).
"""

from __future__ import annotations

from typing import Any

from agent.auth.keys import KeyGrant
from agent.errors import AgentError, InvalidRequestError
from agent.structured.spec import ConstraintSpec, parse_constraint

# What a body the local path would refuse counts as: constrained to a JSON object (it only
# ever reaches targets that enforce constraints, and its output must parse).
UNPARSEABLE = ConstraintSpec(kind="json_object", schema={"type": "object"})

ALLOW_CLOUD_HEADER = "X-Edgefleet-Allow-Cloud"


def request_allows_cloud(body: dict[str, Any], header: str | None) -> bool:
    """The request's own say (default: yes). A malformed value is a 400."""
    allowed = True
    ext = body.get("edgefleet")
    if ext is not None:
        if not isinstance(ext, dict):
            raise InvalidRequestError("edgefleet must be an object", param="edgefleet")
        value = ext.get("allow_cloud")
        if value is not None:
            if not isinstance(value, bool):
                raise InvalidRequestError(
                    "edgefleet.allow_cloud must be true or false", param="edgefleet.allow_cloud"
                )
            allowed = value
    if header is not None:
        text = header.strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise InvalidRequestError(
                f"{ALLOW_CLOUD_HEADER} must be true or false", param=ALLOW_CLOUD_HEADER
            )
        allowed = allowed and text in ("true", "1")
    return allowed


def may_leave_site(
    policy_allows: bool, grant: KeyGrant | None, keys_enabled: bool, request_allows: bool
) -> bool:
    """Policy, key and request: all three must allow it."""
    if not policy_allows or not request_allows:
        return False
    if grant is None:
        return not keys_enabled
    return grant.key.allow_cloud


def hop_honoured(hop_header: str | None) -> bool:
    """Was this request forwarded already (so it must not be forwarded again)?"""
    return bool(hop_header and hop_header.strip())


def constraint_of(body: dict[str, Any]) -> ConstraintSpec | None:
    """The request's output constraint (agent/structured: response_format, tools and
    tool_choice), or None for free text. A body the local path would refuse is treated as
    constrained (it never reaches a target that ignores constraints)."""
    try:
        return parse_constraint(
            response_format=body.get("response_format"),
            tools=body.get("tools"),
            tool_choice=body.get("tool_choice"),
            functions=body.get("functions"),
        )
    except (AgentError, TypeError, AttributeError, ValueError):
        return UNPARSEABLE


def requires_constraints(
    body: dict[str, Any], constraint: ConstraintSpec | bool | None = False
) -> bool:
    """Does this request need a target that enforces constrained decoding? Such requests
    only go to targets with ``supports_constraints``: a JSON response_format, tools (with
    any tool_choice but "none"), or another engine's grammar / guided-decoding field.
    ``constraint``: the body's :func:`constraint_of`, when the caller has it already."""
    if constraint is False:
        constraint = constraint_of(body)
    if constraint is not None:
        return True
    return any(
        body.get(name) is not None
        for name in ("grammar", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
    )
