"""The error body both HTTP APIs answer in: OpenAI's ``{"error": {...}}`` shape.

``message`` (for people), ``type`` (``invalid_request_error``, ``authentication_error``,
``server_error``, ...), ``param`` (the request field at fault, or null) and ``code`` (a
stable machine-readable reason, or null): what the ``openai`` SDK reads into its
exceptions. Built here only, so the agent, the coordinator and the answers given before
any handler runs (edgefleet.http_limits) cannot drift apart.
"""

from __future__ import annotations

__all__ = ["openai_error"]


def openai_error(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
