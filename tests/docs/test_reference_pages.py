"""The reference pages in docs/reference/ are what the code generates now.

``devtools.docs_reference`` writes them from the OpenAPI documents, the configuration
models and the argparse parsers; here they are regenerated into a temporary directory and
compared with the committed ones, so a route, a key or a flag changed without
regenerating fails with the command that fixes it.
"""

from __future__ import annotations

from pathlib import Path

from devtools import docs_reference
from devtools.docs_reference import COMMAND, GENERATED, REFERENCE, pages, stale


def test_committed_reference_pages_are_current() -> None:
    found = stale(REFERENCE)
    assert not found, (
        f"stale generated pages in docs/reference/: {', '.join(found)}; "
        f"regenerate them with `{COMMAND}` (or `make docs`) and commit the result"
    )


def test_generation_is_deterministic() -> None:
    assert pages() == pages()


def test_pages_name_neither_this_checkout_nor_this_machine() -> None:
    checkout = str(docs_reference.REPO)
    home = str(Path.home())
    for name, text in pages().items():
        assert text.startswith(GENERATED), name
        assert checkout not in text, f"{name} names the checkout's path"
        assert home not in text, f"{name} names the home directory"


def test_every_route_key_and_command_is_on_a_page() -> None:
    from agent.api.openapi import openapi_document
    from agent.config import AgentConfig
    from coordinator.api.routes import api_document
    from coordinator.config import CoordinatorConfig
    from edgefleet.config_loading import leaf_fields

    text = pages()
    for path, operations in api_document()["paths"].items():
        for method in operations:
            assert f"`{method.upper()} {path}`" in text["coordinator-http-api.md"]
    for path, operations in openapi_document()["paths"].items():
        for method in operations:
            assert f"`{method.upper()} {path}`" in text["agent-http-api.md"]
    for key, _ in leaf_fields(AgentConfig):
        assert f"| `{key}` |" in text["agent-config.md"], key
    for key, _ in leaf_fields(CoordinatorConfig):
        assert f"| `{key}` |" in text["coordinator-config.md"], key
    for command in ("tokens create", "keys mint", "rollouts start", "models publish"):
        assert f"`edgefleet-coordinator {command}`" in text["cli-coordinator.md"], command
    assert "`python -m models build`" in text["cli-tools.md"]
    assert "`python -m edge_images bundle`" in text["cli-tools.md"]


def test_the_check_names_an_edited_page(tmp_path: Path) -> None:
    docs_reference.write(tmp_path)
    edited = tmp_path / "agent-config.md"
    edited.write_text(edited.read_text(encoding="utf-8") + "hand edit\n", encoding="utf-8")
    (tmp_path / "gone.md").write_text(GENERATED + " by an older version -->\n")
    assert stale(tmp_path) == ["agent-config.md", "gone.md"]
    assert docs_reference.main(["--check", "--out", str(tmp_path)]) == 1
