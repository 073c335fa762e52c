"""The OpenAI error body is built in one place (edgefleet/openai_errors.py).

It was built in three (the agent's API, the coordinator's API, and the answers given
before any handler runs), which can drift apart: a field renamed in one would reach only
some clients. Every other module calls ``openai_error``.
"""

from __future__ import annotations

import re

from devtools.process import REPO_ROOT
from edgefleet.openai_errors import openai_error

# a dict literal that opens the error body itself: {"error": {"message": ...
_BUILT = re.compile(r"""\{\s*["']error["']\s*:\s*\{\s*["']message["']\s*:""")


def test_only_openai_errors_builds_the_body() -> None:
    builders = sorted(
        str(path.relative_to(REPO_ROOT))
        for package in ("agent", "coordinator", "edgefleet", "edgefleet_client")
        for path in (REPO_ROOT / package).rglob("*.py")
        if _BUILT.search(path.read_text(encoding="utf-8"))
    )
    assert builders == ["edgefleet/openai_errors.py"]


def test_the_body_has_openais_four_fields() -> None:
    assert openai_error(
        "no such model", "invalid_request_error", param="model", code="model_not_found"
    ) == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert openai_error("x", "server_error")["error"]["param"] is None
